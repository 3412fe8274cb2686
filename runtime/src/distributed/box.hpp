#pragma once
// Boxes of global indices: what a rank holds under a layout, what two holdings share, and
// where a box lies in a block's memory. The geometry every redistribution plan is made of.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/layout.hpp"

namespace kvmap::Detail {

// A half-open box of global indices.
struct Box {
  int ndim = 0;
  std::int64_t lo[Impl::kMaxRank] = {};
  std::int64_t hi[Impl::kMaxRank] = {};

  std::int64_t volume() const {
    std::int64_t v = 1;
    for (int d = 0; d < ndim; ++d) v *= std::max<std::int64_t>(0, hi[d] - lo[d]);
    return v;
  }
  std::vector<std::int64_t> extents() const {
    std::vector<std::int64_t> e(ndim);
    for (int d = 0; d < ndim; ++d) e[d] = std::max<std::int64_t>(0, hi[d] - lo[d]);
    return e;
  }
};

// The global indices rank r holds under layout L.
Box held(const Layout& L, int r);
Box intersect(const Box& a, const Box& b);
// Contiguous (row-major) block over buffer memory.
LocalBlock buffer_block(unsigned char* data, const Box& box);
// True when `sub` is one contiguous run of memory inside a block with these strides.
bool contiguous_in(const std::vector<std::int64_t>& strides, const Box& sub);
// Byte offset of global index sub.lo inside a block with these strides holding `whole`.
std::size_t offset_bytes(const std::vector<std::int64_t>& strides, const Box& whole, const Box& sub,
                         std::size_t itemsize);
// Address of global index sub.lo inside a block that holds the box `whole`.
const unsigned char* address(const LocalBlock& block, const Box& whole, const Box& sub,
                             std::size_t itemsize);

}  // namespace kvmap::Detail
