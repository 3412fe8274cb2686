// Which rows each rank's extended block holds (halo_plan.hpp).
#include "halo_plan.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "kvmap/error.hpp"
#include "kvmap/overlap.hpp"

namespace kvmap::Detail {

namespace {

std::int64_t rows_of(const Layout& layout) {
  return layout.gshape()[static_cast<std::size_t>(*layout.split())];
}

// The global row the extended block's row at global position g (outside [0, n) for the
// boundary's rows) holds; -1 for the constant.
std::int64_t source_of(std::int64_t g, std::int64_t n, HaloBoundary boundary) {
  if (g >= 0 && g < n) return g;
  switch (boundary) {
    case HaloBoundary::Periodic: return ((g % n) + n) % n;
    case HaloBoundary::Reflect: return g < 0 ? -g - 1 : 2 * n - g - 1;
    case HaloBoundary::Nearest: return g < 0 ? 0 : n - 1;
    case HaloBoundary::Constant:
    case HaloBoundary::None: break;
  }
  return -1;
}

// Appends the block rows [first_row, first_row + rows) holding the global positions
// [g0, g0 + rows) to `runs`, one run per stretch of rows from one rank in one direction.
void add_rows(const Layout& layout, std::int64_t n, HaloBoundary boundary, std::int64_t first_row,
              std::int64_t g0, std::int64_t rows, std::vector<HaloRun>& runs) {
  for (std::int64_t k = 0; k < rows; ++k) {
    const std::int64_t s = source_of(g0 + k, n, boundary);
    const int rank = s < 0 ? HaloRun::kConstant : layout.owner(s);
    const std::int64_t local = s < 0 ? 0 : s - layout.offset(rank);
    if (!runs.empty()) {
      HaloRun& last = runs.back();
      const bool adjacent = last.first_row + last.rows == first_row + k && last.source == rank;
      if (adjacent && rank == HaloRun::kConstant) {
        ++last.rows;
        continue;
      }
      if (adjacent) {
        const std::int64_t next = last.source_row + last.step * last.rows;
        if (last.rows == 1 && (local == last.source_row + 1 || local == last.source_row - 1)) {
          last.step = local == last.source_row + 1 ? 1 : -1;
          ++last.rows;
          continue;
        }
        if (last.rows > 1 && local == next) {
          ++last.rows;
          continue;
        }
      }
    }
    HaloRun run;
    run.first_row = first_row + k;
    run.rows = 1;
    run.source = rank;
    run.source_row = local;
    run.step = 1;
    runs.push_back(run);
  }
}

// The global rows whose images under the boundary's maps are rank `rank`'s rows, as
// intervals [lo, hi) of positions an extended block may hold: the rows themselves, and where
// the boundary takes rows from the far end or mirrors them, their images beyond the ends.
std::vector<std::pair<std::int64_t, std::int64_t>> images(std::int64_t lo, std::int64_t hi,
                                                          std::int64_t n, HaloBoundary boundary) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out{{lo, hi}};
  switch (boundary) {
    case HaloBoundary::Periodic:
      out.push_back({lo - n, hi - n});
      out.push_back({lo + n, hi + n});
      break;
    case HaloBoundary::Reflect:
      out.push_back({-hi, -lo});                // g -> -g - 1 at the start
      out.push_back({2 * n - hi, 2 * n - lo});  // g -> 2n - g - 1 at the end
      break;
    case HaloBoundary::Nearest:
      if (lo == 0) out.push_back({std::numeric_limits<std::int64_t>::min() / 4, 0});
      if (hi == n) out.push_back({n, std::numeric_limits<std::int64_t>::max() / 4});
      break;
    case HaloBoundary::Constant:
    case HaloBoundary::None: break;
  }
  return out;
}

}  // namespace

void check_halo(const Layout& layout, HaloDepth depth, HaloBoundary boundary, const char* who) {
  KVMAP_CHECK(layout.split().has_value(), ValueError,
              who << ": a halo runs along the split axis; this array is replicated (split=None)");
  KVMAP_CHECK(depth.before >= 0 && depth.after >= 0, ValueError,
              who << ": depth must be >= 0, got (" << depth.before << ", " << depth.after << ")");
  const std::int64_t n = rows_of(layout);
  const bool repeats = boundary == HaloBoundary::Periodic || boundary == HaloBoundary::Reflect;
  KVMAP_CHECK(!repeats || n == 0 || std::max(depth.before, depth.after) <= n, ValueError,
              who << ": depth (" << depth.before << ", " << depth.after << ") exceeds the " << n
                  << " rows along the split axis, which a "
                  << (boundary == HaloBoundary::Periodic ? "periodic" : "reflecting")
                  << " boundary would have to repeat");
}

HaloWindow halo_window(const Layout& layout, int rank, HaloDepth depth, HaloBoundary boundary) {
  HaloWindow w;
  w.count = layout.count(rank);
  if (w.count == 0) return w;
  const std::int64_t n = rows_of(layout);
  const std::int64_t o = layout.offset(rank);
  const bool clipped = boundary == HaloBoundary::None;
  w.before = clipped ? std::min(depth.before, o) : depth.before;
  w.after = clipped ? std::min(depth.after, n - o - w.count) : depth.after;
  add_rows(layout, n, boundary, 0, o - w.before, w.before, w.runs);
  add_rows(layout, n, boundary, w.before + w.count, o + w.count, w.after, w.runs);
  return w;
}

std::vector<int> halo_receivers(const Layout& layout, int rank, HaloDepth depth,
                                HaloBoundary boundary) {
  std::vector<int> receivers;
  const std::int64_t count = layout.count(rank);
  if (count == 0 || (depth.before == 0 && depth.after == 0)) return receivers;
  const std::int64_t n = rows_of(layout);
  const std::int64_t o = layout.offset(rank);
  // A rank r holds position g in its window when its rows meet [g - after, g + before]: the
  // candidates are the ranks whose rows meet the images of this rank's rows, widened so.
  for (const auto& [lo, hi] : images(o, o + count, n, boundary)) {
    const std::int64_t a = std::max<std::int64_t>(0, lo - depth.after);
    const std::int64_t b = std::min<std::int64_t>(n, hi + depth.before);
    if (a >= b) continue;
    const auto [first, last] = layout.ranks_meeting(a, b);
    for (int r = first; r < last; ++r) {
      if (std::find(receivers.begin(), receivers.end(), r) != receivers.end()) continue;
      const HaloWindow w = halo_window(layout, r, depth, boundary);
      const bool takes = std::any_of(w.runs.begin(), w.runs.end(),
                                     [&](const HaloRun& run) { return run.source == rank; });
      if (takes) receivers.push_back(r);
    }
  }
  std::sort(receivers.begin(), receivers.end());
  return receivers;
}

}  // namespace kvmap::Detail

namespace kvmap {

const char* name(Boundary b) {
  switch (b) {
    case Boundary::None: return "none";
    case Boundary::Periodic: return "periodic";
    case Boundary::Reflect: return "reflect";
    case Boundary::Nearest: return "nearest";
    case Boundary::Constant: return "constant";
  }
  return "invalid";
}

}  // namespace kvmap
