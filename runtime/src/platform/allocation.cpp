// Kokkos memory for DistView shards: counted in kvmap::stats(), large host arrays in huge
// pages, and large blocks recycled through a bounded cache (first-touch page faults of
// fresh arrays otherwise dominate redistribution and vmap outputs).
#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kvmap/error.hpp"
#include "switches.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/layout.hpp"
#include "kvmap/stats.hpp"
#include "stats_counters.hpp"
#include "local_block.hpp"
#include "allocation.hpp"

namespace kvmap::Detail {

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
constexpr std::size_t kCachedMinimum = 2 * kHugePage;  // smaller blocks are cheap to make

std::size_t cache_capacity() {
  static const std::size_t capacity = [] {
    const char* env = std::getenv("KVMAP_ALLOCATION_CACHE_MIB");
    return (env ? std::strtoull(env, nullptr, 10) : 1024ull) << 20;
  }();
  return capacity;
}

template <class MemorySpace>
void advise_huge_pages(void* data, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if constexpr (is_host_accessible<MemorySpace>) {
    if (bytes < kCachedMinimum) return;
    const auto begin = (reinterpret_cast<std::uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
    const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kHugePage - 1);
    // NOLINTNEXTLINE(performance-no-int-to-ptr): an address rounded to a huge page
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  }
#else
  (void)data;
  (void)bytes;
#endif
}

// Freed large blocks of one memory space, by capacity; emptied when Kokkos finalizes.
template <class MemorySpace>
class BlockCache {
 public:
  using Buffer = Kokkos::View<unsigned char*, MemorySpace>;
  static BlockCache& instance() {
    static BlockCache* cache = [] {
      auto* c = new BlockCache();
      Kokkos::push_finalize_hook([c] { c->close(); });
      return c;
    }();
    return *cache;
  }
  Buffer take(std::size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(capacity);
      if (it != free_.end()) {
        Buffer b = std::move(it->second);
        free_.erase(it);
        cached_ -= capacity;
        return b;
      }
    }
    Buffer b(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kvmap::DistView")),
             capacity);
    advise_huge_pages<MemorySpace>(b.data(), capacity);
    return b;
  }
  void give_back(Buffer b) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t capacity = b.extent(0);
    if (closed_ || capacity > cache_capacity()) return;
    // Oldest-first eviction is unnecessary for a cache this small: drop the largest.
    while (cached_ + capacity > cache_capacity() && !free_.empty()) {
      auto last = std::prev(free_.end());
      cached_ -= last->first;
      free_.erase(last);
    }
    cached_ += capacity;
    free_.emplace(capacity, std::move(b));
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.clear();
    cached_ = 0;
    closed_ = true;
  }

 private:
  std::mutex mutex_;
  std::multimap<std::size_t, Buffer> free_;
  std::size_t cached_ = 0;
  bool closed_ = false;
};

template <class MemorySpace>
struct TrackedAllocation {
  Kokkos::View<unsigned char*, MemorySpace> view;
  std::size_t bytes = 0;
  bool cached = false;
  TrackedAllocation(Kokkos::View<unsigned char*, MemorySpace> v, std::size_t n, bool from_cache)
      : view(std::move(v)), bytes(n), cached(from_cache) {
    count_allocation(bytes);
  }
  ~TrackedAllocation() {
    count_deallocation(bytes);
    if (cached && Kokkos::is_initialized())
      BlockCache<MemorySpace>::instance().give_back(std::move(view));
  }
};

}  // namespace

template <class MemorySpace>
LocalBlock allocate_block(const std::vector<std::int64_t>& extents, std::size_t itemsize) {
  const std::int64_t numel = checked_numel(extents);
  KVMAP_CHECK(
      static_cast<std::uint64_t>(numel) <= std::numeric_limits<std::size_t>::max() / itemsize,
      ValueError,
      "kvmap: an array of shape " << to_string(extents) << " and " << itemsize
                                  << "-byte elements needs more bytes than size_t counts");
  const std::size_t bytes = static_cast<std::size_t>(numel) * itemsize;
  if (bytes > 0) fault_point("allocate", FaultPhase::Plan, -1);
  std::shared_ptr<TrackedAllocation<MemorySpace>> owner;
  if (bytes >= kCachedMinimum && bytes <= std::numeric_limits<std::size_t>::max() - kHugePage) {
    const std::size_t capacity = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    owner = std::make_shared<TrackedAllocation<MemorySpace>>(
        BlockCache<MemorySpace>::instance().take(capacity), bytes, true);
  } else {
    owner = std::make_shared<TrackedAllocation<MemorySpace>>(
        Kokkos::View<unsigned char*, MemorySpace>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kvmap::DistView")), bytes),
        bytes, false);
  }
  LocalBlock block;
  block.data = owner->view.data();
  block.extents = extents;
  block.strides = row_major_strides(extents);
  block.owner = std::move(owner);
  return block;
}

#define KVMAP_INSTANTIATE_ALLOCATE(Space) \
  template LocalBlock allocate_block<Space>(const std::vector<std::int64_t>&, std::size_t);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_ALLOCATE)

}  // namespace kvmap::Detail
