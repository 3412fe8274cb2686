#pragma once
// Shard arithmetic of a global array over ranks: pure, no MPI, no Kokkos.
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace kvmap {

using Shape = std::vector<std::int64_t>;

std::string to_string(const Shape& shape);

// How a global array of shape gshape is cut along one split axis into per-rank counts,
// or replicated (split == nullopt: every rank holds the whole array).
class Layout {
 public:
  // Heat's shard rule: n rows on P ranks, c = n / P, r = n % P; ranks < r get c + 1.
  static Layout balanced(Shape gshape, std::optional<int> split, int nranks);
  // Any non-negative counts that sum to gshape[split]; one per rank.
  static Layout from_counts(Shape gshape, int split, std::vector<std::int64_t> counts);
  // Every one of nranks ranks holds the whole array.
  static Layout replicated(Shape gshape, int nranks);

  const Shape& gshape() const { return gshape_; }
  std::optional<int> split() const { return split_; }
  int nranks() const { return nranks_; }
  int ndim() const { return static_cast<int>(gshape_.size()); }
  std::int64_t numel() const;

  // Rows along the split axis. A replicated layout has no split axis: count, offset,
  // counts, offsets and owner throw ValueError on it, lshape(r) is the global shape.
  std::int64_t count(int rank) const;
  std::int64_t offset(int rank) const;
  Shape lshape(int rank) const;
  const std::vector<std::int64_t>& counts() const;
  const std::vector<std::int64_t>& offsets() const;
  int owner(std::int64_t global_index) const;

  bool is_balanced() const;
  bool is_replicated() const { return !split_.has_value(); }
  bool operator==(const Layout& other) const;
  bool operator!=(const Layout& other) const { return !(*this == other); }
  std::string str() const;

 private:
  Layout(Shape gshape, std::optional<int> split, int nranks, std::vector<std::int64_t> counts);
  void check_rank(int rank) const;
  void check_split(const char* what) const;

  Shape gshape_;
  std::optional<int> split_;
  int nranks_ = 1;
  std::vector<std::int64_t> counts_;
  std::vector<std::int64_t> offsets_;
};

std::ostream& operator<<(std::ostream& os, const Layout& layout);

namespace Impl {
// Normalizes a possibly negative axis for an array of ndim dimensions; ValueError names `what`.
int normalize_axis(std::int64_t axis, int ndim, const char* what);
// Product of extents; ValueError on negative extents or int64 overflow.
std::int64_t checked_numel(const Shape& shape);
}  // namespace Impl

}  // namespace kvmap
