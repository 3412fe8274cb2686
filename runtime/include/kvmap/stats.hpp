#pragma once
/// \file
/// Process-local counters of what the runtime did since start (or the last reset_stats()).
#include "kvmap/config.hpp"
#include <cstdint>

KVMAP_API_BEGIN
namespace kvmap {

/// What the runtime did on this rank: the counters of kvmap::stats().
struct Stats {
  std::uint64_t bytes_copied = 0;     ///< bytes the runtime copied (packing, materializing, slices)
  std::uint64_t vmap_calls = 0;       ///< completed or failed kvmap::vmap invocations
  std::uint64_t chunks_run = 0;       ///< chunks executed by the vmap scheduler
  std::uint64_t collectives = 0;      ///< MPI collectives issued through kvmap::Comm
  std::uint64_t bytes_received = 0;   ///< bytes this rank's MPI calls through kvmap::Comm received
  std::uint64_t bytes_allocated = 0;  ///< bytes the runtime allocated in Kokkos memory spaces
  std::int64_t bytes_live = 0;        ///< of those, still allocated now (not reset by reset_stats)
  std::uint64_t plans_built = 0;    ///< redistribution plans made (the others came from the cache)
  std::uint64_t chunk_retries = 0;  ///< chunks run again as two halves after running out of memory
  /// The chunk size the last vmap or map_batches call with chunk_size(auto_chunk) chose on
  /// this rank (0 before any such call).
  std::int64_t auto_chunk_size = 0;
  /// The bytes per sample that call measured with its probe chunks (0 before any such call).
  std::int64_t auto_bytes_per_sample = 0;
  /// Whether MPI is given device memory (true) or device data is staged through host buffers
  /// (false): the run-time decision of KVMAP_GPU_AWARE_MPI / KVMAP_ENABLE_GPU_AWARE_MPI / the
  /// MPI library, made when kvmap initializes (false before). Not a counter; kept by reset_stats.
  bool gpu_aware_mpi = false;
};

/// This rank's counters since the start or the last reset_stats() (local, no communication).
Stats stats();
/// Zeroes the counters (bytes_live and gpu_aware_mpi are kept).
void reset_stats();

}  // namespace kvmap
KVMAP_API_END
