// Chunks sized by memory (chunk_size(auto_chunk) under a memory budget), chunks run again in
// halves when f runs out of memory, and fixed-shape chunks (pad_to_chunk) for programs made
// for one batch size. References: the per-sample loop or the whole batch at once, on the
// gathered inputs; memory: the allocator's own count (MemoryMeter), not kvmap's probe.
#include "memory_meter.hpp"
#include "support/vmap_test.hpp"

#include <c10/util/Exception.h>
#include <torch/jit.h>
#include <torch/script.h>

#include <new>
#include <optional>

using namespace kvmap_test;
using kvmap::VmapOptions;

TEST_CASE("chunk_size(auto_chunk): the chosen chunk fits the budget, measured independently") {
  // The meter is torch's allocator's count (a counting CPU allocator on the host, the CUDA
  // caching allocator's statistics on a GPU), not kvmap's probe.
  if (!kvmap::Detail::MemoryMeter::supported(device())) {
    MESSAGE("no independent memory measurement on " << device().str() << " in this build");
    return;
  }
  // What f costs per sample: D * kCopies float32 values live at once, twice (the expanded
  // copy and its double), 1 MiB: the budgets below allow fewer samples per chunk than the
  // host's cache preference ever cuts a chunk to (16), so the budget alone decides.
  constexpr std::int64_t kD = 32, kCopies = 4096;
  auto footprint_f = [](const at::Tensor& xi) {
    const at::Tensor wide = xi.unsqueeze(-1).expand({kD, kCopies}).contiguous();
    return (wide * 2.0).sum();
  };
  // The same as a batched function, for map_batches.
  auto footprint_batch = [](const at::Tensor& xs) {
    const at::Tensor wide = xs.unsqueeze(-1).expand({xs.size(0), kD, kCopies}).contiguous();
    return (wide * 2.0).sum({1, 2});
  };
  const int P = nranks();
  const std::int64_t n = 100 * P;
  const at::Tensor full = randn_everywhere({n, kD}, at::kFloat, 31);
  auto x = View::from_global(full, 0);
  const std::int64_t per_sample = 2 * kD * kCopies * 4;
  // Two chunks in flight share the budget (where the host space has two threads; map_batches,
  // which runs chunks at once on every LibTorch).
  struct Case {
    std::int64_t budget;
    int in_flight;
    bool batched;
  };
  for (const Case& cs : {Case{4 << 20, 1, false}, Case{12 << 20, 1, false}, Case{12 << 20, 1, true},
                         Case{12 << 20, 2, true}}) {
    const std::int64_t budget = cs.budget;
    CAPTURE(budget);
    CAPTURE(cs.in_flight);
    CAPTURE(cs.batched);
    std::optional<kvmap::DistView<TestMemSpace>> y;
    std::int64_t peak = 0;
    {
      kvmap::Detail::MemoryMeter meter(device());
      kvmap::reset_stats();
      const auto options = VmapOptions()
                               .chunk_size(kvmap::auto_chunk)
                               .memory_budget(budget)
                               .concurrency(cs.in_flight);
      y = cs.batched ? kvmap::map_batches(footprint_batch, options)(x)
                     : kvmap::vmap(footprint_f, options)(x);
      Kokkos::fence();
      peak = meter.peak_bytes();
    }
    const kvmap::Stats s = kvmap::stats();
    CAPTURE(s.auto_chunk_size);
    CAPTURE(s.auto_bytes_per_sample);
    CAPTURE(peak);
    // The measure is at least the temporaries, the choice fills the budget with them.
    CHECK(s.auto_bytes_per_sample >= per_sample);
    CHECK(s.auto_bytes_per_sample <= per_sample * 3 / 2);
    CHECK(s.auto_chunk_size >= 1);
    CHECK(s.auto_chunk_size * s.auto_bytes_per_sample <= budget);
    CHECK(s.auto_chunk_size >= budget / per_sample / 2 / cs.in_flight);
    CHECK(s.auto_chunk_size < 100);  // chunked indeed
    CHECK(peak <= budget + budget / 10);
    // 2 x (a 512-term sum of copies of a 32-term sum) in float32, against float64.
    const at::Tensor ref = full.to(at::kDouble).sum(1) * (2.0 * kCopies);
    CHECK(close(y->allgather(), ref.to(at::kFloat), kD * kCopies + 2));
  }
}

