// The halo plan (runtime/src/arithmetic/halo_plan): which rows each rank's extended block
// holds, without MPI, at up to thousands of ranks, against an independent reference: the
// gathered array padded as numpy.pad pads it, each rank's window cut out of it.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "halo_plan.hpp"
#include "kvmap/error.hpp"
#include "kvmap/layout.hpp"

using kvmap::Layout;
using kvmap::Detail::halo_receivers;
using kvmap::Detail::halo_window;
using kvmap::Detail::HaloBoundary;
using kvmap::Detail::HaloDepth;
using kvmap::Detail::HaloRun;
using kvmap::Detail::HaloWindow;

namespace {

constexpr std::int64_t kConstant = -1;  // the reference's mark for a constant row

// numpy.pad(arange(n), (before, after), mode) as global row indices (kConstant for
// "constant"): the padded array every window is cut from.
std::vector<std::int64_t> padded(std::int64_t n, HaloDepth d, HaloBoundary b) {
  std::vector<std::int64_t> base(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) base[static_cast<std::size_t>(i)] = i;
  std::vector<std::int64_t> out;
  auto pad_row = [&](std::int64_t k, bool front) -> std::int64_t {
    // k: 1 for the row next to the array, 2 for the next one out, ...
    switch (b) {
      case HaloBoundary::Constant: return kConstant;
      case HaloBoundary::Nearest: return front ? 0 : n - 1;
      case HaloBoundary::Reflect: return front ? k - 1 : n - k;   // "symmetric"
      case HaloBoundary::Periodic: return front ? n - k : k - 1;  // "wrap"
      case HaloBoundary::None: break;
    }
    return -2;
  };
  if (b != HaloBoundary::None) {
    for (std::int64_t k = d.before; k >= 1; --k) out.push_back(pad_row(k, true));
  }
  out.insert(out.end(), base.begin(), base.end());
  if (b != HaloBoundary::None) {
    for (std::int64_t k = 1; k <= d.after; ++k) out.push_back(pad_row(k, false));
  }
  return out;
}

// Rank r's window as the reference cuts it: the padded rows from its first row's position
// minus `before` to its last row's plus `after` (clipped at the array's ends for "none").
std::vector<std::int64_t> reference_window(const Layout& l, int r, HaloDepth d, HaloBoundary b,
                                           const std::vector<std::int64_t>& pad) {
  const std::int64_t count = l.count(r);
  if (count == 0) return {};
  const std::int64_t shift = b == HaloBoundary::None ? 0 : d.before;  // padded index of row 0
  std::int64_t lo = shift + l.offset(r) - d.before, hi = shift + l.offset(r) + count + d.after;
  lo = std::max<std::int64_t>(lo, 0);
  hi = std::min<std::int64_t>(hi, static_cast<std::int64_t>(pad.size()));
  return std::vector<std::int64_t>(pad.begin() + lo, pad.begin() + hi);
}

// The plan's window as global row indices, row by row.
std::vector<std::int64_t> planned_window(const Layout& l, int r, const HaloWindow& w) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(w.rows()), -3);
  for (std::int64_t k = 0; k < w.count; ++k)
    rows[static_cast<std::size_t>(w.before + k)] = l.offset(r) + k;
  for (const HaloRun& run : w.runs) {
    REQUIRE(run.rows >= 1);
    REQUIRE((run.step == 1 || run.step == -1));
    for (std::int64_t k = 0; k < run.rows; ++k) {
      const auto at = static_cast<std::size_t>(run.first_row + k);
      REQUIRE(at < rows.size());
      CHECK(rows[at] == -3);  // each row filled once, and never a local one
      if (run.source == HaloRun::kConstant) {
        rows[at] = kConstant;
      } else {
        const std::int64_t local = run.source_row + run.step * k;
        REQUIRE(local >= 0);
        REQUIRE(local < l.count(run.source));
        rows[at] = l.offset(run.source) + local;
      }
    }
  }
  return rows;
}

const HaloBoundary kBoundaries[] = {HaloBoundary::None, HaloBoundary::Periodic,
                                    HaloBoundary::Reflect, HaloBoundary::Nearest,
                                    HaloBoundary::Constant};

// Every rank's window against the reference, and every rank's receivers against the set of
// windows that take its rows (found by looking at every window).
void check_layout(const Layout& l, HaloDepth d, HaloBoundary b) {
  const std::int64_t n = l.gshape()[static_cast<std::size_t>(*l.split())];
  const std::vector<std::int64_t> pad = padded(n, d, b);
  std::vector<std::set<int>> takes_from(static_cast<std::size_t>(l.nranks()));
  for (int r = 0; r < l.nranks(); ++r) {
    const HaloWindow w = halo_window(l, r, d, b);
    INFO("rank " << r << " of " << l.nranks());
    CHECK(planned_window(l, r, w) == reference_window(l, r, d, b, pad));
    for (const HaloRun& run : w.runs)
      if (run.source >= 0) takes_from[static_cast<std::size_t>(run.source)].insert(r);
  }
  for (int s = 0; s < l.nranks(); ++s) {
    const std::vector<int> got = halo_receivers(l, s, d, b);
    const std::set<int>& want = takes_from[static_cast<std::size_t>(s)];
    INFO("sender " << s);
    CHECK(std::vector<int>(want.begin(), want.end()) == got);
  }
}

}  // namespace

