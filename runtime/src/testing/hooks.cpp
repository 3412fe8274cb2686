// kvmap's test hooks (testing/hooks.hpp): compiled into the internal target kvmap_internals
// for tests and benchmarks, never into libkvmap.
#include "hooks.hpp"

#include <algorithm>
#include <climits>
#include <mutex>

#include "kvmap/error.hpp"

namespace kvmap::Detail {

void set_mpi_count_limit(std::size_t limit) {
  test_switches().mpi_count_limit = std::min<std::size_t>(std::max<std::size_t>(limit, 1), INT_MAX);
}

void set_force_host_staging(bool force) {
  test_switches().force_host_staging = force;
}

void set_host_follows_gpu_decision(bool follow) {
  test_switches().host_follows_gpu_decision = follow;
}

void redecide_gpu_aware_mpi() {
  remake_gpu_aware_decision();
}

Comm emulated_comm(int rank, int size) {
  KVMAP_CHECK(size >= 1 && rank >= 0 && rank < size, ValueError,
              "kvmap: an emulated communicator needs 0 <= rank < size, got rank " << rank << " of "
                                                                                  << size);
  return comm_over(emulated_transport(rank, size));
}

void arm_fault(const std::string& site, int rank, FaultPhase phase) {
  TestSwitches& s = test_switches();
  std::lock_guard<std::mutex> lock(s.fault_mutex);
  s.fault_site = site;
  s.fault_rank = rank;
  s.fault_phase = phase;
  s.fault_armed = true;
}

void disarm_faults() {
  TestSwitches& s = test_switches();
  std::lock_guard<std::mutex> lock(s.fault_mutex);
  s.fault_armed = false;
  s.fault_site.clear();
  s.fault_rank = -1;
}

std::uint64_t faults_injected() {
  return test_switches().faults_injected.load();
}

}  // namespace kvmap::Detail
