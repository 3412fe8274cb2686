// kvmap::vmap against an independent reference: gather the inputs, loop over the samples
// calling the function on each one, stack. Never the code under test.
#include "support/kvmap_test.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "kvmap/impl/torch_compat.hpp"
#include <torch/version.h>
#include <mpi.h>

#if defined(KOKKOS_ENABLE_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::Randomness;
using kvmap::VmapOptions;

namespace {

// Stacks per-sample outputs of `one(i)` for i in [0, n) along each output's out_dim.
std::vector<at::Tensor> loop_reference(
    std::int64_t n, std::vector<std::int64_t> out_dims,
    const std::function<std::vector<at::Tensor>(std::int64_t)>& one) {
  std::vector<std::vector<at::Tensor>> per_output;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> outs = one(i);
    per_output.resize(outs.size());
    for (std::size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(outs[k]);
  }
  std::vector<at::Tensor> stacked;
  for (std::size_t k = 0; k < per_output.size(); ++k) {
    std::int64_t d = out_dims.size() == 1 ? out_dims[0] : out_dims[k];
    if (d < 0) d += per_output[k][0].dim() + 1;
    stacked.push_back(at::stack(per_output[k], d));
  }
  return stacked;
}

// The same full tensor on every rank.
at::Tensor randn_everywhere(at::IntArrayRef shape, at::ScalarType type, std::uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return on_device(at::randn(shape, g, at::TensorOptions().dtype(at::kDouble)).to(type));
}

bool close(const at::Tensor& a, const at::Tensor& b) {
  const bool single = a.scalar_type() == at::kFloat;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::allclose(a.to(at::kDouble), b.to(at::kDouble), single ? 1e-4 : 1e-9,
                      single ? 1e-4 : 1e-9);
}

std::vector<int> all_ranks() {
  std::vector<int> r;
  for (int i = 0; i < nranks(); ++i) r.push_back(i);
  return r;
}

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
            CHECK(close(y0.allgather(), ref[0]));
            if (to_int) {
              // Truncation of nearly-integral products may differ by one ulp-driven unit.
              CHECK((y1.allgather().to(at::kLong) - ref[1].to(at::kLong))
                        .abs()
                        .max()
                        .item<int64_t>() <= 1);
              CHECK((y1.dtype() == DType::Int32));
            } else {
              CHECK(close(y1.allgather(), ref[1]));
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
      CHECK(close(y.allgather(), ref[0]));
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
      CHECK(close(s.allgather(), ref[0]));
      CHECK(close(t.allgather(), ref[1]));
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
      CHECK(close(table.allgather(), at::ones({2, 5, 1}, on_device(at::kFloat)) *
                                         full.sum(1).to(at::kFloat).reshape({1, 1, n})));
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
    for (int k = 0; k < 3; ++k) CHECK(at::equal(ys[k].allgather(), ref[k]));
  }
  // The last axis as batch axis.
  auto x = View::from_global(full, -1);
  auto y =
      kvmap::vmap([](const at::Tensor& v) { return v.cumsum(0); }, VmapOptions().out_dims({-1}))(x);
  CHECK(close(y.allgather(), full.cumsum(0)));
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

TEST_CASE("chunks in flight: concurrency > 1 gives the same result") {
  const int P = nranks();
  const at::Tensor full = randn_everywhere({9 * P, 8, 8}, at::kDouble, 17);
  auto x = View::from_global(full, 0);
  auto f = [](const at::Tensor& m) { return at::matmul(m, m.t()).trace(); };
  const auto ref = loop_reference(
      9 * P, {0}, [&](int64_t i) { return std::vector<at::Tensor>{f(full.select(0, i))}; });
  for (int conc : {1, 2, 3}) {
    kvmap::DistView<TestMemSpace> y =
        kvmap::vmap(f, VmapOptions().chunk_size(2).concurrency(conc))(x);
    CHECK(close(y.allgather(), ref[0]));
  }
}

TEST_CASE("chunks in flight run under the caller's grad mode, inference mode and randomness") {
  // Every chunk, on whichever thread runs it, sees the torch state of the thread that called
  // vmap; the values match the per-sample loop at 1, 2 and 4 chunks in flight.
  const int P = nranks();
  const int64_t n = 7 * P;
  const at::Tensor full = randn_everywhere({n, 3}, at::kDouble, 23);
  auto x = View::from_global(full, 0);
  const auto ref = loop_reference(
      n, {0}, [&](int64_t i) { return std::vector<at::Tensor>{full.select(0, i).sin() * 2}; });
  auto options = [](int conc) { return VmapOptions().chunk_size(1).concurrency(conc); };
  SUBCASE("grad mode") {
    for (int conc : {1, 2, 4}) {
      for (bool grad : {false, true}) {
        INFO("concurrency " << conc << ", grad mode " << grad);
        std::atomic<int> chunks{0}, saw_other_mode{0};
        std::mutex threads_mutex;
        std::set<std::thread::id> threads;
        auto f = [&](const at::Tensor& v) {
          ++chunks;
          if (at::GradMode::is_enabled() != grad) ++saw_other_mode;
          {
            std::lock_guard<std::mutex> lock(threads_mutex);
            threads.insert(std::this_thread::get_id());
          }
          return v.sin() * 2;
        };
        at::AutoGradMode mode(grad);
        auto y = kvmap::vmap(f, options(conc))(x);
        CHECK(chunks.load() == y.lshape()[0]);
        CHECK(saw_other_mode.load() == 0);
        CHECK(close(y.allgather(), ref[0]));
        // Chunks really are in flight at once where LibTorch allows it: on several threads.
        const int host_threads = Kokkos::DefaultHostExecutionSpace().concurrency();
        const bool parallel =
            conc > 1 && host_threads > 1 && kvmap::Impl::torch_compat::concurrent_vmap_supported();
        CHECK(threads.size() ==
              (parallel ? static_cast<std::size_t>(std::min(conc, host_threads)) : 1u));
      }
    }
  }
  SUBCASE("inference mode") {
    for (int conc : {1, 2, 4}) {
      INFO("concurrency " << conc);
      std::atomic<int> outside{0};
      auto f = [&](const at::Tensor& v) {
        if (!c10::InferenceMode::is_enabled()) ++outside;
        at::Tensor out = v.sin();
        out.mul_(2);  // in place: legal on an inference tensor only inside inference mode
        return out;
      };
      at::Tensor got;
      {
        c10::InferenceMode guard;
        got = kvmap::vmap(f, options(conc))(x).allgather();
      }
      CHECK(outside.load() == 0);
      CHECK(close(got, ref[0]));
    }
  }
  SUBCASE("different randomness") {
    // (deterministic part, v + uniform draw): the first against the loop, the draws in
    // [0, 1) and different for every sample on every rank.
    auto f = [](const at::Tensor& v) {
      return std::make_tuple(v.sin() * 2, v + at::rand({3}, v.options()));
    };
    for (int conc : {1, 2, 4}) {
      INFO("concurrency " << conc);
      at::manual_seed(42);
      auto [det, noisy] = kvmap::vmap(f, options(conc).randomness(Randomness::Different))(x);
      CHECK(close(det.allgather(), ref[0]));
      const at::Tensor draws = noisy.allgather() - full;
      CHECK(draws.min().item<double>() >= -1e-12);
      CHECK(draws.max().item<double>() < 1.0 + 1e-12);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 1; j < n; ++j) CHECK_FALSE(at::allclose(draws[i], draws[j]));
      }
    }
  }
}

