#include "kvmap/layout.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "kvmap/error.hpp"

namespace kvmap {

// Plain appends, no stream: signatures of every collective call are built from these.
std::string to_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

namespace Impl {

int normalize_axis(std::int64_t axis, int ndim, const char* what) {
  KVMAP_CHECK(ndim > 0, ValueError,
              "kvmap: " << what << " " << axis << " is invalid for a 0-dimensional array");
  KVMAP_CHECK(axis >= -ndim && axis < ndim, ValueError,
              "kvmap: " << what << " " << axis << " is out of range for an array of " << ndim
                        << " dimensions (expected " << -ndim << " <= axis < " << ndim << ")");
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

std::int64_t checked_numel(const Shape& shape) {
  std::int64_t n = 1;
  bool overflow = false;
  for (std::int64_t e : shape) {
    KVMAP_CHECK(e >= 0, ValueError,
                "kvmap: shape " << to_string(shape) << " has a negative extent " << e);
    if (e != 0 && n > std::numeric_limits<std::int64_t>::max() / e) overflow = true;
    n = overflow ? n : n * e;
  }
  // An empty array never overflows, whatever its other extents.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  KVMAP_CHECK(!overflow, ValueError,
              "kvmap: shape " << to_string(shape) << " has more elements than int64 can count");
  return n;
}

}  // namespace Impl

Layout::Layout(Shape gshape, std::optional<int> split, int nranks, std::vector<std::int64_t> counts)
    : gshape_(std::move(gshape)), split_(split), nranks_(nranks), counts_(std::move(counts)) {
  offsets_.resize(counts_.size());
  std::int64_t off = 0;
  for (std::size_t r = 0; r < counts_.size(); ++r) {
    offsets_[r] = off;
    off += counts_[r];
  }
}

Layout Layout::balanced(Shape gshape, std::optional<int> split, int nranks) {
  KVMAP_CHECK(nranks >= 1, ValueError, "kvmap::Layout: nranks must be >= 1, got " << nranks);
  Impl::checked_numel(gshape);
  if (!split) return Layout(std::move(gshape), std::nullopt, nranks, {});
  const int s = Impl::normalize_axis(*split, static_cast<int>(gshape.size()), "split axis");
  const std::int64_t n = gshape[s];
  const std::int64_t c = n / nranks, r = n % nranks;
  std::vector<std::int64_t> counts(static_cast<std::size_t>(nranks));
  for (int p = 0; p < nranks; ++p) counts[p] = c + (p < r ? 1 : 0);
  return Layout(std::move(gshape), s, nranks, std::move(counts));
}

Layout Layout::from_counts(Shape gshape, int split, std::vector<std::int64_t> counts) {
  Impl::checked_numel(gshape);
  const int s = Impl::normalize_axis(split, static_cast<int>(gshape.size()), "split axis");
  KVMAP_CHECK(!counts.empty(), ValueError, "kvmap::Layout::from_counts: counts must not be empty");
  std::int64_t sum = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    KVMAP_CHECK(
        counts[r] >= 0, ValueError,
        "kvmap::Layout::from_counts: count " << counts[r] << " of rank " << r << " is negative");
    KVMAP_CHECK(counts[r] <= gshape[s] - sum, ValueError,
                "kvmap::Layout::from_counts: counts " << to_string(counts) << " sum to more than "
                                                      << "the extent " << gshape[s] << " of axis "
                                                      << s);
    sum += counts[r];
  }
  KVMAP_CHECK(sum == gshape[s], ValueError,
              "kvmap::Layout::from_counts: counts "
                  << to_string(counts) << " sum to " << sum << ", expected the extent " << gshape[s]
                  << " of split axis " << s << " of shape " << to_string(gshape));
  const int nranks = static_cast<int>(counts.size());
  return Layout(std::move(gshape), s, nranks, std::move(counts));
}

Layout Layout::replicated(Shape gshape, int nranks) {
  return balanced(std::move(gshape), std::nullopt, nranks);
}

std::int64_t Layout::numel() const {
  return Impl::checked_numel(gshape_);
}

void Layout::check_rank(int rank) const {
  KVMAP_CHECK(rank >= 0 && rank < nranks_, ValueError,
              "kvmap::Layout: rank " << rank << " out of range for " << nranks_ << " ranks");
}

void Layout::check_split(const char* what) const {
  KVMAP_CHECK(split_.has_value(), ValueError,
              "kvmap::Layout::" << what << ": the layout is replicated (no split axis)");
}

std::int64_t Layout::count(int rank) const {
  check_split("count");
  check_rank(rank);
  return counts_[rank];
}

std::int64_t Layout::offset(int rank) const {
  check_split("offset");
  check_rank(rank);
  return offsets_[rank];
}

Shape Layout::lshape(int rank) const {
  check_rank(rank);
  Shape s = gshape_;
  if (split_) s[*split_] = counts_[rank];
  return s;
}

const std::vector<std::int64_t>& Layout::counts() const {
  check_split("counts");
  return counts_;
}

const std::vector<std::int64_t>& Layout::offsets() const {
  check_split("offsets");
  return offsets_;
}

int Layout::owner(std::int64_t global_index) const {
  check_split("owner");
  const std::int64_t n = gshape_[*split_];
  KVMAP_CHECK(global_index >= 0 && global_index < n, ValueError,
              "kvmap::Layout::owner: index " << global_index << " out of range [0, " << n << ")");
  // The last rank whose offset is <= index and which holds rows (empty ranks own nothing).
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), global_index);
  int r = static_cast<int>(it - offsets_.begin()) - 1;
  while (counts_[r] == 0) --r;
  return r;
}

bool Layout::is_balanced() const {
  if (!split_) return true;
  return *this == balanced(gshape_, split_, nranks_);
}

bool Layout::operator==(const Layout& other) const {
  return gshape_ == other.gshape_ && split_ == other.split_ && nranks_ == other.nranks_ &&
         counts_ == other.counts_;
}

std::string Layout::str() const {
  std::string s = "Layout(gshape=" + to_string(gshape_) + ", split=";
  if (split_) {
    s += std::to_string(*split_) + ", counts=" + to_string(counts_);
  } else {
    s += "None (replicated on " + std::to_string(nranks_) + " ranks)";
  }
  s += ")";
  return s;
}

std::ostream& operator<<(std::ostream& os, const Layout& layout) {
  return os << layout.str();
}

}  // namespace kvmap
