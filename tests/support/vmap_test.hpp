#pragma once
// Helpers shared by the kvmap::vmap tests (test_vmap_*.cpp): the independent reference (the
// per-sample loop over the gathered inputs, stacked), inputs every rank builds alike, and the
// tolerance the results are compared with.
#include "support/kvmap_test.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace kvmap_test {

// Stacks per-sample outputs of `one(i)` for i in [0, n) along each output's out_dim.
inline std::vector<at::Tensor> loop_reference(
    std::int64_t n, std::vector<std::int64_t> out_dims,
    const std::function<std::vector<at::Tensor>(std::int64_t)>& one) {
  std::vector<std::vector<at::Tensor>> per_output;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<at::Tensor> outs = one(i);
    per_output.resize(outs.size());
    for (std::size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(outs[k]);
  }
  std::vector<at::Tensor> stacked;
  for (std::size_t k = 0; k < per_output.size(); ++k) {
    std::int64_t d = out_dims.size() == 1 ? out_dims[0] : out_dims[k];
    if (d < 0) d += per_output[k][0].dim() + 1;
    stacked.push_back(at::stack(per_output[k], d));
  }
  return stacked;
}

// The same full tensor on every rank.
inline at::Tensor randn_everywhere(at::IntArrayRef shape, at::ScalarType type, std::uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return on_device(at::randn(shape, g, at::TensorOptions().dtype(at::kDouble)).to(type));
}

// `got` has the dtype of `ref`, a reference computed in the same precision (the per-sample
// loop), and is within the rounding bound of it: kvmap::check_close, norm-wise unless
// `magnitudes` are given, with `roundings` along the longest chain of the mapped function
// (non-floating outputs compare exactly). Printed by CHECK when it fails.
inline kvmap::Closeness close(const at::Tensor& got, const at::Tensor& ref, std::int64_t roundings,
                              const at::Tensor& magnitudes = {}) {
  if (got.defined() && ref.defined() && got.scalar_type() != ref.scalar_type()) {
    kvmap::Closeness c;
    c.mismatch = std::string("dtypes differ: ") + c10::toString(got.scalar_type()) +
                 " against the reference's " + c10::toString(ref.scalar_type());
    return c;
  }
  return kvmap::check_close(got, ref, kvmap::ErrorBound{roundings, magnitudes});
}

}  // namespace kvmap_test
