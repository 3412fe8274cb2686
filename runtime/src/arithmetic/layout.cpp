#include "kvmap/layout.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "kvmap/error.hpp"
#include "hash.hpp"

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

struct Layout::Rows {
  std::vector<std::int64_t> counts;
  std::vector<std::int64_t> offsets;  // exclusive prefix sums, one per rank
  std::uint64_t hash = 0;
  int with_rows = 0;

  explicit Rows(std::vector<std::int64_t> c) : counts(std::move(c)), offsets(counts.size()) {
    std::int64_t off = 0;
    std::uint64_t h = 0x6b766d61705f726full;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = off;
      off += counts[r];
      with_rows += counts[r] > 0 ? 1 : 0;
      h = Detail::combine64(h, static_cast<std::uint64_t>(counts[r]));
    }
    hash = h;
  }
};

namespace {
// Heat's rule, arithmetically.
struct Heat {
  std::int64_t c, r;
  Heat(std::int64_t n, int P) : c(n / P), r(n % P) {}
  std::int64_t count(int rank) const { return c + (rank < r ? 1 : 0); }
  std::int64_t offset(int rank) const { return rank * c + std::min<std::int64_t>(rank, r); }
  // The rank whose rows hold global row i (0 <= i < n).
  int owner(std::int64_t i) const {
    const std::int64_t big = r * (c + 1);
    return static_cast<int>(i < big ? i / (c + 1) : r + (i - big) / c);
  }
};
}  // namespace

Layout::Layout(Shape gshape, std::optional<int> split, int nranks, Kind kind, int holder,
               std::shared_ptr<const Rows> rows)
    : gshape_(std::move(gshape)),
      split_(split),
      nranks_(nranks),
      kind_(kind),
      holder_(holder),
      rows_(std::move(rows)) {
  fingerprint_ = compute_fingerprint();
}

Layout::Layout(const Layout& other)
    : gshape_(other.gshape_),
      split_(other.split_),
      nranks_(other.nranks_),
      kind_(other.kind_),
      holder_(other.holder_),
      rows_(other.rows_),
      fingerprint_(other.fingerprint_) {}

Layout::Layout(Layout&& other) noexcept
    : gshape_(std::move(other.gshape_)),
      split_(other.split_),
      nranks_(other.nranks_),
      kind_(other.kind_),
      holder_(other.holder_),
      rows_(std::move(other.rows_)),
      fingerprint_(other.fingerprint_),
      lazy_rows_(other.lazy_rows_.exchange(nullptr)) {}

Layout& Layout::operator=(const Layout& other) {
  if (this != &other) *this = Layout(other);
  return *this;
}

Layout& Layout::operator=(Layout&& other) noexcept {
  if (this == &other) return *this;
  gshape_ = std::move(other.gshape_);
  split_ = other.split_;
  nranks_ = other.nranks_;
  kind_ = other.kind_;
  holder_ = other.holder_;
  rows_ = std::move(other.rows_);
  fingerprint_ = other.fingerprint_;
  delete lazy_rows_.exchange(other.lazy_rows_.exchange(nullptr));
  return *this;
}

Layout::~Layout() {
  delete lazy_rows_.load();
}

std::uint64_t Layout::compute_fingerprint() const {
  std::uint64_t h = Detail::combine64(0x6c61796f7574ull, static_cast<std::uint64_t>(nranks_));
  h = Detail::combine64(h, gshape_.size());
  for (std::int64_t e : gshape_) h = Detail::combine64(h, static_cast<std::uint64_t>(e));
  h = Detail::combine64(h, split_ ? static_cast<std::uint64_t>(*split_) : ~0ull);
  h = Detail::combine64(h, static_cast<std::uint64_t>(kind_));
  if (kind_ == Kind::OneRank) h = Detail::combine64(h, static_cast<std::uint64_t>(holder_));
  if (kind_ == Kind::Counts) h = Detail::combine64(h, rows_->hash);
  return h;
}

