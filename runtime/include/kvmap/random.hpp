#pragma once
/// \file
/// Counter-based, process-count-invariant random numbers: the value of every element
/// depends only on (seed, stream, global index), never on the number of ranks or chunks.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "kvmap/config.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/dist_view.hpp"

KVMAP_API_BEGIN
namespace kvmap {

/// Collective: sets the seed of kvmap's random streams on every rank of comm (the seed must
/// be the same on every rank) and restarts the stream counter.
void manual_seed(std::uint64_t seed, const Comm& comm = Comm::world());
/// The seed kvmap's random streams use now (the last manual_seed's, else the default).
std::uint64_t initial_seed();

namespace random {

/// Uniform in [0, 1) / standard normal, for Float32 or Float64. Without a seed the current
/// kvmap seed is used and each call draws a fresh stream (the same on every rank).
///@{
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
DistView<MemorySpace> uniform(Shape gshape, DType dtype, std::optional<int> split,
                              Comm comm = Comm::world(),
                              std::optional<std::uint64_t> seed = std::nullopt);
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
DistView<MemorySpace> normal(Shape gshape, DType dtype, std::optional<int> split,
                             Comm comm = Comm::world(),
                             std::optional<std::uint64_t> seed = std::nullopt);
///@}

}  // namespace random

}  // namespace kvmap
KVMAP_API_END
