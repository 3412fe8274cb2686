// The README's example: a distributed array, a redistribution, and a check.
#include <kvmap/kvmap.hpp>

#include <ATen/ATen.h>

int main(int argc, char** argv) {
  kvmap::ScopeGuard guard(argc, argv);  // MPI + Kokkos, unless already initialized
  {
    auto world = kvmap::Comm::world();
    // 10 rows over the ranks of world, split along axis 0 (Heat's rule: 10 on 3 -> 4, 3, 3)
    auto x = kvmap::DistView<>::arange(10, kvmap::DType::Float64, 0, world);
    at::Tensor mine = x.local();  // zero-copy: shares memory with the Kokkos allocation
    mine.mul_(2.0);               // so writes are visible to kvmap
    auto everywhere = x.resplit(std::nullopt);  // replicated: every rank has all 10 rows
    if (!at::equal(everywhere.local(), at::arange(10, mine.options()) * 2)) return 1;
  }
  return 0;
}
