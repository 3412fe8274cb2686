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
  for (double v : kvmap::Detail::transport(world()).allgather(d))
    CHECK(std::memcmp(&v, &d, sizeof d) == 0);
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
  // Relative to the norm (no cancellation): a scaled sum of squares rounds about 3 times per
  // element, the allreduce once per rank, the root and the rescaling once each.
  auto within = [P](double got, double exact, std::int64_t elements) {
    const auto scalar = [](double v) { return at::full({}, v, at::kDouble); };
    return kvmap::check_close(scalar(got), scalar(exact), {3 * elements + P + 3, scalar(exact)});
  };
  CHECK(within(kvmap::linalg::nrm2(x), 5e300, 2 * P));
  // All tiny: the squares underflow in plain arithmetic, not here.
  auto tiny = View::from_local(on_device(at::tensor({3e-200, 4e-200}, at::kDouble)), 0);
  CHECK(within(kvmap::linalg::nrm2(tiny), 5e-200 * std::sqrt(P), 2 * P));
  // Float32 extremes sum in double without scaling.
  auto f = View::from_local(on_device(at::tensor({1e38f, 2e38f}, at::kFloat)), 0);
  const double f3 = static_cast<double>(1e38f), f4 = static_cast<double>(2e38f);
  CHECK(within(kvmap::linalg::nrm2(f), std::sqrt(P * (f3 * f3 + f4 * f4)), 2 * P));
  const double n = kvmap::linalg::nrm2(x);
  for (double v : kvmap::Detail::transport(world()).allgather(n))
    CHECK(std::memcmp(&v, &n, sizeof n) == 0);
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
    // Against float64 on the gathered arrays, within the bound of an n-term sum in `type`
    // (each rank's partial sum, then the allreduce's P-term sum, then the result in `type`).
    const at::Tensor x64 = xf.to(at::kCPU).to(at::kDouble), y64 = yf.to(at::kCPU).to(at::kDouble);
    const std::int64_t n = x64.numel();
    auto as_type = [&](double v) { return at::full({}, v, at::TensorOptions().dtype(type)); };
    auto f64 = [](const at::Tensor& t) { return at::full({}, t.item<double>(), at::kDouble); };
    CHECK(kvmap::check_close(as_type(kvmap::linalg::dot(x, y)), f64((x64 * y64).sum()),
                             {n + P + 1, f64((x64 * y64).abs().sum())}));
    // sqrt of a sum of squares: n + 1 roundings under the root, halved by it, the root's own.
    CHECK(kvmap::check_close(as_type(kvmap::linalg::nrm2(x)), f64(x64.norm()),
                             {n + P + 3, f64(x64.norm())}));
    // The same value on every rank, bit for bit.
    const double d = kvmap::linalg::dot(x, y);
    for (double v : kvmap::Detail::transport(world()).allgather(d)) CHECK(v == d);
    kvmap::linalg::axpby(2.0, x, -0.5, y);
    // 2x and 0.5y are exact, their sum rounds once (twice with a fused multiply-add).
    CHECK(kvmap::check_close(y.allgather(), 2.0 * x64 - 0.5 * y64,
                             {2, (2.0 * x64).abs() + (0.5 * y64).abs()}));
    auto v1 = View::from_global(xf.select(1, 0).contiguous(), 0);
    const at::Tensor v64 = x64.select(1, 0);
    CHECK(kvmap::check_close(as_type(kvmap::linalg::nrm2(v1)), f64(v64.norm()),
                             {v64.numel() + P + 3, f64(v64.norm())}));
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
      const auto scalar = [](double v) { return at::full({}, v, at::kDouble); };
      CHECK(kvmap::check_close(scalar(kvmap::linalg::nrm2(x)), scalar(expect),
                               {3 * ints.numel() + P + 3, scalar(expect)}));
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
