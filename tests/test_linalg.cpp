// linalg::dot and nrm2 across ranks: every rank's part is summed exactly, so the result is
// the correctly rounded sum of the parts whatever MPI's reduction order, the same bits on every
// rank; nrm2's one pass neither over- nor underflows; and dot, nrm2, axpby against torch on
// the gathered arrays.
#include "support/kvmap_test.hpp"

#include <cmath>
#include <limits>

using namespace kvmap_test;
using kvmap::DType;

namespace {
// One element per rank: 2^60 on ranks 0, 3, 6, ...; 3 on ranks 1, 4, ...; -2^60 on 2, 5, ...
double part_of(int r) {
  const double big = std::ldexp(1.0, 60);
  return r % 3 == 0 ? big : (r % 3 == 1 ? 3.0 : -big);
}
}  // namespace

TEST_CASE("dot: the exact sum of the ranks' parts, rounded once, on every rank") {
  const int P = nranks(), me = rank();
  auto x = View::from_local(on_device(at::full({1}, part_of(me), at::kDouble)), 0);
  auto ones = View::from_local(on_device(at::ones({1}, at::kDouble)), 0);
  // The reference in 128-bit integers (every part is an integer below 2^61), rounded once by
  // the conversion to double. Summed in rank order in doubles, 2^60 + 3 - 2^60 would give 0.
  __int128 exact = 0;
  for (int r = 0; r < P; ++r) exact += static_cast<__int128>(part_of(r));
  const double expect = static_cast<double>(exact);
  const double d = kvmap::linalg::dot(x, ones);
  CHECK(d == expect);
  if (P == 3) CHECK(d == 3.0);
  for (double v : world().allgather(d)) CHECK(std::memcmp(&v, &d, sizeof d) == 0);
  // Run to run: the same bits again.
  const double again = kvmap::linalg::dot(x, ones);
  CHECK(std::memcmp(&again, &d, sizeof d) == 0);
}

TEST_CASE("dot: infinities and NaN parts decide the result") {
  const int P = nranks(), me = rank();
  const double inf = std::numeric_limits<double>::infinity();
  auto ones = View::from_local(on_device(at::ones({1}, at::kDouble)), 0);
  auto pos = View::from_local(on_device(at::full({1}, me == P - 1 ? inf : 1.0, at::kDouble)), 0);
  CHECK(kvmap::linalg::dot(pos, ones) == inf);
  auto neg = View::from_local(on_device(at::full({1}, me == 0 ? -inf : 1.0, at::kDouble)), 0);
  CHECK(kvmap::linalg::dot(neg, ones) == -inf);
  if (P > 1) {
    auto both = View::from_local(
        on_device(at::full({1}, me == 0 ? -inf : (me == 1 ? inf : 1.0), at::kDouble)), 0);
    CHECK(std::isnan(kvmap::linalg::dot(both, ones)));
  }
  // Parts whose exact sum leaves the double range: inf, as a plain sum would.
  auto huge = View::from_local(on_device(at::full({1}, 1.5e308, at::kDouble)), 0);
  CHECK(kvmap::linalg::dot(huge, ones) == (P > 1 ? inf : 1.5e308));
}

TEST_CASE("nrm2: huge and tiny elements on different ranks, one pass, no overflow") {
  const int P = nranks(), me = rank();
  // Rank 0 holds 3e300 and 4e300, the others tiny values that do not change the norm.
  const at::Tensor mine =
      me == 0 ? at::tensor({3e300, 4e300}, at::kDouble) : at::tensor({1e-300, 2e-300}, at::kDouble);
  auto x = View::from_local(on_device(mine), 0);
  CHECK(kvmap::linalg::nrm2(x) == doctest::Approx(5e300).epsilon(1e-15));
  // All tiny: the squares underflow in plain arithmetic, not here.
  auto tiny = View::from_local(on_device(at::tensor({3e-200, 4e-200}, at::kDouble)), 0);
  CHECK(kvmap::linalg::nrm2(tiny) == doctest::Approx(5e-200 * std::sqrt(P)).epsilon(1e-14));
  // Float32 extremes sum in double without scaling.
  auto f = View::from_local(on_device(at::tensor({1e38f, 2e38f}, at::kFloat)), 0);
  const double f3 = static_cast<double>(1e38f), f4 = static_cast<double>(2e38f);
  CHECK(kvmap::linalg::nrm2(f) ==
        doctest::Approx(std::sqrt(P * (f3 * f3 + f4 * f4))).epsilon(1e-14));
  const double n = kvmap::linalg::nrm2(x);
  for (double v : world().allgather(n)) CHECK(std::memcmp(&v, &n, sizeof n) == 0);
}

