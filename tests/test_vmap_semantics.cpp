// kvmap::vmap's results against an independent reference: gather the inputs, loop over the
// samples calling the function on each one, stack. Never the code under test. Heat's F and G,
// batch lengths and layouts, split axes and out_dims, zero copy, outputs that never alias,
// nested vmaps and the device contract. (Chunks in flight: test_vmap_chunks.cpp; errors:
// test_vmap_errors.cpp; randomness: test_vmap_randomness.cpp.)
#include "support/vmap_test.hpp"

#include <atomic>

#include "torch_compat.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::VmapOptions;

namespace {

// Heat's F: (topk(svdvals(a), k).values ** 2, scale * a @ b).
struct HeatF {
  int64_t k;
  double scale;
  bool to_int;
  std::tuple<at::Tensor, at::Tensor> operator()(const at::Tensor& a, const at::Tensor& b) const {
    at::Tensor second = scale * at::matmul(a, b);
    if (to_int) second = second.to(at::kInt);
    return {std::get<0>(at::topk(at::linalg_svdvals(a), k)).pow(2), second};
  }
};

}  // namespace

TEST_CASE("Heat's F over a split 0 and b split 1 or replicated, every chunk size") {
  const int P = nranks();
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const at::Tensor a_full = randn_everywhere({5 * P, 10, 10}, type, 11);
    const at::Tensor b_full = randn_everywhere({10, 5 * P}, type, 12);
    auto a = View::from_global(a_full, 0);
    for (bool b_split : {true, false}) {
      auto b = View::from_global(b_full, b_split ? std::optional<int>(1) : std::nullopt);
      for (const std::vector<int64_t>& out_dims :
           {std::vector<int64_t>{0, 0}, std::vector<int64_t>{0, 1}})
        for (bool to_int : {false, true}) {
          const HeatF f{2, 2.2, to_int};
          const auto ref = loop_reference(5 * P, out_dims, [&](int64_t i) {
            auto [y0, y1] = f(a_full.select(0, i), b_split ? b_full.select(1, i) : b_full);
            return std::vector<at::Tensor>{y0, y1};
          });
          for (std::optional<int64_t> cs :
               {std::optional<int64_t>(), std::optional<int64_t>(1), std::optional<int64_t>(2),
                std::optional<int64_t>(3), std::optional<int64_t>(4)}) {
            INFO("dtype " << c10::toString(type) << ", b split " << b_split << ", out_dims[1] "
                          << out_dims[1] << ", int " << to_int << ", chunk " << (cs ? *cs : -1));
            auto [y0, y1] = kvmap::vmap(f, VmapOptions().out_dims(out_dims).chunk_size(cs))(a, b);
            CHECK(y0.split() == 0);
            CHECK(y1.split() == out_dims[1]);
            CHECK(y0.layout().counts() == a.layout().counts());
            // Singular values of a 10x10 matrix: LAPACK bounds their error by p(n) u sigma_max
            // with p(n) <= n^2; squared, twice that.
            CHECK(close(y0.allgather(), ref[0], 2 * 10 * 10 + 1));
            if (to_int) {
              // Truncation of nearly-integral products may differ by one ulp-driven unit.
              CHECK((y1.allgather().to(at::kLong) - ref[1].to(at::kLong))
                        .abs()
                        .max()
                        .item<int64_t>() <= 1);
              CHECK((y1.dtype() == DType::Int32));
            } else {
              CHECK(close(y1.allgather(), ref[1], 10 + 1));  // 10-term dot, then the scale
            }
          }
        }
    }
  }
}

TEST_CASE("Heat's G: one output, pass-through scalars") {
  const int P = nranks();
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const at::Tensor a_full = randn_everywhere({5 * P, 10, 10}, type, 13);
    auto a = View::from_global(a_full, 0);
    auto G = [](const at::Tensor& x, double m, double scale) { return (x - m).pow(scale); };
    const auto ref = loop_reference(5 * P, {0}, [&](int64_t i) {
      return std::vector<at::Tensor>{G(a_full.select(0, i), 2.0, 3.0)};
    });
    for (std::optional<int64_t> cs :
         {std::optional<int64_t>(), std::optional<int64_t>(1), std::optional<int64_t>(2),
          std::optional<int64_t>(3), std::optional<int64_t>(4), std::optional<int64_t>(1000)}) {
      kvmap::DistView<TestMemSpace> y = kvmap::vmap(G, VmapOptions().chunk_size(cs))(a, 2.0, 3.0);
      CHECK(close(y.allgather(), ref[0], 8));  // x - m, then a cube: 3 roundings and pow's
    }
  }
}

