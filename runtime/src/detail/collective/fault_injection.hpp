#pragma once
// Test hook for fault tests: make the next call of one collective entry point fail on one
// rank, in its plan (before the agreement: every rank throws alike) or in its execute phase
// (after the agreement: the job aborts with a message), or make one allocation fail. Costs
// one relaxed atomic load when nothing is armed.
#include <cstdint>
#include <string>

#include "detail/detail.hpp"

namespace kvmap::Detail {

enum class FaultPhase { Plan, Execute };

// The next fault_point(site, phase, rank) on that rank throws kvmap::Error (one shot).
// site "allocate" with rank -1: the next allocation of DistView memory in this process.
void arm_fault(const std::string& site, int rank, FaultPhase phase = FaultPhase::Plan);
void disarm_faults();
std::uint64_t faults_injected();

// Called by the collective helper around the agreement, and by allocate_block ("allocate",
// rank -1).
void fault_point(const char* site, FaultPhase phase, int rank);

}  // namespace kvmap::Detail