TEST_CASE("randomness modes") {
  const int P = nranks(), me = rank();
  auto x = View::zeros({3 * P, 2}, DType::Float32, 0);
  auto draw = [](const at::Tensor& v) { return v + at::rand({4}, v.options()); };
  SUBCASE("error: a random op raises on every rank with torch's message") {
    // Every rank fails itself, so every rank rethrows torch's own error (c10::Error).
    for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(2)}) {
      expect_collective_error<c10::Error>(
          [&] {
            kvmap::vmap(draw,
                        VmapOptions().chunk_size(cs))(View::zeros({3 * P, 4}, DType::Float32, 0));
          },
          all_ranks(), "randomness");
    }
  }
  SUBCASE("same: identical draws for every sample on every rank, for any chunk size") {
    auto y4 = View::zeros({3 * P, 4}, DType::Float32, 0);
    at::manual_seed(1000 + me);  // different states: the runtime synchronizes them
    auto same = kvmap::vmap(draw, VmapOptions().randomness(Randomness::Same))(y4).allgather();
    CHECK(same.sub(same.select(0, 0)).abs().max().item<float>() == 0.0f);
    at::manual_seed(1000 + me);
    auto chunked =
        kvmap::vmap(draw, VmapOptions().randomness(Randomness::Same).chunk_size(2))(y4).allgather();
    CHECK(at::equal(chunked, same));
  }
  SUBCASE("different: draws differ across samples and ranks even when seeded alike") {
    auto y4 = View::zeros({3 * P, 4}, DType::Float32, 0);
    at::manual_seed(42);
    auto diff = kvmap::vmap(draw, VmapOptions().randomness(Randomness::Different))(y4).allgather();
    at::manual_seed(42);
    auto chunked =
        kvmap::vmap(draw, VmapOptions().randomness(Randomness::Different).chunk_size(2))(y4)
            .allgather();
    // All 3P rows pairwise distinct, unchunked and chunked.
    for (const at::Tensor& d : {diff, chunked}) {
      for (int64_t i = 0; i < 3 * P; ++i) {
        for (int64_t j = i + 1; j < 3 * P; ++j) CHECK_FALSE(at::equal(d[i], d[j]));
      }
    }
    // Afterwards every rank's generator is in the same state again.
    const float next = at::rand({1}, on_device(at::kFloat)).item<float>();
    const auto all = world().allgather(next);
    for (float v : all) CHECK(v == next);
  }
  (void)x;
}

