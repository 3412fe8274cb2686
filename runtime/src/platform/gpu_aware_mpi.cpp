#include "gpu_aware_mpi.hpp"

#include <mpi.h>

#include <Kokkos_Macros.hpp>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "kvmap/comm.hpp"
#include "mpi_transport.hpp"
#include "kvmap/config.hpp"
#include "kvmap/error.hpp"
#include "switches.hpp"

// Open MPI declares its GPU queries in mpi-ext.h, MPICH in mpi.h.
#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

namespace kvmap::Detail {

namespace {

std::mutex g_decision_mutex;
std::optional<GpuAwareDecision> g_decision;
std::atomic<int> g_direct{-1};  // the decision's `direct` once made, for the per-call path

GpuAwareDecision decide_now() {
  return decide_gpu_aware_mpi(std::getenv("KVMAP_GPU_AWARE_MPI"), built_gpu_aware_mode(),
                              query_mpi_gpu_support());
}

[[maybe_unused]] std::string bit(int value) {
  return value ? "1" : "0";
}

}  // namespace

GpuAwareMode built_gpu_aware_mode() {
#if KVMAP_GPU_AWARE_MPI_MODE == 0
  return GpuAwareMode::Off;
#elif KVMAP_GPU_AWARE_MPI_MODE == 1
  return GpuAwareMode::On;
#else
  return GpuAwareMode::Auto;
#endif
}

MpiGpuQuery query_mpi_gpu_support() {
  using Answer = MpiGpuQuery::Answer;
  [[maybe_unused]] const auto answer = [](int yes, std::string how) {
    return MpiGpuQuery{yes ? Answer::Yes : Answer::No, std::move(how)};
  };
#if defined(KOKKOS_ENABLE_HIP)
  // ROCm memory.
#if defined(MPIX_ROCM_AWARE_SUPPORT) && MPIX_ROCM_AWARE_SUPPORT
  return answer(MPIX_Query_rocm_support(),
                "Open MPI: MPIX_Query_rocm_support() = " + bit(MPIX_Query_rocm_support()));
#elif defined(OPEN_MPI) && OPEN_MPI
  return {Answer::No, "Open MPI: built without ROCm support (no MPIX_ROCM_AWARE_SUPPORT)"};
#elif defined(MPIX_GPU_SUPPORT_HIP)
  int supported = 0;
  MPIX_GPU_query_support(MPIX_GPU_SUPPORT_HIP, &supported);
  return answer(supported, "MPICH: MPIX_GPU_query_support(HIP) = " + bit(supported));
#else
  return {Answer::Unknown, "this MPI offers no query for ROCm memory"};
#endif
#else
  // CUDA memory (also what a host-only build reports: the MPI's answer for the usual GPU).
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  const int supported = MPIX_Query_cuda_support();
  return answer(supported, "Open MPI: MPIX_Query_cuda_support() = " + bit(supported));
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return {Answer::No, "Open MPI: built without CUDA support (MPIX_CUDA_AWARE_SUPPORT = 0)"};
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported);
  return answer(supported, "MPICH: MPIX_GPU_query_support(CUDA) = " + bit(supported));
#else
  return {Answer::Unknown, "this MPI offers no query for CUDA memory"};
#endif
#endif
}

GpuAwareDecision decide_gpu_aware_mpi(const char* env, GpuAwareMode built,
                                      const MpiGpuQuery& query) {
  if (env != nullptr && *env != '\0') {
    if (std::strcmp(env, "1") == 0) return {true, "KVMAP_GPU_AWARE_MPI=1 in the environment"};
    if (std::strcmp(env, "0") == 0) return {false, "KVMAP_GPU_AWARE_MPI=0 in the environment"};
    throw Error(std::string("kvmap: KVMAP_GPU_AWARE_MPI='") + env +
                "' is neither 0 (stage device data through host buffers for MPI) nor 1 (give "
                "MPI device pointers); unset it to let kvmap ask the MPI library");
  }
  switch (built) {
    case GpuAwareMode::On: return {true, "built with KVMAP_ENABLE_GPU_AWARE_MPI=ON"};
    case GpuAwareMode::Off: return {false, "built with KVMAP_ENABLE_GPU_AWARE_MPI=OFF"};
    case GpuAwareMode::Auto: break;
  }
  switch (query.answer) {
    case MpiGpuQuery::Answer::Yes: return {true, "AUTO: " + query.how};
    case MpiGpuQuery::Answer::No: return {false, "AUTO: " + query.how};
    case MpiGpuQuery::Answer::Unknown: break;
  }
  return {false, "AUTO: " + query.how + "; set KVMAP_GPU_AWARE_MPI=1 if it is GPU-aware"};
}

GpuAwareDecision gpu_aware_mpi() {
  std::lock_guard<std::mutex> lock(g_decision_mutex);
  if (!g_decision) {
    g_decision = decide_now();
    g_direct = g_decision->direct ? 1 : 0;
  }
  return *g_decision;
}

void decide_gpu_aware_mpi_on_every_rank() {
  std::string error;
  try {
    (void)gpu_aware_mpi();
  } catch (const Error& e) {
    error = e.what();
  }
  const std::int32_t failed = error.empty() ? 0 : 1;
  // Through kvmap's duplicate of the world, like every MPI call of kvmap: counted by stats().
  const Comm world = Comm::world();
  if ((world.size() > 1 ? Detail::transport(world).allreduce_max(failed) : failed) == 0) return;
  throw Error(failed ? error
                     : "kvmap: KVMAP_GPU_AWARE_MPI is neither 0 nor 1 on another rank (its "
                       "message names the value)");
}

bool gpu_aware_mpi_if_decided() {
  return g_direct.load() == 1;
}

bool mpi_reads_directly(bool host_accessible) {
  const TestSwitches& s = test_switches();
  if (host_accessible && !s.host_follows_gpu_decision.load()) return !s.force_host_staging.load();
  const int direct = g_direct.load();
  return direct >= 0 ? direct == 1 : gpu_aware_mpi().direct;
}

void remake_gpu_aware_decision() {
  std::lock_guard<std::mutex> lock(g_decision_mutex);
  g_decision.reset();  // a failed decision leaves none made
  g_direct = -1;
  g_decision = decide_now();
  g_direct = g_decision->direct ? 1 : 0;
}

}  // namespace kvmap::Detail
