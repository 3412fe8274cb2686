// Kokkos memory for DistView shards: counted in kvmap::stats(), large host arrays in huge
// pages, and large blocks recycled through a bounded cache (first-touch page faults of
// fresh arrays otherwise dominate redistribution and vmap outputs).
#include <Kokkos_Core.hpp>

#include <cstdlib>
#include <limits>

#include "kvmap/error.hpp"
#include "switches.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/layout.hpp"
#include "kvmap/stats.hpp"
#include "stats_counters.hpp"
#include "local_block.hpp"
#include "allocation.hpp"
#include "block_cache.hpp"

namespace kvmap::Detail {

namespace {

std::size_t cache_capacity() {
  static const std::size_t capacity = [] {
    const char* env = std::getenv("KVMAP_ALLOCATION_CACHE_MIB");
    return (env ? std::strtoull(env, nullptr, 10) : 1024ull) << 20;
  }();
  return capacity;
}

// Freed large blocks of one memory space (block_cache.hpp); emptied and closed when Kokkos
// finalizes (a View must not outlive Kokkos).
template <class MemorySpace>
class SpaceCache {
 public:
  using Buffer = Kokkos::View<unsigned char*, MemorySpace>;
  static SpaceCache& instance() {
    static SpaceCache* cache = [] {
      auto* c = new SpaceCache();
      Kokkos::push_finalize_hook([c] { c->blocks_.clear(true); });
      return c;
    }();
    return *cache;
  }
  Buffer take(std::size_t capacity) {
    if (auto kept = blocks_.take(capacity)) return std::move(kept->first);
    Buffer b(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kvmap::DistView")),
             capacity);
    if constexpr (is_host_accessible<MemorySpace>) advise_huge_pages(b.data(), capacity);
    return b;
  }
  void give_back(Buffer b) {
    const std::size_t capacity = b.extent(0);
    blocks_.give_back(std::move(b), capacity);
  }

 private:
  BlockCache<Buffer> blocks_{cache_capacity()};
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
      SpaceCache<MemorySpace>::instance().give_back(std::move(view));
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
    const std::size_t capacity = cached_capacity(bytes);
    owner = std::make_shared<TrackedAllocation<MemorySpace>>(
        SpaceCache<MemorySpace>::instance().take(capacity), bytes, true);
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
