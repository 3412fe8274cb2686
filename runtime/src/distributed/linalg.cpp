#include "kvmap/linalg.hpp"

#include <KokkosBlas1_axpby.hpp>
#include <KokkosBlas1_dot.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvmap/error.hpp"

#include "agreement.hpp"
#include "exact_sum.hpp"
#include "local_block.hpp"

namespace kvmap::linalg {

namespace {

template <class M>
void check_operand(const DistView<M>& x, const char* what, const char* arg) {
  KVMAP_CHECK(
      x.ndim() == 1 || x.ndim() == 2, ValueError,
      "kvmap::linalg::" << what << ": " << arg << " must have 1 or 2 dimensions, got " << x.ndim());
  KVMAP_CHECK(x.dtype() == DType::Float32 || x.dtype() == DType::Float64, TypeError,
              "kvmap::linalg::" << what << ": " << arg << " must be float32 or float64, got "
                                << name(x.dtype()));
  const auto contiguous = Detail::row_major_strides(x.lshape());
  bool ok = true;
  for (int d = 0; d < x.ndim(); ++d)
    ok = ok && (x.lshape()[d] <= 1 || x.local_strides()[d] == contiguous[d]);
  KVMAP_CHECK(ok, ValueError,
              "kvmap::linalg::" << what << ": the local shard of " << arg
                                << " is not contiguous (strides " << to_string(x.local_strides())
                                << "); redistribute or copy it first");
}

template <class M>
void check_pair(const DistView<M>& x, const DistView<M>& y, const char* what) {
  check_operand(x, what, "x");
  check_operand(y, what, "y");
  KVMAP_CHECK(x.comm().id() == y.comm().id(), ValueError,
              "kvmap::linalg::" << what << ": x and y live on different communicators");
  KVMAP_CHECK(x.layout() == y.layout(), ValueError,
              "kvmap::linalg::" << what << ": x and y need equal layouts, got " << x.layout()
                                << " and " << y.layout());
  KVMAP_CHECK(
      x.dtype() == y.dtype(), TypeError,
      "kvmap::linalg::" << what << ": x is " << name(x.dtype()) << " but y is " << name(y.dtype()));
}

// What every rank must pass alike: the operands' layouts, dtypes and communicators.
template <class M>
void describe(Detail::Signature& sig, const DistView<M>& x, const char* name) {
  sig.arg(name, x.layout()).arg("dtype", x.dtype()).arg("comm", x.comm());
}

// The shard as a 1-d unmanaged Kokkos view over all its elements.
template <class T, class M>
Kokkos::View<T*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>> flat(const DistView<M>& x) {
  std::int64_t n = 1;
  for (std::int64_t e : x.lshape()) n *= e;
  return Kokkos::View<T*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      static_cast<T*>(x.local_data()), static_cast<std::size_t>(n));
}

// The squares of one shard in three sums whose scaling by constant powers of two keeps them
// from overflowing or underflowing (Blue's algorithm, as LAPACK's dnrm2 since 3.10): squares
// of tiny elements scaled up, of huge ones scaled down, the rest as they are.
struct SquareSums {
  double small = 0, medium = 0, big = 0;
};
constexpr double kTiny = 0x1p-511;  // below: scaled up by kUp
constexpr double kHuge = 0x1p+486;  // above: scaled down by kDown
constexpr double kUp = 0x1p+537, kDown = 0x1p-538;
constexpr int kUpExponent = 537, kDownExponent = -538;

template <class T, class M>
struct SquareSumsOf {
  using value_type = SquareSums;
  Kokkos::View<T*, M, Kokkos::MemoryTraits<Kokkos::Unmanaged>> v;
  KOKKOS_INLINE_FUNCTION void operator()(const std::size_t i, SquareSums& s) const {
    const double x = static_cast<double>(v(i));
    const double a = x < 0 ? -x : x;
    if (a > kHuge) {
      s.big += (x * kDown) * (x * kDown);
    } else if (a < kTiny) {
      s.small += (x * kUp) * (x * kUp);
    } else {
      s.medium += x * x;
    }
  }
  KOKKOS_INLINE_FUNCTION void init(SquareSums& s) const { s = SquareSums{}; }
  KOKKOS_INLINE_FUNCTION void join(SquareSums& dst, const SquareSums& src) const {
    dst.small += src.small;
    dst.medium += src.medium;
    dst.big += src.big;
  }
#if KVMAP_KOKKOS_VOLATILE_JOIN
  KOKKOS_INLINE_FUNCTION void join(volatile SquareSums& dst, const volatile SquareSums& src) const {
    // (Assignments: a compound assignment to a volatile is deprecated in C++20.)
    dst.small = dst.small + src.small;
    dst.medium = dst.medium + src.medium;
    dst.big = dst.big + src.big;
  }
#endif
};

// The exact sum of every rank's parts (any order, any number of ranks: the same bits),
// reduced in the agreement.
struct ExactPayload {
  Detail::ExactSum sum;
  static void combine(const ExactPayload& in, ExactPayload& inout) { inout.sum.merge(in.sum); }
};

// The sum of squares of this rank's shard, exactly as an ExactSum. One plain pass (what
// KokkosBlas::nrm2 does, vectorized) suffices unless it overflowed or came out so small that
// squares below the double range could matter: then a second pass with Blue's scaled sums.
// Float32 elements square in double without either, whatever their values.
template <class M>
Detail::ExactSum local_squares(const DistView<M>& x) {
  using Exec = typename DistView<M>::execution_space;
  std::int64_t n = 1;
  for (std::int64_t e : x.lshape()) n *= e;
  const Kokkos::RangePolicy<Exec> all(0, static_cast<std::size_t>(n));
  Detail::ExactSum out;
  double plain = 0.0;
  if (x.dtype() == DType::Float32) {
    const auto v = flat<float>(x);
    Kokkos::parallel_reduce(
        "kvmap::linalg::nrm2", all,
        KOKKOS_LAMBDA(const std::size_t i, double& sum) {
          const double a = static_cast<double>(v(i));
          sum += a * a;
        },
        plain);
    out.add(plain);
    return out;
  }
  const auto v = flat<double>(x);
  Kokkos::parallel_reduce(
      "kvmap::linalg::nrm2", all,
      KOKKOS_LAMBDA(const std::size_t i, double& sum) { sum += v(i) * v(i); }, plain);
  // Squares lost below 2^-1022 change a sum of at least 2^-900 by n * 2^-122 relatively.
  if (std::isnan(plain) || (std::isfinite(plain) && plain >= 0x1p-900)) {
    out.add(plain);
    return out;
  }
  SquareSums parts;
  Kokkos::parallel_reduce("kvmap::linalg::nrm2/scaled", all, SquareSumsOf<double, M>{v}, parts);
  out.add(parts.small, -2 * kUpExponent);
  out.add(parts.medium);
  out.add(parts.big, -2 * kDownExponent);
  return out;
}

}  // namespace

