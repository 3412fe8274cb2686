// linalg::dot and nrm2 across ranks: every rank's part is summed exactly, so the result is
// the correctly rounded sum of the parts whatever MPI's reduction order, the same bits on every
// rank; and nrm2's one pass neither over- nor underflows.
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