TEST_CASE("out of memory above a chunk length, on one rank: halves until it fits") {
  const int P = nranks();
  const int victim = P - 1;
  const std::int64_t n = 37 * P;
  const at::Tensor full = randn_everywhere({n, 5}, at::kFloat, 41);
  auto x = View::from_global(full, 0);
  // f of one sample and of a batch that "run out of memory" on `victim` above 5 samples, as
  // torch's allocators say it (c10::OutOfMemoryError) and as the C++ runtime does.
  auto per_sample = [&](const at::Tensor& xi) {
    if (rank() == victim && kvmap::chunk_rows() > 5) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "injected: ", kvmap::chunk_rows(), " samples");
    }
    return xi * 3.0f + 1.0f;
  };
  auto batched = [&](const at::Tensor& xs) {
    if (rank() == victim && kvmap::chunk_rows() > 5) throw std::bad_alloc();
    return xs * 3.0f + 1.0f;
  };
  const at::Tensor ref = full * 3.0f + 1.0f;  // exact in float32 either way
  for (int conc : {1, 2}) {
    for (std::int64_t cs : {16, 37}) {
      CAPTURE(conc);
      CAPTURE(cs);
      kvmap::reset_stats();
      auto y = kvmap::vmap(per_sample, VmapOptions().chunk_size(cs).concurrency(conc))(x);
      const std::uint64_t retries = kvmap::stats().chunk_retries;
      auto z = kvmap::map_batches(batched, VmapOptions().chunk_size(cs).concurrency(conc))(x);
      CHECK(at::equal(y.allgather(), ref));
      CHECK(at::equal(z.allgather(), ref));
      // 16 -> 8 -> 4: two splits per chunk of 16 (and of the 5 left over, none); 37 -> ...
      if (rank() == victim) {
        CHECK(retries >= 2);
      } else {
        CHECK(retries == 0);
      }
    }
  }
  // chunk_size(auto_chunk) too: the second probe (as many samples as the first allows, all
  // 36 left) halves until it fits, and what fitted is the chunk size from then on.
  kvmap::reset_stats();
  auto a = kvmap::vmap(per_sample,
                       VmapOptions().chunk_size(kvmap::auto_chunk).memory_budget(1 << 30))(x);
  CHECK(at::equal(a.allgather(), ref));
  const kvmap::Stats s = kvmap::stats();
  if (rank() == victim) {
    CHECK(s.chunk_retries >= 3);  // 36 -> 18 -> 9 -> 4 or 5
    CHECK(s.auto_chunk_size <= 5);
    CHECK(s.auto_chunk_size >= 4);
  } else {
    CHECK(s.chunk_retries == 0);
  }
}

TEST_CASE("one sample that does not fit is an error on every rank") {
  const int P = nranks();
  const int victim = P - 1;
  auto x = View::from_global(randn_everywhere({6 * P, 3}, at::kFloat, 43), 0);
  auto f = [&](const at::Tensor& xi) {
    if (rank() == victim) TORCH_CHECK_WITH(OutOfMemoryError, false, "injected: no sample fits");
    return xi + 1.0f;
  };
  expect_collective_error<c10::OutOfMemoryError>(
      [&] { kvmap::vmap(f, VmapOptions().chunk_size(4))(x); }, {victim}, "no sample fits");
  // The next call works.
  auto y = kvmap::vmap([](const at::Tensor& xi) { return xi + 1.0f; })(x);
  CHECK(y.gshape() == x.gshape());
}

TEST_CASE("pad_to_chunk: a program made for 64 rows, at every batch size from 1 to 200") {
  // A TorchScript function that accepts only batches of exactly 64 rows (as a program exported
  // with a static batch does) and a C++ function that checks the same and chunk_rows().
  auto unit = torch::jit::compile(R"JIT(
def f(x: Tensor) -> Tensor:
    assert x.size(0) == 64, "made for 64 rows"
    return torch.tanh(x) * 2.0 + x.sum(1, keepdim=True)
)JIT");
  std::atomic<std::int64_t> padded_calls{0};
  auto scripted = [&](const at::Tensor& xs) {
    const std::int64_t real = kvmap::chunk_rows();
    if (real < xs.size(0)) {
      ++padded_calls;
      // The padding repeats the chunk's last real row.
      CHECK(at::equal(xs.narrow(0, real, xs.size(0) - real),
                      xs.narrow(0, real - 1, 1).expand({xs.size(0) - real, xs.size(1)})));
    }
    return unit->get_function("f")({xs}).toTensor();
  };
  const int P = nranks();
  for (std::int64_t n = 1; n <= 200; ++n) {
    CAPTURE(n);
    const at::Tensor full =
        randn_everywhere({n, 6}, at::kFloat, 50 + static_cast<std::uint64_t>(n));
    auto x = View::from_global(full, 0);
    auto y = kvmap::map_batches(scripted, VmapOptions().chunk_size(64).pad_to_chunk())(x);
    const at::Tensor ref = at::tanh(full) * 2.0 + full.sum(1, true);
    // tanh (4), the scale, a 6-term sum and the addition.
    CHECK(close(y.allgather(), ref, 4 + 1 + 6 + 1));
    CHECK(y.lshape_map() == x.lshape_map());
  }
  CHECK(padded_calls.load() > 0);
  (void)P;
  // Without padding the same program fails on a short chunk: the check above is real.
  auto x = View::from_global(randn_everywhere({3 * nranks(), 6}, at::kFloat, 60), 0);
  CHECK_THROWS(kvmap::map_batches(scripted, VmapOptions().chunk_size(64))(x));
}

TEST_CASE("pad_to_chunk: out of memory cannot shrink a padded chunk; where pad_to_chunk applies") {
  auto x = View::from_global(randn_everywhere({10 * nranks(), 2}, at::kFloat, 61), 0);
  const int victim = nranks() - 1;
  auto f = [&](const at::Tensor& xs) {
    if (rank() == victim) throw std::bad_alloc();
    return xs * 2.0f;
  };
  expect_collective_error<kvmap::OutOfMemoryError>(
      [&] { kvmap::map_batches(f, VmapOptions().chunk_size(8).pad_to_chunk())(x); }, {victim},
      "use a smaller chunk_size (e.g. 4)");
  expect_collective_error<kvmap::ValueError>(
      [&] {
        kvmap::vmap([](const at::Tensor& a) { return a; },
                    VmapOptions().chunk_size(4).pad_to_chunk())(x);
      },
      all_ranks(), "pad_to_chunk applies to kvmap::map_batches only");
  expect_collective_error<kvmap::ValueError>(
      [&] {
        kvmap::map_batches([](const at::Tensor& a) { return a; }, VmapOptions().pad_to_chunk())(x);
      },
      all_ranks(), "pad_to_chunk needs a chunk size");
  CHECK_THROWS_AS(VmapOptions().memory_budget(0), kvmap::ValueError);
}
