#pragma once
// Fault points for the fault tests, which arm them (arm_fault, detail/testing/hooks.hpp): the
// next call of one collective entry point fails on one rank, in its plan (before the
// agreement: every rank throws alike) or in its execute phase (after the agreement: the job
// aborts with a message), or one allocation fails. Costs one relaxed atomic load when nothing
// is armed, which in an application is always.
#include "detail/detail.hpp"

namespace kvmap::Detail {

enum class FaultPhase { Plan, Execute };

// Called by the collective helper around the agreement, and by allocate_block ("allocate",
// rank -1). Throws kvmap::Error when this site, phase and rank are armed (one shot).
void fault_point(const char* site, FaultPhase phase, int rank);

}  // namespace kvmap::Detail
