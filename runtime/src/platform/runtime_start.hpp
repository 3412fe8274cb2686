#pragma once
// How kvmap starts and ends in a process, one owner for kvmap::ScopeGuard (C++) and
// `import kvmap` (Python, whose MPI mpi4py starts).
#include "detail.hpp"

namespace kvmap::Detail {

// Starts Kokkos with the program's arguments (on the device this rank maps to, device_map.hpp)
// unless it runs already; the GPU-aware MPI decision is made on every rank either way (a bad
// KVMAP_GPU_AWARE_MPI throws on all). MPI must be running. Returns whether it started Kokkos.
bool start_kokkos(int& argc, char**& argv);

// Ends kvmap's use of the process before MPI is finalized: frees kvmap's communicator
// duplicates and what they cache (collective), then, with `finalize_kokkos`, finalizes Kokkos
// where no kvmap allocation is alive. (A Python program may still hold DistViews at exit, in
// module globals or tracebacks: freeing Kokkos memory after Kokkos::finalize aborts, so Kokkos
// then stays up and the operating system takes the memory back.)
void end_process_use(bool finalize_kokkos);

}  // namespace kvmap::Detail
