#include "box.hpp"

#include "local_block.hpp"

namespace kvmap::Detail {

Box held(const Layout& L, int r) {
  Box b;
  b.ndim = L.ndim();
  for (int d = 0; d < b.ndim; ++d) b.hi[d] = L.gshape()[d];
  if (L.split()) {
    const int s = *L.split();
    b.lo[s] = L.offset(r);
    b.hi[s] = L.offset(r) + L.count(r);
  }
  return b;
}

Box intersect(const Box& a, const Box& b) {
  Box c;
  c.ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    c.lo[d] = std::max(a.lo[d], b.lo[d]);
    c.hi[d] = std::max(c.lo[d], std::min(a.hi[d], b.hi[d]));
  }
  return c;
}

LocalBlock buffer_block(unsigned char* data, const Box& box) {
  LocalBlock b;
  b.data = data;
  b.extents = box.extents();
  b.strides = row_major_strides(b.extents);
  return b;
}

bool contiguous_in(const std::vector<std::int64_t>& strides, const Box& sub) {
  if (sub.volume() <= 1) return true;
  const auto g = make_strided_copy(sub.extents(), strides, strides);
  return g.ndim == 1 && g.src_strides[0] == 1;
}

std::size_t offset_bytes(const std::vector<std::int64_t>& strides, const Box& whole, const Box& sub,
                         std::size_t itemsize) {
  std::int64_t off = 0;
  for (int d = 0; d < whole.ndim; ++d) off += (sub.lo[d] - whole.lo[d]) * strides[d];
  return static_cast<std::size_t>(off) * itemsize;
}

const unsigned char* address(const LocalBlock& block, const Box& whole, const Box& sub,
                             std::size_t itemsize) {
  return static_cast<const unsigned char*>(block.data) +
         offset_bytes(block.strides, whole, sub, itemsize);
}

}  // namespace kvmap::Detail