TEST_CASE("linalg: dot, nrm2, axpby against torch on the gathered arrays") {
  const int me = rank(), P = nranks();
  for (at::ScalarType type : {at::kFloat, at::kDouble}) {
    const at::Tensor xf = on_device(
        at::randn({5 * P + 3, 4}, at::detail::createCPUGenerator(31), at::kDouble).to(type));
    const at::Tensor yf = on_device(
        at::randn({5 * P + 3, 4}, at::detail::createCPUGenerator(32), at::kDouble).to(type));
    auto x = View::from_global(xf, 0);
    auto y = View::from_global(yf, 0);
    const double tol = type == at::kFloat ? 1e-4 : 1e-12;
    CHECK(kvmap::linalg::dot(x, y) ==
          doctest::Approx((xf.to(at::kDouble) * yf.to(at::kDouble)).sum().item<double>())
              .epsilon(tol));
    CHECK(kvmap::linalg::nrm2(x) ==
          doctest::Approx(xf.to(at::kDouble).norm().item<double>()).epsilon(tol));
    // The same value on every rank, bit for bit.
    const double d = kvmap::linalg::dot(x, y);
    for (double v : world().allgather(d)) CHECK(v == d);
    kvmap::linalg::axpby(2.0, x, -0.5, y);
    CHECK(at::allclose(y.allgather(), 2.0 * xf - 0.5 * yf, tol, tol));
    auto v1 = View::from_global(xf.select(1, 0).contiguous(), 0);
    CHECK(kvmap::linalg::nrm2(v1) ==
          doctest::Approx(xf.select(1, 0).to(at::kDouble).norm().item<double>()).epsilon(tol));
  }
  // nrm2 where squaring would over- or underflow: the reference scales in plain arithmetic
  // (every element is c times a small integer, so the norm is c times the integers' norm).
  for (double c : {1e200, 1e-200, 1e30}) {
    for (at::ScalarType type : {at::kDouble, at::kFloat}) {
      if (type == at::kFloat && c != 1e30) continue;
      const at::Tensor ints = (at::arange(3 * P + 2, on_device(at::kDouble)).remainder(5) + 1);
      auto x = View::from_global((ints * c).to(type), 0);
      // float32: the rounded elements' norm in float64, where their squares fit.
      const double expect = type == at::kFloat
                                ? (ints * c).to(type).to(at::kDouble).norm().item<double>()
                                : c * ints.norm().item<double>();
      INFO("scale " << c << " dtype " << at::toString(type));
      CHECK(kvmap::linalg::nrm2(x) == doctest::Approx(expect).epsilon(1e-12));
    }
  }
  auto zeros = View::zeros({2 * P + 1}, DType::Float64, 0);
  CHECK(kvmap::linalg::nrm2(zeros) == 0.0);
  auto with_inf = View::from_global(
      at::tensor({1.0, std::numeric_limits<double>::infinity(), 2.0}, at::kDouble).to(device()), 0);
  CHECK(std::isinf(kvmap::linalg::nrm2(with_inf)));
  // inf on one rank next to huge values on another: still inf (rescaling must not make NaN).
  auto inf_and_huge = View::from_global(
      at::tensor({std::numeric_limits<double>::infinity(), 1e300, 1e300, 1e300}, at::kDouble)
          .to(device()),
      0);
  CHECK(std::isinf(kvmap::linalg::nrm2(inf_and_huge)));
  auto with_nan = View::from_global(
      at::tensor({1.0, std::numeric_limits<double>::quiet_NaN(), 2.0}, at::kDouble).to(device()),
      0);
  CHECK(std::isnan(kvmap::linalg::nrm2(with_nan)));
  // Bad input is detected on every rank.
  auto a = View::zeros({6}, DType::Float64, 0);
  auto b = View::zeros({7}, DType::Float64, 0);
  std::vector<int> everyone;
  for (int r = 0; r < P; ++r) everyone.push_back(r);
  expect_collective_error<kvmap::ValueError>([&] { kvmap::linalg::dot(a, b); }, everyone,
                                             "equal layouts");
  auto i = View::zeros({6}, DType::Int32, 0);
  expect_collective_error<kvmap::TypeError>([&] { kvmap::linalg::nrm2(i); }, everyone,
                                            "float32 or float64");
  (void)me;
}
