// Layout: pure shard arithmetic (no MPI, no Kokkos).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "kvmap/error.hpp"
#include "kvmap/layout.hpp"

using kvmap::Layout;
using kvmap::Shape;
using Counts = std::vector<int64_t>;

TEST_CASE("Heat's shard rule") {
  const Layout a = Layout::balanced({10}, 0, 3);
  CHECK(a.counts() == Counts{4, 3, 3});
  CHECK(a.offsets() == Counts{0, 4, 7});
  CHECK(Layout::balanced({11}, 0, 3).counts() == Counts{4, 4, 3});
  CHECK(Layout::balanced({2}, 0, 4).counts() == Counts{1, 1, 0, 0});
  CHECK(Layout::balanced({0, 5}, 0, 3).counts() == Counts{0, 0, 0});
  // Against an independent formulation: deal the rows round robin, then the larger
  // shares go to the lower ranks.
  for (int64_t n : {0, 1, 5, 17, 100}) {
    for (int P : {1, 2, 3, 4, 7}) {
      Counts expect(P, 0);
      for (int64_t i = 0; i < n; ++i) ++expect[i % P];
      std::sort(expect.begin(), expect.end(), std::greater<>());
      CHECK(Layout::balanced({n, 2}, 0, P).counts() == expect);
    }
  }
}

TEST_CASE("lshape, offsets, owner and split normalization") {
  const Layout l = Layout::balanced({3, 10, 2}, -2, 3);
  REQUIRE(l.split() == 1);
  CHECK(l.lshape(0) == Shape{3, 4, 2});
  CHECK(l.lshape(2) == Shape{3, 3, 2});
  CHECK(l.offset(2) == 7);
  CHECK(l.owner(0) == 0);
  CHECK(l.owner(3) == 0);
  CHECK(l.owner(4) == 1);
  CHECK(l.owner(9) == 2);
  CHECK_THROWS_AS(l.owner(10), kvmap::ValueError);
  CHECK_THROWS_AS(l.owner(-1), kvmap::ValueError);
  CHECK(l.is_balanced());
  CHECK(l.numel() == 60);
}

TEST_CASE("unbalanced layouts with empty ranks") {
  const Layout l = Layout::from_counts({6, 2}, 0, {0, 4, 0, 2});
  CHECK(l.offsets() == Counts{0, 0, 4, 4});
  CHECK(l.owner(0) == 1);
  CHECK(l.owner(3) == 1);
  CHECK(l.owner(4) == 3);
  CHECK(l.owner(5) == 3);
  CHECK_FALSE(l.is_balanced());
  CHECK(l != Layout::balanced({6, 2}, 0, 4));
  CHECK(Layout::from_counts({6, 2}, 0, {2, 2, 1, 1}) == Layout::balanced({6, 2}, 0, 4));
}

TEST_CASE("replicated layouts") {
  const Layout r = Layout::balanced({4, 5}, std::nullopt, 3);
  CHECK(r.is_replicated());
  CHECK(r.is_balanced());
  CHECK(r.lshape(1) == Shape{4, 5});
  CHECK_THROWS_AS(r.count(0), kvmap::ValueError);
  CHECK_THROWS_AS(r.owner(0), kvmap::ValueError);
  CHECK(Layout::balanced({}, std::nullopt, 2).numel() == 1);  // 0-d
}