Layout Layout::balanced(Shape gshape, std::optional<int> split, int nranks) {
  KVMAP_CHECK(nranks >= 1, ValueError, "kvmap::Layout: nranks must be >= 1, got " << nranks);
  Impl::checked_numel(gshape);
  if (!split) return Layout(std::move(gshape), std::nullopt, nranks, Kind::Replicated, 0, {});
  const int s = Impl::normalize_axis(*split, static_cast<int>(gshape.size()), "split axis");
  return Layout(std::move(gshape), s, nranks, Kind::Balanced, 0, {});
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
  // One representation per layout, so that equal layouts have equal fingerprints.
  const Heat heat(gshape[s], nranks);
  bool balanced = true;
  int holders = 0, holder = 0;
  for (int r = 0; r < nranks; ++r) {
    balanced = balanced && counts[r] == heat.count(r);
    if (counts[r] > 0) {
      ++holders;
      holder = r;
    }
  }
  if (balanced) return Layout(std::move(gshape), s, nranks, Kind::Balanced, 0, {});
  if (holders == 1) return Layout(std::move(gshape), s, nranks, Kind::OneRank, holder, {});
  auto rows = std::make_shared<const Rows>(std::move(counts));
  return Layout(std::move(gshape), s, nranks, Kind::Counts, 0, std::move(rows));
}

Layout Layout::on_rank(Shape gshape, int split, int holder, int nranks) {
  KVMAP_CHECK(nranks >= 1, ValueError, "kvmap::Layout: nranks must be >= 1, got " << nranks);
  KVMAP_CHECK(
      holder >= 0 && holder < nranks, ValueError,
      "kvmap::Layout::on_rank: rank " << holder << " out of range for " << nranks << " ranks");
  Impl::checked_numel(gshape);
  const int s = Impl::normalize_axis(split, static_cast<int>(gshape.size()), "split axis");
  // No rows, one rank, or one row on rank 0: that is Heat's rule too.
  const std::int64_t n = gshape[s];
  if (n == 0 || nranks == 1 || (n == 1 && holder == 0)) {
    return Layout(std::move(gshape), s, nranks, Kind::Balanced, 0, {});
  }
  return Layout(std::move(gshape), s, nranks, Kind::OneRank, holder, {});
}

Layout Layout::replicated(Shape gshape, int nranks) {
  return balanced(std::move(gshape), std::nullopt, nranks);
}

Layout Layout::with_shape(Shape gshape, int split) const {
  check_split("with_shape");
  Impl::checked_numel(gshape);
  const int s = Impl::normalize_axis(split, static_cast<int>(gshape.size()), "split axis");
  KVMAP_CHECK(gshape[s] == extent(), ValueError,
              "kvmap::Layout::with_shape: axis " << s << " of shape " << to_string(gshape)
                                                 << " has extent " << gshape[s]
                                                 << ", the layout's split axis " << extent());
  return Layout(std::move(gshape), s, nranks_, kind_, holder_, rows_);
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
  switch (kind_) {
    case Kind::Balanced: return Heat(extent(), nranks_).count(rank);
    case Kind::OneRank: return rank == holder_ ? extent() : 0;
    case Kind::Counts: return rows_->counts[rank];
    case Kind::Replicated: break;
  }
  return 0;
}

std::int64_t Layout::offset(int rank) const {
  check_split("offset");
  check_rank(rank);
  switch (kind_) {
    case Kind::Balanced: return Heat(extent(), nranks_).offset(rank);
    case Kind::OneRank: return rank <= holder_ ? 0 : extent();
    case Kind::Counts: return rows_->offsets[rank];
    case Kind::Replicated: break;
  }
  return 0;
}

Shape Layout::lshape(int rank) const {
  check_rank(rank);
  Shape s = gshape_;
  if (split_) s[*split_] = count(rank);
  return s;
}

const Layout::Rows& Layout::materialized() const {
  if (kind_ == Kind::Counts) return *rows_;
  const Rows* rows = lazy_rows_.load(std::memory_order_acquire);
  if (rows != nullptr) return *rows;
  std::vector<std::int64_t> c(static_cast<std::size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) c[r] = count(r);
  auto* made = new Rows(std::move(c));
  const Rows* expected = nullptr;
  if (!lazy_rows_.compare_exchange_strong(expected, made, std::memory_order_acq_rel)) {
    delete made;  // another thread made them first
    return *expected;
  }
  return *made;
}

