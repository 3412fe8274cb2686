// _kvmap: the Python face of kvmap. DistViews in every memory space the build has (host
// memory, and the GPU's in a CUDA or HIP build), the vmap scheduler with a Python callable,
// Heat interop, and the factories and redistributions Heat users know (bindings.hpp lists the
// parts).
#include "bindings.hpp"

PYBIND11_MODULE(_kvmap, m) {
  namespace kp = kvmap::python;
  m.doc() = "kvmap: per-sample torch functions over arrays distributed with MPI (C++ core)";
  kp::bind_errors(m);
  kp::bind_runtime(m);
  kp::bind_dist_view(m);
  kp::bind_factories(m);
  kp::bind_tolerance(m);
  kp::bind_heat(m);
  kp::bind_vmap(m);
  kp::bind_ghost_exchange(m);
}