TEST_CASE("bad arguments raise ValueError naming the problem") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const kvmap::ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no ValueError");
  };
  CHECK(message([] { Layout::balanced({4}, 1, 2); }).find("out of range") != std::string::npos);
  CHECK(message([] { Layout::balanced({4}, -2, 2); }).find("split axis -2") != std::string::npos);
  CHECK(message([] { Layout::balanced({}, 0, 2); }).find("0-dimensional") != std::string::npos);
  CHECK(message([] {
          Layout::balanced({4, -1}, 0, 2);
        }).find("negative extent") != std::string::npos);
  CHECK(message([] { Layout::balanced({4}, 0, 0); }).find("nranks") != std::string::npos);
  CHECK(message([] { Layout::from_counts({5}, 0, {2, 2}); }).find("sum to 4") != std::string::npos);
  CHECK(message([] {
          Layout::from_counts({5}, 0, {4, 4});
        }).find("sum to more") != std::string::npos);
  CHECK(message([] {
          Layout::from_counts({5}, 0, {-1, 6});
        }).find("negative") != std::string::npos);
  CHECK(message([] { Layout::from_counts({5}, 0, {}); }).find("empty") != std::string::npos);
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  CHECK(message([&] { Layout::balanced({big, 3}, 0, 2); }).find("int64") != std::string::npos);
  // Zero-sized arrays never overflow, whatever the other extents.
  CHECK(Layout::balanced({big, 3, 0}, 0, 2).numel() == 0);
  CHECK(message([] { Layout::balanced({4}, 0, 2).lshape(2); }).find("rank 2") != std::string::npos);
}

TEST_CASE("str() names shape, split and counts") {
  CHECK(Layout::from_counts({5, 2}, 0, {3, 2}).str() ==
        "Layout(gshape=[5, 2], split=0, counts=[3, 2])");
  // Beyond 32 ranks the counts are abbreviated: a message stays short at any scale.
  const std::string big = Layout::balanced({100000, 3}, 0, 131072).str();
  CHECK(big.size() < 200);
  CHECK(big.find("on 131072 ranks") != std::string::npos);
}

// Counts of each rank under Heat's rule, one at a time: the reference for the O(1) forms.
Counts heat_rule(int64_t n, int P) {
  Counts c(P, 0);
  for (int64_t i = 0; i < n; ++i) ++c[i % P];
  std::sort(c.begin(), c.end(), std::greater<>());
  return c;
}