TEST_CASE("one collective per call in every randomness mode, none on one rank") {
  const int P = nranks(), me = rank();
  auto x = View::from_global(pattern({3 * P + 1, 4}, at::kFloat, 11), 0);
  auto w = View::from_global(pattern({4}, at::kFloat, 12), std::nullopt);
  const at::Tensor xg = x.allgather(), wg = w.allgather();
  auto f = [](const at::Tensor& v, const at::Tensor& u) {
    return std::make_tuple((v * u).sum(), v.sin());
  };
  auto collectives_of = [&](auto&& call) {
    const std::uint64_t before = kvmap::stats().collectives;
    call();
    return kvmap::stats().collectives - before;
  };
  const std::uint64_t one = P > 1 ? 1 : 0;
  for (Randomness mode : {Randomness::Error, Randomness::Different, Randomness::Same}) {
    for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(2)}) {
      INFO("randomness " << kvmap::name(mode) << ", chunk size " << cs.value_or(0));
      std::optional<std::tuple<View, View>> out;
      at::manual_seed(5);  // every rank's generator alike: Same mode's usual case
      CHECK(collectives_of([&] {
              out = kvmap::vmap(f, VmapOptions().randomness(mode).chunk_size(cs))(x, w);
            }) == one);
      // Independent reference: the gathered arrays, one sample at a time.
      const at::Tensor y0 = std::get<0>(*out).allgather(), y1 = std::get<1>(*out).allgather();
      for (int64_t i = 0; i < xg.size(0); ++i) {
        CHECK(at::allclose(y0[i], (xg[i] * wg).sum()));
        CHECK(at::equal(y1[i], xg[i].sin()));
      }
    }
  }
  // f runs before the agreement: a failure of f on one rank is still raised on every rank,
  // within that one collective.
  if (P > 1) {
    const std::uint64_t n = collectives_of([&] {
      expect_collective_error<std::runtime_error>(
          [&] {
            kvmap::vmap([&](const at::Tensor& v) {
              if (me == 0) throw std::runtime_error("f failed on rank 0");
              return v;
            })(x);
          },
          {0}, "f failed on rank 0");
    });
    // The agreement, then (only on failure) every rank's status and fingerprint, and the
    // first failing rank's message: its length and its bytes.
    CHECK(n == 4);
  }
  // Same mode from different generator states: the agreement finds them different, rank 0's
  // state is broadcast, f runs again from it and the results are agreed: three collectives,
  // and every rank draws alike.
  at::manual_seed(100 + me);
  std::optional<View> drawn;
  const View zeros = View::zeros({3 * P + 1, 4}, DType::Float32, 0);
  CHECK(collectives_of([&] {
          drawn = kvmap::vmap([](const at::Tensor& v) { return v + at::rand({4}, v.options()); },
                              VmapOptions().randomness(Randomness::Same))(zeros);
        }) == (P > 1 ? 3u : 0u));
  const at::Tensor draws = drawn->allgather();
  for (int64_t i = 1; i < draws.size(0); ++i) CHECK(at::equal(draws[i], draws[0]));
  // Afterwards every rank's generator is in the same state: the next call needs one collective.
  CHECK(collectives_of([&] {
          (void)kvmap::vmap([](const at::Tensor& v) { return v + at::rand({4}, v.options()); },
                            VmapOptions().randomness(Randomness::Same))(x);
        }) == one);
}

