// Redistribution round trips (bit-exact for every dtype), empty shards, many ranks of
// dimensions, the large-count path, staging through host buffers, and the copies of
// unchanged layouts. (Random arrays: test_random.cpp; linalg: test_linalg.cpp.)
#include "support/kvmap_test.hpp"
#include "comm_registry.hpp"
#include "hooks.hpp"

#include <mpi.h>

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::Shape;

namespace {

// The slice of `full` that `layout` gives to rank r (an independent reference).
at::Tensor expected_local(const at::Tensor& full, const Layout& layout, int r) {
  if (!layout.split()) return full;
  return full.narrow(*layout.split(), layout.offset(r), layout.count(r));
}

// Random-looking but deterministic unbalanced counts (some ranks empty) summing to n.
std::vector<int64_t> uneven_counts(int64_t n, int P, int salt) {
  std::vector<int64_t> counts(P, 0);
  for (int64_t i = 0; i < n; ++i)
    counts[(i * 7 + salt * 3 + i / 3) % P == 0 ? 0 : (i * 5 + salt) % P]++;
  return counts;
}

}  // namespace

TEST_CASE("scatter -> gather and from_global -> allgather are bit-exact for every dtype") {
  const int me = rank();
  for (DType dt : all_dtypes()) {
    INFO("dtype " << kvmap::name(dt));
    const at::Tensor full = pattern({7, 3, 2}, kvmap::to_torch(dt), 1);
    for (int split : {0, 1, 2}) {
      auto s = View::scatter(me == 0 ? full : at::Tensor(), split);
      CHECK(s.dtype() == dt);
      CHECK(s.gshape() == Shape{7, 3, 2});
      CHECK(bit_equal(s.local(), expected_local(full, s.layout(), me)));
      const at::Tensor g = s.gather(0);
      if (me == 0) {
        CHECK(bit_equal(g, full));
      } else {
        CHECK_FALSE(g.defined());
      }
      auto f = View::from_global(full, split);
      CHECK(f.layout() == Layout::balanced({7, 3, 2}, split, nranks()));
      CHECK(bit_equal(f.allgather(), full));
    }
  }
}

TEST_CASE("resplit 0 -> 1 -> replicated -> 0 and unbalanced -> balance") {
  const int me = rank(), P = nranks();
  for (DType dt : all_dtypes()) {
    INFO("dtype " << kvmap::name(dt));
    const at::Tensor full = pattern({9, 5}, kvmap::to_torch(dt), 2);
    auto a = View::from_global(full, 0);
    auto b = a.resplit(1);
    CHECK(b.layout() == Layout::balanced({9, 5}, 1, P));
    CHECK(bit_equal(b.local(), expected_local(full, b.layout(), me)));
    auto c = b.resplit(std::nullopt);
    CHECK(c.layout().is_replicated());
    CHECK(bit_equal(c.local(), full));
    auto d = c.resplit(0);
    CHECK(bit_equal(d.local(), expected_local(full, d.layout(), me)));

    const Layout uneven = Layout::from_counts({9, 5}, 0, uneven_counts(9, P, 1));
    auto u = a.redistribute(uneven);
    CHECK(u.layout() == uneven);
    CHECK(bit_equal(u.local(), expected_local(full, uneven, me)));
    auto balanced = u.balance();
    CHECK(balanced.is_balanced());
    CHECK(bit_equal(balanced.local(), expected_local(full, balanced.layout(), me)));
    const at::Tensor on_last = u.gather(P - 1);
    CHECK(on_last.defined() == (me == P - 1));
    if (me == P - 1) CHECK(bit_equal(on_last, full));
  }
}

TEST_CASE("redistribution sequences across layouts and axes preserve the array") {
  const int me = rank(), P = nranks();
  const at::Tensor full = pattern({6, 4, 5}, at::kDouble, 3);
  auto v = View::from_global(full, 2);
  std::vector<Layout> targets = {
      Layout::from_counts({6, 4, 5}, 1, uneven_counts(4, P, 2)),
      Layout::from_counts({6, 4, 5}, 0, uneven_counts(6, P, 5)),
      Layout::replicated({6, 4, 5}, P),
      Layout::from_counts({6, 4, 5}, 2, uneven_counts(5, P, 7)),
      Layout::balanced({6, 4, 5}, 0, P),
  };
  for (const Layout& t : targets) {
    INFO("target " << t);
    v = v.redistribute(t);
    CHECK(v.layout() == t);
    CHECK(bit_equal(v.local(), expected_local(full, t, me)));
  }
}

