#include <Kokkos_Core.hpp>

#include <limits>

#include "kvmap/error.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/layout.hpp"
#include "kvmap/stats.hpp"

namespace kvmap::Impl {

namespace {
template <class MemorySpace>
struct TrackedAllocation {
  Kokkos::View<unsigned char*, MemorySpace> view;
  std::size_t bytes = 0;
  TrackedAllocation(Kokkos::View<unsigned char*, MemorySpace> v, std::size_t n)
      : view(std::move(v)), bytes(n) {
    count_allocation(bytes);
  }
  ~TrackedAllocation() { count_deallocation(bytes); }
};
}  // namespace

template <class MemorySpace>
LocalBlock allocate_block(const std::vector<std::int64_t>& extents, std::size_t itemsize) {
  const std::int64_t numel = checked_numel(extents);
  KVMAP_CHECK(static_cast<std::uint64_t>(numel) <= std::numeric_limits<std::size_t>::max() / itemsize,
              ValueError,
              "kvmap: an array of shape " << to_string(extents) << " and " << itemsize
                                          << "-byte elements needs more bytes than size_t counts");
  const std::size_t bytes = static_cast<std::size_t>(numel) * itemsize;
  Kokkos::View<unsigned char*, MemorySpace> view(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("kvmap::DistView")), bytes);
  auto owner = std::make_shared<TrackedAllocation<MemorySpace>>(std::move(view), bytes);
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

}  // namespace kvmap::Impl
