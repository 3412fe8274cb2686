#include "kvmap/runtime.hpp"

#include <Kokkos_Core.hpp>

#include "kvmap/comm.hpp"
#include "kvmap/config.hpp"
#include "kvmap/error.hpp"
#include "detail/comm.hpp"

namespace kvmap {

ScopeGuard::ScopeGuard(int& argc, char**& argv) {
  started_mpi_ = Impl::init_mpi(argc, argv);
  // Kokkos 4's own ScopeGuard aborts when Kokkos is already up, so ask first.
  if (!Kokkos::is_initialized()) {
    Kokkos::initialize(argc, argv);
    started_kokkos_ = true;
  }
}

const char* version() {
  return KVMAP_VERSION_STRING;
}

const char* build_info() {
  return "kvmap " KVMAP_VERSION_STRING " (Kokkos " KVMAP_KOKKOS_VERSION_STRING
         ", devices " KVMAP_KOKKOS_DEVICES_STRING "; LibTorch " KVMAP_TORCH_VERSION_STRING ")";
}

ScopeGuard::~ScopeGuard() {
  if (started_kokkos_) Kokkos::finalize();
  if (started_mpi_) Impl::finalize_mpi();
}

}  // namespace kvmap
