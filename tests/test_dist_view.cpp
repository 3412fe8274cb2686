// DistView: factories, zero-copy adoption of Kokkos views and tensors, typed local views,
// and the errors of bad input on every rank.
#include <numeric>

#include "support/kvmap_test.hpp"

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Shape;

TEST_CASE("factories: shapes, values and layouts") {
  const int P = nranks(), me = rank();
  auto z = View::zeros({10, 3}, DType::Float64, 0);
  CHECK(z.gshape() == Shape{10, 3});
  CHECK(z.layout() == kvmap::Layout::balanced({10, 3}, 0, P));
  CHECK(z.lshape() == z.layout().lshape(me));
  CHECK(z.local().sum().item<double>() == 0.0);
  CHECK(z.is_balanced());

  auto f = View::full({4, 7}, 2.5, DType::Float32, -1);
  CHECK(f.split() == 1);
  CHECK(f.local().eq(2.5).all().item<bool>());
  CHECK(f.lshape() == Shape{4, f.layout().count(me)});

  auto a = View::arange(11, DType::Int64, 0);
  at::Tensor expect = at::arange(
      a.layout().offset(me), a.layout().offset(me) + a.layout().count(me), on_device(at::kLong));
  CHECK(at::equal(a.local(), expect));

  auto r = View::full({3}, 1.0, DType::Int32, std::nullopt);
  CHECK(r.lshape() == Shape{3});
  CHECK(r.layout().is_replicated());

  auto s = View::zeros({}, DType::Float64, std::nullopt);  // 0-d
  CHECK(s.ndim() == 0);
  CHECK(s.local().dim() == 0);

  for (DType t : all_dtypes()) {
    auto e = View::zeros({5, 2}, t, 0);
    CHECK((e.local().scalar_type() == kvmap::to_torch(t)));
    CHECK(e.local().count_nonzero().item<int64_t>() == 0);
  }
}

TEST_CASE("from_local adopts Kokkos views without copying") {
  const int me = rank();
  const int64_t rows = me + 2;  // unbalanced on purpose
  kvmap::reset_stats();

  SUBCASE("LayoutRight") {
    Kokkos::View<double**, Kokkos::LayoutRight, TestMemSpace> v("v", rows, 3);
    auto d = View::from_local(v, 0);
    CHECK(d.local().data_ptr() == static_cast<void*>(v.data()));
    CHECK(d.local().strides().vec() == std::vector<int64_t>{3, 1});
    int64_t total = 0;
    for (int r = 0; r < nranks(); ++r) total += r + 2;
    CHECK(d.gshape() == Shape{total, 3});
    CHECK(d.layout().count(me) == rows);
    CHECK_FALSE((nranks() > 1 && d.is_balanced()));
    auto back = d.local_view<double**, Kokkos::LayoutRight>();
    CHECK(back.data() == v.data());
  }
  SUBCASE("LayoutLeft") {
    Kokkos::View<float**, Kokkos::LayoutLeft, TestMemSpace> v("v", rows, 4);
    auto d = View::from_local(v, 0);
    CHECK(d.local().data_ptr() == static_cast<void*>(v.data()));
    CHECK(d.local().strides().vec() == std::vector<int64_t>{1, rows});
    auto back = d.local_view<float**, Kokkos::LayoutLeft>();
    CHECK(back.data() == v.data());
    CHECK_THROWS_AS((d.local_view<float**, Kokkos::LayoutRight>()), kvmap::TypeError);
  }
  SUBCASE("LayoutStride and a static extent") {
    Kokkos::View<double* [3], Kokkos::LayoutRight, TestMemSpace> base("base", 2 * rows);
    auto every_other = Kokkos::subview(base, std::pair<int64_t, int64_t>(0, rows), Kokkos::ALL);
    Kokkos::LayoutStride ls(rows, 6, 3, 1);
    Kokkos::View<double**, Kokkos::LayoutStride, TestMemSpace> strided(base.data(), ls);
    auto d = View::from_local(strided, 0);
    CHECK(d.local().data_ptr() == static_cast<void*>(base.data()));
    CHECK(d.local().strides().vec() == std::vector<int64_t>{6, 1});
    auto back = d.local_view<double* [3]>();
    CHECK(back.data() == base.data());
    CHECK(back.stride(0) == 6);
    CHECK_THROWS_AS((d.local_view<double* [4]>()), kvmap::TypeError);
    auto s2 = View::from_local(every_other, 0);
    CHECK(s2.local().data_ptr() == static_cast<void*>(base.data()));
  }
  SUBCASE("the owner is kept alive") {
    at::Tensor t;
    void* p = nullptr;
    {
      Kokkos::View<int64_t*, TestMemSpace> v("v", rows);
      Kokkos::deep_copy(v, 42);
      p = v.data();
      t = View::from_local(v, 0).local();
    }
    CHECK(t.data_ptr() == p);
    CHECK(t.eq(42).all().item<bool>());
  }
  CHECK(kvmap::stats().bytes_copied == 0);
}

