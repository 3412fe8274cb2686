#pragma once
// Strided N-d box copy between two memory layouts, as one Kokkos kernel per element type:
// the pack and unpack step of every redistribution.
#include <Kokkos_Core.hpp>

#include <complex>
#include <cstdint>

#include "detail.hpp"
#include "kvmap/dtype.hpp"

#include "local_block.hpp"

namespace kvmap::Detail {

// The pair of a complex number as plain data: std::complex's size and alignment (Kokkos'
// complex is aligned to its size, which adopted memory need not be), copyable in device code.
template <class R>
struct complex_parts {
  R re, im;
};
static_assert(sizeof(complex_parts<double>) == sizeof(std::complex<double>) &&
                  alignof(complex_parts<double>) == alignof(std::complex<double>),
              "complex_parts has std::complex's layout");

// The type a kernel moves an element as: the table's storage type, with the plain pair for
// std::complex, and bytes for bool (memory of a bool array need not hold 0 or 1, e.g.
// DistView::empty's; loading it as bool is undefined).
template <class T>
struct kernel_element {
  using type = T;
};
template <>
struct kernel_element<bool> {
  using type = std::uint8_t;
};
template <class R>
struct kernel_element<std::complex<R>> {
  using type = complex_parts<R>;
};

template <class Space, class T>
using UnmanagedElements = Kokkos::View<T*, Space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// Copies the box `g` from src to dst, both seen as the elements their strides reach (typed,
// unmanaged, bounds-checked in Kokkos debug builds).
template <class ExecSpace, class T>
void box_copy_typed(const ExecSpace& exec,
                    UnmanagedElements<typename ExecSpace::memory_space, const T> src,
                    UnmanagedElements<typename ExecSpace::memory_space, T> dst,
                    const StridedCopy& g) {
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
          for (std::int64_t j = 0; j < inner; ++j) dst(dof + j * ds) = src(so + j * ss);
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
          dst(dof) = src(so);
        });
  }
}

// Elements a box with these extents and strides reaches from its first element.
inline std::size_t reach(const StridedCopy& g, const std::int64_t* strides) {
  std::int64_t last = 0;
  for (int d = 0; d < g.ndim; ++d) last += (g.extents[d] - 1) * strides[d];
  return static_cast<std::size_t>(last) + 1;
}

// Copies the box of `dtype` elements. Asynchronous on `exec`: fence before reading dst from
// another space or from MPI.
template <class ExecSpace>
void box_copy(const ExecSpace& exec, const void* src, void* dst, const StridedCopy& g,
              DType dtype) {
  if (g.numel() == 0) return;
  using M = typename ExecSpace::memory_space;
  visit(dtype, [&](auto tag) {
    using T = typename kernel_element<typename decltype(tag)::type>::type;
    box_copy_typed<ExecSpace, T>(
        exec, UnmanagedElements<M, const T>(static_cast<const T*>(src), reach(g, g.src_strides)),
        UnmanagedElements<M, T>(static_cast<T*>(dst), reach(g, g.dst_strides)), g);
  });
}

}  // namespace kvmap::Detail
