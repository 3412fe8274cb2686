// The map_overlap example of docs/concepts.md: explicit steps of the 1-D heat equation on a
// periodic rod split over the ranks; each step needs one row of each neighbour.
#include <kvmap/kvmap.hpp>

#include <ATen/ATen.h>

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);
  {
    // 1000 points of a rod, split along axis 0: a hot spot in the middle.
    const std::int64_t n = 1000;
    const at::Tensor x0 = at::exp(-at::pow(at::linspace(-1, 1, n, at::kDouble) * 8, 2));
    auto u = kvmap::DistView<>::from_global(x0, 0);

    // Written for a block and one row of each neighbour: u has 2 more rows than the block.
    auto step = [](const at::Tensor& b, double r) {
      const std::int64_t m = b.size(0) - 2;
      return b.narrow(0, 1, m) +
             r * (b.narrow(0, 0, m) - 2 * b.narrow(0, 1, m) + b.narrow(0, 2, m));
    };
    auto heat = kvmap::map_overlap(
        step, kvmap::OverlapOptions().depth(1).boundary(kvmap::Boundary::Periodic).trim(false));
    for (int t = 0; t < 50; ++t) u = heat(u, 0.25);

    // The same steps on the whole rod (torch's roll is the periodic neighbour): the same
    // operations on the same values, so the results agree to the last bit.
    at::Tensor v = x0;
    for (int t = 0; t < 50; ++t) v = v + 0.25 * (v.roll(1) - 2 * v + v.roll(-1));
    if (!at::equal(u.allgather(), v)) return 1;
  }
  return 0;
}
