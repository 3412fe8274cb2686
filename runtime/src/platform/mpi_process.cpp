#include "mpi_process.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "kvmap/error.hpp"
#include "comm_registry.hpp"

namespace kvmap::Detail {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("kvmap: ") + call + " failed: " + std::string(text, len));
}

bool mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

bool mpi_running() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return mpi_initialized() && !finalized;
}

void require_mpi() {
  if (!mpi_running()) {
    throw Error(
        "kvmap: MPI is not initialized (create a kvmap::ScopeGuard, or call MPI_Init, first)");
  }
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

bool init_mpi(int& argc, char**& argv) {
  int provided = MPI_THREAD_SINGLE;
  if (mpi_initialized()) {
    MPI_Query_thread(&provided);
    KVMAP_CHECK(provided >= MPI_THREAD_FUNNELED, Error,
                "kvmap: MPI was initialized with thread level "
                    << provided << ", kvmap needs at least MPI_THREAD_FUNNELED");
    return false;
  }
  check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    throw Error("kvmap: MPI provides no MPI_THREAD_FUNNELED support");
  }
  return true;
}

void finalize_mpi() {
  release_cached_comms();
  MPI_Finalize();
}

void abort_job(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  // The launcher forwards a rank's output asynchronously, and MPICH's Hydra drops what it has
  // not forwarded when the abort reaches it: give it a moment to pass the message on.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  // The whole job: MPICH (4.0.2) ends only the caller when given another communicator, and
  // leaves the other ranks waiting in the call's collectives.
  MPI_Abort(MPI_COMM_WORLD, 70);
  std::abort();
}

}  // namespace kvmap::Detail