TEST_CASE("non-contiguous sources: transposed tensors and LayoutLeft views") {
  const int me = rank(), P = nranks();
  const at::Tensor full = pattern({4 * P + 1, 3}, at::kFloat, 4);
  const Layout l = Layout::balanced(full.sizes().vec(), 0, P);
  // The local piece stored column-major: a transposed contiguous tensor.
  at::Tensor mine = expected_local(full, l, me).t().contiguous().t();
  CHECK_FALSE(mine.is_contiguous());
  auto d = View::from_local(mine, 0);
  CHECK(bit_equal(d.allgather(), full));
  CHECK(bit_equal(d.resplit(1).local(),
                  expected_local(full, Layout::balanced(full.sizes().vec(), 1, P), me)));
}

TEST_CASE("fewer rows than ranks leaves shards empty") {
  const int me = rank(), P = nranks();
  const at::Tensor full = pattern({2, 3}, at::kLong, 5);
  auto d = View::from_global(full, 0);
  const int64_t expect = P == 1 ? 2 : (me < 2 ? 1 : 0);
  CHECK(d.layout().count(me) == expect);
  CHECK(d.local().size(0) == expect);
  CHECK(bit_equal(d.allgather(), full));
  CHECK(bit_equal(d.resplit(1).allgather(), full));
  auto z = View::zeros({0, 4}, DType::Float32, 0);
  CHECK(z.allgather().sizes().vec() == std::vector<int64_t>{0, 4});
}

TEST_CASE("0-d, 1-d and 5-d arrays") {
  const int me = rank();
  const at::Tensor scalar = at::full({}, 3.25, on_device(at::kDouble));
  auto s = View::scatter(me == 0 ? scalar : at::Tensor(), std::nullopt);
  CHECK(s.ndim() == 0);
  CHECK(s.local().item<double>() == 3.25);
  const at::Tensor g = s.gather(0);
  if (me == 0) CHECK(bit_equal(g, scalar));

  const at::Tensor line = pattern({13}, at::kInt, 6);
  CHECK(bit_equal(View::from_global(line, 0).allgather(), line));

  const at::Tensor five = pattern({3, 2, 4, 1, 5}, at::kComplexDouble, 7);
  for (int split = 0; split < 5; ++split) {
    auto f = View::from_global(five, split);
    CHECK(bit_equal(f.local(), expected_local(five, f.layout(), me)));
    CHECK(bit_equal(f.resplit((split + 2) % 5).allgather(), five));
  }
}

TEST_CASE("counts above the MPI count limit take the large-count path") {
  // Lowering the limit to 7 bytes makes every message "too large" for one MPI call.
  const std::size_t saved = kvmap::Detail::mpi_count_limit();
  kvmap::Detail::set_mpi_count_limit(7);
  const int me = rank();
  const at::Tensor full = pattern({23, 6}, at::kDouble, 8);
  auto a = View::from_global(full, 0);
  CHECK(bit_equal(a.resplit(1).local(),
                  expected_local(full, Layout::balanced({23, 6}, 1, nranks()), me)));
  CHECK(bit_equal(a.allgather(), full));
  auto s = View::scatter(me == 0 ? full : at::Tensor(), 1);
  const at::Tensor g = s.gather(0);
  if (me == 0) CHECK(bit_equal(g, full));
  kvmap::Detail::set_mpi_count_limit(saved);
  CHECK(kvmap::Detail::mpi_count_limit() == saved);
}

TEST_CASE(
    "staged through host buffers (as without a GPU-aware MPI): same results, staging counted") {
  // What a device memory space does when MPI cannot read it, forced on this backend's memory.
  const int me = rank(), P = nranks();
  const at::Tensor full = pattern({23, 6}, at::kDouble, 9);
  const auto a = View::from_global(full, 0);
  const Layout target = Layout::balanced({23, 6}, 1, P);
  // Bytes this rank sends to and receives from other ranks in the resplit 0 -> 1.
  const int64_t sent = a.layout().count(me) * (6 - target.count(me)) * 8;
  const int64_t received = (23 - a.layout().count(me)) * target.count(me) * 8;

  kvmap::reset_stats();
  const View direct = a.resplit(1);
  const std::uint64_t copied_direct = kvmap::stats().bytes_copied;
  struct Unforce {
    ~Unforce() { kvmap::Detail::set_force_host_staging(false); }
  } unforce;
  kvmap::Detail::set_force_host_staging(true);
  kvmap::reset_stats();
  const View staged = a.resplit(1);
  const std::uint64_t copied_staged = kvmap::stats().bytes_copied;
  CHECK(bit_equal(staged.local(), expected_local(full, target, me)));
  CHECK(bit_equal(direct.local(), staged.local()));
  // Every byte to or from another rank crossed a host buffer once more (at least).
  CHECK(copied_staged >= copied_direct + static_cast<std::uint64_t>(sent + received));
  if (P == 1) CHECK(copied_staged == copied_direct);

  CHECK(bit_equal(a.allgather(), full));
  CHECK(bit_equal(staged.resplit(std::nullopt).local(), full));
  CHECK(bit_equal(staged.resplit(0).local(), a.local()));
  const at::Tensor g = staged.gather(P - 1);
  if (me == P - 1) CHECK(bit_equal(g, full));
  auto s = View::scatter(me == 0 ? full : at::Tensor(), 1);
  CHECK(bit_equal(s.local(), expected_local(full, s.layout(), me)));
  // A scalar is broadcast from root's memory.
  const at::Tensor scalar = pattern({}, at::kFloat, 4);
  CHECK(bit_equal(View::scatter(me == 0 ? scalar : at::Tensor(), std::nullopt).local(), scalar));
  // Staged and cut into pieces above the MPI count limit.
  const std::size_t saved = kvmap::Detail::mpi_count_limit();
  kvmap::Detail::set_mpi_count_limit(5);
  CHECK(bit_equal(a.resplit(1).local(), expected_local(full, target, me)));
  CHECK(bit_equal(a.allgather(), full));
  kvmap::Detail::set_mpi_count_limit(saved);
}

