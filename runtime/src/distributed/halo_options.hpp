#pragma once
// The public halo options (kvmap/overlap.hpp) as the halo plan and a call's signature take
// them: one place for DistView::halo and map_overlap.
#include "detail.hpp"
#include "halo_plan.hpp"
#include "kvmap/overlap.hpp"
#include "signature.hpp"

namespace kvmap::Detail {

inline HaloBoundary halo_boundary(Boundary b) {
  switch (b) {
    case Boundary::Periodic: return HaloBoundary::Periodic;
    case Boundary::Reflect: return HaloBoundary::Reflect;
    case Boundary::Nearest: return HaloBoundary::Nearest;
    case Boundary::Constant: return HaloBoundary::Constant;
    case Boundary::None: break;
  }
  return HaloBoundary::None;
}

// What every rank must pass alike: the depth, the boundary and its constant.
inline void describe_halo(Signature& sig, const OverlapOptions& o) {
  sig.arg("depth_before", o.depth_before())
      .arg("depth_after", o.depth_after())
      .text("boundary", name(o.boundary()))
      .arg("constant", o.constant());
}

}  // namespace kvmap::Detail