TEST_CASE("from_local adopts tensors without copying, any non-negative strides") {
  kvmap::reset_stats();
  at::Tensor base = at::arange(24, on_device(at::kFloat)).reshape({4, 6});
  at::Tensor t = base.t();  // non-contiguous
  auto d = View::from_local(t, 1);
  CHECK(d.local().data_ptr() == t.data_ptr());
  CHECK(d.gshape() == Shape{6, 4 * nranks()});
  at::Tensor broadcast = at::ones({1}, on_device(at::kDouble)).expand({5, 3});  // stride 0
  auto b = View::from_local(broadcast, 0);
  CHECK(b.local().strides().vec() == std::vector<int64_t>{0, 0});
  CHECK(b.local().sum().item<double>() == 15.0);
  CHECK(kvmap::stats().bytes_copied == 0);
}

TEST_CASE("from_local with a known layout adopts without gathering counts") {
  const int P = nranks(), me = rank();
  const std::int64_t n = 3 * P + 2;
  const kvmap::Layout layout = kvmap::Layout::balanced({n, 4}, 0, P);
  // Each rank's piece of arange(n * 4) by Heat's rule, computed here from n and P alone.
  const std::int64_t c = n / P, r = n % P;
  const std::int64_t count = c + (me < r ? 1 : 0), offset = me * c + std::min<std::int64_t>(me, r);
  at::Tensor piece =
      at::arange(offset * 4, (offset + count) * 4, on_device(at::kDouble)).reshape({count, 4});
  kvmap::reset_stats();
  auto d = View::from_local(piece, layout);
  CHECK(kvmap::stats().bytes_copied == 0);
  CHECK(d.local().data_ptr() == piece.data_ptr());
  CHECK(d.layout() == layout);
  CHECK(at::equal(d.allgather(), at::arange(n * 4, on_device(at::kDouble)).reshape({n, 4}).cpu()));
  // The same DistView as from_local's gathered counts make.
  CHECK(View::from_local(piece, 0).layout() == layout);
  // Replicated: every rank holds the whole array.
  at::Tensor whole = at::ones({2, 3}, on_device(at::kFloat));
  CHECK(View::from_local(whole, kvmap::Layout::replicated({2, 3}, P)).split() == std::nullopt);
}

TEST_CASE("local_view checks dtype and rank") {
  auto d = View::zeros({6, 2}, DType::Float32, 0);
  CHECK_THROWS_WITH_AS((d.local_view<double**>()), doctest::Contains("float32"), kvmap::TypeError);
  CHECK_THROWS_WITH_AS((d.local_view<float***>()), doctest::Contains("rank 3"), kvmap::TypeError);
  CHECK_THROWS_AS((d.local_view<int32_t**>()), kvmap::TypeError);
  auto v = d.local_view<float**, Kokkos::LayoutRight>();
  CHECK(v.extent(1) == 2);
  auto s = View::zeros({}, DType::Int16, std::nullopt).local_view<int16_t>();
  CHECK(s.data() != nullptr);
}

