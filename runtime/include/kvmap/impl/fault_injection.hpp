#pragma once
// Test hook for fault tests: make the next call of one collective entry point fail on one
// rank, inside its local phase, so the failure goes through the same agreement as any
// real error. Costs one relaxed atomic load when nothing is armed.
#include <cstdint>
#include <string>

namespace kvmap::Impl {

// The next fault_point(site, rank) on that rank throws kvmap::Error (one shot).
void arm_fault(const std::string& site, int rank);
void disarm_faults();
std::uint64_t faults_injected();

// Called by every collective entry point inside its local phase.
void fault_point(const char* site, int rank);

}  // namespace kvmap::Impl
