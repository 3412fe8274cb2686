// Full neighbour lists over all of a rank's atoms and ghosts, for pair_style kvmap's ghosts
// mode: a message-passing model that recomputes its layers on the ghosts needs each ghost's
// neighbours too, and ExaMiniMD lists the neighbours of its own atoms only. The atoms are binned
// with Kokkos::BinSort over their bounding box in cells no narrower than the cutoff; a list is
// read through the interface of ExaMiniMD's lists (get_neighs(i).get_num_neighs(), (k)), in
// ExaMiniMD's memory space. It is built again only when an atom moved more than half the skin
// since the last build, or the rows changed (ExaMiniMD's rebuilds reorder atoms and ghosts).
#ifndef KVMAP_EXAMINIMD_SHELL_NEIGHBORS_H
#define KVMAP_EXAMINIMD_SHELL_NEIGHBORS_H

#include <types.h>

#include <Kokkos_Core.hpp>
#include <Kokkos_Sort.hpp>

#include <algorithm>
#include <utility>

class ShellNeighbors {
 public:
  using Exec = Kokkos::DefaultExecutionSpace;
  using MemSpace = Exec::memory_space;

  // One atom's neighbours (ExaMiniMD's neighbour-list interface).
  struct Row {
    const T_INT* neighbors;
    int count;
    KOKKOS_INLINE_FUNCTION int get_num_neighs() const { return count; }
    KOKKOS_INLINE_FUNCTION T_INT operator()(int k) const { return neighbors[k]; }
  };

  KOKKOS_INLINE_FUNCTION Row get_neighs(T_INT i) const { return Row{&index_(i, 0), count_(i)}; }

  // Whether the lists must be built again for the first n rows of x: their number changed, or
  // some atom moved more than `half_skin` since the last build.
  bool stale(const t_x& x, T_INT n, double half_skin) const {
    if (n != rows_ || built_.extent(0) != static_cast<std::size_t>(n)) return true;
    const auto x0 = built_;
    double worst = 0;
    Kokkos::parallel_reduce(
        "kvmap::examinimd::shell_moved", Kokkos::RangePolicy<Exec>(0, n),
        KOKKOS_LAMBDA(const T_INT i, double& m) {
          double rsq = 0;
          for (int d = 0; d < 3; ++d) rsq += (x(i, d) - x0(i, d)) * (x(i, d) - x0(i, d));
          if (rsq > m) m = rsq;
        },
        Kokkos::Max<double>(worst));
    return worst > half_skin * half_skin;
  }

  // Every pair of the first n rows of x within `cutoff` of each other (i != j).
  void build(const t_x& x, T_INT n, double cutoff) {
    rows_ = n;
    built_ = Kokkos::View<double**, Kokkos::LayoutRight, MemSpace>(
        Kokkos::view_alloc("kvmap::examinimd::shell_positions", Kokkos::WithoutInitializing), n,
        3);
    const auto x0 = built_;
    Kokkos::parallel_for(
        "kvmap::examinimd::shell_keep", Kokkos::RangePolicy<Exec>(0, n),
        KOKKOS_LAMBDA(const T_INT i) {
          for (int d = 0; d < 3; ++d) x0(i, d) = x(i, d);
        });
    count_ = Kokkos::View<int*, MemSpace>("kvmap::examinimd::shell_counts", n);
    if (n == 0) {
      index_ = decltype(index_)("kvmap::examinimd::shell_neighbors", 0, 1);
      return;
    }
    Cells cells;
    for (int d = 0; d < 3; ++d) {
      double lo = 0, hi = 0;
      Kokkos::parallel_reduce(
          "kvmap::examinimd::shell_lo", Kokkos::RangePolicy<Exec>(0, n),
          KOKKOS_LAMBDA(const T_INT i, double& m) { m = x0(i, d) < m ? x0(i, d) : m; },
          Kokkos::Min<double>(lo));
      Kokkos::parallel_reduce(
          "kvmap::examinimd::shell_hi", Kokkos::RangePolicy<Exec>(0, n),
          KOKKOS_LAMBDA(const T_INT i, double& m) { m = x0(i, d) > m ? x0(i, d) : m; },
          Kokkos::Max<double>(hi));
      cells.lo[d] = lo;
      cells.bins[d] = std::max(1, static_cast<int>((hi - lo) / cutoff));
      cells.inverse[d] = hi > lo ? cells.bins[d] / (hi - lo) : 0.0;  // cells >= cutoff wide
    }
    Kokkos::BinSort<decltype(x0), Cells> sorter(x0, cells);
    sorter.create_permute_vector();
    const auto permute = sorter.get_permute_vector();
    const auto offsets = sorter.get_bin_offsets();
    const auto in_bin = sorter.get_bin_count();
    const auto counts = count_;
    using Pairs = PairsOf<decltype(permute), decltype(offsets), decltype(in_bin)>;
    const Pairs pairs{cells, x0, permute, offsets, in_bin, cutoff * cutoff};
    int width = 0;
    Kokkos::parallel_reduce(
        "kvmap::examinimd::shell_count", Kokkos::RangePolicy<Exec>(0, n),
        KOKKOS_LAMBDA(const T_INT i, int& m) {
          int k = 0;
          pairs(i, [&k](T_INT) { ++k; });
          counts(i) = k;
          if (k > m) m = k;
        },
        Kokkos::Max<int>(width));
    index_ = decltype(index_)(
        Kokkos::view_alloc("kvmap::examinimd::shell_neighbors", Kokkos::WithoutInitializing), n,
        std::max(width, 1));
    const auto index = index_;
    Kokkos::parallel_for(
        "kvmap::examinimd::shell_fill", Kokkos::RangePolicy<Exec>(0, n),
        KOKKOS_LAMBDA(const T_INT i) {
          int k = 0;
          pairs(i, [&](T_INT j) { index(i, k++) = j; });
        });
    Exec().fence();
  }