TEST_CASE("bad input raises on every rank with a clear message") {
  const int odd = odd_rank(), me = rank();
  SUBCASE("from_local: non-split extents differ on one rank") {
    if (nranks() > 1) {
      expect_collective_error<kvmap::ValueError>(
          [&] {
            Kokkos::View<double**, TestMemSpace> v("v", 2, me == odd ? 5 : 3);
            View::from_local(v, 0);
          },
          {odd}, "all extents except the split axis");
    }
  }
  SUBCASE("from_local: dtype differs on one rank") {
    if (nranks() > 1) {
      expect_collective_error<kvmap::ValueError>(
          [&] {
            at::Tensor t = at::zeros({2, 3}, on_device(me == odd ? at::kFloat : at::kDouble));
            View::from_local(t, 0);
          },
          {odd}, "dtype float32");
    }
  }
  SUBCASE("from_local with a layout: one rank's piece does not fit it") {
    const kvmap::Layout layout = kvmap::Layout::balanced({2 * nranks(), 3}, 0, nranks());
    expect_collective_error<kvmap::ValueError>(
        [&] {
          at::Tensor t = at::zeros({me == odd ? 3 : 2, 3}, on_device(at::kFloat));
          View::from_local(t, layout);
        },
        {odd}, "but the layout gives it");
  }
  SUBCASE("from_local with a layout for another number of ranks") {
    expect_collective_error<kvmap::ValueError>(
        [&] {
          View::from_local(at::zeros({2, 3}, on_device(at::kFloat)),
                           kvmap::Layout::balanced({2, 3}, 0, nranks() + 1));
        },
        [] {
          std::vector<int> all(nranks());
          std::iota(all.begin(), all.end(), 0);
          return all;
        }(),
        "the layout is for");
  }
  SUBCASE("from_local: split out of range on one rank") {
    expect_collective_error<kvmap::ValueError>(
        [&] {
          at::Tensor t = at::zeros({2, 3}, on_device(at::kFloat));
          View::from_local(t, me == odd ? 2 : 0);
        },
        {odd}, "split axis 2 is out of range");
  }
  SUBCASE("factory: split out of range everywhere") {
    expect_collective_error<kvmap::ValueError>(
        [&] {
          View::zeros({4, 4}, DType::Float32, 3);
        },
        [] {
          std::vector<int> all;
          for (int r = 0; r < nranks(); ++r) all.push_back(r);
          return all;
        }(),
        "split axis 3 is out of range");
  }
  SUBCASE("factory: negative extent") {
    try {
      View::empty({4, -2}, DType::Float32, 0);
      FAIL_CHECK("no exception");
    } catch (const kvmap::ValueError& e) {
      CHECK(std::string(e.what()).find("negative extent -2") != std::string::npos);
    } catch (const kvmap::RemoteError& e) {
      // Every rank failed itself, so nobody sees a RemoteError.
      FAIL_CHECK(e.what());
    }
  }
  SUBCASE("factory: arguments differ on one rank") {
    if (nranks() > 1) {
      expect_collective_error<kvmap::ValueError>(
          [&] {
            View::zeros({me == odd ? 5 : 4, 2}, DType::Float32, 0);
          },
          {odd}, "needs the same arguments on every rank");
    }
  }
  SUBCASE("ranks pass different arrays: the agreement compares their layouts") {
    if (nranks() > 1) {
      auto a = View::zeros({6, 2}, DType::Float32, 0);
      auto b = View::zeros({7, 2}, DType::Float32, 0);
      const View& mine = me == odd ? b : a;
      for (const auto& call : std::vector<std::function<void()>>{
               [&] { mine.gather(0); }, [&] { mine.allgather(); }, [&] { mine.resplit(1); },
               [&] { mine.balance(); }, [&] { kvmap::linalg::nrm2(mine); }}) {
        expect_collective_error<kvmap::ValueError>(call, {odd},
                                                   "needs the same arguments on every rank");
      }
    }
  }
  SUBCASE("linalg: operands on different communicators") {
    auto a = View::zeros({6}, DType::Float64, 0);
    auto b = View::zeros({6}, DType::Float64, 0, kvmap::Comm(MPI_COMM_SELF));
    std::vector<int> all;
    for (int r = 0; r < nranks(); ++r) all.push_back(r);
    expect_collective_error<kvmap::ValueError>([&] { kvmap::linalg::dot(a, b); }, all,
                                               "different communicators");
  }
  SUBCASE("redistribute: layout for the wrong number of ranks") {
    auto d = View::zeros({6}, DType::Float32, 0);
    const auto wrong = kvmap::Layout::balanced({6}, 0, nranks() + 1);
    std::vector<int> all;
    for (int r = 0; r < nranks(); ++r) all.push_back(r);
    expect_collective_error<kvmap::ValueError>([&] { d.redistribute(wrong); }, all,
                                               "ranks but the communicator has");
  }
  SUBCASE("redistribute: counts differ on one rank") {
    if (nranks() > 1) {
      auto d = View::zeros({6}, DType::Float32, 0);
      std::vector<int64_t> counts(nranks(), 0);
      counts[me == odd ? 0 : nranks() - 1] = 6;
      expect_collective_error<kvmap::ValueError>(
          [&] { d.redistribute(kvmap::Layout::from_counts({6}, 0, counts)); }, {odd},
          "needs the same arguments on every rank");
    }
  }
  SUBCASE("scatter: root passes an undefined tensor") {
    std::vector<int> root{0};
    expect_collective_error<kvmap::ValueError>([&] { View::scatter(at::Tensor(), 0); }, root,
                                               "undefined");
  }
  SUBCASE("the communicator stays usable after an agreed failure") {
    try {
      View::zeros({me == odd ? 5 : 4}, DType::Float32, me == odd ? 3 : 0);
    } catch (const kvmap::Error&) {
    }
    auto ok = View::arange(8, DType::Int32, 0);
    CHECK(ok.allgather().sum().item<int64_t>() == 28);
  }
}

