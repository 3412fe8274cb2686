// kvmap::map_batches (f on each chunk's plain batched tensors) and empty batches (vmap and
// map_batches over 0 samples), against independent references: the direct batched call on
// the gathered data, per-sample loops, analytic gradients, torch's own shapes.
#include "support/vmap_test.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <atomic>
#include <mutex>

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::Randomness;
using kvmap::VmapOptions;

namespace {

std::vector<std::optional<int64_t>> chunk_sizes() {
  return {std::nullopt, std::optional<int64_t>(1), std::optional<int64_t>(2),
          std::optional<int64_t>(3), std::optional<int64_t>(1000)};
}

// Layouts of n samples: balanced, fewer samples than ranks, all on the last rank.
std::vector<Layout> layouts_of(int64_t n, int64_t width) {
  const int P = nranks();
  std::vector<Layout> out{Layout::balanced({n, width}, 0, P)};
  if (P > 1) {
    std::vector<int64_t> counts(P, 0);
    counts[P - 1] = n;
    out.push_back(Layout::from_counts({n, width}, 0, counts));
  }
  return out;
}

}  // namespace

TEST_CASE("map_batches: the direct batched call on the gathered data, any chunking and layout") {
  const int P = nranks();
  // A batched model: two outputs, one with a dtype of its own; w is passed whole.
  auto model = [](const at::Tensor& x, const at::Tensor& w) {
    return std::make_tuple(at::tanh(at::matmul(x, w)), x.sum(1).to(at::kFloat));
  };
  for (int64_t n : {int64_t(1), int64_t(5 * P + 1)}) {
    const at::Tensor full = randn_everywhere({n, 4}, at::kDouble, 21);
    const at::Tensor w_full = randn_everywhere({4, 3}, at::kDouble, 22);
    auto w = View::from_global(w_full, std::nullopt);
    const auto [ref0, ref1] = model(full, w_full);
    for (const Layout& l : layouts_of(n, 4)) {
      auto x = View::from_global(full, 0).redistribute(l);
      for (std::optional<int64_t> cs : chunk_sizes())
        for (int conc : {1, 2})
          for (const std::vector<int64_t>& dims :
               {std::vector<int64_t>{0}, std::vector<int64_t>{1, 0},
                std::vector<int64_t>{-1, -1}}) {
            INFO(l << " chunk " << (cs ? *cs : -1) << " concurrency " << conc << " out_dims[0] "
                   << dims[0]);
            auto [y0, y1] = kvmap::map_batches(
                model, VmapOptions().out_dims(dims).chunk_size(cs).concurrency(conc))(x, w);
            const int64_t d0 = dims[0] < 0 ? 1 : dims[0];
            CHECK(y0.split() == d0);
            CHECK(y1.split() == 0);
            CHECK(y0.layout().counts() == l.counts());
            CHECK((y1.dtype() == DType::Float32));
            CHECK(close(y0.allgather(), ref0.movedim(0, d0), 4 + 4));  // 4-term dot, tanh
            CHECK(close(y1.allgather(), ref1, 4 + 1));  // 4-term sum, cast to float32
          }
    }
  }
}

TEST_CASE("map_batches: inputs split along another axis arrive batch axis first") {
  const int P = nranks();
  const at::Tensor full = randn_everywhere({3, 2 * P + 1, 5}, at::kFloat, 23);
  auto x = View::from_global(full, 1);
  for (std::optional<int64_t> cs : chunk_sizes()) {
    auto y = kvmap::map_batches(
        [](const at::Tensor& b) {
          // [chunk, 3, 5], a view of the shard
          CHECK(b.size(1) == 3);
          CHECK(b.size(2) == 5);
          return b.sum(2);
        },
        VmapOptions().out_dims({1}).chunk_size(cs))(x);
    CHECK(y.split() == 1);
    CHECK(close(y.allgather(), full.sum(2), 5));
  }
}

TEST_CASE("map_batches: zero copy unchunked, no output shares memory with an input or another") {
  const int P = nranks();
  auto x = View::from_global(randn_everywhere({4 * P, 6}, at::kDouble, 24), 0);
  kvmap::reset_stats();
  const void* seen = nullptr;
  auto doubled = kvmap::map_batches([&](const at::Tensor& b) {
    seen = b.data_ptr();
    return b * 2;
  })(x);
  CHECK(seen == x.local().data_ptr());  // f saw the shard itself
  CHECK(kvmap::stats().bytes_copied == 0);
  CHECK(at::equal(doubled.local(), x.local() * 2));
  for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(3)}) {
    auto [a, b] = kvmap::map_batches([](const at::Tensor& v) { return std::make_tuple(v, v); },
                                     VmapOptions().chunk_size(cs))(x);
    CHECK(a.local().data_ptr() != x.local().data_ptr());
    CHECK(b.local().data_ptr() != a.local().data_ptr());
    CHECK(at::equal(a.allgather(), x.allgather()));
    CHECK(at::equal(b.allgather(), x.allgather()));
  }
}

