#include "local_block.hpp"

#include <cstdint>
#include <limits>

#include "kvmap/error.hpp"
#include "kvmap/layout.hpp"

namespace kvmap::Detail {

std::vector<std::int64_t> row_major_strides(const std::vector<std::int64_t>& extents) {
  std::vector<std::int64_t> strides(extents.size());
  std::int64_t s = 1;
  for (std::size_t d = extents.size(); d-- > 0;) {
    strides[d] = s;
    s *= extents[d] > 0 ? extents[d] : 1;
  }
  return strides;
}

std::size_t checked_span_bytes(const std::vector<std::int64_t>& extents,
                               const std::vector<std::int64_t>& strides, std::size_t itemsize) {
  KVMAP_CHECK(extents.size() == strides.size(), ValueError,
              "kvmap: " << extents.size() << " extents but " << strides.size() << " strides");
  KVMAP_CHECK(static_cast<int>(extents.size()) <= kMaxRank, ValueError,
              "kvmap: arrays have at most " << kMaxRank << " dimensions, got " << extents.size());
  KVMAP_CHECK(itemsize > 0 && itemsize <= 16, ValueError,
              "kvmap: invalid element size " << itemsize);
  for (std::size_t d = 0; d < extents.size(); ++d) {
    KVMAP_CHECK(extents[d] >= 0, ValueError,
                "kvmap: negative extent " << extents[d] << " in shape " << to_string(extents));
    KVMAP_CHECK(strides[d] >= 0, ValueError,
                "kvmap: negative stride " << strides[d] << " in strides " << to_string(strides)
                                          << " (only non-negative strides are supported)");
  }
  const ElementSpan span = element_span(extents.data(), strides.data(), extents.size());
  if (span.empty) return 0;
  const auto elements = static_cast<std::uint64_t>(span.hi) + 1;  // lo is 0: strides >= 0
  KVMAP_CHECK(elements <= std::numeric_limits<std::size_t>::max() / itemsize, ValueError,
              "kvmap: shape " << to_string(extents) << " spans more bytes than size_t can count");
  return static_cast<std::size_t>(elements * itemsize);
}

namespace {
[[noreturn]] void throw_span_overflow(const std::int64_t* extents, const std::int64_t* strides,
                                      std::size_t ndim) {
  throw ValueError("kvmap: shape " + to_string(std::vector<std::int64_t>(extents, extents + ndim)) +
                   " with strides " +
                   to_string(std::vector<std::int64_t>(strides, strides + ndim)) +
                   " spans more elements than int64 can address");
}
}  // namespace

ElementSpan element_span(const std::int64_t* extents, const std::int64_t* strides,
                         std::size_t ndim) {
  // One pass (the no-aliasing rule asks this of every output on every call); the message is
  // built out of line.
  std::int64_t lo = 0, hi = 0;
  bool overflow = false;
  for (std::size_t d = 0; d < ndim; ++d) {
    if (extents[d] == 0) return {};
    std::int64_t reach = 0;  // (extent - 1) * stride, added to lo (negative) or hi
    overflow |= __builtin_mul_overflow(extents[d] - 1, strides[d], &reach);
    overflow |= strides[d] < 0 ? __builtin_add_overflow(lo, reach, &lo)
                               : __builtin_add_overflow(hi, reach, &hi);
  }
  if (overflow || hi == std::numeric_limits<std::int64_t>::max()) {
    throw_span_overflow(extents, strides, ndim);
  }
  return {lo, hi, false};
}

StridedCopy make_strided_copy(const std::vector<std::int64_t>& extents,
                              const std::vector<std::int64_t>& src_strides,
                              const std::vector<std::int64_t>& dst_strides) {
  KVMAP_CHECK(extents.size() <= static_cast<std::size_t>(kMaxRank) &&
                  src_strides.size() == extents.size() && dst_strides.size() == extents.size(),
              ValueError,
              "kvmap: a box copy needs at most "
                  << kMaxRank << " axes and one stride per axis, got " << extents.size()
                  << " extents and " << src_strides.size() << "/" << dst_strides.size()
                  << " strides");
  StridedCopy g;
  // Drop unit axes, then merge neighbours that are contiguous in both source and destination.
  for (std::size_t d = 0; d < extents.size(); ++d) {
    if (extents[d] == 1) continue;
    if (g.ndim > 0) {
      const int p = g.ndim - 1;
      // Products that overflow cannot describe contiguous memory: such axes stay apart.
      std::int64_t src_run = 0, dst_run = 0, merged = 0;
      const bool fits = !__builtin_mul_overflow(src_strides[d], extents[d], &src_run) &&
                        !__builtin_mul_overflow(dst_strides[d], extents[d], &dst_run) &&
                        !__builtin_mul_overflow(g.extents[p], extents[d], &merged);
      if (fits && g.src_strides[p] == src_run && g.dst_strides[p] == dst_run) {
        g.extents[p] = merged;
        g.src_strides[p] = src_strides[d];
        g.dst_strides[p] = dst_strides[d];
        continue;
      }
    }
    g.extents[g.ndim] = extents[d];
    g.src_strides[g.ndim] = src_strides[d];
    g.dst_strides[g.ndim] = dst_strides[d];
    ++g.ndim;
  }
  if (g.ndim == 0) {  // a single element
    g.ndim = 1;
    g.extents[0] = 1;
    g.src_strides[0] = 1;
    g.dst_strides[0] = 1;
  }
  return g;
}

}  // namespace kvmap::Detail
