#include "kvmap/runtime.hpp"

#include <Kokkos_Core.hpp>
#include <string>

#include "kvmap/comm.hpp"
#include "kvmap/config.hpp"
#include "kvmap/error.hpp"
#include "comm_registry.hpp"
#include "mpi_process.hpp"
#include "device_map.hpp"
#include "gpu_aware_mpi.hpp"
#include "host_allocator_start.hpp"
#include "runtime_start.hpp"
#include "stats_counters.hpp"

namespace kvmap {

namespace Detail {

bool start_kokkos(int& argc, char**& argv) {
  apply_host_allocator_environment();
  // Kokkos 4's own ScopeGuard aborts when Kokkos is already up, so ask first.
  if (Kokkos::is_initialized()) {
    decide_gpu_aware_mpi_on_every_rank();
    return false;
  }
  initialize_kokkos(argc, argv);
  return true;
}

void end_process_use(bool finalize_kokkos) {
  release_cached_comms();
  if (finalize_kokkos && Kokkos::is_initialized() && live_allocations() == 0) Kokkos::finalize();
}

}  // namespace Detail

ScopeGuard::ScopeGuard(int& argc, char**& argv) {
  started_mpi_ = Detail::init_mpi(argc, argv);
  try {
    started_kokkos_ = Detail::start_kokkos(argc, argv);
  } catch (...) {
    if (started_mpi_) Detail::finalize_mpi();
    throw;
  }
}

const char* version() {
  return KVMAP_VERSION_STRING;
}

namespace {
// The MPI library's name for itself up to its first line break or comma, blanks collapsed
// ("Open MPI v4.1.4", "MPICH Version: 4.0.2").
std::string mpi_library() {
  const std::string full = Detail::mpi_library_version();
  std::string name;
  for (char c : full.substr(0, full.find_first_of("\n,"))) {
    const bool blank = c == ' ' || c == '\t';
    if (blank && (name.empty() || name.back() == ' ')) continue;
    name += blank ? ' ' : c;
  }
  while (!name.empty() && name.back() == ' ') name.pop_back();
  return name;
}
}  // namespace

const char* build_info() {
  thread_local std::string text;
  text = "kvmap " KVMAP_VERSION_STRING " (Kokkos " KVMAP_KOKKOS_VERSION_STRING
         ", devices " KVMAP_KOKKOS_DEVICES_STRING "; LibTorch " KVMAP_TORCH_VERSION_STRING;
  if (Detail::mpi_running()) {
    const Detail::GpuAwareDecision gpu_aware = Detail::gpu_aware_mpi();
    text += "; MPI " + mpi_library() + "; device " + Detail::device_report() + "; GPU-aware MPI " +
            (gpu_aware.direct ? "yes" : "no") + " (" + gpu_aware.reason + ")";
  }
  text += ")";
  return text.c_str();
}

ScopeGuard::~ScopeGuard() {
  if (started_kokkos_) Kokkos::finalize();
  if (started_mpi_) Detail::finalize_mpi();
}

}  // namespace kvmap
