#pragma once
// The parts of the _kvmap module, each bound by its own source: the exception bridge
// (errors.cpp), kvmap's start and end and check_close (runtime_bindings.cpp), the DistView
// class (dist_view_bindings.cpp), the factories and linear algebra (factory_bindings.cpp),
// Heat interop (heat_adapter.cpp), the vmap front-end (vmap_frontend.cpp) and the ghost
// exchange (ghost_bindings.cpp).
#include <torch/csrc/utils/pybind.h>

namespace kvmap::python {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_runtime(py::module_& m);
void bind_tolerance(py::module_& m);
void bind_dist_view(py::module_& m);
void bind_factories(py::module_& m);
void bind_heat(py::module_& m);
void bind_vmap(py::module_& m);
void bind_ghost_exchange(py::module_& m);

}  // namespace kvmap::python