TEST_CASE("sample_uniform / sample_normal do not depend on ranks or chunk sizes") {
  const int64_t n = 11;
  auto f = [](const at::Tensor& v) {
    return std::make_tuple(v + kvmap::sample_uniform({3}),
                           kvmap::sample_normal({2, 2}, at::kDouble));
  };
  auto run = [&](const kvmap::Comm& comm, std::optional<int64_t> cs) {
    kvmap::manual_seed(77, comm);
    auto x = View::zeros({n, 3}, DType::Float32, 0, comm);
    auto [u, g] = kvmap::vmap(f, VmapOptions().chunk_size(cs))(x);
    return std::make_pair(u.allgather(), g.allgather());
  };
  const auto reference = run(world(), std::nullopt);
  CHECK(reference.first.min().item<float>() >= 0.0f);
  CHECK(reference.first.max().item<float>() < 1.0f);
  CHECK_FALSE(at::equal(reference.first[0], reference.first[1]));
  for (std::optional<int64_t> cs : {std::optional<int64_t>(1), std::optional<int64_t>(3)}) {
    const auto r = run(world(), cs);
    CHECK(at::equal(r.first, reference.first));
    CHECK(at::equal(r.second, reference.second));
  }
  for_each_prefix_comm([&](const kvmap::Comm& sub) {
    for (std::optional<int64_t> cs :
         {std::optional<int64_t>(), std::optional<int64_t>(1), std::optional<int64_t>(3)}) {
      const auto r = run(sub, cs);
      CHECK(at::equal(r.first, reference.first));
      CHECK(at::equal(r.second, reference.second));
    }
  });
  CHECK_THROWS_WITH_AS(kvmap::sample_uniform({2}),
                       doctest::Contains("outside a function run by kvmap::vmap"), kvmap::Error);
}

TEST_CASE("per-sample streams are counted per communicator") {
  const int me = rank();
  auto f = [](const at::Tensor& v) { return v + kvmap::sample_uniform({2}); };
  auto x = View::zeros({5, 2}, DType::Float32, 0);
  kvmap::manual_seed(5, world());
  const at::Tensor first = kvmap::vmap(f)(x).allgather();
  const at::Tensor second_expected = kvmap::vmap(f)(x).allgather();
  CHECK_FALSE(at::equal(first, second_expected));
  // Rank 0 alone draws on its own communicator in between: the world's stream is untouched.
  kvmap::manual_seed(5, world());
  CHECK(at::equal(kvmap::vmap(f)(x).allgather(), first));
  if (me == 0) {
    auto alone = View::zeros({3, 2}, DType::Float32, 0, kvmap::Comm::self());
    (void)kvmap::vmap(f)(alone);
    (void)kvmap::random::uniform<TestMemSpace>({4}, DType::Float64, 0, kvmap::Comm::self());
  }
  CHECK(at::equal(kvmap::vmap(f)(x).allgather(), second_expected));
  // Ranks seeded differently cannot draw consistent samples: an agreed error, not silence.
  if (nranks() > 1) {
    const int odd = odd_rank();
    if (me == odd) kvmap::manual_seed(6, kvmap::Comm::self());
    expect_collective_error<kvmap::ValueError>([&] { kvmap::vmap(f)(x); }, {odd}, "seed=6");
    kvmap::manual_seed(5, world());
    CHECK(at::equal(kvmap::vmap(f)(x).allgather(), first));
  }
}