 private:
  // Kokkos::BinSort's bin operator: cells of the bounding box, positions clamped into it.
  struct Cells {
    double lo[3] = {0, 0, 0}, inverse[3] = {0, 0, 0};
    int bins[3] = {1, 1, 1};
    KOKKOS_INLINE_FUNCTION int cell(double v, int d) const {
      const int c = static_cast<int>((v - lo[d]) * inverse[d]);
      return c < 0 ? 0 : (c >= bins[d] ? bins[d] - 1 : c);
    }
    template <class Keys>
    KOKKOS_INLINE_FUNCTION int bin(Keys& x, const int& i) const {
      return (cell(x(i, 0), 0) * bins[1] + cell(x(i, 1), 1)) * bins[2] + cell(x(i, 2), 2);
    }
    KOKKOS_INLINE_FUNCTION int max_bins() const { return bins[0] * bins[1] * bins[2]; }
    template <class Keys, class I1, class I2>
    KOKKOS_INLINE_FUNCTION bool operator()(Keys& x, const I1& i, const I2& j) const {
      return bin(x, i) < bin(x, j);  // order within bins: unused (no sort within bins)
    }
  };

  // Calls visit(j) for every j != i within the cutoff of atom i, scanning the 27 cells around
  // i's; j in the order of the sorted cells.
  template <class Permute, class Offsets, class Counts>
  struct PairsOf {
    Cells cells;
    Kokkos::View<double**, Kokkos::LayoutRight, MemSpace> x;
    Permute permute;
    Offsets offsets;
    Counts in_bin;
    double cutsq;
    template <class Visit>
    KOKKOS_INLINE_FUNCTION void operator()(const T_INT i, Visit&& visit) const {
      int c[3];
      for (int d = 0; d < 3; ++d) c[d] = cells.cell(x(i, d), d);
      for (int a = c[0] > 0 ? c[0] - 1 : 0; a <= c[0] + 1 && a < cells.bins[0]; ++a)
        for (int b = c[1] > 0 ? c[1] - 1 : 0; b <= c[1] + 1 && b < cells.bins[1]; ++b)
          for (int e = c[2] > 0 ? c[2] - 1 : 0; e <= c[2] + 1 && e < cells.bins[2]; ++e) {
            const int bin = (a * cells.bins[1] + b) * cells.bins[2] + e;
            const auto begin = offsets(bin), end = begin + in_bin(bin);
            for (auto p = begin; p < end; ++p) {
              const T_INT j = static_cast<T_INT>(permute(p));
              double rsq = 0;
              for (int d = 0; d < 3; ++d) rsq += (x(j, d) - x(i, d)) * (x(j, d) - x(i, d));
              if (j != i && rsq <= cutsq) visit(j);
            }
          }
    }
  };

  T_INT rows_ = -1;
  Kokkos::View<double**, Kokkos::LayoutRight, MemSpace> built_;
  Kokkos::View<int*, MemSpace> count_;
  Kokkos::View<T_INT**, Kokkos::LayoutRight, MemSpace> index_;
};

#endif