TEST_CASE("every representation answers like the counts it stands for") {
  // Balanced (arithmetic), all rows on one rank, and stored counts, each checked rank by rank
  // and row by row against plain counts and prefix sums.
  for (int P : {1, 2, 3, 5, 8}) {
    for (int64_t n : {0, 1, 2, 7, 16, 23}) {
      std::vector<Counts> cases = {heat_rule(n, P)};
      for (int h = 0; h < P; ++h) {
        Counts c(P, 0);
        c[h] = n;
        cases.push_back(c);
      }
      Counts uneven(P, 0);
      for (int64_t i = 0; i < n; ++i) ++uneven[(i * i + 3) % P];
      cases.push_back(uneven);
      for (const Counts& counts : cases) {
        INFO("P " << P << ", counts " << kvmap::to_string(counts));
        const Layout l = Layout::from_counts({n, 3}, 0, counts);
        Counts offsets(P, 0);
        for (int r = 1; r < P; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
        int holders = 0;
        for (int r = 0; r < P; ++r) {
          CHECK(l.count(r) == counts[r]);
          CHECK(l.offset(r) == offsets[r]);
          CHECK(l.lshape(r) == Shape{counts[r], 3});
          holders += counts[r] > 0 ? 1 : 0;
        }
        CHECK(l.counts() == counts);
        CHECK(l.offsets() == offsets);
        CHECK(l.ranks_with_rows() == holders);
        CHECK(l.is_balanced() == (counts == heat_rule(n, P)));
        for (int64_t i = 0; i < n; ++i) {
          int expect = 0;
          while (!(offsets[expect] <= i && i < offsets[expect] + counts[expect])) ++expect;
          CHECK(l.owner(i) == expect);
        }
        // ranks_meeting: the ranks from the owner of the first row to that of the last.
        for (int64_t lo = 0; lo < n; ++lo) {
          for (int64_t hi = lo + 1; hi <= n; ++hi) {
            const auto [first, last] = l.ranks_meeting(lo, hi);
            CHECK(first == l.owner(lo));
            CHECK(last == l.owner(hi - 1) + 1);
          }
        }
        // The same layout made another way: the same fingerprint, equal.
        if (n > 0 && std::count(counts.begin(), counts.end(), n) == 1) {
          const int h =
              static_cast<int>(std::find(counts.begin(), counts.end(), n) - counts.begin());
          const Layout on = Layout::on_rank({n, 3}, 0, h, P);
          CHECK(on == l);
          CHECK(on.fingerprint() == l.fingerprint());
        }
        if (counts == heat_rule(n, P)) {
          CHECK(Layout::balanced({n, 3}, 0, P) == l);
          CHECK(Layout::balanced({n, 3}, 0, P).fingerprint() == l.fingerprint());
        }
      }
    }
  }
}

TEST_CASE("fingerprints tell layouts apart") {
  const Layout a = Layout::from_counts({6, 2}, 0, {0, 4, 0, 2});
  const Layout b = Layout::from_counts({6, 2}, 0, {0, 4, 2, 0});
  const Layout c = Layout::from_counts({6, 3}, 0, {0, 4, 0, 2});
  CHECK(a.fingerprint() != b.fingerprint());
  CHECK(a.fingerprint() != c.fingerprint());
  CHECK(a.fingerprint() != Layout::balanced({6, 2}, 0, 4).fingerprint());
  CHECK(a.fingerprint() != Layout::balanced({6, 2}, std::nullopt, 4).fingerprint());
  CHECK(Layout::balanced({6, 2}, 0, 4).fingerprint() !=
        Layout::balanced({6, 2}, 0, 3).fingerprint());
  CHECK(Layout::balanced({6, 2}, 0, 4).fingerprint() !=
        Layout::balanced({2, 6}, 1, 4).fingerprint());
  CHECK(a.fingerprint() == Layout::from_counts({6, 2}, 0, {0, 4, 0, 2}).fingerprint());
  CHECK(a == Layout::from_counts({6, 2}, 0, {0, 4, 0, 2}));
}

TEST_CASE("with_shape: a layout of another shape over the same rows, shared") {
  const Layout a = Layout::from_counts({6, 2}, 0, {1, 4, 0, 1});
  const Layout out = a.with_shape({5, 6, 7}, 1);
  CHECK(out == Layout::from_counts({5, 6, 7}, 1, {1, 4, 0, 1}));
  CHECK(out.same_rows(a));
  CHECK(out.lshape(1) == Shape{5, 4, 7});
  CHECK(Layout::balanced({9}, 0, 4).with_shape({2, 9}, -1) == Layout::balanced({2, 9}, 1, 4));
  CHECK_THROWS_AS(a.with_shape({5, 7}, 1), kvmap::ValueError);
  CHECK_THROWS_AS(Layout::replicated({6}, 2).with_shape({6}, 0), kvmap::ValueError);
  // Copies and moves keep everything, counts() included.
  Layout copy = out;
  Layout moved = std::move(copy);
  CHECK(moved == out);
  CHECK(moved.counts() == Counts{1, 4, 0, 1});
  copy = moved;
  CHECK(copy.counts() == Counts{1, 4, 0, 1});
}

TEST_CASE("a balanced layout of 131,072 ranks answers without materializing its counts") {
  // count, offset, owner and ranks_meeting are arithmetic; the counts are made only on request.
  const int P = 131072;
  const int64_t n = 1000003;
  const Layout l = Layout::balanced({n, 8}, 0, P);
  const Counts ref = heat_rule(n, 7);  // (a sanity check of the helper)
  CHECK(ref.size() == 7);
  const int64_t c = n / P, r = n % P;
  for (int rank : {0, 1, static_cast<int>(r) - 1, static_cast<int>(r), P - 1}) {
    CHECK(l.count(rank) == c + (rank < r ? 1 : 0));
    CHECK(l.offset(rank) == rank * c + std::min<int64_t>(rank, r));
  }
  CHECK(l.owner(n - 1) == P - 1);
  CHECK(l.owner(0) == 0);
  CHECK(l.ranks_meeting(l.offset(5), l.offset(7)) == std::pair<int, int>(5, 7));
  CHECK(l.counts().size() == static_cast<std::size_t>(P));
  CHECK(std::accumulate(l.counts().begin(), l.counts().end(), int64_t{0}) == n);
}