TEST_CASE("errors are raised on every rank with clear messages") {
  const int P = nranks(), me = rank(), odd = odd_rank();
  auto x = View::zeros({2 * P, 3}, DType::Float32, 0);
  SUBCASE("mapped inputs with different layouts") {
    auto y = View::zeros({2 * P + 1, 3}, DType::Float32, 0);
    auto add = [](const at::Tensor& a, const at::Tensor& b) { return a + b.sum(); };
    expect_collective_error<kvmap::ValueError>([&] { kvmap::vmap(add)(x, y); }, all_ranks(),
                                               "same batch length and the same per-rank counts");
    // The message names both layouts.
    expect_collective_error<kvmap::ValueError>(
        [&] { kvmap::vmap(add)(x, y); }, all_ranks(),
        "mapped input 0 has " + x.layout().str() + " and mapped input 1 has " + y.layout().str());
    if (P > 1) {
      // Same batch length, different per-rank counts.
      std::vector<int64_t> counts(P, 2);
      counts[0] = 3;
      counts[P - 1] = 1;
      auto z = View::zeros({2 * P, 3}, DType::Float32, 0)
                   .redistribute(Layout::from_counts({2 * P, 3}, 0, counts));
      expect_collective_error<kvmap::ValueError>(
          [&] { kvmap::vmap(add)(x, z); }, all_ranks(),
          "mapped input 0 has " + x.layout().str() + " and mapped input 1 has " + z.layout().str());
    }
  }
  SUBCASE("no mapped input") {
    auto r = View::zeros({3}, DType::Float32, std::nullopt);
    expect_collective_error<kvmap::ValueError>(
        [&] { kvmap::vmap([](const at::Tensor& a) { return a; })(r); }, all_ranks(),
        "no mapped input");
  }
  SUBCASE("out_dims count differs from the outputs") {
    expect_collective_error<kvmap::ValueError>(
        [&] {
          kvmap::vmap([](const at::Tensor& a) { return std::make_tuple(a, a); },
                      VmapOptions().out_dims({0, 1, 2}))(x);
        },
        all_ranks(), "out_dims [0, 1, 2] has 3 entries but the function returned 2");
  }
  SUBCASE("out_dim out of range") {
    expect_collective_error<kvmap::ValueError>(
        [&] { kvmap::vmap([](const at::Tensor& a) { return a; }, VmapOptions().out_dims({2}))(x); },
        all_ranks(), "out_dims[0] = 2 is out of range");
  }
  SUBCASE("the function throws on one rank only") {
    expect_collective_error<std::runtime_error>(
        [&] {
          kvmap::vmap([&](const at::Tensor& a) {
            if (me == odd) throw std::runtime_error("boom on the odd rank");
            return a;
          })(x);
        },
        {odd}, "boom on the odd rank");
    // And the next call works.
    auto y = kvmap::vmap([](const at::Tensor& a) { return a + 1; })(x);
    CHECK(y.allgather().eq(1).all().item<bool>());
  }
  SUBCASE("outputs whose per-sample shape differs between ranks") {
    if (P > 1) {
      bool threw = false;
      try {
        kvmap::vmap([&](const at::Tensor& a) { return me == odd ? a.sum() : a; })(x);
      } catch (const kvmap::ValueError& e) {
        threw = true;
        CHECK(std::string(e.what()).find("outputs differ between ranks") != std::string::npos);
      }
      CHECK(threw);
    }
  }
  SUBCASE("outputs whose dtype differs between ranks") {
    if (P > 1) {
      bool threw = false;
      try {
        kvmap::vmap([&](const at::Tensor& a) { return me == odd ? a.to(at::kDouble) : a; })(x);
      } catch (const kvmap::ValueError& e) {
        threw = true;
        const std::string what = e.what();
        CHECK(what.find("outputs differ between ranks") != std::string::npos);
        CHECK(what.find("float64") != std::string::npos);
        CHECK(what.find("float32") != std::string::npos);
      }
      CHECK(threw);
    }
  }
  SUBCASE("the function throws in a later chunk, chunks in flight") {
    // 5 samples per rank, one per chunk: rank `odd` fails in its fifth call of f, a chunk
    // run by the Kokkos policy (not chunk 0), with 1 or 2 chunks in flight.
    auto five = View::from_global(at::arange(5 * P, on_device(at::kFloat)).reshape({5 * P, 1}), 0);
    for (int conc : {1, 2}) {
      std::atomic<int> calls{0};
      expect_collective_error<std::runtime_error>(
          [&] {
            kvmap::vmap(
                [&](const at::Tensor& a) {
                  if (me == odd && ++calls == 5) throw std::runtime_error("the fifth chunk failed");
                  return a * 2;
                },
                VmapOptions().chunk_size(1).concurrency(conc))(five);
          },
          {odd}, "the fifth chunk failed");
    }
    auto y = kvmap::vmap([](const at::Tensor& a) { return a * 2; },
                         VmapOptions().chunk_size(2).concurrency(2))(five);
    CHECK(
        at::equal(y.allgather(), at::arange(5 * P, on_device(at::kFloat)).reshape({5 * P, 1}) * 2));
    // After a failure no further chunk starts: failing in the second of five chunks, one at a
    // time, f runs twice; with two in flight, at most the other chunk of that wave runs too.
    for (int conc : {1, 2}) {
      std::atomic<int> calls{0};
      expect_collective_error<std::runtime_error>(
          [&] {
            kvmap::vmap(
                [&](const at::Tensor& a) {
                  if (me == odd && ++calls == 2)
                    throw std::runtime_error("the second chunk failed");
                  return a * 2;
                },
                VmapOptions().chunk_size(1).concurrency(conc))(five);
          },
          {odd}, "the second chunk failed");
      if (me == odd) CHECK(calls.load() <= (conc == 1 ? 2 : 3));
    }
  }
  SUBCASE("ranks pass different arrays") {
    if (P > 1) {
      // Invalid on one rank only (batch lengths differ there): agreed, nothing hangs.
      auto longer = View::zeros({4 * P, 2}, DType::Float32, 0);
      expect_collective_error<kvmap::ValueError>(
          [&] {
            kvmap::vmap([](const at::Tensor& a, const at::Tensor&) { return a; })(
                x, me == odd ? longer : x);
          },
          {odd}, "same batch length");
      // Valid on every rank, but not the same arrays: the agreed signature holds the layouts.
      auto wider = View::zeros({2 * P, 4}, DType::Float32, 0);
      expect_collective_error<kvmap::ValueError>(
          [&] { kvmap::vmap([](const at::Tensor& a) { return a; })(me == odd ? wider : x); }, {odd},
          "needs the same arguments on every rank");
      // The communicator is still usable.
      CHECK(at::equal(kvmap::vmap([](const at::Tensor& a) { return a + 1; })(x).allgather(),
                      x.allgather() + 1));
    }
  }
  SUBCASE("arrays on different communicators, replicated arguments that differ") {
    auto add = [](const at::Tensor& a, const at::Tensor& b) { return a + b.sum(); };
    auto alone = View::zeros({2 * P, 3}, DType::Float32, 0, kvmap::Comm(MPI_COMM_SELF));
    expect_collective_error<kvmap::ValueError>([&] { kvmap::vmap(add)(x, alone); }, all_ranks(),
                                               "lives on another communicator");
    if (P > 1) {
      // Replicated arguments are part of the agreed signature too.
      auto r3 = View::zeros({3}, DType::Float32, std::nullopt);
      auto r4 = View::zeros({4}, DType::Float32, std::nullopt);
      expect_collective_error<kvmap::ValueError>([&] { kvmap::vmap(add)(x, me == odd ? r4 : r3); },
                                                 {odd}, "needs the same arguments on every rank");
    }
  }
  SUBCASE("options differ between ranks") {
    if (P > 1) {
      expect_collective_error<kvmap::ValueError>(
          [&] {
            kvmap::vmap([](const at::Tensor& a) { return a; },
                        VmapOptions().out_dims({me == odd ? 1 : 0}))(x);
          },
          {odd}, "needs the same arguments on every rank");
    }
  }
  SUBCASE("bad options are rejected when set") {
    CHECK_THROWS_WITH_AS(VmapOptions().chunk_size(0), doctest::Contains(">= 1"), kvmap::ValueError);
    CHECK_THROWS_WITH_AS(VmapOptions().concurrency(0), doctest::Contains("expected >= 1, got 0"),
                         kvmap::ValueError);
    CHECK_THROWS_WITH_AS(VmapOptions().out_dims({}), doctest::Contains("give at least one dim"),
                         kvmap::ValueError);
  }
}

