// check_close: error bounds that hold for every summation order, and still catch real errors.
// The data are exact float32 values made by an integer generator and summed by this file's own
// loops, so every case is the same on every CPU (no BLAS or ATen kernel picks an order here).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <ATen/ATen.h>
#include <c10/util/Logging.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kvmap/error.hpp"
#include "kvmap/tolerance.hpp"

namespace {

// 64 float32 terms in [-2, 2) (multiples of 2^-22, so exact), the last one chosen so that the
// exact sum is near -0.007: a value near zero made of terms of order one, like tanh(x@W).sum(-1)
// at the sample that failed the old check.
std::vector<float> terms_near_zero(std::uint64_t seed) {
  std::vector<float> t;
  double sum = 0;
  for (int j = 0; j < 63; ++j) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto k = static_cast<std::int64_t>(seed >> 40) - (std::int64_t{1} << 23);
    t.push_back(static_cast<float>(std::ldexp(static_cast<double>(k), -22)));
    sum += t.back();
  }
  t.push_back(static_cast<float>(-sum - 0.007));
  return t;
}

// Order 1: the contracted axis permuted so that the positive terms come first (largest first),
// then the negative ones: the partial sums grow large before they cancel.
float sum_sign_sorted(const std::vector<float>& t) {
  std::vector<std::size_t> order(t.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) {
    if ((t[i] < 0) != (t[j] < 0)) return t[i] >= 0;
    return std::abs(t[i]) > std::abs(t[j]);
  });
  float s = 0;
  for (std::size_t j : order) s = s + t[j];
  return s;
}

// Order 2: 16 lanes (as an AVX-512 kernel keeps them), then a pairwise reduction of the lanes.
float sum_blocked(const std::vector<float>& t, std::size_t lanes = 16) {
  std::vector<float> acc(lanes, 0.0f);
  for (std::size_t j = 0; j < t.size(); ++j) acc[j % lanes] = acc[j % lanes] + t[j];
  for (std::size_t h = lanes / 2; h >= 1; h /= 2)
    for (std::size_t a = 0; a < h; ++a) acc[a] = acc[a] + acc[a + h];
  return acc[0];
}

double exact_sum(const std::vector<float>& t) {
  double s = 0;  // multiples of 2^-22 below 2^7 in magnitude: every partial sum is exact
  for (float v : t) s += v;
  return s;
}

double abs_sum(const std::vector<float>& t) {
  double s = 0;
  for (float v : t) s += std::abs(v);
  return s;
}

at::Tensor scalar(double v, at::ScalarType type) {
  return at::full({}, v, at::TensorOptions().dtype(type));
}

// The check every comparison used before: a fixed absolute tolerance.
bool old_check(float a, float b) {
  return at::allclose(scalar(a, at::kFloat), scalar(b, at::kFloat), 1e-4, 1e-5);
}

}  // namespace

TEST_CASE("a value near zero, 64 float32 terms, two summation orders") {
  const std::vector<float> t = terms_near_zero(39);
  const float a = sum_sign_sorted(t), b = sum_blocked(t);
  const double ref = exact_sum(t);
  INFO("orders give " << a << " and " << b << ", exact " << ref);
  CHECK(std::abs(ref + 0.007) < 1e-6);
  // The reproduction: the two orders differ by more than allclose(rtol=1e-4, atol=1e-5)
  // allows, at a value of -0.007, although each is close to the exact sum.
  REQUIRE_FALSE(old_check(a, b));
  CHECK(std::abs(a - b) > 1.1e-5);

  kvmap::ErrorBound bound;
  bound.roundings = 64;
  bound.magnitudes = scalar(abs_sum(t), at::kDouble);
  for (float v : {a, b}) {
    const kvmap::Closeness c =
        kvmap::check_close(scalar(v, at::kFloat), scalar(ref, at::kDouble), bound);
    INFO(c.describe());
    CHECK(c.ok);
    CHECK(c.form == "component-wise");
    CHECK(c.ratio < 0.2);
  }
  // Between the two float32 results: the sum of both bounds.
  const kvmap::Closeness ab =
      kvmap::check_close(scalar(a, at::kFloat), scalar(b, at::kFloat), bound);
  INFO(ab.describe());
  CHECK(ab.ok);

  // A real error of 1e-3 is caught, against the float64 value and against the other order.
  const float wrong = a + 1e-3f;
  const kvmap::Closeness w =
      kvmap::check_close(scalar(wrong, at::kFloat), scalar(ref, at::kDouble), bound);
  INFO(w.describe());
  CHECK_FALSE(w.ok);
  CHECK(w.ratio > 1.0);
  CHECK(w.describe().find("OUTSIDE") != std::string::npos);
  CHECK_FALSE(kvmap::check_close(scalar(wrong, at::kFloat), scalar(b, at::kFloat), bound).ok);
}

