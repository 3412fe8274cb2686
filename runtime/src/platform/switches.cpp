// The test switches the library reads and the fault points the fault tests arm.
#include "switches.hpp"

#include <mutex>
#include <string>

#include "kvmap/error.hpp"

namespace kvmap::Detail {

void fault_point(const char* site, FaultPhase phase, int rank) {
  TestSwitches& s = test_switches();
  if (!s.fault_armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(s.fault_mutex);
  if (!s.fault_armed || rank != s.fault_rank || phase != s.fault_phase || s.fault_site != site)
    return;
  s.fault_armed = false;
  ++s.faults_injected;
  throw Error(std::string("kvmap: injected fault at ") + site +
              (phase == FaultPhase::Plan ? " (plan)" : " (execute)") + " on rank " +
              std::to_string(rank));
}

TestSwitches& test_switches() {
  static TestSwitches switches;
  return switches;
}

}  // namespace kvmap::Detail
