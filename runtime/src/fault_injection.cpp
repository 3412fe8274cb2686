#include "detail/collective/fault_injection.hpp"

#include <atomic>
#include <mutex>

#include "kvmap/error.hpp"

namespace kvmap::Detail {

namespace {
std::atomic<bool> g_armed{false};
std::atomic<std::uint64_t> g_injected{0};
std::mutex g_mutex;
std::string g_site;
int g_rank = -1;
FaultPhase g_phase = FaultPhase::Plan;
}  // namespace

void arm_fault(const std::string& site, int rank, FaultPhase phase) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_site = site;
  g_rank = rank;
  g_phase = phase;
  g_armed = true;
}

void disarm_faults() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_armed = false;
  g_site.clear();
  g_rank = -1;
}

std::uint64_t faults_injected() {
  return g_injected.load();
}

void fault_point(const char* site, FaultPhase phase, int rank) {
  if (!g_armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_armed || rank != g_rank || phase != g_phase || g_site != site) return;
  g_armed = false;
  ++g_injected;
  throw Error(std::string("kvmap: injected fault at ") + site +
              (phase == FaultPhase::Plan ? " (plan)" : " (execute)") + " on rank " +
              std::to_string(rank));
}

}  // namespace kvmap::Detail
