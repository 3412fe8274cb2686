#pragma once
// Heat interop, in one place: a heat.DNDarray as a DistView (kvmap.from_heat, and the
// arguments of kvmap.vmap / kvmap.map_batches) and a DistView as a DNDarray (DistView.to_heat,
// and the results of a call whose mapped inputs include a DNDarray), sharing memory both ways.
// What kvmap relies on of Heat's private fields (Heat 1.9's DNDarray stores its constructor's
// arguments under "_DNDarray__<name>") is confined to heat_adapter.cpp and checked by
// bindings/python/tests/test_heat_interop.py (test_heat_private_fields), which fails naming
// the field when a Heat release changes them; where a field is missing the adapter reads the
// public property instead.
#include <torch/csrc/utils/pybind.h>

#include "dist_views.hpp"
#include "vmap_frontend.hpp"

namespace kvmap::python {

// A call whose positional arguments from `first_foreign` on include a DNDarray (or something
// that is neither: TypeError): DNDarrays are adopted as DistViews (zero copy) and the results
// are DNDarrays sharing the results' memory, as heat.vmap returns.
py::tuple run_with_dndarrays(const PyMapped& m, PyObject* args, PyObject* kwargs,
                             Py_ssize_t first_foreign);

// kvmap.from_heat, DistView.to_heat and the private-field check the tests call.
void bind_heat(py::module_& m);

// The DNDarray sharing `view`'s memory on the Python communicator `comm` (None: the one the
// DistView was made on, which a duplicated mpi4py communicator replaces); DistView.to_heat.
py::object to_heat(PyDistView& view, py::object comm);

}  // namespace kvmap::python
