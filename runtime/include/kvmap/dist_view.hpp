#pragma once
/// \file
/// DistView: a global array sharded along one split axis over the ranks of a communicator
/// (or replicated), with each rank's shard in Kokkos memory of MemorySpace.
#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "kvmap/config.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/dtype.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/impl/view_block.hpp"
#include "kvmap/layout.hpp"
#include "kvmap/overlap.hpp"

namespace at {
class Tensor;
}

namespace kvmap::Detail {
struct DistViewAccess;  ///< kvmap's own access to a DistView's parts (not installed, not exported)
}  // namespace kvmap::Detail

KVMAP_API_BEGIN
namespace kvmap {

namespace Impl {
enum class ViewLayoutKind { Right, Left, Stride };
template <class L>
constexpr ViewLayoutKind view_layout_kind() {
  if constexpr (std::is_same_v<L, Kokkos::LayoutRight>) {
    return ViewLayoutKind::Right;
  } else if constexpr (std::is_same_v<L, Kokkos::LayoutLeft>) {
    return ViewLayoutKind::Left;
  } else {
    static_assert(std::is_same_v<L, Kokkos::LayoutStride>,
                  "kvmap::DistView::local_view: layout must be LayoutRight, LayoutLeft or "
                  "LayoutStride");
    return ViewLayoutKind::Stride;
  }
}
/// TypeError unless a view of this element dtype, rank, static extents (-1: dynamic) and
/// layout kind can describe the block.
void check_local_view(DType have, DType want, const LocalBlock& block, int rank,
                      const std::int64_t* static_extents, ViewLayoutKind kind);
}  // namespace Impl

/// A global array sharded along one split axis (or replicated) across the ranks of a
/// kvmap::Comm; each rank's shard lives in `MemorySpace` (HostSpace, CudaSpace, HIPSpace, ...)
/// and is seen by torch without a copy (local()). Copies share the shard.
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
class DistView {
 public:
  /// The Kokkos memory space of the shard, and the execution space kvmap's kernels use on it.
  ///@{
  using memory_space = MemorySpace;
  using execution_space = Impl::exec_space_of<MemorySpace>;
  ///@}

  // ---- collective factories ----------------------------------------------------------
  /// A new array of global shape `gshape`, balanced along `split` (Heat's rule) or
  /// replicated (nullopt): uninitialized (empty), zeros, `value` (full), or 0 .. n-1 (arange,
  /// one dimension). Collective over `comm`.
  ///@{
  static DistView empty(Shape gshape, DType dtype, std::optional<int> split,
                        Comm comm = Comm::world());
  static DistView zeros(Shape gshape, DType dtype, std::optional<int> split,
                        Comm comm = Comm::world());
  static DistView full(Shape gshape, double value, DType dtype, std::optional<int> split,
                       Comm comm = Comm::world());
  static DistView arange(std::int64_t n, DType dtype, std::optional<int> split,
                         Comm comm = Comm::world());
  ///@}

  /// Adopts each rank's local piece without copying; the global shape is the pieces
  /// concatenated in rank order along split (replicated: every rank holds the whole array).
  /// Non-split extents and dtypes must agree on all ranks.
  template <class KokkosView>
  static DistView from_local(const KokkosView& local, std::optional<int> split,
                             Comm comm = Comm::world()) {
    static_assert(Kokkos::is_view<KokkosView>::value,
                  "kvmap::DistView::from_local: expected a Kokkos::View or an at::Tensor");
    static_assert(std::is_same_v<typename KokkosView::memory_space, MemorySpace>,
                  "kvmap::DistView::from_local: the view's memory space must be the "
                  "DistView's MemorySpace");
    static_assert(!std::is_const_v<typename KokkosView::value_type>,
                  "kvmap::DistView::from_local: a view of const elements cannot be adopted, since "
                  "a DistView's memory is writable (local(), redistribution, vmap outputs); pass a "
                  "view of non-const elements, or copy the data first");
    using T = std::remove_cv_t<typename KokkosView::value_type>;
    return from_local_source(
        [&local](DType& dtype) {
          dtype = dtype_of<T>();
          return Impl::block_from_view(local);
        },
        split, std::move(comm));
  }
  /// The same for a torch tensor on the memory space's device (adopted: its storage is kept
  /// alive by the DistView).
  static DistView from_local(const at::Tensor& local, std::optional<int> split,
                             Comm comm = Comm::world());
  /// The same when every rank knows the layout (e.g. Layout::balanced): no rank's count has
  /// to travel, so the agreement is one fixed-size reduction instead of a gather. Each rank's
  /// piece must have layout.lshape(rank); the layout must be the same on every rank.
  static DistView from_local(const at::Tensor& local, const Layout& layout,
                             Comm comm = Comm::world());
  /// Every rank holds the full tensor and keeps (a copy of) its slice.
  static DistView from_global(const at::Tensor& full, std::optional<int> split,
                              Comm comm = Comm::world());
  /// Only root's tensor matters; the other ranks may pass an undefined tensor.
  static DistView scatter(const at::Tensor& full_on_root, std::optional<int> split,
                          Comm comm = Comm::world(), int root = 0);