TEST_CASE("bool arrays move their bytes as they are, whatever the bytes") {
  // Memory of a bool array need not hold 0 or 1 (DistView::empty's does not): redistribution
  // moves bytes, it does not load bools. Written and compared through uint8 views.
  const int P = nranks();
  const at::Tensor full =
      ((at::arange(4 * P * 3, at::kLong) * 37 + 5) % 256).to(at::kByte).reshape({4 * P, 3});
  auto v = View::empty({4 * P, 3}, DType::Bool, 0);
  const std::int64_t off = v.layout().offset(rank()), rows = v.lshape()[0];
  v.local().view(at::kByte).copy_(on_device(full.narrow(0, off, rows)));
  CHECK(at::equal(v.resplit(1).allgather().view(at::kByte).cpu(), full));
  CHECK(at::equal(v.resplit(std::nullopt).local().view(at::kByte).cpu(), full));
}

TEST_CASE("redistribution counts the bytes it copies") {
  kvmap::reset_stats();
  auto a = View::zeros({8, 4}, DType::Float64, 0);
  const auto before = kvmap::stats();
  auto b = a.resplit(1);
  const auto after = kvmap::stats();
  CHECK(after.bytes_copied > before.bytes_copied);
  // One agreement and, the split axis changing, one all-to-all; nothing communicates on one
  // rank.
  CHECK(after.collectives - before.collectives == (nranks() > 1 ? 2u : 0u));
  CHECK(kvmap::stats().bytes_live >= 0);
}

TEST_CASE("gather and allgather of a replicated array return copies, not aliases") {
  const at::Tensor full = pattern({3, 5}, at::kDouble, 7);
  auto r = View::from_global(full, std::nullopt);
  const auto before = kvmap::stats().bytes_copied;
  at::Tensor all = r.allgather();
  CHECK(kvmap::stats().bytes_copied - before == static_cast<uint64_t>(full.numel() * 8));
  CHECK(all.data_ptr() != r.local().data_ptr());
  all.fill_(-1.0);
  CHECK(bit_equal(r.local(), full));
  at::Tensor on_root = r.gather(0);
  if (rank() == 0) {
    CHECK(on_root.data_ptr() != r.local().data_ptr());
    CHECK(bit_equal(on_root, full));
  } else {
    CHECK_FALSE(on_root.defined());
  }
}

TEST_CASE("unchanged layouts: resplit, balance and redistribute return arrays of their own") {
  // Every operation that keeps the layout still returns new memory (copied locally, counted,
  // no communication): writing to the result leaves the source as it was.
  const int P = nranks();
  for (std::optional<int> split :
       {std::optional<int>(0), std::optional<int>(1), std::optional<int>()}) {
    INFO("split " << (split ? std::to_string(*split) : std::string("None")));
    const at::Tensor full = pattern({2 * P + 1, 3}, at::kFloat, 9);
    auto x = View::from_global(full, split);  // balanced already
    const std::vector<std::function<View()>> ops = {[&] { return x.resplit(split); },
                                                    [&] { return x.balance(); },
                                                    [&] { return x.redistribute(x.layout()); }};
    for (const auto& op : ops) {
      const auto before = kvmap::stats();
      View y = op();
      const auto after = kvmap::stats();
      CHECK(y.layout() == x.layout());
      CHECK(after.bytes_copied - before.bytes_copied ==
            static_cast<uint64_t>(x.local().numel() * 4));
      CHECK(bit_equal(y.allgather(), full));
      if (y.local().numel() > 0) CHECK(y.local().data_ptr() != x.local().data_ptr());
      y.local().fill_(-1.0f);
      CHECK(bit_equal(x.allgather(), full));
    }
  }
}
