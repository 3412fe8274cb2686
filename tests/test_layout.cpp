// Layout: pure shard arithmetic (no MPI, no Kokkos).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <limits>

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
}
