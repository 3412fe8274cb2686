#include "kvmap/linalg.hpp"

#include <KokkosBlas1_axpby.hpp>
#include <KokkosBlas1_dot.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvmap/error.hpp"

#include "collective.hpp"

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
  const auto contiguous = Impl::row_major_strides(x.lshape());
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
void describe(Impl::Signature& sig, const DistView<M>& x, const char* name) {
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

// A part of a Euclidean norm as LAPACK's lassq keeps it: norm = scale * sqrt(ssq), with
// ssq the sum of (x_i / scale)^2, so no square of a huge or tiny element over- or underflows.
struct ScaledSsq {
  double scale = 0.0;
  double ssq = 0.0;
};

template <class T, class M>
ScaledSsq local_scaled_ssq(const DistView<M>& x) {
  using Exec = typename DistView<M>::execution_space;
  const auto v = flat<T>(x);
  const Kokkos::RangePolicy<Exec> all(0, v.extent(0));
  double largest = 0.0;
  Kokkos::parallel_reduce(
      "kvmap::linalg::nrm2/scale", all,
      KOKKOS_LAMBDA(const std::size_t i, double& m) {
        const double a = static_cast<double>(v(i));
        if (a > m) m = a;
        if (-a > m) m = -a;
      },
      Kokkos::Max<double>(largest));
  // Zero, infinite or NaN-only parts are summed unscaled: their sum (0, inf or NaN) is the
  // answer and reaches the result through the combination.
  const bool finite = largest > 0.0 && largest <= std::numeric_limits<double>::max();
  const double scale = finite ? largest : 1.0;
  ScaledSsq part;
  Kokkos::parallel_reduce(
      "kvmap::linalg::nrm2/ssq", all,
      KOKKOS_LAMBDA(const std::size_t i, double& sum) {
        const double q = static_cast<double>(v(i)) / scale;
        sum += q * q;
      },
      part.ssq);
  part.scale = finite ? largest : (largest > 0.0 ? 1.0 : 0.0);
  return part;
}

double sum_in_rank_order(const std::vector<double>& parts) {
  double total = 0.0;
  for (double p : parts) total += p;
  return total;
}

}  // namespace

// dot and nrm2 compute their local part in the plan (a local reduction, nothing shared is
// changed) and the agreement carries it: one collective per call.
template <class M>
double dot(const DistView<M>& x, const DistView<M>& y) {
  return Impl::collective<double>(
      "linalg::dot", x.comm(),
      [&](Impl::Signature& sig, double& partial) {
        describe(sig, x, "x");
        describe(sig, y, "y");
        check_pair(x, y, "dot");
        if (x.dtype() == DType::Float64) {
          partial = KokkosBlas::dot(flat<double>(x), flat<double>(y));
        } else {
          partial = static_cast<double>(KokkosBlas::dot(flat<float>(x), flat<float>(y)));
        }
        return true;
      },
      [](bool, const std::vector<double>& parts) { return sum_in_rank_order(parts); });
}

template <class M>
double nrm2(const DistView<M>& x) {
  return Impl::collective<ScaledSsq>(
      "linalg::nrm2", x.comm(),
      [&](Impl::Signature& sig, ScaledSsq& partial) {
        describe(sig, x, "x");
        check_operand(x, "nrm2", "x");
        partial =
            x.dtype() == DType::Float64 ? local_scaled_ssq<double>(x) : local_scaled_ssq<float>(x);
        return true;
      },
      [](bool, const std::vector<ScaledSsq>& parts) {
        // An infinite or NaN part decides the norm (inf, or NaN when any part is NaN); it is not
        // rescaled, since inf * (a tiny ratio squared, 0) would make NaN of it.
        double special = 0.0;
        bool any_special = false;
        for (const ScaledSsq& p : parts) {
          if (!std::isfinite(p.ssq)) {
            special += p.ssq;
            any_special = true;
          }
        }
        if (any_special) return special;
        // Combined in rank order, rescaled to the largest scale: the same result on every rank.
        double scale = 0.0;
        for (const ScaledSsq& p : parts) scale = std::max(scale, p.scale);
        double ssq = 0.0;
        for (const ScaledSsq& p : parts) {
          const double r = scale > 0.0 ? p.scale / scale : 1.0;
          ssq += p.ssq * r * r;
        }
        if (scale == 0.0) return std::sqrt(ssq);  // all zero (or NaN)
        return scale * std::sqrt(ssq);
      });
}

// y is written only after every rank's checks passed.
template <class M>
void axpby(double a, const DistView<M>& x, double b, DistView<M>& y) {
  Impl::collective(
      "linalg::axpby", x.comm(),
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        describe(sig, x, "x");
        describe(sig, y, "y");
        sig.arg("a", a).arg("b", b);
        check_pair(x, y, "axpby");
        return true;
      },
      [&](bool, const std::vector<Impl::NoPayload>&) {
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

#define KVMAP_INSTANTIATE_LINALG(Space)                                       \
  template double dot<Space>(const DistView<Space>&, const DistView<Space>&); \
  template double nrm2<Space>(const DistView<Space>&);                        \
  template void axpby<Space>(double, const DistView<Space>&, double, DistView<Space>&);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_LINALG)

}  // namespace kvmap::linalg