TEST_CASE("map_batches: sample_uniform / sample_normal give vmap's per-sample values") {
  const int64_t n = 11;
  auto per_sample = [](const at::Tensor& v) {  // in call order: uniform, then normal
    at::Tensor u = kvmap::sample_uniform({3});
    at::Tensor g = kvmap::sample_normal({2, 2}, at::kDouble);
    return std::make_tuple(v + u, g);
  };
  auto batched = [](const at::Tensor& b) {
    at::Tensor u = kvmap::sample_uniform({3});
    at::Tensor g = kvmap::sample_normal({2, 2}, at::kDouble);
    CHECK(u.sizes() == at::IntArrayRef{b.size(0), 3});
    CHECK(g.sizes() == at::IntArrayRef{b.size(0), 2, 2});
    return std::make_tuple(b + u, g);
  };
  auto x_of = [&](const kvmap::Comm& comm) { return View::zeros({n, 3}, DType::Float32, 0, comm); };
  kvmap::manual_seed(77, world());
  auto [ru, rg] = kvmap::vmap(per_sample)(x_of(world()));
  const at::Tensor ref_u = ru.allgather(), ref_g = rg.allgather();
  for_each_prefix_comm([&](const kvmap::Comm& sub) {
    for (std::optional<int64_t> cs : chunk_sizes())
      for (int conc : {1, 2}) {
        kvmap::manual_seed(77, sub);
        auto [u, g] =
            kvmap::map_batches(batched, VmapOptions().chunk_size(cs).concurrency(conc))(x_of(sub));
        CHECK(at::equal(u.allgather(), ref_u));
        CHECK(at::equal(g.allgather(), ref_g));
      }
  });
  CHECK_THROWS_WITH_AS(kvmap::sample_normal({2}),
                       doctest::Contains("outside a function run by kvmap::vmap or "
                                         "kvmap::map_batches"),
                       kvmap::Error);
}

TEST_CASE("map_batches: autograd inside f, under the caller's grad mode") {
  const int P = nranks();
  const at::Tensor full = randn_everywhere({3 * P + 2, 3}, at::kDouble, 25);
  auto x = View::from_global(full, 0);
  // Per-particle energy e(x) = |x|^2 / 2 + sum(sin x); forces -de/dx = -(x + cos x).
  auto energy_and_forces = [](const at::Tensor& b) {
    at::AutoGradMode on(true);
    at::Tensor xg = b.detach().requires_grad_(true);
    at::Tensor e = 0.5 * xg.pow(2).sum(1) + xg.sin().sum(1);
    at::Tensor g = torch::autograd::grad({e.sum()}, {xg})[0];
    return std::make_tuple(e, -g);
  };
  for (std::optional<int64_t> cs : chunk_sizes())
    for (int conc : {1, 2}) {
      auto [e, forces] =
          kvmap::map_batches(energy_and_forces, VmapOptions().chunk_size(cs).concurrency(conc))(x);
      // Squares and a 3-term sum, sines (4) and a 3-term sum, their sum: 4 + 3 + 1.
      CHECK(close(e.allgather(), 0.5 * full.pow(2).sum(1) + full.sin().sum(1), 8));
      CHECK(close(forces.allgather(), -(full + full.cos()), 4 + 1));
    }
  // f sees the caller's grad mode in every chunk, in flight or not.
  for (bool grad : {false, true}) {
    at::AutoGradMode mode(grad);
    std::mutex m;
    std::vector<bool> modes;
    (void)kvmap::map_batches(
        [&](const at::Tensor& b) {
          std::lock_guard<std::mutex> lock(m);
          modes.push_back(at::GradMode::is_enabled());
          return b + 1;
        },
        VmapOptions().chunk_size(1).concurrency(2))(x);
    CHECK(modes.size() == static_cast<std::size_t>(x.layout().count(rank())));
    for (bool seen : modes) CHECK(seen == grad);
  }
}

