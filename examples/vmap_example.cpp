// The vmap example of docs/concepts.md: a per-sample function over a distributed batch, chunked.
#include <kvmap/kvmap.hpp>

#include <ATen/ATen.h>

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  {
    // 1000 samples of 64 features, split over the ranks along axis 0; W is replicated.
    auto x = kvmap::random::normal({1000, 64}, kvmap::DType::Float32, 0);
    auto w = kvmap::random::normal({64, 16}, kvmap::DType::Float32, std::nullopt);

    // Written for ONE sample: xi has shape (64,), the result shape ().
    auto energy = [](const at::Tensor& xi, const at::Tensor& W, double scale) {
      return scale * at::tanh(at::matmul(xi, W)).sum();
    };
    auto e = kvmap::vmap(energy, kvmap::VmapOptions().chunk_size(256))(x, w, 0.5);

    // e is a DistView of shape (1000,), split like x. Check against the batched formula in
    // float64, within the rounding bound of float32: a 64-term dot product, tanh (4), a
    // 16-term sum and the scale (kvmap::check_close; chunking changes only the rounding).
    const at::Tensor x64 = x.local().to(at::kDouble), w64 = w.local().to(at::kDouble);
    at::Tensor expect = 0.5 * at::tanh(at::matmul(x64, w64)).sum(-1);
    if (!kvmap::check_close(e.local(), expect, {64 + 4 + 16 + 1})) return 1;
  }
  return 0;
}
