// kvmap::vmap's randomness: the modes (error, same, different), one collective per call in
// each, sample_uniform / sample_normal independent of ranks and chunk sizes, and per-sample
// streams counted per communicator.
#include "support/vmap_test.hpp"

#include <c10/util/Exception.h>

using namespace kvmap_test;
using kvmap::DType;
using kvmap::Randomness;
using kvmap::VmapOptions;

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
    const auto all = kvmap::Detail::transport(world()).allgather(next);
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
      std::vector<at::Tensor> dots, sines;
      for (int64_t i = 0; i < xg.size(0); ++i) {
        dots.push_back((xg[i] * wg).sum());
        sines.push_back(xg[i].sin());
      }
      CHECK(close(y0, at::stack(dots), 4));   // a 4-term dot product
      CHECK(close(y1, at::stack(sines), 4));  // sin: vectorized or not, within 2 ulp
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