TEST_CASE("batch lengths not divisible by P, fewer samples than ranks, unbalanced layouts") {
  const int P = nranks();
  auto f = [](const at::Tensor& x) { return std::make_tuple(x.sin().sum(), x * 3); };
  std::vector<Layout> layouts;
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(5 * P + 1), int64_t(P > 1 ? P - 1 : 1)}) {
    layouts.push_back(Layout::balanced({n, 4}, 0, P));
  }
  std::vector<int64_t> uneven(P, 0);
  uneven[P - 1] = 6;
  if (P > 2) uneven[0] = 3;
  layouts.push_back(Layout::from_counts({P > 2 ? 9 : 6, 4}, 0, uneven));
  for (const Layout& l : layouts) {
    for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(2)}) {
      INFO(l << " chunk " << (cs ? *cs : -1));
      const int64_t n = l.gshape()[0];
      const at::Tensor full = randn_everywhere({n, 4}, at::kDouble, 14);
      auto x = View::from_global(full, 0).redistribute(l);
      auto [s, t] = kvmap::vmap(f, VmapOptions().chunk_size(cs))(x);
      const auto ref = loop_reference(n, {0}, [&](int64_t i) {
        auto [a, b] = f(full.select(0, i));
        return std::vector<at::Tensor>{a, b};
      });
      CHECK(s.layout().counts() == l.counts());
      CHECK(s.gshape() == kvmap::Shape{n});
      CHECK(close(s.allgather(), ref[0], 4 + 4));  // sin, then a 4-term sum
      CHECK(close(t.allgather(), ref[1], 1));
      // Ranks without samples still hold correctly shaped, typed, empty outputs.
      CHECK(t.local().size(0) == l.count(rank()));
      CHECK(t.local().size(1) == 4);
      CHECK((t.local().scalar_type() == at::kDouble));
      // Outputs whose dtype and per-sample shape owe nothing to the input: a rank without
      // samples can only know them from the agreement.
      auto [flags, table] = kvmap::vmap(
          [](const at::Tensor& v) {
            return std::make_tuple(
                (v > 0).sum().to(at::kInt),
                at::ones({2, 5}, v.options().dtype(at::kFloat)) * v.sum().to(at::kFloat));
          },
          VmapOptions().out_dims({0, -1}).chunk_size(cs))(x);
      CHECK((flags.dtype() == DType::Int32));
      CHECK((flags.local().scalar_type() == at::kInt));
      CHECK(flags.local().sizes() == at::IntArrayRef{l.count(rank())});
      CHECK((table.dtype() == DType::Float32));
      CHECK(table.gshape() == kvmap::Shape{2, 5, n});
      CHECK(table.split() == 2);
      CHECK(table.local().sizes() == at::IntArrayRef{2, 5, l.count(rank())});
      CHECK(at::equal(flags.allgather(), (full > 0).sum(1).to(at::kInt)));
      CHECK(close(table.allgather(),
                  at::ones({2, 5, 1}, on_device(at::kFloat)) *
                      full.sum(1).to(at::kFloat).reshape({1, 1, n}),
                  4 + 1));  // a 4-term sum, cast to float32
    }
  }
}

TEST_CASE("split axis 1 and -1, out_dims negative, three outputs with mixed dtypes") {
  const int P = nranks();
  const at::Tensor full = randn_everywhere({3, 2 * P + 1, 5}, at::kFloat, 15);
  auto f = [](const at::Tensor& x) {  // x: (3, 5) per sample
    return std::vector<at::Tensor>{x.sum(), (x > 0).to(at::kBool), x.to(at::kDouble).t()};
  };
  for (int split : {1, -2}) {
    auto x = View::from_global(full, split);
    const std::vector<int64_t> out_dims{0, -1, 1};
    auto ys = kvmap::vmap(f, VmapOptions().out_dims(out_dims).chunk_size(2))(x);
    REQUIRE(ys.size() == 3);
    const auto ref =
        loop_reference(2 * P + 1, out_dims, [&](int64_t i) { return f(full.select(1, i)); });
    CHECK(ys[1].split() == 2);  // -1 normalized for a 2-d per-sample output
    CHECK((ys[0].dtype() == DType::Float32));
    CHECK((ys[1].dtype() == DType::Bool));
    CHECK((ys[2].dtype() == DType::Float64));
    // A 15-term sum (its order is the kernel's), a comparison and a cast (exact).
    for (int k = 0; k < 3; ++k) CHECK(close(ys[k].allgather(), ref[k], 15));
  }
  // The last axis as batch axis.
  auto x = View::from_global(full, -1);
  auto y =
      kvmap::vmap([](const at::Tensor& v) { return v.cumsum(0); }, VmapOptions().out_dims({-1}))(x);
  CHECK(close(y.allgather(), full.cumsum(0), 3));
}

