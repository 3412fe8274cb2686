// kvmap::vmap's failures are raised on every rank with clear messages (each rank that
// failed raises its own error, every other rank a RemoteError naming those ranks), torch's
// batching-rule fallback warning stays visible, and every phase is a Kokkos Tools region.
#include "support/vmap_test.hpp"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include <mpi.h>

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Layout;
using kvmap::VmapOptions;

// What every errors case starts from: this rank, the rank that misbehaves, and a split array
// of two rows per rank.
struct Ranks {
  const int P = nranks(), me = rank(), odd = odd_rank();
  View x = View::zeros({2 * P, 3}, DType::Float32, 0);
};

TEST_CASE_FIXTURE(Ranks, "errors: mapped inputs that do not match, or no mapped input") {
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
}

TEST_CASE_FIXTURE(
    Ranks, "errors: out_dims that do not fit the outputs, outputs that differ between ranks") {
  SUBCASE("out_dims count differs from the outputs") {
    expect_collective_error<kvmap::ValueError>(
        [&] {
          kvmap::vmap([](const at::Tensor& a) { return std::make_tuple(a, a); },
                      VmapOptions().out_dims({0, 1, 2}))(x);
        },
        all_ranks(), "out_dims [0, 1, 2] has 3 entries but the function returned 2");
  }
  SUBCASE("one out_dim per output, exactly (torch.vmap's tuple): one for two outputs") {
    expect_collective_error<kvmap::ValueError>(
        [&] {
          kvmap::vmap([](const at::Tensor& a) { return std::make_tuple(a, a); },
                      VmapOptions().out_dims_per_output({0}))(x);
        },
        all_ranks(), "out_dims [0] has 1 entries but the function returned 2 outputs (give one");
    // The same single out_dim as a broadcast applies to both outputs.
    auto [p, q] = kvmap::vmap([](const at::Tensor& a) { return std::make_tuple(a, a); },
                              VmapOptions().out_dims({0}))(x);
    CHECK(p.gshape() == x.gshape());
    CHECK(q.gshape() == x.gshape());
  }
  SUBCASE("out_dim out of range") {
    expect_collective_error<kvmap::ValueError>(
        [&] { kvmap::vmap([](const at::Tensor& a) { return a; }, VmapOptions().out_dims({2}))(x); },
        all_ranks(), "out_dims[0] = 2 is out of range");
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
}

TEST_CASE_FIXTURE(Ranks,
                  "errors: the function throws on one rank, in any chunk; the next call works") {
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
  SUBCASE("the function throws in a later chunk, chunks in flight") {
    // 5 samples per rank, one per chunk: rank `odd` fails in its fifth call of f, a chunk
    // run by the Kokkos policy (not chunk 0), with 1 or 2 chunks in flight.
    auto five = View::from_global(at::arange(5 * P, on_device(at::kFloat)).reshape({5 * P, 1}), 0);
    // f doubles its sample and throws `message` on rank `odd` in its n-th call, one sample per
    // chunk, `conc` chunks in flight; returns how often f ran on this rank.
    auto fail_in_call = [&](int n, const char* message, int conc) {
      std::atomic<int> calls{0};
      expect_collective_error<std::runtime_error>(
          [&] {
            kvmap::vmap(
                [&](const at::Tensor& a) {
                  if (me == odd && ++calls == n) throw std::runtime_error(message);
                  return a * 2;
                },
                VmapOptions().chunk_size(1).concurrency(conc))(five);
          },
          {odd}, message);
      return calls.load();
    };
    for (int conc : {1, 2}) fail_in_call(5, "the fifth chunk failed", conc);
    auto y = kvmap::vmap([](const at::Tensor& a) { return a * 2; },
                         VmapOptions().chunk_size(2).concurrency(2))(five);
    CHECK(
        at::equal(y.allgather(), at::arange(5 * P, on_device(at::kFloat)).reshape({5 * P, 1}) * 2));
    // After a failure no further chunk starts: failing in the second of five chunks, one at a
    // time, f runs twice; with two in flight, at most the other chunk of that wave runs too.
    for (int conc : {1, 2}) {
      const int calls = fail_in_call(2, "the second chunk failed", conc);
      if (me == odd) CHECK(calls <= (conc == 1 ? 2 : 3));
    }
  }
}

TEST_CASE_FIXTURE(Ranks,
                  "errors: arguments that differ between ranks or live on another communicator") {
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
}

TEST_CASE_FIXTURE(Ranks, "errors: options are checked when set and agreed between ranks") {
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
