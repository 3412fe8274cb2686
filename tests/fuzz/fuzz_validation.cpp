// libFuzzer target over kvmap's validation entry points: Layout construction and queries,
// shape/axis checks, out_dims normalization, and the tensor bridge's stride checks and box
// geometry. Only ValueError is an acceptable failure; any other exception, crash,
// sanitizer report or broken invariant is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "kvmap/error.hpp"
#include "local_block.hpp"
#include "out_dims.hpp"
#include "kvmap/layout.hpp"

namespace {

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  std::int64_t i64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | byte();
    return static_cast<std::int64_t>(v);
  }
  // Mostly small values, sometimes extreme ones.
  std::int64_t extent() {
    const std::uint8_t kind = byte();
    if (kind < 200) return static_cast<std::int64_t>(byte() % 9) - (kind < 8 ? 2 : 0);
    return i64();
  }
};

[[noreturn]] void broken(const char* what) {
  __builtin_trap();
  (void)what;
}

void check_layout(const kvmap::Layout& l) {
  const auto& g = l.gshape();
  if (kvmap::Impl::checked_numel(g) < 0) broken("numel");
  if (!l.split()) return;
  const int s = *l.split();
  if (s < 0 || s >= l.ndim()) broken("split");
  std::int64_t sum = 0;
  for (int r = 0; r < l.nranks(); ++r) {
    if (l.count(r) < 0 || l.offset(r) != sum) broken("counts/offsets");
    if (l.lshape(r)[s] != l.count(r)) broken("lshape");
    sum += l.count(r);
  }
  if (sum != g[s]) broken("sum");
  if (l.counts().size() != static_cast<std::size_t>(l.nranks())) broken("counts size");
  for (int r = 0; r < l.nranks(); ++r) {
    if (l.counts()[r] != l.count(r) || l.offsets()[r] != l.offset(r)) broken("materialized");
  }
  if (g[s] > 0) {
    const auto [first, last] = l.ranks_meeting(g[s] / 3, g[s]);
    if (first != l.owner(g[s] / 3) || last != l.owner(g[s] - 1) + 1) broken("ranks_meeting");
  }
  if (l.ranks_with_rows() < 0 || l.ranks_with_rows() > l.nranks()) broken("ranks_with_rows");
  for (std::int64_t i : {std::int64_t(0), g[s] / 2, g[s] - 1}) {
    if (i < 0 || i >= g[s]) continue;
    const int o = l.owner(i);
    if (o < 0 || o >= l.nranks() || i < l.offset(o) || i >= l.offset(o) + l.count(o))
      broken("owner");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in{data, size};
  const std::uint8_t op = in.byte() % 5;
  const int ndim = in.byte() % 11;  // up to 10: beyond kvmap's 8 on purpose
  std::vector<std::int64_t> shape(ndim), strides(ndim);
  for (auto& e : shape) e = in.extent();
  for (auto& s : strides) s = in.extent();
  try {
    switch (op) {
      case 0: {  // balanced layout
        const int nranks = static_cast<int>(in.byte() % 9) - 1;
        const bool split = in.byte() & 1;
        const std::int64_t axis = static_cast<std::int8_t>(in.byte());
        check_layout(kvmap::Layout::balanced(
            shape, split ? std::optional<int>(static_cast<int>(axis)) : std::nullopt, nranks));
        break;
      }
      case 1: {  // layout from counts
        const int nranks = in.byte() % 9;
        std::vector<std::int64_t> counts(nranks);
        for (auto& c : counts) c = in.extent();
        const int axis = static_cast<std::int8_t>(in.byte());
        const kvmap::Layout l = kvmap::Layout::from_counts(shape, axis, counts);
        check_layout(l);
        const kvmap::Layout again = kvmap::Layout::from_counts(l.gshape(), *l.split(), l.counts());
        if (!(l == again) || l.fingerprint() != again.fingerprint()) broken("equality");
        if (l.is_balanced() != (l == kvmap::Layout::balanced(l.gshape(), *l.split(), l.nranks())))
          broken("balanced");
        break;
      }
      case 2: {  // stride checks of the tensor bridge
        const std::size_t itemsize = in.byte() % 20;
        const std::size_t span = kvmap::Detail::checked_span_bytes(shape, strides, itemsize);
        const std::int64_t numel = kvmap::Impl::checked_numel(shape);
        if (numel > 0 && span < itemsize) broken("span");
        if (numel == 0 && span != 0) broken("empty span");
        break;
      }
      case 3: {  // box geometry of pack/unpack
        std::vector<std::int64_t> other(ndim);
        for (auto& s : other) s = in.extent();
        for (auto& e : shape) e = static_cast<std::int64_t>(static_cast<std::uint64_t>(e) % 7);
        const auto g = kvmap::Detail::make_strided_copy(shape, strides, other);
        std::int64_t expect = 1;
        for (std::int64_t e : shape) expect *= e;
        if (g.ndim < 1 || g.ndim > kvmap::Impl::kMaxRank || g.numel() != expect) broken("geometry");
        break;
      }
      case 4: {  // out_dims normalization
        const std::size_t nout = in.byte() % 12;
        std::vector<std::int64_t> dims(in.byte() % 4);
        for (auto& d : dims) d = static_cast<std::int8_t>(in.byte());
        const std::size_t k = in.byte() % 13;
        const std::int64_t per_sample = static_cast<std::int8_t>(in.byte());
        const bool per_output = in.byte() % 2 == 1;
        const std::int64_t d =
            kvmap::Detail::normalize_out_dim(dims, per_output, k, nout, per_sample);
        if (d < 0 || d > per_sample) broken("out_dim");
        if (per_output && dims.size() != nout) broken("out_dims per output");
        break;
      }
    }
  } catch (const kvmap::ValueError&) {
    // the documented answer to bad input
  }
  return 0;
}
