#pragma once
/// \file
/// Shard arithmetic of a global array over ranks: pure, no MPI, no Kokkos.
#include "kvmap/config.hpp"
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

KVMAP_API_BEGIN
namespace kvmap {

/// A global or local shape: one extent per dimension.
using Shape = std::vector<std::int64_t>;

/// "[4, 3]".
std::string to_string(const Shape& shape);

/// How a global array of shape gshape is cut along one split axis into per-rank counts,
/// or replicated (split == nullopt: every rank holds the whole array).
///
/// What a layout costs does not grow with the number of ranks unless its counts do: a
/// balanced layout, and one whose rows all sit on one rank, store O(1) and compute counts and
/// offsets arithmetically; other counts are stored once and shared by every layout derived
/// from them (with_shape: vmap outputs, copies). Each layout has a 64-bit fingerprint,
/// computed once when it is built, that equal layouts share (collective calls agree on it).
class Layout {
 public:
  /// Heat's shard rule: n rows on P ranks, c = n / P, r = n % P; ranks < r get c + 1.
  static Layout balanced(Shape gshape, std::optional<int> split, int nranks);
  /// Any non-negative counts that sum to gshape[split]; one per rank. Counts that follow
  /// Heat's rule give the balanced layout (equal to it, O(1) storage).
  static Layout from_counts(Shape gshape, int split, std::vector<std::int64_t> counts);
  /// Every row along split on rank `holder` (a gather's target, a scatter's source).
  static Layout on_rank(Shape gshape, int split, int holder, int nranks);
  /// Every one of nranks ranks holds the whole array.
  static Layout replicated(Shape gshape, int nranks);
  /// A layout of another global shape over the same per-rank rows (shared, not copied),
  /// split along `split` of the new shape; gshape[split] must be this layout's split extent.
  Layout with_shape(Shape gshape, int split) const;

  /// Copies and moves share the stored counts (no per-rank copy).
  ///@{
  Layout(const Layout& other);
  Layout(Layout&& other) noexcept;
  Layout& operator=(const Layout& other);
  Layout& operator=(Layout&& other) noexcept;
  ///@}
  ~Layout();

  /// The global shape, the split axis (nullopt: replicated), the number of ranks, the
  /// number of dimensions and the number of elements of the global array.
  ///@{
  const Shape& gshape() const { return gshape_; }
  std::optional<int> split() const { return split_; }
  int nranks() const { return nranks_; }
  int ndim() const { return static_cast<int>(gshape_.size()); }
  std::int64_t numel() const;
  ///@}

  /// Rows along the split axis. A replicated layout has no split axis: count, offset,
  /// counts, offsets, owner and ranks_meeting throw ValueError on it, lshape(r) is the
  /// global shape. count, offset and lshape are O(1) for balanced and one-rank layouts.
  ///@{
  std::int64_t count(int rank) const;
  std::int64_t offset(int rank) const;
  Shape lshape(int rank) const;
  ///@}
  /// One entry per rank: O(P) the first time they are asked of a balanced or one-rank layout
  /// (kvmap's own per-call paths use count/offset/ranks_meeting instead).
  ///@{
  const std::vector<std::int64_t>& counts() const;
  const std::vector<std::int64_t>& offsets() const;
  ///@}
  /// The rank holding the global row `global_index` along the split axis. O(log P).
  int owner(std::int64_t global_index) const;
  /// The ranks [first, last) whose rows meet the global rows [lo, hi) (lo < hi); ranks in
  /// between that hold no row are included. O(log P).
  std::pair<int, int> ranks_meeting(std::int64_t lo, std::int64_t hi) const;
  /// Ranks holding at least one row (all ranks when replicated). O(1).
  int ranks_with_rows() const;

  /// Whether the counts follow Heat's rule (balanced()). O(1).
  bool is_balanced() const;
  /// No split axis: every rank holds the whole array.
  bool is_replicated() const { return !split_.has_value(); }
  /// Equal split extents and per-rank counts, whatever the other extents: O(1) when the
  /// counts are shared or arithmetic.
  bool same_rows(const Layout& other) const;
  /// 64 bits that equal layouts share (computed once, when the layout is built).
  std::uint64_t fingerprint() const { return fingerprint_; }
  /// Same global shape, split axis, number of ranks and counts.
  ///@{
  bool operator==(const Layout& other) const;
  bool operator!=(const Layout& other) const { return !(*this == other); }
  ///@}
  /// For messages: the counts in full up to 32 ranks, abbreviated beyond.
  std::string str() const;

 private:
  enum class Kind : std::uint8_t { Replicated, Balanced, OneRank, Counts };
  struct Rows;  ///< stored counts, their offsets and hash; shared
  Layout(Shape gshape, std::optional<int> split, int nranks, Kind kind, int holder,
         std::shared_ptr<const Rows> rows);
  void check_rank(int rank) const;
  void check_split(const char* what) const;
  std::int64_t extent() const { return gshape_[static_cast<std::size_t>(*split_)]; }
  const Rows& materialized() const;
  std::uint64_t compute_fingerprint() const;

  Shape gshape_;
  std::optional<int> split_;
  int nranks_ = 1;
  Kind kind_ = Kind::Replicated;
  int holder_ = 0;                    ///< OneRank
  std::shared_ptr<const Rows> rows_;  ///< Counts
  std::uint64_t fingerprint_ = 0;
  /// counts()/offsets() of a balanced or one-rank layout, made on first use (owned).
  mutable std::atomic<const Rows*> lazy_rows_{nullptr};
};

/// Writes layout.str().
std::ostream& operator<<(std::ostream& os, const Layout& layout);

namespace Impl {
/// Normalizes a possibly negative axis for an array of ndim dimensions; ValueError names `what`.
int normalize_axis(std::int64_t axis, int ndim, const char* what);
/// Product of extents; ValueError on negative extents or int64 overflow.
std::int64_t checked_numel(const Shape& shape);
}  // namespace Impl

}  // namespace kvmap
KVMAP_API_END
