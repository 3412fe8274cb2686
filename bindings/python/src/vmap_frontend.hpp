#pragma once
// The Python front-end of kvmap's one vmap core: kvmap.vmap and kvmap.map_batches return a
// callable implemented in C++ (no Python frame per call) that converts the DistView arguments,
// calls the core with the Python function, and converts the results; Heat DNDarrays go through
// the Heat adapter (heat_adapter.hpp). Mapping, agreement, chunks and assembly are the core's.
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <optional>
#include <vector>

#include "dist_views.hpp"

namespace kvmap::python {

// tp_call): no Python frame, no argument parsing beyond the DistViews.
struct PyMapped {
  py::object func;
  kvmap::VmapOptions options;
  kvmap::Impl::Mapping mapping = kvmap::Impl::Mapping::Samples;
  // kvmap.map_overlap: the map_overlap core with these options instead of the vmap core.
  std::optional<kvmap::OverlapOptions> overlap;
  const char* who() const {
    if (overlap) return "kvmap.map_overlap";
    return mapping == kvmap::Impl::Mapping::Samples ? "kvmap.vmap" : "kvmap.map_batches";
  }
};

// The Python front-end of kvmap's one vmap core (kvmap.vmap and kvmap.map_batches): it
// converts the arguments, f and f's results; slot mapping, agreement, chunks and assembly
// are the core's. `args` holds DistViews only.
// The DistViews of a call's positional arguments: on the stack for the usual few (a call
// makes no heap allocation for them).
class ArgViews {
 public:
  explicit ArgViews(Py_ssize_t n) {
    if (n > static_cast<Py_ssize_t>(small_.size())) big_.resize(static_cast<std::size_t>(n));
  }
  const PyDistView*& operator[](Py_ssize_t i) { return data()[i]; }
  const PyDistView** data() { return big_.empty() ? small_.data() : big_.data(); }

 private:
  std::array<const PyDistView*, 8> small_{};
  std::vector<const PyDistView*> big_;
};

// The results of a call and the Python communicator they live on (their inputs').
struct VmapResults {
  std::vector<AnyView> views;
  py::object comm;
};

// Runs the call on the DistViews `views` of the positional arguments (keyword arguments pass
// through to f unmapped).
VmapResults run_vmap_views(const PyMapped& m, const PyDistView* const* views, Py_ssize_t nargs,
                           PyObject* kwargs);

// kvmap._mapped and the Mapped type.
void bind_vmap(py::module_& m);

}  // namespace kvmap::python
