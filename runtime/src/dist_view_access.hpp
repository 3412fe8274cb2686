#pragma once
// For kvmap's own modules: a DistView's local block, and DistViews assembled from parts
// without communication or checks (the parts were planned and agreed by the caller).
#include "kvmap/dist_view.hpp"

namespace kvmap::Impl {

struct DistViewAccess {
  template <class M>
  static const LocalBlock& block(const DistView<M>& v) {
    return v.block_;
  }
  template <class M>
  static DistView<M> make(Layout layout, DType dtype, Comm comm, LocalBlock block) {
    return DistView<M>(std::move(layout), dtype, std::move(comm), std::move(block));
  }
};

}  // namespace kvmap::Impl