// dot and nrm2 compute their local part in the plan (a local reduction, nothing shared is
// changed) and the agreement carries it, summed exactly: one fixed-size collective per call,
// the same result on every rank and from run to run.
template <class M>
double dot(const DistView<M>& x, const DistView<M>& y) {
  return Detail::collective<ExactPayload>(
      "linalg::dot", x.comm(),
      [&](Detail::Signature& sig, ExactPayload& partial) {
        describe(sig, x, "x");
        describe(sig, y, "y");
        check_pair(x, y, "dot");
        if (x.dtype() == DType::Float64) {
          partial.sum.add(KokkosBlas::dot(flat<double>(x), flat<double>(y)));
        } else {
          partial.sum.add(static_cast<double>(KokkosBlas::dot(flat<float>(x), flat<float>(y))));
        }
        return true;
      },
      [](bool, const ExactPayload& total) {
        const Detail::ExactSum& s = total.sum;
        if (s.nan > 0 || (s.pos_inf > 0 && s.neg_inf > 0))
          return std::numeric_limits<double>::quiet_NaN();
        if (s.pos_inf > 0) return std::numeric_limits<double>::infinity();
        if (s.neg_inf > 0) return -std::numeric_limits<double>::infinity();
        const auto [m, e] = s.rounded();
        return std::ldexp(m, e);
      });
}

template <class M>
double nrm2(const DistView<M>& x) {
  return Detail::collective<ExactPayload>(
      "linalg::nrm2", x.comm(),
      [&](Detail::Signature& sig, ExactPayload& partial) {
        describe(sig, x, "x");
        check_operand(x, "nrm2", "x");
        partial.sum = local_squares(x);
        return true;
      },
      [](bool, const ExactPayload& total) {
        // A NaN element makes the norm NaN, an infinite one (and no NaN) infinite.
        const Detail::ExactSum& s = total.sum;
        if (s.nan > 0) return std::numeric_limits<double>::quiet_NaN();
        if (s.pos_inf > 0 || s.neg_inf > 0) return std::numeric_limits<double>::infinity();
        auto [m, e] = s.rounded();
        if (e % 2 != 0) {
          m *= 2;
          e -= 1;
        }
        return std::ldexp(std::sqrt(m), e / 2);
      });
}

// y is written only after every rank's checks passed.
template <class M>
void axpby(double a, const DistView<M>& x, double b, DistView<M>& y) {
  Detail::collective(
      "linalg::axpby", x.comm(),
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        describe(sig, x, "x");
        describe(sig, y, "y");
        sig.arg("a", a).arg("b", b);
        check_pair(x, y, "axpby");
        return true;
      },
      [&](bool, const Detail::NoPayload&) {
        if (x.dtype() == DType::Float64) {
          KokkosBlas::axpby(a, flat<double>(x), b, flat<double>(y));
        } else {
          KokkosBlas::axpby(static_cast<float>(a), flat<float>(x), static_cast<float>(b),
                            flat<float>(y));
        }
        typename DistView<M>::execution_space().fence();
        return true;
      });
}

#define KVMAP_INSTANTIATE_LINALG(Space)                                                    \
  template KVMAP_EXPORT double dot<Space>(const DistView<Space>&, const DistView<Space>&); \
  template KVMAP_EXPORT double nrm2<Space>(const DistView<Space>&);                        \
  template KVMAP_EXPORT void axpby<Space>(double, const DistView<Space>&, double, DistView<Space>&);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_LINALG)

}  // namespace kvmap::linalg
