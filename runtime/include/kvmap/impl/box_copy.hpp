#pragma once
// Strided N-d box copy between two memory layouts, as one Kokkos kernel: the pack and
// unpack step of every redistribution.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvmap/error.hpp"

#include "kvmap/impl/local_block.hpp"

namespace kvmap::Impl {

struct Word16 {
  std::uint64_t lo, hi;
};

template <class ExecSpace, class Word>
void box_copy_typed(const ExecSpace& exec, const void* src_v, void* dst_v, const BoxGeometry& g) {
  const Word* src = static_cast<const Word*>(src_v);
  Word* dst = static_cast<Word*>(dst_v);
  const int last = g.ndim - 1;
  constexpr bool on_host =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
  if constexpr (on_host) {
    // One thread per row of the innermost axis: a long inner loop that compilers vectorize.
    const std::int64_t inner = g.extents[last];
    const std::int64_t rows = g.numel() / (inner > 0 ? inner : 1);
    if (inner == 0) return;
    Kokkos::parallel_for(
        "kvmap::box_copy",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, rows),
        KOKKOS_LAMBDA(const std::int64_t row) {
          std::int64_t rest = row, so = 0, dof = 0;
          for (int d = last - 1; d >= 0; --d) {
            const std::int64_t i = rest % g.extents[d];
            rest /= g.extents[d];
            so += i * g.src_strides[d];
            dof += i * g.dst_strides[d];
          }
          const std::int64_t ss = g.src_strides[last], ds = g.dst_strides[last];
          for (std::int64_t j = 0; j < inner; ++j) dst[dof + j * ds] = src[so + j * ss];
        });
  } else {
    Kokkos::parallel_for(
        "kvmap::box_copy",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, g.numel()),
        KOKKOS_LAMBDA(const std::int64_t flat) {
          std::int64_t rest = flat, so = 0, dof = 0;
          for (int d = last; d >= 0; --d) {
            const std::int64_t i = rest % g.extents[d];
            rest /= g.extents[d];
            so += i * g.src_strides[d];
            dof += i * g.dst_strides[d];
          }
          dst[dof] = src[so];
        });
  }
}

// Copies the box; itemsize selects the machine word (1, 2, 4, 8 or 16 bytes). Asynchronous
// on `exec`: fence before reading dst from another space or from MPI.
template <class ExecSpace>
void box_copy(const ExecSpace& exec, const void* src, void* dst, const BoxGeometry& g,
              std::size_t itemsize) {
  if (g.numel() == 0) return;
  switch (itemsize) {
    case 1: box_copy_typed<ExecSpace, std::uint8_t>(exec, src, dst, g); break;
    case 2: box_copy_typed<ExecSpace, std::uint16_t>(exec, src, dst, g); break;
    case 4: box_copy_typed<ExecSpace, std::uint32_t>(exec, src, dst, g); break;
    case 8: box_copy_typed<ExecSpace, std::uint64_t>(exec, src, dst, g); break;
    case 16: box_copy_typed<ExecSpace, Word16>(exec, src, dst, g); break;
    default:
      throw_value_error("kvmap: box copy of unsupported element size " + std::to_string(itemsize));
  }
}

}  // namespace kvmap::Impl
