#pragma once
/// \file
/// Distributed BLAS-1 on DistViews (Kokkos Kernels on each shard, results agreed globally).
/// x and y must have equal layouts, the same dtype (float32 or float64) and 1 or 2
/// dimensions; 2-d arrays are treated as one vector of all their elements.
#include "kvmap/config.hpp"
#include "kvmap/dist_view.hpp"

KVMAP_API_BEGIN
namespace kvmap {
namespace linalg {

/// Global sum of x .* y. Each rank's partial sum is added exactly (in fixed point, in the
/// call's one fixed-size agreement) and rounded once, so the result is the same on every rank
/// and from run to run, whatever order MPI reduces in.
template <class MemorySpace>
double dot(const DistView<MemorySpace>& x, const DistView<MemorySpace>& y);

/// Global Euclidean norm of x: one pass over each shard summing squares, and a second one
/// (squares in three ranges scaled by powers of two) only on a shard whose plain sum
/// over- or underflowed; summed exactly across ranks.
template <class MemorySpace>
double nrm2(const DistView<MemorySpace>& x);

/// y = a * x + b * y, in place on every rank's shard of y.
template <class MemorySpace>
void axpby(double a, const DistView<MemorySpace>& x, double b, DistView<MemorySpace>& y);

}  // namespace linalg
}  // namespace kvmap
KVMAP_API_END
