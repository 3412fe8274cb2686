#pragma once
// Describes a Kokkos view as a LocalBlock without copying; the block keeps the view alive.
#include <Kokkos_Core.hpp>

#include <memory>
#include <type_traits>

#include "kvmap/config.hpp"
#include "kvmap/impl/local_block.hpp"

KVMAP_API_BEGIN
namespace kvmap {
namespace Impl {

template <class View>
LocalBlock block_from_view(const View& view) {
  static_assert(Kokkos::is_view<View>::value, "kvmap: expected a Kokkos::View");
  constexpr int rank = static_cast<int>(View::rank);
  static_assert(rank <= kMaxRank, "kvmap: views of rank above 8 are not supported");
  LocalBlock block;
  block.data = const_cast<void*>(static_cast<const void*>(view.data()));
  block.extents.resize(rank);
  block.strides.resize(rank);
  for (int d = 0; d < rank; ++d) {
    block.extents[d] = static_cast<std::int64_t>(view.extent(d));
    block.strides[d] = static_cast<std::int64_t>(view.stride(d));
  }
  block.owner = std::make_shared<View>(view);
  return block;
}

}  // namespace Impl
}  // namespace kvmap
KVMAP_API_END
