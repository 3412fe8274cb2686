#pragma once
// The library's side of the test hooks: the switches the hooks turn (runtime/src/testing,
// compiled only into the internal target kvmap_internals, never into libkvmap), and the fault
// points they arm. The library reads them; nothing in it writes them, so in an application
// they keep their defaults.
#include "detail.hpp"

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "kvmap/comm.hpp"

namespace kvmap::Detail {

class Transport;

// Fault points for the fault tests, which arm them (arm_fault, testing/hooks.hpp): the next
// call of one collective entry point fails on one rank, in its plan (before the agreement:
// every rank throws alike) or in its execute phase (after the agreement: the job aborts with
// a message), or one allocation fails. Costs one relaxed atomic load when nothing is armed,
// which in an application is always.
enum class FaultPhase { Plan, Execute };

// Called by the collective helper around the agreement, and by allocate_block ("allocate",
// rank -1). Throws kvmap::Error when this site, phase and rank are armed (one shot).
void fault_point(const char* site, FaultPhase phase, int rank);

struct TestSwitches {
  // The largest element count kvmap passes to one MPI call.
  std::atomic<std::size_t> mpi_count_limit{static_cast<std::size_t>(INT_MAX)};
  // Host memory staged through host buffers as device memory without GPU-aware MPI is.
  std::atomic<bool> force_host_staging{false};
  // Host memory given to MPI or staged as the GPU-aware decision says for device memory.
  std::atomic<bool> host_follows_gpu_decision{false};

  // One armed fault (fault_point): `armed` is read without the lock.
  std::atomic<bool> fault_armed{false};
  std::atomic<std::uint64_t> faults_injected{0};
  std::mutex fault_mutex;
  std::string fault_site;
  int fault_rank = -1;
  FaultPhase fault_phase{};
};

TestSwitches& test_switches();

// The GPU-aware decision made again (gpu_aware_mpi.cpp), after KVMAP_GPU_AWARE_MPI changed.
void remake_gpu_aware_decision();

}  // namespace kvmap::Detail
