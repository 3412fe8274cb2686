#pragma once
// Memory for local blocks in a Kokkos memory space: counted in kvmap::stats(), large blocks
// recycled by a cache (fresh pages fault on every call), allocation faults injectable.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "kvmap/impl/local_block.hpp"

namespace kvmap::Detail {

// Memory of `nbytes` in a Kokkos memory space, counted in kvmap::stats().
template <class MemorySpace>
LocalBlock allocate_block(const std::vector<std::int64_t>& extents, std::size_t itemsize);

}  // namespace kvmap::Detail