  // ---- shape and placement -----------------------------------------------------------
  /// How the global array is cut over the ranks.
  const Layout& layout() const { return layout_; }
  /// The global shape, this rank's local shape, every rank's local shape (O(P)), the split
  /// axis (nullopt: replicated), the element type and its size, the number of dimensions,
  /// the communicator, and whether the counts follow Heat's rule (Layout's).
  ///@{
  const Shape& gshape() const { return layout_.gshape(); }
  Shape lshape() const { return block_.extents; }
  std::vector<Shape> lshape_map() const;
  std::optional<int> split() const { return layout_.split(); }
  DType dtype() const { return dtype_; }
  std::size_t itemsize() const { return size_of(dtype_); }
  int ndim() const { return layout_.ndim(); }
  const Comm& comm() const { return comm_; }
  bool is_balanced() const { return layout_.is_balanced(); }
  ///@}
  /// The local shard's element strides and data pointer (in MemorySpace).
  ///@{
  const std::vector<std::int64_t>& local_strides() const { return block_.strides; }
  void* local_data() const { return block_.data; }
  ///@}

  /// Zero-copy view of the local shard (same data pointer; device from the memory space).
  at::Tensor local() const;

  /// Typed, checked, unmanaged Kokkos view of the local shard: TypeError on a dtype, rank,
  /// static extent or layout mismatch (LayoutRight/Left need matching contiguous strides).
  template <class DataType, class KLayout = Kokkos::LayoutStride>
  Kokkos::View<DataType, KLayout, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> local_view()
      const {
    using V = Kokkos::View<DataType, KLayout, MemorySpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using T = std::remove_cv_t<typename V::value_type>;
    constexpr int rank = static_cast<int>(V::rank);
    constexpr int rank_dynamic = static_cast<int>(V::rank_dynamic);
    std::int64_t static_extents[Impl::kMaxRank + 1] = {};
    for (int d = 0; d < rank; ++d) {
      static_extents[d] = d < rank_dynamic ? -1 : static_cast<std::int64_t>(V::static_extent(d));
    }
    Impl::check_local_view(dtype_, dtype_of<T>(), block_, rank, static_extents,
                           Impl::view_layout_kind<KLayout>());
    KLayout layout;
    for (int d = 0; d < rank; ++d) {
      layout.dimension[d] = static_cast<std::size_t>(block_.extents[d]);
      if constexpr (std::is_same_v<KLayout, Kokkos::LayoutStride>) {
        layout.stride[d] = static_cast<std::size_t>(block_.strides[d]);
      }
    }
    return V(static_cast<typename V::pointer_type>(block_.data), layout);
  }

  // ---- redistribution (collective) ---------------------------------------------------
  at::Tensor gather(int root = 0) const;              ///< full array on root, undefined elsewhere
  at::Tensor allgather() const;                       ///< full array on every rank
  DistView resplit(std::optional<int> split) const;   ///< balanced along another axis / replicated
  DistView balance() const;                           ///< same split, balanced counts
  DistView redistribute(const Layout& target) const;  ///< any layout of the same global shape

  // ---- halos (collective) --------------------------------------------------------------
  /// This rank's block extended along the split axis by `options`' depth before and after
  /// (its trim is ignored), the rows beyond the global ends as its boundary says (numpy.pad's
  /// meaning on the gathered array; Boundary::None adds none there): a new contiguous tensor on
  /// the shard's device, with as many rows along the split axis as the local ones plus the
  /// halo's, taken from as many ranks as they lie on. An empty tensor on a rank without rows.
  /// One fixed-size agreement, then only the halo rows travel, to the ranks that need them.
  /// ValueError on every rank for a replicated array, a negative depth, or a depth beyond the
  /// global length with a periodic or reflecting boundary.
  at::Tensor halo(const OverlapOptions& options) const;
  /// halo(OverlapOptions().depth(depth).boundary(boundary, constant)).
  at::Tensor halo(std::int64_t depth, Boundary boundary = Boundary::None,
                  double constant = 0.0) const;

 private:
  friend struct Detail::DistViewAccess;
  DistView(Layout layout, DType dtype, Comm comm, Impl::LocalBlock block)
      : layout_(std::move(layout)),
        dtype_(dtype),
        comm_(std::move(comm)),
        block_(std::move(block)) {}
  /// from_local's collective: `source` (run in the plan) gives this rank's block and dtype.
  using LocalSource = std::function<Impl::LocalBlock(DType&)>;
  static DistView from_local_source(const LocalSource& source, std::optional<int> split, Comm comm);
  /// What the factories write into new memory.
  enum class Fill { Nothing, Zeros, Value, GlobalIndex };
  static DistView create(const char* site, Shape gshape, DType dtype, std::optional<int> split,
                         Comm comm, Fill fill, double value);

  Layout layout_;
  DType dtype_;
  Comm comm_;
  Impl::LocalBlock block_;
};

/// \cond KVMAP_INTERNAL
#define KVMAP_EXTERN_DIST_VIEW(Space) extern template class KVMAP_EXPORT DistView<Space>;
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_EXTERN_DIST_VIEW)
#undef KVMAP_EXTERN_DIST_VIEW
/// \endcond

}  // namespace kvmap
KVMAP_API_END
