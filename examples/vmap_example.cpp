// The README's vmap example: a per-sample function over a distributed batch, chunked.
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

    // e is a DistView of shape (1000,), split like x. Check against a plain batched call.
    at::Tensor expect = 0.5 * at::tanh(at::matmul(x.local(), w.local())).sum(-1);
    if (!at::allclose(e.local(), expect, 1e-5, 1e-5)) return 1;
  }
  return 0;
}
