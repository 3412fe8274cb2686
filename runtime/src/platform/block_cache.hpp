#pragma once
// Large memory blocks kept after they are freed, so that the next allocation of about the same
// size reuses pages that are already mapped and faulted in (a fresh block costs an mmap, a page
// fault per 4 KiB page and an munmap: for arrays made and dropped every call, that is most of
// their cost). One policy for every such cache in kvmap: DistView shards in Kokkos memory
// (allocation.cpp) and torch's CPU tensors under kvmap's host allocator (host_allocator.cpp).
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "detail.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace kvmap::Detail {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
// Smaller blocks are cheap to make (glibc keeps them in its heap): not cached.
constexpr std::size_t kCachedMinimum = 2 * kHugePage;

// The capacity a cached block of `bytes` gets: whole huge pages (so that sizes that change by a
// few rows from call to call, as an MD rank's atom count does, fall on the same capacity).
// `bytes` must be at most SIZE_MAX - kHugePage.
inline std::size_t cached_capacity(std::size_t bytes) {
  return (bytes + kHugePage - 1) / kHugePage * kHugePage;
}

// Asks Linux to back the whole huge pages inside [data, data + bytes) with huge pages.
inline void advise_huge_pages(void* data, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kCachedMinimum) return;
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  // NOLINTNEXTLINE(performance-no-int-to-ptr): an address rounded to a huge page
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// What a BlockCache did since it was made or emptied by close().
struct BlockCacheCounts {
  std::uint64_t reused = 0;   // take() answered with a kept block
  std::uint64_t missed = 0;   // take() found none: the caller makes a fresh block
  std::uint64_t dropped = 0;  // blocks freed instead of kept (over the limit, or closed)
  std::size_t bytes_kept = 0;
  std::size_t bytes_kept_peak = 0;
};

// Freed blocks of one kind (`Block` frees its memory when destroyed: a Kokkos::View, a
// unique_ptr), by capacity, at most `limit` bytes of them. take(c) answers with the smallest
// kept block of capacity c to c + c/8 (so that a block is not spent on a much smaller array),
// give_back keeps a block, dropping the largest kept ones while the limit would be passed.
// Thread-safe.
template <class Block>
class BlockCache {
 public:
  explicit BlockCache(std::size_t limit) : limit_(limit) {}

  // A kept block and its capacity, or nothing (counted as a miss).
  std::optional<std::pair<Block, std::size_t>> take(std::size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(capacity);
    if (it == free_.end() || it->first - capacity > capacity / 8) {
      ++counts_.missed;
      return std::nullopt;
    }
    std::pair<Block, std::size_t> found{std::move(it->second), it->first};
    counts_.bytes_kept -= it->first;
    free_.erase(it);
    ++counts_.reused;
    return found;
  }

  // Keeps `block` of `capacity` bytes, or frees it (a block larger than the limit, a closed
  // cache). Blocks are freed after the lock is released.
  void give_back(Block block, std::size_t capacity) {
    std::multimap<std::size_t, Block> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_ || capacity > limit_) {
        ++counts_.dropped;
        dropped.emplace(capacity, std::move(block));
      } else {
        // Oldest-first eviction is unnecessary for a cache this small: drop the largest.
        while (counts_.bytes_kept + capacity > limit_ && !free_.empty()) {
          auto last = std::prev(free_.end());
          counts_.bytes_kept -= last->first;
          ++counts_.dropped;
          dropped.insert(free_.extract(last));
        }
        counts_.bytes_kept += capacity;
        if (counts_.bytes_kept > counts_.bytes_kept_peak)
          counts_.bytes_kept_peak = counts_.bytes_kept;
        free_.emplace(capacity, std::move(block));
      }
    }
  }

  // Frees every kept block; with `closed`, every block given back later is freed too.
  void clear(bool closed) {
    std::multimap<std::size_t, Block> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      dropped.swap(free_);
      counts_.dropped += dropped.size();
      counts_.bytes_kept = 0;
      closed_ = closed;
    }
  }

  // Opens a closed cache again with a new limit (the counters start from zero).
  void reopen(std::size_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = limit;
    closed_ = false;
    counts_ = BlockCacheCounts{};
  }

  BlockCacheCounts counts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  mutable std::mutex mutex_;
  std::multimap<std::size_t, Block> free_;
  std::size_t limit_;
  BlockCacheCounts counts_;
  bool closed_ = false;
};

}  // namespace kvmap::Detail
