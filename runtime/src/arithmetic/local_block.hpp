#pragma once
// The geometry of local blocks, Kokkos-free: strides, checked spans, and the merged box of a
// strided copy.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "kvmap/impl/local_block.hpp"

namespace kvmap::Detail {

// Row-major strides (in elements) of a contiguous array of this shape.
std::vector<std::int64_t> row_major_strides(const std::vector<std::int64_t>& extents);

// The element offsets of the first and last element of a strided array, [lo, hi] (any
// sign of stride), and whether it is empty; ValueError when an offset overflows int64. The
// one owner of span arithmetic: checked_span_bytes and the no-aliasing spans use it.
struct ElementSpan {
  std::int64_t lo = 0, hi = 0;
  bool empty = true;
};
ElementSpan element_span(const std::int64_t* extents, const std::int64_t* strides,
                         std::size_t ndim);

// Checks extents and strides of a strided array of `itemsize`-byte elements and returns the
// bytes its elements span (0 when empty). ValueError on negative extents or strides, more
// than 8 dimensions, or a span whose size overflows.
std::size_t checked_span_bytes(const std::vector<std::int64_t>& extents,
                               const std::vector<std::int64_t>& strides, std::size_t itemsize);

// The loops of one strided copy (not a box of global indices: that is distributed/box.hpp's
// Box): `extents` read with src_strides and written with dst_strides (elements).
struct StridedCopy {
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
StridedCopy make_strided_copy(const std::vector<std::int64_t>& extents,
                              const std::vector<std::int64_t>& src_strides,
                              const std::vector<std::int64_t>& dst_strides);

}  // namespace kvmap::Detail
