#pragma once
// For kvmap's own modules: a DistView's local block, and DistViews assembled from parts
// without communication or checks (the parts were planned and agreed by the caller).
#include "detail.hpp"
#include "kvmap/dist_view.hpp"

#include "agreement.hpp"
#include "allocation.hpp"

namespace kvmap::Detail {

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

// A DistView of `local` under `layout`, with no communication: what this rank can check
// alone is checked (dtype, device, strides, the layout's rank count), not that the tensor
// has the layout's shape on this rank. Only for a caller whose next step is a collective
// that checks every argument's shard against its layout in its plan (vmap's), so that a
// wrong shape is still an error on every rank: the Python front-end's Heat DNDarrays.
template <class M>
DistView<M> adopt_without_agreement(const at::Tensor& local, Layout layout, Comm comm);

// A collective factory: a new DistView of the balanced layout of gshape. Its plan records
// the arguments (describe(signature), which may also check them), allocates this rank's
// block and fills it (fill(view): local kernels only, so a failure is still agreed); the
// agreement follows; nothing runs after it.
template <class M, class Describe, class Fill>
DistView<M> new_balanced(const char* site, const Shape& gshape, DType dtype,
                         std::optional<int> split, const Comm& comm, Describe&& describe,
                         Fill&& fill) {
  return collective(
      site, comm,
      [&](Signature& sig, NoPayload&) {
        sig.arg("gshape", gshape).arg("dtype", static_cast<int>(dtype)).arg("split", split);
        describe(sig);
        dtype_from_int(static_cast<int>(dtype));
        Layout layout = Layout::balanced(gshape, split, comm.size());
        LocalBlock block = allocate_block<M>(layout.lshape(comm.rank()), size_of(dtype));
        DistView<M> view =
            DistViewAccess::make<M>(std::move(layout), dtype, comm, std::move(block));
        fill(view);
        return view;
      },
      [](DistView<M>& view, const NoPayload&) { return std::move(view); });
}

}  // namespace kvmap::Detail