TEST_CASE(
    "communicators: one duplicate per user communicator, shared state, no MPI when a Comm goes") {
  const int me = rank();
  const kvmap::Comm a(MPI_COMM_WORLD), b(MPI_COMM_WORLD);
  CHECK(a.raw() == b.raw());
  CHECK(a.id() == world().id());
  CHECK(kvmap::Comm::self().id() != world().id());
  for (std::uint64_t id : kvmap::Detail::transport(world()).allgather(world().id()))
    CHECK(id == world().id());
  // Making and dropping Comms of a known communicator on one rank only is local: no rank
  // waits for the others (it was an MPI_Comm_dup and an MPI_Comm_free each before).
  if (me == 0) {
    for (int i = 0; i < 100; ++i) {
      kvmap::Comm c(MPI_COMM_WORLD);
      CHECK(c.id() == world().id());
    }
  }
  // The user may free their communicator right after making a Comm of it.
  MPI_Comm raw;
  MPI_Comm_split(MPI_COMM_WORLD, 0, nranks() - 1 - me, &raw);
  kvmap::Comm reversed(raw);
  MPI_Comm_free(&raw);
  CHECK(reversed.id() != world().id());
  CHECK(reversed.rank() == nranks() - 1 - me);
  const auto ids = kvmap::Detail::transport(reversed).allgather(reversed.id());
  for (std::uint64_t id : ids) CHECK(id == reversed.id());
  auto v = View::arange(10, DType::Int64, 0, reversed);
  CHECK(bit_equal(v.allgather(), at::arange(10, at::kLong)));
  // Unseeded draws with a fresh Comm of the same communicator each time continue one stream.
  const at::Tensor first =
      kvmap::random::uniform<TestMemSpace>({8}, DType::Float64, 0, kvmap::Comm(MPI_COMM_WORLD))
          .allgather();
  const at::Tensor second =
      kvmap::random::uniform<TestMemSpace>({8}, DType::Float64, 0, kvmap::Comm(MPI_COMM_WORLD))
          .allgather();
  CHECK_FALSE(at::equal(first, second));
}
