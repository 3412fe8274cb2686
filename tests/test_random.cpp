// kvmap::random: arrays that do not depend on the number of ranks (every prefix
// sub-communicator builds the same bits), their moments, the streams of unseeded calls, and
// the Philox4x32-10 generator against its published known-answer vectors.
#include "support/kvmap_test.hpp"
#include "philox.hpp"

#include <cmath>

using namespace kvmap_test;
using kvmap::DType;

TEST_CASE("random arrays do not depend on the number of ranks") {
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO("dtype " << kvmap::name(dt));
    const at::Tensor u =
        kvmap::random::uniform<TestMemSpace>({37, 3}, dt, 0, world(), 1234).allgather();
    const at::Tensor n =
        kvmap::random::normal<TestMemSpace>({37, 3}, dt, 1, world(), 99).allgather();
    // The same arrays built by every prefix sub-communicator {0..k-1}, k = 1..P.
    for_each_prefix_comm([&](const kvmap::Comm& sub) {
      CHECK(bit_equal(kvmap::random::uniform<TestMemSpace>({37, 3}, dt, 1, sub, 1234).allgather(),
                      u));
      CHECK(bit_equal(kvmap::random::normal<TestMemSpace>({37, 3}, dt, 0, sub, 99).allgather(), n));
    });
    CHECK(u.min().item<double>() >= 0.0);
    CHECK(u.max().item<double>() < 1.0);
    CHECK_FALSE(bit_equal(
        u, kvmap::random::uniform<TestMemSpace>({37, 3}, dt, 0, world(), 1235).allgather()));
  }
  // Moments of a large sample.
  const at::Tensor big =
      kvmap::random::uniform<TestMemSpace>({200000}, DType::Float64, 0, world(), 7).allgather();
  CHECK(big.mean().item<double>() == doctest::Approx(0.5).epsilon(0.01));
  CHECK(big.var().item<double>() == doctest::Approx(1.0 / 12).epsilon(0.02));
  const at::Tensor gauss =
      kvmap::random::normal<TestMemSpace>({200000}, DType::Float64, 0, world(), 8).allgather();
  CHECK(std::abs(gauss.mean().item<double>()) < 0.01);
  CHECK(gauss.std().item<double>() == doctest::Approx(1.0).epsilon(0.01));
  // Unseeded calls draw fresh streams, identically on every rank after manual_seed.
  kvmap::manual_seed(5);
  const at::Tensor first = kvmap::random::uniform<TestMemSpace>({8}, DType::Float64, 0).allgather();
  const at::Tensor second =
      kvmap::random::uniform<TestMemSpace>({8}, DType::Float64, 0).allgather();
  CHECK_FALSE(bit_equal(first, second));
  kvmap::manual_seed(5);
  CHECK(bit_equal(kvmap::random::uniform<TestMemSpace>({8}, DType::Float64, 0).allgather(), first));
  CHECK_THROWS_AS(kvmap::random::uniform<TestMemSpace>({8}, DType::Int32, 0), kvmap::TypeError);
}

TEST_CASE("Philox4x32-10 matches the published known-answer vectors") {
  using kvmap::Detail::philox4x32;
  auto r0 = philox4x32(0, 0, 0);
  CHECK(r0.v[0] == 0x6627e8d5u);
  CHECK(r0.v[1] == 0xe169c58du);
  CHECK(r0.v[2] == 0xbc57ac4cu);
  CHECK(r0.v[3] == 0x9b00dbd8u);
  auto r1 = philox4x32(~0ull, ~0ull, ~0ull);
  CHECK(r1.v[0] == 0x408f276du);
  CHECK(r1.v[1] == 0x41c83b0eu);
  CHECK(r1.v[2] == 0xa20bc7c6u);
  CHECK(r1.v[3] == 0x6d5451fdu);
  auto r2 = philox4x32(0x85a308d3243f6a88ull, 0x0370734413198a2eull, 0x299f31d0a4093822ull);
  CHECK(r2.v[0] == 0xd16cfe09u);
  CHECK(r2.v[1] == 0x94fdccebu);
  CHECK(r2.v[2] == 0x5001e420u);
  CHECK(r2.v[3] == 0x24126ea1u);
}
