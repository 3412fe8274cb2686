#include "kvmap/runtime.hpp"

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include "kvmap/comm.hpp"
#include "kvmap/config.hpp"
#include "kvmap/error.hpp"

namespace kvmap {

ScopeGuard::ScopeGuard(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    started_mpi_ = true;
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      throw Error("kvmap::ScopeGuard: MPI provides no MPI_THREAD_FUNNELED support");
    }
  } else {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    KVMAP_CHECK(provided >= MPI_THREAD_FUNNELED, Error,
                "kvmap::ScopeGuard: MPI was initialized with thread level "
                    << provided << ", kvmap needs at least MPI_THREAD_FUNNELED");
  }
  // Kokkos 4's own ScopeGuard aborts when Kokkos is already up, so ask first.
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize(argc, argv);
    started_kokkos_ = true;
  }
}

const char* version() { return KVMAP_VERSION_STRING; }

const char* build_info() {
  return "kvmap " KVMAP_VERSION_STRING " (Kokkos " KVMAP_KOKKOS_VERSION_STRING ", devices "
         KVMAP_KOKKOS_DEVICES_STRING "; LibTorch " KVMAP_TORCH_VERSION_STRING ")";
}

ScopeGuard::~ScopeGuard() {
  if (started_kokkos_) Kokkos::finalize();
  if (started_mpi_) {
    Impl::release_cached_comms();
    MPI_Finalize();
  }
}

}  // namespace kvmap