TEST_CASE("the bound holds for every order, and points at the one wrong sample") {
  // 2,000 samples of 64 terms, summed in three orders; one sample then corrupted by 1e-3.
  constexpr int n = 2000;
  std::vector<double> exact(n), magnitude(n);
  std::vector<float> sign_sorted(n), blocked16(n), blocked8(n);
  for (int i = 0; i < n; ++i) {
    const std::vector<float> t = terms_near_zero(1000 + static_cast<std::uint64_t>(i));
    exact[i] = exact_sum(t);
    magnitude[i] = abs_sum(t);
    sign_sorted[i] = sum_sign_sorted(t);
    blocked16[i] = sum_blocked(t, 16);
    blocked8[i] = sum_blocked(t, 8);
  }
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor ref = at::tensor(exact, f64);
  kvmap::ErrorBound bound;
  bound.roundings = 64;
  bound.magnitudes = at::tensor(magnitude, f64);
  const at::Tensor s = at::tensor(sign_sorted, f32), b16 = at::tensor(blocked16, f32),
                   b8 = at::tensor(blocked8, f32);
  // The old check fails somewhere among these samples; the bound holds everywhere.
  CHECK_FALSE(at::allclose(s, b16, 1e-4, 1e-5));
  for (const at::Tensor& got : {s, b16, b8}) {
    const kvmap::Closeness c = kvmap::check_close(got, ref, bound);
    INFO(c.describe());
    CHECK(c.ok);
  }
  CHECK(kvmap::check_close(s, b16, bound).ok);
  // A real 1e-3 error in one sample is caught and located.
  const at::Tensor wrong = s.clone();
  wrong[1234] += 1e-3f;
  const kvmap::Closeness c = kvmap::check_close(wrong, ref, bound);
  INFO(c.describe());
  CHECK_FALSE(c.ok);
  CHECK(c.position == std::vector<std::int64_t>{1234});
  // Where every value is a cancellation (here all near -0.007), max |reference| says nothing
  // of the terms: the norm-wise form rejects correct sums. Such callers pass the magnitudes.
  CHECK_FALSE(kvmap::check_close(b16, ref, kvmap::ErrorBound{64, {}}).ok);
}

TEST_CASE("norm-wise form, shapes, kinds, NaN and infinities") {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor ref = at::tensor({10.0, -3.0, 0.0, 1e-9}, f64).reshape({2, 2});
  // Norm-wise: max |reference| = 10, one rounding of float32: bound 10 * (2^-24 + 2^-53).
  const double u = std::ldexp(1.0, -24) + std::ldexp(1.0, -53);
  at::Tensor got = ref.to(at::kFloat).to(at::kDouble);
  got[1][1] = 1e-9 + 0.9 * 10 * u;  // an absolute error near zero that the norm allows
  kvmap::Closeness c = kvmap::check_close(got.to(at::kFloat), ref);
  CHECK(c.ok);
  CHECK(c.form == "norm-wise");
  got[1][1] = 1e-9 + 2.0 * 10 * u;
  c = kvmap::check_close(got, ref);
  CHECK_FALSE(c.ok);
  CHECK(c.position == std::vector<std::int64_t>{1, 1});
  CHECK(c.bound == doctest::Approx(10 * std::ldexp(1.0, -52)));  // float64 against float64

  CHECK(kvmap::unit_roundoff(at::kFloat) == std::ldexp(1.0, -24));
  CHECK(kvmap::unit_roundoff(at::kHalf) == std::ldexp(1.0, -11));
  CHECK(kvmap::unit_roundoff(at::kBFloat16) == std::ldexp(1.0, -8));
  CHECK(kvmap::unit_roundoff(at::kComplexFloat) == std::ldexp(1.0, -24));
  CHECK(kvmap::unit_roundoff(at::kInt) == 0.0);

  // Shapes and kinds must match.
  c = kvmap::check_close(at::zeros({3}), at::zeros({3, 1}));
  CHECK_FALSE(c.ok);
  CHECK(c.describe().find("shapes differ") != std::string::npos);
  CHECK_FALSE(kvmap::check_close(at::zeros({2}, at::kComplexFloat), at::zeros({2}, f64)).ok);
  CHECK_THROWS_AS(kvmap::check_close(at::zeros({2}), at::zeros({2}), kvmap::ErrorBound{0, {}}),
                  kvmap::ValueError);

  // Integers compare exactly.
  const at::Tensor ints = at::arange(6, at::kLong);
  CHECK(kvmap::check_close(ints, ints.clone()).ok);
  at::Tensor off = ints.clone();
  off[4] = 5;
  c = kvmap::check_close(off, ints);
  CHECK_FALSE(c.ok);
  CHECK(c.form == "exact");
  CHECK(c.position == std::vector<std::int64_t>{4});

  // NaN only matches NaN; an infinity only itself; a finite value never matches either.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const at::Tensor special = at::tensor({nan, inf, -inf, 1.0}, f64);
  CHECK(kvmap::check_close(special.to(at::kFloat), special).ok);
  CHECK_FALSE(kvmap::check_close(at::tensor({1.0, inf, -inf, 1.0}, f64), special).ok);
  CHECK_FALSE(kvmap::check_close(at::tensor({nan, -inf, -inf, 1.0}, f64), special).ok);
  CHECK_FALSE(kvmap::check_close(at::tensor({nan, inf, 0.0, 1.0}, f64), special).ok);

  // Complex: the modulus of the difference.
  const at::Tensor z = at::randn({8}, at::kComplexDouble);
  CHECK(kvmap::check_close(z.to(at::kComplexFloat), z).ok);
  CHECK_FALSE(
      kvmap::check_close(z + at::full({8}, c10::complex<double>(0, 1e-3), z.options()), z).ok);

  // Empty tensors agree.
  CHECK(kvmap::check_close(at::zeros({0, 3}), at::zeros({0, 3}, f64)).ok);
}
