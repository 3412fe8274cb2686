#pragma once
// A local shard as kvmap stores it, independent of memory space and element type.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvmap::Impl {

inline constexpr int kMaxRank = 8;

struct LocalBlock {
  void* data = nullptr;
  std::vector<std::int64_t> extents;  // local shape
  std::vector<std::int64_t> strides;  // in elements, non-negative
  std::shared_ptr<void> owner;        // keeps the memory alive (Kokkos view, tensor, ...)
};

// Row-major strides (in elements) of a contiguous array of this shape.
std::vector<std::int64_t> row_major_strides(const std::vector<std::int64_t>& extents);

// Checks extents and strides of a strided array of `itemsize`-byte elements and returns the
// bytes its elements span (0 when empty). ValueError on negative extents or strides, more
// than 8 dimensions, or a span whose size overflows.
std::size_t checked_span_bytes(const std::vector<std::int64_t>& extents,
                               const std::vector<std::int64_t>& strides, std::size_t itemsize);

// Memory of `nbytes` in a Kokkos memory space, counted in kvmap::stats().
template <class MemorySpace>
LocalBlock allocate_block(const std::vector<std::int64_t>& extents, std::size_t itemsize);

// A box of `extents` read with src_strides and written with dst_strides (elements).
struct BoxGeometry {
  int ndim = 0;
  std::int64_t extents[kMaxRank] = {};
  std::int64_t src_strides[kMaxRank] = {};
  std::int64_t dst_strides[kMaxRank] = {};

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= extents[d];
    return n;
  }
};

// Unit axes dropped, neighbours contiguous in both layouts merged (at least one axis).
BoxGeometry make_box_geometry(const std::vector<std::int64_t>& extents,
                              const std::vector<std::int64_t>& src_strides,
                              const std::vector<std::int64_t>& dst_strides);

}  // namespace kvmap::Impl
