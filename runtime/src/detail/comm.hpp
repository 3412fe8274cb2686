#pragma once
// The MPI side of kvmap's runtime that users do not call: the count limit, the collective
// release of kvmap's communicators, MPI's start and end.
#include <cstddef>
#include <string>

namespace kvmap {
namespace Impl {
// Largest element count kvmap passes to one MPI call (INT_MAX unless lowered by a test,
// detail/testing.hpp).
std::size_t mpi_count_limit();
// Frees every duplicate kvmap made (collective, in the same order on every rank; before
// MPI_Finalize), the agreement's MPI operations and datatypes, and whatever the hooks
// registered with on_release hold (cached redistribution plans). Comms still held afterwards
// throw on use.
void release_cached_comms();
void on_release(void (*hook)());
bool mpi_initialized();
// The running MPI library's name for itself (MPI_Get_library_version).
std::string mpi_library_version();
// Initializes MPI with at least MPI_THREAD_FUNNELED, or checks the thread level of an MPI
// that is already initialized (Error when it is below FUNNELED). True when this call
// initialized MPI.
bool init_mpi(int& argc, char**& argv);
// Releases the cached communicators, then finalizes MPI.
void finalize_mpi();
}  // namespace Impl

}  // namespace kvmap