TEST_CASE("zero copy on the unchunked path; chunked writes into preallocated outputs") {
  const int P = nranks();
  auto x = View::from_global(randn_everywhere({4 * P, 6}, at::kDouble, 16), 0);
  kvmap::reset_stats();
  // The identity's output is the input's memory: copied once, since outputs never alias.
  auto same = kvmap::vmap([](const at::Tensor& v) { return v; })(x);
  CHECK(same.local().data_ptr() != x.local().data_ptr());
  CHECK(kvmap::stats().bytes_copied == static_cast<uint64_t>(x.local().numel() * 8));
  CHECK(at::equal(same.allgather(), x.allgather()));
  kvmap::reset_stats();
  auto doubled = kvmap::vmap([](const at::Tensor& v) { return v * 2; })(x);
  CHECK(kvmap::stats().bytes_copied == 0);
  CHECK(kvmap::stats().vmap_calls == 1);
  CHECK(kvmap::stats().chunks_run == 1);
  CHECK(at::equal(doubled.local(), x.local() * 2));
  // A per-sample constant is a stride-0 broadcast: materialized exactly once.
  kvmap::reset_stats();
  auto constant =
      kvmap::vmap([](const at::Tensor&) { return at::ones({3}, on_device(at::kFloat)); },
                  VmapOptions().out_dims({1}))(x);
  CHECK(kvmap::stats().bytes_copied == static_cast<uint64_t>(3 * x.layout().count(rank()) * 4));
  CHECK(constant.gshape() == kvmap::Shape{3, 4 * P});
  CHECK(constant.local().eq(1).all().item<bool>());
  // The same with a negative out_dim: normalized by kvmap, not by LibTorch.
  for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(3)}) {
    auto ignore = kvmap::vmap(
        [](const at::Tensor&) {
          return at::arange(6, on_device(at::kDouble)).reshape({2, 3});
        },
        VmapOptions().out_dims({-1}).chunk_size(cs))(x);
    CHECK(ignore.split() == 2);
    CHECK(ignore.gshape() == kvmap::Shape{2, 3, 4 * P});
    CHECK(
        at::equal(ignore.allgather(),
                  at::arange(6, on_device(at::kDouble)).reshape({2, 3, 1}).expand({2, 3, 4 * P})));
  }
  // Chunked: each chunk's result is written into its slice (bytes copied = output bytes).
  kvmap::reset_stats();
  auto chunked =
      kvmap::vmap([](const at::Tensor& v) { return v * 2; }, VmapOptions().chunk_size(3))(x);
  CHECK(kvmap::stats().bytes_copied == static_cast<uint64_t>(x.local().numel() * 8));
  CHECK(kvmap::stats().chunks_run == static_cast<uint64_t>((x.layout().count(rank()) + 2) / 3));
  CHECK(at::equal(chunked.local(), x.local() * 2));
  // chunk_size larger than the local batch is one chunk, adopted.
  kvmap::reset_stats();
  auto big =
      kvmap::vmap([](const at::Tensor& v) { return v + 1; }, VmapOptions().chunk_size(1 << 20))(x);
  CHECK(kvmap::stats().bytes_copied == 0);
  CHECK(at::equal(big.local(), x.local() + 1));
}