const std::vector<std::int64_t>& Layout::counts() const {
  check_split("counts");
  return materialized().counts;
}

const std::vector<std::int64_t>& Layout::offsets() const {
  check_split("offsets");
  return materialized().offsets;
}

int Layout::owner(std::int64_t global_index) const {
  check_split("owner");
  const std::int64_t n = extent();
  KVMAP_CHECK(global_index >= 0 && global_index < n, ValueError,
              "kvmap::Layout::owner: index " << global_index << " out of range [0, " << n << ")");
  switch (kind_) {
    case Kind::Balanced: return Heat(n, nranks_).owner(global_index);
    case Kind::OneRank: return holder_;
    default: break;
  }
  // The last rank whose offset is <= index: never an empty rank (the next one has the same
  // offset), so the rank that holds the row.
  const auto& off = rows_->offsets;
  auto it = std::upper_bound(off.begin(), off.end(), global_index);
  return static_cast<int>(it - off.begin()) - 1;
}

std::pair<int, int> Layout::ranks_meeting(std::int64_t lo, std::int64_t hi) const {
  check_split("ranks_meeting");
  KVMAP_CHECK(0 <= lo && lo < hi && hi <= extent(), ValueError,
              "kvmap::Layout::ranks_meeting: rows [" << lo << ", " << hi << ") out of range [0, "
                                                     << extent() << ")");
  return {owner(lo), owner(hi - 1) + 1};
}

int Layout::ranks_with_rows() const {
  switch (kind_) {
    case Kind::Replicated: return nranks_;
    case Kind::Balanced: return static_cast<int>(std::min<std::int64_t>(extent(), nranks_));
    case Kind::OneRank: return 1;
    case Kind::Counts: return rows_->with_rows;
  }
  return 0;
}

bool Layout::is_balanced() const {
  return kind_ == Kind::Replicated || kind_ == Kind::Balanced;
}

bool Layout::same_rows(const Layout& other) const {
  if (!split_ || !other.split_ || nranks_ != other.nranks_ || kind_ != other.kind_ ||
      extent() != other.extent()) {
    return false;
  }
  switch (kind_) {
    case Kind::Balanced: return true;
    case Kind::OneRank: return holder_ == other.holder_;
    case Kind::Counts:
      return rows_ == other.rows_ ||
             (rows_->hash == other.rows_->hash && rows_->counts == other.rows_->counts);
    case Kind::Replicated: break;
  }
  return false;
}

bool Layout::operator==(const Layout& other) const {
  if (fingerprint_ != other.fingerprint_ || gshape_ != other.gshape_ || split_ != other.split_ ||
      nranks_ != other.nranks_) {
    return false;
  }
  return !split_ || same_rows(other);
}

std::string Layout::str() const {
  std::string s = "Layout(gshape=" + to_string(gshape_) + ", split=";
  if (!split_) {
    s += "None (replicated on " + std::to_string(nranks_) + " ranks))";
    return s;
  }
  s += std::to_string(*split_) + ", counts=";
  constexpr int kShown = 32, kEnds = 8;
  if (nranks_ <= kShown) {
    Shape c(static_cast<std::size_t>(nranks_));
    for (int r = 0; r < nranks_; ++r) c[r] = count(r);
    s += to_string(c);
  } else {
    s += "[";
    for (int r = 0; r < kEnds; ++r) s += std::to_string(count(r)) + ", ";
    s += "...";
    for (int r = nranks_ - kEnds; r < nranks_; ++r) s += ", " + std::to_string(count(r));
    s += "] on " + std::to_string(nranks_) + " ranks";
    if (kind_ == Kind::Balanced) s += ", balanced";
    if (kind_ == Kind::Counts) {
      s += ", counts fingerprint " + std::to_string(rows_->hash);
    }
  }
  s += ")";
  return s;
}

std::ostream& operator<<(std::ostream& os, const Layout& layout) {
  return os << layout.str();
}

}  // namespace kvmap