TEST_CASE("torch's batching-rule fallback warning stays visible") {
  struct Capture : c10::WarningHandler {
    std::vector<std::string> messages;
#if TORCH_VERSION_MAJOR >= 2
    void process(const c10::Warning& w) override {
      messages.push_back(w.msg());
    }
#else
    void process(const c10::SourceLocation&, const std::string& msg, const bool) override {
      messages.push_back(msg);
    }
#endif
  } capture;
#if TORCH_VERSION_MAJOR >= 2
  c10::WarningUtils::WarningHandlerGuard guard(&capture);
#else
  c10::Warning::WarningHandlerGuard guard(&capture);
#endif
  auto x = View::from_global(randn_everywhere({2 * nranks(), 5}, at::kFloat, 18), 0);
  kvmap::DistView<TestMemSpace> h =
      kvmap::vmap([](const at::Tensor& v) { return at::histc(v, 3); })(x);
  bool seen = false;
  for (const auto& m : capture.messages)
    seen = seen || m.find("batching rule") != std::string::npos;
  CHECK(seen);
  CHECK(h.gshape() == kvmap::Shape{2 * nranks(), 3});
}

namespace {
std::vector<std::string>* g_regions = nullptr;
void record_region(const char* name) {
  if (g_regions) g_regions->push_back(name);
}
void ignore_pop() {}
}  // namespace

