#pragma once
// Which rows each rank's extended block holds (map_overlap, DistView::halo): a pure function
// of the layout's counts along the split axis, the depth before and after, and the boundary
// at the global ends, with numpy.pad's meaning on the gathered array: none (no rows added at
// the ends: edge blocks are shorter), periodic ("wrap"), reflect ("symmetric": the edge row
// repeated first), nearest ("edge") or a constant. No MPI: every rank computes every rank's
// window from the layout alone, so sender and receiver agree on every message without
// communicating. Cost per rank: proportional to its halo rows and to the ranks they come from
// or go to, never to the number of ranks.
#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "kvmap/layout.hpp"

namespace kvmap::Detail {

enum class HaloBoundary { None, Periodic, Reflect, Nearest, Constant };

struct HaloDepth {
  std::int64_t before = 0;
  std::int64_t after = 0;
};

// `rows` consecutive rows of an extended block, from block row `first_row` on: the local rows
// source_row, source_row + step, ... (step +1, or -1 for a reflection) of rank `source`, or
// the boundary's constant (source kConstant).
struct HaloRun {
  static constexpr int kConstant = -1;
  std::int64_t first_row = 0;
  std::int64_t rows = 0;
  int source = kConstant;
  std::int64_t source_row = 0;
  int step = 1;
  bool operator==(const HaloRun& o) const {
    return first_row == o.first_row && rows == o.rows && source == o.source &&
           source_row == o.source_row && step == o.step;
  }
};

// One rank's extended block along the split axis: `before` halo rows, its own `count` rows,
// `after` halo rows; `runs` say where each halo row comes from, in block order. A rank
// without rows has no window (all zero: it calls no function and needs nothing).
struct HaloWindow {
  std::int64_t before = 0;
  std::int64_t count = 0;
  std::int64_t after = 0;
  std::vector<HaloRun> runs;
  std::int64_t rows() const { return before + count + after; }
};

// ValueError naming `who` for a negative depth, or a depth beyond the global length with a
// periodic or reflecting boundary (numpy.pad would repeat the array; the halo has one copy).
void check_halo(const Layout& layout, HaloDepth depth, HaloBoundary boundary, const char* who);

// Rank `rank`'s window (check_halo first).
HaloWindow halo_window(const Layout& layout, int rank, HaloDepth depth, HaloBoundary boundary);

// The ranks whose windows hold rows of `rank`, ascending (`rank` itself where its own window
// does: periodic on one rank, a reflection at its own edge).
std::vector<int> halo_receivers(const Layout& layout, int rank, HaloDepth depth,
                                HaloBoundary boundary);

}  // namespace kvmap::Detail
