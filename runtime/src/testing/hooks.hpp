#pragma once
// Hooks for kvmap's tests and benchmarks, never for applications: they change how the
// runtime moves data so that rare paths (large counts, staging through host memory) run on
// any machine, emulate rank counts the machine does not have, and inject faults. Defined in
// runtime/src/testing (the internal target kvmap_internals), not in libkvmap: an application
// cannot call them. Not installed, not in kvmap.hpp.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "comm_registry.hpp"  // the registry: next_sequence, CommAccess, comm_over
#include "mpi_transport.hpp"  // a Comm's transport
#include "switches.hpp"       // FaultPhase

namespace kvmap::Detail {

// Lowers the largest element count kvmap passes to one MPI call (INT_MAX by default), so the
// large-count paths run with small arrays.
void set_mpi_count_limit(std::size_t limit);
// Stages MPI's bytes through host buffers for host memory too, so the path a device without
// GPU-aware MPI takes runs on every backend.
void set_force_host_staging(bool force);
// Host memory is given to MPI or staged as the GPU-aware decision says for device memory, so
// the decision (KVMAP_GPU_AWARE_MPI, the build, the MPI's answer) is seen in bytes_copied on
// any machine.
void set_host_follows_gpu_decision(bool follow);
// Makes the GPU-aware decision again (after a test changed KVMAP_GPU_AWARE_MPI).
void redecide_gpu_aware_mpi();

// A communicator of `size` ranks on which this process plays rank `rank`, and every other
// rank is taken to do exactly what it does: collectives return this rank's own contribution
// (gathers repeat it), point-to-point messages are not sent. No MPI call is made, and data
// from other ranks never arrives. For kvmap-perf's scale scenario: the per-call local work of
// kvmap's real code paths at a number of ranks the machine does not have.
Comm emulated_comm(int rank, int size);
// Its transport (testing/emulated_transport.cpp).
std::unique_ptr<Transport> emulated_transport(int rank, int size);

// The next fault_point(site, phase, rank) on that rank throws kvmap::Error (one shot).
// site "allocate" with rank -1: the next allocation of DistView memory in this process.
void arm_fault(const std::string& site, int rank, FaultPhase phase = FaultPhase::Plan);
void disarm_faults();
std::uint64_t faults_injected();

}  // namespace kvmap::Detail
