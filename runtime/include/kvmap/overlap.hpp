#pragma once
/// \file
/// Halos along the split axis: the options of kvmap::map_overlap (kvmap/vmap.hpp) and of
/// DistView::halo (kvmap/dist_view.hpp), with Dask's names and numpy.pad's meaning at the
/// global ends.
#include "kvmap/config.hpp"
#include <cstdint>

KVMAP_API_BEGIN
namespace kvmap {

/// What the rows beyond the global ends of the split axis hold, as numpy.pad pads the
/// gathered array (Dask's map_overlap names).
enum class Boundary {
  None,      ///< nothing: the first and last blocks get no rows there (they are shorter)
  Periodic,  ///< the rows of the other end ("wrap")
  Reflect,   ///< the edge rows mirrored, the edge row first ("symmetric")
  Nearest,   ///< the edge row repeated ("edge")
  Constant,  ///< a constant ("constant")
};

/// "none", "periodic", "reflect", "nearest" or "constant".
const char* name(Boundary b);

/// The options of map_overlap and DistView::halo, fluent:
/// `OverlapOptions().depth(2).boundary(Boundary::Periodic)`.
class OverlapOptions {
 public:
  /// Rows added before and after each block along the split axis (>= 0; ValueError on every
  /// rank at the call otherwise).
  OverlapOptions& depth(std::int64_t rows) { return depth(rows, rows); }
  /// Rows added before and after each block, separately.
  OverlapOptions& depth(std::int64_t before, std::int64_t after) {
    before_ = before;
    after_ = after;
    return *this;
  }
  /// The rows beyond the global ends; `constant` is their value for Boundary::Constant.
  OverlapOptions& boundary(Boundary b, double constant = 0.0) {
    boundary_ = b;
    constant_ = constant;
    return *this;
  }
  /// Whether kvmap removes the added rows from f's outputs (true: f returns as many rows as
  /// it was given), or f returns its own rows only (false).
  OverlapOptions& trim(bool t) {
    trim_ = t;
    return *this;
  }

  /// Rows added before each block.
  std::int64_t depth_before() const { return before_; }
  /// Rows added after each block.
  std::int64_t depth_after() const { return after_; }
  /// What the rows beyond the global ends hold.
  Boundary boundary() const { return boundary_; }
  /// Their value for Boundary::Constant.
  double constant() const { return constant_; }
  /// Whether kvmap removes the added rows from f's outputs.
  bool trim() const { return trim_; }

 private:
  std::int64_t before_ = 0;
  std::int64_t after_ = 0;
  Boundary boundary_ = Boundary::None;
  double constant_ = 0.0;
  bool trim_ = true;
};

}  // namespace kvmap
KVMAP_API_END
