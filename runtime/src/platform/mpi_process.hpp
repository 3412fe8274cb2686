#pragma once
// MPI's start and end for kvmap's ScopeGuard and Python module, the MPI library's name, MPI
// error codes as exceptions, and the end of the whole job after an agreed call failed.
#include <string>

#include "detail.hpp"

namespace kvmap::Detail {

bool mpi_initialized();
// Initialized and not yet finalized.
bool mpi_running();
// Throws Error unless mpi_running().
void require_mpi();
// The running MPI library's name for itself (MPI_Get_library_version).
std::string mpi_library_version();
// Initializes MPI with at least MPI_THREAD_FUNNELED, or checks the thread level of an MPI
// that is already initialized (Error when it is below FUNNELED). True when this call
// initialized MPI.
bool init_mpi(int& argc, char**& argv);
// Releases the cached communicators, then finalizes MPI.
void finalize_mpi();
// Error("kvmap: <call> failed: <MPI's text>") unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* call);
// Writes `message` to stderr and ends the whole job (MPI_Abort on MPI_COMM_WORLD): for
// failures after every rank has agreed to run a call, when the other ranks can no longer be
// told.
[[noreturn]] void abort_job(const std::string& message);

}  // namespace kvmap::Detail
