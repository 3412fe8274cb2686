// Must not compile: the per-sample function returns a double, not tensors.
#include <kvmap/vmap.hpp>

int main() {
  auto x = kvmap::DistView<>::zeros({4}, kvmap::DType::Float32, 0);
  auto y = kvmap::vmap([](const at::Tensor& t) { return t.sum().item<double>(); })(x);
  (void)y;
  return 0;
}