TEST_CASE("halo plan: every boundary and layout against numpy.pad's rows") {
  std::mt19937_64 rng(7);
  for (HaloBoundary b : kBoundaries) {
    for (int P : {1, 2, 3, 4, 7}) {
      for (int trial = 0; trial < 20; ++trial) {
        // Uneven counts with empty ranks and shards shorter than the depth.
        std::vector<std::int64_t> counts(static_cast<std::size_t>(P));
        for (auto& c : counts) c = static_cast<std::int64_t>(rng() % 4);
        std::int64_t n = 0;
        for (auto c : counts) n += c;
        if (n == 0) continue;
        const Layout l = Layout::from_counts({n, 3}, 0, counts);
        std::int64_t limit = 6;
        if (b == HaloBoundary::Periodic || b == HaloBoundary::Reflect) limit = n;
        const HaloDepth d{static_cast<std::int64_t>(rng() % (limit + 1)),
                          static_cast<std::int64_t>(rng() % (limit + 1))};
        INFO("P " << P << " n " << n << " depth (" << d.before << ", " << d.after << ")");
        check_layout(l, d, b);
      }
    }
  }
}

TEST_CASE("halo plan: thousands of ranks, balanced and uneven, without MPI") {
  for (HaloBoundary b : kBoundaries) {
    for (int P : {1000, 5000}) {
      check_layout(Layout::balanced({3 * static_cast<std::int64_t>(P) + 1, 2}, 0, P), {2, 3}, b);
      std::vector<std::int64_t> counts(static_cast<std::size_t>(P));
      for (int r = 0; r < P; ++r) counts[static_cast<std::size_t>(r)] = (3 * r + 1) % 4;
      std::int64_t n = 0;
      for (auto c : counts) n += c;
      check_layout(Layout::from_counts({n}, 0, counts), {5, 1}, b);
    }
  }
}

TEST_CASE("halo plan: a rank's work follows its halo, not the number of ranks") {
  // Balanced rows of 10: a depth of 2 takes rows from the two neighbours only, whatever P.
  for (int P : {4, 64, 4096}) {
    const Layout l = Layout::balanced({10 * static_cast<std::int64_t>(P)}, 0, P);
    const HaloWindow w = halo_window(l, P / 2, {2, 2}, HaloBoundary::Periodic);
    CHECK(w.runs.size() == 2);
    CHECK(halo_receivers(l, P / 2, {2, 2}, HaloBoundary::Periodic) ==
          std::vector<int>{P / 2 - 1, P / 2 + 1});
    // The edges wrap to the far end.
    CHECK(halo_receivers(l, 0, {2, 2}, HaloBoundary::Periodic) == std::vector<int>{1, P - 1});
  }
}

TEST_CASE("halo plan: invalid depths and boundaries are ValueErrors naming the caller") {
  const Layout l = Layout::balanced({5, 2}, 0, 2);
  CHECK_THROWS_WITH_AS(kvmap::Detail::check_halo(l, {-1, 0}, HaloBoundary::None, "kvmap::test"),
                       doctest::Contains("kvmap::test: depth must be >= 0"), kvmap::ValueError);
  CHECK_THROWS_WITH_AS(kvmap::Detail::check_halo(l, {6, 0}, HaloBoundary::Periodic, "kvmap::test"),
                       doctest::Contains("exceeds the 5 rows"), kvmap::ValueError);
  CHECK_THROWS_AS(kvmap::Detail::check_halo(l, {0, 6}, HaloBoundary::Reflect, "kvmap::test"),
                  kvmap::ValueError);
  CHECK_NOTHROW(kvmap::Detail::check_halo(l, {6, 6}, HaloBoundary::Nearest, "kvmap::test"));
  CHECK_NOTHROW(kvmap::Detail::check_halo(l, {9, 9}, HaloBoundary::Constant, "kvmap::test"));
  CHECK_NOTHROW(kvmap::Detail::check_halo(l, {9, 9}, HaloBoundary::None, "kvmap::test"));
  CHECK_THROWS_AS(kvmap::Detail::check_halo(Layout::replicated({5}, 2), {1, 1}, HaloBoundary::None,
                                            "kvmap::test"),
                  kvmap::ValueError);
}
