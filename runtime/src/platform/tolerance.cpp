// check_close: floating-point results against a reference under a rounding-error bound.
#include "kvmap/tolerance.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>
#include <sstream>

#include "kvmap/error.hpp"

namespace kvmap {

namespace {

bool is_inexact(at::ScalarType t) {
  return at::isFloatingType(t) || at::isComplexType(t);
}

std::vector<std::int64_t> unravel(std::int64_t flat, at::IntArrayRef shape) {
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", v);
  return text;
}

at::Tensor real_part(const at::Tensor& t) {
  return t.is_complex() ? at::real(t) : t;
}

Closeness mismatch(std::string why) {
  Closeness c;
  c.mismatch = std::move(why);
  return c;
}

}  // namespace

double unit_roundoff(at::ScalarType type) {
  switch (at::isComplexType(type) ? c10::toRealValueType(type) : type) {
    case at::kDouble: return std::ldexp(1.0, -53);
    case at::kFloat: return std::ldexp(1.0, -24);
    case at::kHalf: return std::ldexp(1.0, -11);
    case at::kBFloat16: return std::ldexp(1.0, -8);
    default: return 0.0;
  }
}

Closeness check_close(const at::Tensor& actual, const at::Tensor& reference,
                      const ErrorBound& bound) {
  if (!actual.defined() || !reference.defined()) return mismatch("a tensor is undefined");
  if (actual.sizes() != reference.sizes()) {
    std::ostringstream why;
    why << "shapes differ: " << actual.sizes() << " against the reference's " << reference.sizes();
    return mismatch(why.str());
  }
  if (bound.roundings < 1) {
    throw ValueError("kvmap::check_close: roundings must be >= 1, got " +
                     std::to_string(bound.roundings));
  }
  const bool inexact = is_inexact(actual.scalar_type()) || is_inexact(reference.scalar_type());
  if (inexact &&
      at::isComplexType(actual.scalar_type()) != at::isComplexType(reference.scalar_type())) {
    return mismatch(std::string("one tensor is complex, the other not (") +
                    c10::toString(actual.scalar_type()) + " against " +
                    c10::toString(reference.scalar_type()) + ")");
  }
  const bool complex = at::isComplexType(actual.scalar_type());
  const auto wide = inexact ? (complex ? at::kComplexDouble : at::kDouble) : at::kLong;
  const at::Tensor a = actual.detach().to(at::kCPU).to(wide);
  const at::Tensor r = reference.detach().to(at::kCPU).to(wide);

  Closeness c;
  c.roundings = bound.roundings;
  c.elements = a.numel();
  if (!inexact) {
    // Integers and booleans: equal or not.
    c.form = "exact";
    const at::Tensor differ = a.ne(r).reshape({-1});
    c.ok = !differ.any().item<bool>();
    if (a.numel() > 0) {
      const std::int64_t worst = c.ok ? 0 : differ.to(at::kInt).argmax().item<std::int64_t>();
      c.position = unravel(worst, a.sizes());
      c.actual = static_cast<double>(a.reshape({-1})[worst].item<std::int64_t>());
      c.reference = static_cast<double>(r.reshape({-1})[worst].item<std::int64_t>());
      c.error = std::abs(c.actual - c.reference);
      c.ratio = c.ok ? 0.0 : std::numeric_limits<double>::infinity();
    }
    return c;
  }

  const double u = unit_roundoff(actual.scalar_type()) + unit_roundoff(reference.scalar_type());
  at::Tensor m;
  if (bound.magnitudes.defined()) {
    c.form = "component-wise";
    m = bound.magnitudes.detach().to(at::kCPU).to(at::kDouble).abs().expand(a.sizes());
  } else {
    c.form = "norm-wise";
    const at::Tensor finite = at::isfinite(r);
    const double max_ref =
        r.numel() == 0 ? 0.0
                       : at::where(finite, r.abs(), at::zeros_like(r.abs())).max().item<double>();
    m = at::full(a.sizes(), max_ref, at::TensorOptions().dtype(at::kDouble));
  }
  const at::Tensor limit = static_cast<double>(bound.roundings) * u * m;
  // Equal values (same infinities included) and NaN against NaN have no error; any other
  // element with a NaN or an infinity has an infinite one.
  const at::Tensor same = a.eq(r).logical_or(at::isnan(a).logical_and(at::isnan(r)));
  at::Tensor error = (a - r).abs();
  error = at::where(at::isfinite(error), error, at::full_like(error, INFINITY));
  error = at::where(same, at::zeros_like(error), error);
  const at::Tensor ratio = at::where(error.eq(0), at::zeros_like(error), error / limit);
  c.ok = a.numel() == 0 || !ratio.gt(1.0).any().item<bool>();
  if (a.numel() == 0) return c;
  const at::Tensor flat_ratio = ratio.reshape({-1});
  std::int64_t worst = flat_ratio.argmax().item<std::int64_t>();
  if (flat_ratio[worst].item<double>() == 0.0)
    worst = error.reshape({-1}).argmax().item<std::int64_t>();
  c.position = unravel(worst, a.sizes());
  c.actual = real_part(a).reshape({-1})[worst].item<double>();
  c.reference = real_part(r).reshape({-1})[worst].item<double>();
  c.error = error.reshape({-1})[worst].item<double>();
  c.bound = limit.reshape({-1})[worst].item<double>();
  c.ratio = flat_ratio[worst].item<double>();
  return c;
}

std::string Closeness::describe() const {
  if (!mismatch.empty()) return "not comparable: " + mismatch;
  std::ostringstream s;
  s << (ok ? "within" : "OUTSIDE") << " the error bound";
  if (elements == 0) {
    s << " (no elements)";
    return s.str();
  }
  s << (ok ? "; worst element [" : " at [");
  for (std::size_t d = 0; d < position.size(); ++d) s << (d ? ", " : "") << position[d];
  s << "]: " << number(actual) << " against the reference " << number(reference) << ", |error| "
    << number(error);
  if (form == "exact") {
    s << " (exact comparison)";
  } else {
    s << (ratio > 1.0 ? " > " : " <= ") << "bound " << number(bound) << " (" << form << ", "
      << roundings << " roundings; error/bound " << number(ratio) << ")";
  }
  return s.str();
}

std::ostream& operator<<(std::ostream& out, const Closeness& c) {
  return out << c.describe();
}

}  // namespace kvmap