TEST_CASE("map_batches: errors on every rank") {
  const int P = nranks(), me = rank(), odd = odd_rank();
  auto x = View::zeros({2 * P, 3}, DType::Float32, 0);
  SUBCASE("an output whose first axis is not the chunk length, on one rank") {
    for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(1)}) {
      expect_collective_error<kvmap::ValueError>(
          [&] {
            kvmap::map_batches([&](const at::Tensor& b) { return me == odd ? b.sum(0) : b * 2; },
                               VmapOptions().chunk_size(cs))(x);
          },
          {odd}, "its first axis must be the chunk length");
    }
    expect_collective_error<kvmap::ValueError>(
        [&] { kvmap::map_batches([](const at::Tensor& b) { return b.sum(); })(x); }, all_ranks(),
        "kvmap::map_batches: output 0 of the function has shape []");
  }
  SUBCASE("randomness is vmap's") {
    for (Randomness r : {Randomness::Same, Randomness::Different}) {
      expect_collective_error<kvmap::ValueError>(
          [&] {
            kvmap::map_batches([](const at::Tensor& b) { return b; },
                               VmapOptions().randomness(r))(x);
          },
          all_ranks(), "applies to kvmap::vmap only");
    }
  }
  SUBCASE("the function throws on one rank; the next call works") {
    expect_collective_error<std::runtime_error>(
        [&] {
          kvmap::map_batches([&](const at::Tensor& b) {
            if (me == odd) throw std::runtime_error("model failed on the odd rank");
            return b;
          })(x);
        },
        {odd}, "model failed on the odd rank");
    CHECK(kvmap::map_batches([](const at::Tensor& b) { return b + 1; })(x)
              .allgather()
              .eq(1)
              .all()
              .item<bool>());
  }
}

TEST_CASE("empty batches: f runs once on 0 samples, as torch.vmap, and the result is empty") {
  for (int64_t split : {0, 1}) {
    const at::Tensor empty = split == 0 ? at::zeros({0, 4}, on_device(at::kFloat))
                                        : at::zeros({4, 0}, on_device(at::kFloat));
    auto x = View::from_global(empty, static_cast<int>(split));
    auto w = View::from_global(randn_everywhere({4, 3}, at::kDouble, 26), std::nullopt);
    for (std::optional<int64_t> cs : {std::optional<int64_t>(), std::optional<int64_t>(2)}) {
      INFO("split " << split << " chunk " << (cs ? *cs : -1));
      // torch.vmap(lambda v: v * 2 + 1)(zeros(0, 4)).shape == [0, 4]; v.sum() gives [0].
      auto [a, s, m] = kvmap::vmap(
          [](const at::Tensor& v, const at::Tensor& wt) {
            return std::make_tuple(v * 2 + 1, v.sum(), at::matmul(v.to(at::kDouble), wt));
          },
          VmapOptions().chunk_size(cs).out_dims({0, 0, 1}))(x, w);
      CHECK(a.gshape() == kvmap::Shape{0, 4});
      CHECK(a.split() == 0);
      CHECK(s.gshape() == kvmap::Shape{0});
      CHECK(m.gshape() == kvmap::Shape{3, 0});
      CHECK(m.split() == 1);
      CHECK((m.dtype() == DType::Float64));
      CHECK(a.local().numel() == 0);
      CHECK(a.allgather().sizes() == at::IntArrayRef{0, 4});
      // map_batches: the model sees [0, 4] and returns [0, ...].
      auto [ba, bs] = kvmap::map_batches(
          [](const at::Tensor& b) {
            CHECK(b.sizes() == at::IntArrayRef{0, 4});
            return std::make_tuple(b * 2 + 1, b.sum(1).to(at::kInt));
          },
          VmapOptions().chunk_size(cs))(x);
      CHECK(ba.gshape() == kvmap::Shape{0, 4});
      CHECK(bs.gshape() == kvmap::Shape{0});
      CHECK((bs.dtype() == DType::Int32));
      // Outputs of empty batches are new DistViews too: usable in the next call.
      auto again = kvmap::vmap([](const at::Tensor& v) { return v + 1; })(ba);
      CHECK(again.gshape() == kvmap::Shape{0, 4});
    }
    // A function that cannot run on an empty batch: its error, agreed (every rank ran f).
    expect_collective_error<c10::Error>(
        [&] { kvmap::map_batches([](const at::Tensor& b) { return std::get<0>(b.max(0)); })(x); },
        all_ranks(), "max");
  }
}
