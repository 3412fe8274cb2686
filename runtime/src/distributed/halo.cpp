// DistView::halo: the local block extended by its halo rows (halo_exchange.hpp), collective.
#include <ATen/ATen.h>
#include <Kokkos_Core.hpp>

#include "agreement.hpp"
#include "halo_exchange.hpp"
#include "halo_options.hpp"
#include "kvmap/dist_view.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "run_exchange.hpp"
#include "torch_stream.hpp"

namespace kvmap {

template <class M>
at::Tensor DistView<M>::halo(const OverlapOptions& options) const {
  const Detail::HaloDepth depth{options.depth_before(), options.depth_after()};
  const Detail::HaloBoundary boundary = Detail::halo_boundary(options.boundary());
  return Detail::collective(
      "DistView::halo", comm_,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        sig.arg("layout", layout_).arg("dtype", dtype_);
        Detail::describe_halo(sig, options);
        Detail::check_halo(layout_, depth, boundary, "kvmap::DistView::halo");
        return Detail::plan_halo_exchange(local(), layout_, comm_.rank(), depth, boundary,
                                          options.constant(), Detail::staged_through_host<M>());
      },
      [&](Detail::HaloExchange& x, const Detail::NoPayload&) {
        const Detail::DeviceSpec device = Impl::device_of<M>();
        if (Detail::kokkos_fence_needed(device)) Kokkos::fence();  // Kokkos' writes first
        Detail::TorchStreamScope torch_on_kokkos(device);
        Detail::run_halo_exchange(Detail::transport(comm_), x);
        torch_on_kokkos.finish();
        return x.extended;
      });
}

template <class M>
at::Tensor DistView<M>::halo(std::int64_t depth, Boundary boundary, double constant) const {
  return halo(OverlapOptions().depth(depth).boundary(boundary, constant));
}

#define KVMAP_INSTANTIATE_HALO(Space)                                                  \
  template KVMAP_EXPORT at::Tensor DistView<Space>::halo(const OverlapOptions&) const; \
  template KVMAP_EXPORT at::Tensor DistView<Space>::halo(std::int64_t, Boundary, double) const;
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_HALO)
#undef KVMAP_INSTANTIATE_HALO

}  // namespace kvmap
