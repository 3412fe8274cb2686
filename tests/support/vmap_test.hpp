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

// Equal shapes and dtypes, values within 1e-4 (float32) or 1e-9 (otherwise).
inline bool close(const at::Tensor& a, const at::Tensor& b) {
  const bool single = a.scalar_type() == at::kFloat;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::allclose(a.to(at::kDouble), b.to(at::kDouble), single ? 1e-4 : 1e-9,
                      single ? 1e-4 : 1e-9);
}

// Every rank of the world, in order (what a failure on every rank names).
inline std::vector<int> all_ranks() {
  std::vector<int> r;
  for (int i = 0; i < nranks(); ++i) r.push_back(i);
  return r;
}

}  // namespace kvmap_test
