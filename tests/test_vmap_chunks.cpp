// kvmap::vmap with chunks in flight: concurrency > 1 gives the loop's results, and every
// chunk, on whichever thread runs it, sees the caller's grad mode, inference mode and
// randomness.
#include "support/vmap_test.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "torch_compat.hpp"

using namespace kvmap_test;
using kvmap::Randomness;
using kvmap::VmapOptions;

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
    CHECK(close(y.allgather(), ref[0], 16));  // trace(m m^T): 8-term dots, an 8-term sum
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
        CHECK(close(y.allgather(), ref[0], 4));  // sin, then an exact doubling
        // Chunks really are in flight at once where LibTorch allows it: on several threads.
        const int host_threads = Kokkos::DefaultHostExecutionSpace().concurrency();
        const bool parallel = conc > 1 && host_threads > 1 &&
                              kvmap::Detail::torch_compat::concurrent_vmap_supported();
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
      CHECK(close(got, ref[0], 4));
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
      CHECK(close(det.allgather(), ref[0], 4));
      // (v + draw) - v recovers the draw up to the rounding of the two additions.
      const at::Tensor draws = noisy.allgather() - full;
      const double slack =
          2 * kvmap::unit_roundoff(at::kDouble) * (full.abs().max().item<double>() + 1.0);
      CHECK(draws.min().item<double>() >= -slack);
      CHECK(draws.max().item<double>() < 1.0 + slack);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = i + 1; j < n; ++j)
          CHECK((draws[i] - draws[j]).abs().max().item<double>() > slack);
      }
    }
  }
}
