#pragma once
/// \file
/// kvmap's caching allocator for torch's CPU tensors (opt-in): large blocks are kept when a
/// tensor is freed and reused by the next tensor of about the same size.
#include "kvmap/config.hpp"
#include <cstddef>
#include <cstdint>

KVMAP_API_BEGIN
namespace kvmap {

/// How kvmap's host allocator keeps blocks.
struct HostAllocatorOptions {
  /// The most bytes of freed blocks kept for reuse; a freed block that does not fit is
  /// returned to the system (the largest kept blocks go first).
  std::size_t cache_bytes = std::size_t(1) << 30;
};

/// What kvmap's host allocator did since it was installed (this process; no communication).
struct HostAllocatorUsage {
  bool installed = false;           ///< whether it is torch's CPU allocator now
  std::uint64_t reused = 0;         ///< large allocations served with a kept block
  std::uint64_t fresh = 0;          ///< large allocations that found none and mapped a new block
  std::uint64_t small = 0;          ///< allocations under 4 MiB, passed on to c10's allocation
  std::uint64_t returned = 0;       ///< large blocks returned to the system instead of kept
  std::size_t bytes_kept = 0;       ///< bytes of freed blocks kept now
  std::size_t bytes_kept_peak = 0;  ///< the most bytes kept at once
  std::size_t bytes_in_use = 0;     ///< bytes of live tensors it allocated (requested sizes)
};

/// Makes kvmap's caching allocator torch's CPU allocator for every tensor allocated from now
/// on in this process: the model's temporaries, kvmap's own tensors, everything ATen
/// allocates on the CPU. Allocations of 4 MiB and more get whole 2 MiB pages (advised as
/// transparent huge pages) and are kept when freed, up to `options.cache_bytes`, so that an
/// application calling the same model every time step stops mapping, faulting in and
/// unmapping fresh memory every step; smaller ones pass to c10's CPU allocation, which
/// glibc's heap already recycles. Memory is 64-byte aligned as with torch's allocator, and
/// torch's memory reporting (the profiler, kvmap's chunk_size(auto) probe) sees every
/// allocation as before. Install it at the start, before other threads allocate tensors
/// (torch's allocator slot is not synchronized). Also done when the library is loaded with
/// `KVMAP_HOST_ALLOCATOR_MIB=<cache MiB>` in the environment. Installing again changes the
/// limit. Throws kvmap::Error where another allocator holds torch's slot with a higher priority.
void install_host_allocator(const HostAllocatorOptions& options = {});

/// Gives torch's CPU allocator slot back to the allocator that held it before
/// install_host_allocator and frees the kept blocks. Tensors still alive keep their memory;
/// their blocks are returned to the system when they are freed. Nothing when not installed.
void uninstall_host_allocator();

/// The host allocator's counters (installed or not: the counters of the last installation).
HostAllocatorUsage host_allocator_usage();

}  // namespace kvmap
KVMAP_API_END
