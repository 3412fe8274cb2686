#pragma once
/// \file
/// Comparing floating-point results with a tolerance that follows from the computation.
///
/// A mapped function's results depend on the chunking, the rank count and the CPU only through
/// rounding: a chunk of one sample may run other kernels (and sum in another order) than a chunk
/// of many, and BLAS/ATen pick their kernels by CPU (AVX2, AVX-512, NEON). A fixed absolute
/// tolerance fails wherever a value is near zero; check_close instead bounds the error of each
/// element by the rounding error analysis of the computation that made it:
///
///   |actual_i - reference_i| <= roundings * (u(actual) + u(reference)) * m_i
///
/// u is the unit roundoff of a dtype (2^-24 float32, 2^-53 float64, 2^-11 float16, 2^-8
/// bfloat16; complex: that of its parts). m_i is, component-wise, the sum of the magnitudes of
/// the terms that made element i (ErrorBound::magnitudes, which the caller computes in float64);
/// without it the check is norm-wise, m_i = max_j |reference_j|. `roundings` counts the
/// roundings along the longest chain that makes one element: a k-term sum or dot product counts
/// k (the classical gamma_k bound, which holds for every summation order, blocking and fused
/// multiply-add), each elementwise arithmetic operation 1, each elementary function (exp, tanh,
/// sin, ...) 4 (vectorized implementations are within 2 ulp). Errors of inputs propagate with
/// the function's derivative: the caller folds them into m_i. The u of the reference is added
/// so that two computations in the same precision (a per-sample loop against a batched call)
/// are compared with the sum of both bounds; against a float64 reference it is negligible.
/// Non-floating dtypes compare exactly; NaN matches only NaN, an infinity only itself.
#include "kvmap/config.hpp"
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

KVMAP_API_BEGIN
namespace kvmap {

/// The bound check_close applies: a rounding count and, for the component-wise form, the
/// terms' magnitudes.
struct ErrorBound {
  /// Implicit from a rounding count: check_close(a, b, 64) is the norm-wise bound of 64.
  ErrorBound(std::int64_t roundings = 1, at::Tensor magnitudes = {})  // NOLINT
      : roundings(roundings), magnitudes(std::move(magnitudes)) {}
  /// Roundings along the longest chain that makes one element (>= 1).
  std::int64_t roundings = 1;
  /// Optional: per element, the sum of the magnitudes of the terms that made it (float64,
  /// broadcastable to the reference's shape). Undefined: the norm-wise form, max |reference|.
  at::Tensor magnitudes;
};

/// The outcome of check_close: whether every element is within its bound and, for the element
/// whose error is the largest fraction of its bound, where it is, both values and the bound.
struct Closeness {
  bool ok = false;                     ///< every element within its bound
  std::string form;                    ///< "component-wise", "norm-wise" or "exact"
  std::string mismatch;                ///< non-empty when shapes or kinds differ
  std::int64_t elements = 0;           ///< how many elements were compared
  std::vector<std::int64_t> position;  ///< index of the worst element
  double actual = 0;                   ///< the worst element's value (real part for complex)
  double reference = 0;                ///< the reference's value there
  double error = 0;                    ///< |actual - reference| there
  double bound = 0;                    ///< and its bound
  double ratio = 0;                    ///< error / bound there (0 when both are 0)
  std::int64_t roundings = 0;          ///< the ErrorBound's rounding count
  /// `ok`: `CHECK(check_close(a, b, n))` prints describe() when it fails.
  explicit operator bool() const { return ok; }
  /// One line: the verdict, the worst element, both values, the error, the bound and its form.
  std::string describe() const;
};

/// Writes describe() (so test frameworks print the verdict of a failed check).
std::ostream& operator<<(std::ostream& out, const Closeness& c);

/// The unit roundoff of a floating dtype (half the distance from 1 to the next value); 0 for
/// integral and boolean dtypes.
double unit_roundoff(at::ScalarType type);

/// Compares `actual` with `reference` (same shape; preferably a float64 reference) under the
/// bound above. Tensors may live on any device; the comparison runs in float64 on the host.
Closeness check_close(const at::Tensor& actual, const at::Tensor& reference,
                      const ErrorBound& bound = {});

}  // namespace kvmap
KVMAP_API_END
