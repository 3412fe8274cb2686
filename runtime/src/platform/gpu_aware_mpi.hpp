#pragma once
// Whether MPI is handed device memory, or kvmap stages device data through host buffers
// (counted in stats().bytes_copied). Decided once per process, in this order:
//   1. the environment: KVMAP_GPU_AWARE_MPI=1 (give MPI device pointers) or 0 (stage);
//   2. the build: KVMAP_ENABLE_GPU_AWARE_MPI=ON or OFF;
//   3. AUTO (the default build): what the running MPI says of itself for this build's kind of
//      device: Open MPI's MPIX_Query_cuda_support() / MPIX_Query_rocm_support(), MPICH's
//      MPIX_GPU_query_support(); an MPI that offers no query is taken as not GPU-aware.
// Host memory is always given to MPI directly (tests can force staging: testing/hooks.hpp).
#include <string>

#include "detail.hpp"

namespace kvmap::Detail {

enum class GpuAwareMode { Off, On, Auto };

// What the running MPI says about reading this build's device memory.
struct MpiGpuQuery {
  enum class Answer { Yes, No, Unknown };
  Answer answer = Answer::Unknown;
  std::string how;  // the call and its answer, e.g. "Open MPI: MPIX_Query_cuda_support() = 0"
};

struct GpuAwareDecision {
  bool direct = false;  // MPI reads and writes device memory
  std::string reason;   // e.g. "AUTO: MPICH: MPIX_GPU_query_support(CUDA) = 1"
};

// The build's mode (KVMAP_ENABLE_GPU_AWARE_MPI).
GpuAwareMode built_gpu_aware_mode();
// Asks the running MPI (initialized) for this build's kind of device: CUDA, or HIP with a
// HIP Kokkos.
MpiGpuQuery query_mpi_gpu_support();
// The decision from the value of KVMAP_GPU_AWARE_MPI (nullptr or "" when unset), the build's
// mode and the MPI's answer. Pure; throws kvmap::Error for a value other than 0 or 1.
GpuAwareDecision decide_gpu_aware_mpi(const char* env, GpuAwareMode built,
                                      const MpiGpuQuery& query);
// This process's decision, made at the first call (kvmap's initialization makes it, so a bad
// KVMAP_GPU_AWARE_MPI is reported there) from the environment, the build and the MPI.
GpuAwareDecision gpu_aware_mpi();
// Makes the decision on every rank of MPI_COMM_WORLD (collective: one MPI_Allreduce of an int
// through kvmap::Comm::world(), none on one rank): where one rank's KVMAP_GPU_AWARE_MPI is
// bad, every rank throws, none waits in a later collective.
void decide_gpu_aware_mpi_on_every_rank();
// The decision's `direct` if it was made (kvmap's initialization makes it), else false; never
// calls MPI (for stats()).
bool gpu_aware_mpi_if_decided();
// Whether MPI is given this memory directly (host memory: yes, unless a test forces staging;
// device memory: the decision).
bool mpi_reads_directly(bool host_accessible);

}  // namespace kvmap::Detail