TEST_CASE("outputs never share memory with an input or with each other, chunked or not") {
  // Each case writes to every output and checks that the inputs and the other outputs kept
  // their values (compared with copies taken before the call).
  const int P = nranks();
  for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(3)}) {
    for (int64_t per_rank : {1, 2, 5}) {
      INFO("chunk size " << (cs ? std::to_string(*cs) : std::string("none")) << ", " << per_rank
                         << " samples per rank");
      const at::Tensor x_full = randn_everywhere({per_rank * P, 4}, at::kDouble, 40);
      const at::Tensor w_full = randn_everywhere({4, 3}, at::kDouble, 41);
      auto x = View::from_global(x_full, 0);
      auto w = View::from_global(w_full, std::nullopt);                // replicated: passed whole
      const at::Tensor t = randn_everywhere({2, 2}, at::kDouble, 42);  // a plain tensor argument
      const at::Tensor t_before = t.clone();
      auto unchanged = [&] {
        CHECK(at::equal(x.allgather(), x_full));
        CHECK(at::equal(w.local(), w_full));
        CHECK(at::equal(t, t_before));
      };
      // The identity.
      auto same =
          kvmap::vmap([](const at::Tensor& v) { return v; }, VmapOptions().chunk_size(cs))(x);
      same.local().fill_(-1.0);
      unchanged();
      CHECK(same.allgather().eq(-1.0).all().item<bool>());
      // A replicated input returned for every sample.
      auto whole = kvmap::vmap([](const at::Tensor&, const at::Tensor& W) { return W; },
                               VmapOptions().chunk_size(cs))(x, w);
      CHECK(at::equal(whole.allgather(), w_full.unsqueeze(0).expand({per_rank * P, 4, 3})));
      whole.local().fill_(-1.0);
      unchanged();
      // A tensor argument returned, and a view of the input.
      auto [arg, part] =
          kvmap::vmap([](const at::Tensor& v,
                         const at::Tensor& T) { return std::make_tuple(T, v.narrow(0, 1, 2)); },
                      VmapOptions().chunk_size(cs))(x, t);
      CHECK(at::equal(part.allgather(), x_full.narrow(1, 1, 2)));
      arg.local().fill_(-1.0);
      part.local().fill_(-1.0);
      unchanged();
      // One tensor returned twice.
      auto [first, second] = kvmap::vmap(
          [](const at::Tensor& v) {
            at::Tensor r = v * 2;
            return std::make_tuple(r, r);
          },
          VmapOptions().chunk_size(cs))(x);
      first.local().fill_(-1.0);
      CHECK(at::equal(second.allgather(), x_full * 2));
      unchanged();
    }
  }
}

TEST_CASE("nested vmaps inside the function keep working") {
  // What torch.vmap does inside a Python function: one more functorch level, pushed and
  // popped within f, over a non-mapped axis of each sample.
  namespace tc = kvmap::Detail::torch_compat;
  const int P = nranks();
  const at::Tensor full = randn_everywhere({2 * P + 1, 4, 3}, at::kDouble, 20);
  auto x = View::from_global(full, 0);
  auto f = [](const at::Tensor& sample) {  // sample: (4, 3)
    tc::VmapLevel inner(sample.size(0), tc::VmapRandomness::Error);
    at::Tensor rows = inner.add_batch_dim(sample, 0);                // (3,) per row
    return inner.remove_batch_dim(rows.softmax(0) * rows.sum(), 0);  // (4, 3) again
  };
  auto y = kvmap::vmap(f, VmapOptions().chunk_size(2))(x);
  const auto ref = loop_reference(2 * P + 1, {0}, [&](int64_t i) {
    const at::Tensor s = full.select(0, i);
    return std::vector<at::Tensor>{s.softmax(1) * s.sum(1, true)};
  });
  CHECK(close(y.allgather(), ref[0], 12));  // softmax of 3 (exp, 3-term sum, divide) times a sum
}

TEST_CASE("device contract: torch works on the memory space's device and Kokkos' stream") {
  const int P = nranks();
  auto x = View::from_global(randn_everywhere({3 * P, 2}, at::kFloat, 50), 0);
  // Tensors f makes on "the current device" land on the inputs' device.
  std::atomic<int> wrong_device{0};
  auto y = kvmap::vmap(
      [&](const at::Tensor& v) {
        const at::Tensor made =
            at::ones({2}, at::TensorOptions().dtype(at::kFloat).device(device().type()));
        if (made.device() != device() && !device().is_cpu()) ++wrong_device;
        if (v.device() != device()) ++wrong_device;
        return v + made;
      },
      VmapOptions().chunk_size(2))(x);
  CHECK(wrong_device.load() == 0);
  CHECK(close(y.allgather(), x.allgather() + 1, 1));
#if defined(KOKKOS_ENABLE_CUDA)
  if (std::is_same_v<TestMemSpace, Kokkos::CudaSpace>) {
    // Torch's current stream inside f is the Kokkos instance's: no fence between them.
    const Kokkos::Cuda instance;
    std::atomic<int> other_stream{0};
    kvmap::vmap([&](const at::Tensor& v) {
      if (c10::cuda::getCurrentCUDAStream().stream() != instance.cuda_stream()) ++other_stream;
      if (c10::cuda::current_device() != instance.cuda_device()) ++other_stream;
      return v * 2;
    })(x);
    CHECK(other_stream.load() == 0);
  }
#endif
  if (!device().is_cpu()) {
    // An output on another device: TypeError on the ranks that ran f, RemoteError elsewhere.
    expect_collective_error<kvmap::TypeError>(
        [&] { kvmap::vmap([](const at::Tensor& v) { return v.cpu(); })(x); }, all_ranks(),
        "is on cpu");
    // from_global of a host tensor into device memory.
    expect_collective_error<kvmap::TypeError>(
        [&] {
          View::from_global(at::zeros({4, 2}), 0);
        },
        all_ranks(), "is on cpu");
  }
}