TEST_CASE("every phase is a Kokkos Tools region") {
  std::vector<std::string> regions;
  g_regions = &regions;
  Kokkos::Tools::Experimental::set_push_region_callback(record_region);
  Kokkos::Tools::Experimental::set_pop_region_callback(ignore_pop);
  auto x = View::zeros({3 * nranks(), 2}, DType::Float64, 0);
  kvmap::DistView<TestMemSpace> y =
      kvmap::vmap([](const at::Tensor& v) { return v + 1; }, VmapOptions().chunk_size(2))(x);
  Kokkos::Tools::Experimental::set_push_region_callback(nullptr);
  Kokkos::Tools::Experimental::set_pop_region_callback(nullptr);
  g_regions = nullptr;
  for (const char* phase : {"kvmap::vmap", "kvmap::vmap/validate", "kvmap::vmap/chunk",
                            "kvmap::vmap/agree", "kvmap::vmap/assemble"}) {
    CHECK_MESSAGE(std::find(regions.begin(), regions.end(), phase) != regions.end(), phase);
  }
  CHECK(y.allgather().eq(1).all().item<bool>());
}

TEST_CASE("nested vmaps inside the function keep working") {
  // What torch.vmap does inside a Python function: one more functorch level, pushed and
  // popped within f, over a non-mapped axis of each sample.
  namespace tc = kvmap::Impl::torch_compat;
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
  CHECK(close(y.allgather(), ref[0]));
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
  CHECK(close(y.allgather(), x.allgather() + 1));
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
