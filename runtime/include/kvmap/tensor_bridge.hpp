#pragma once
// Kokkos memory <-> at::Tensor without copies, and DType <-> torch ScalarType.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "kvmap/dtype.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/impl/view_block.hpp"

namespace kvmap {

at::ScalarType to_torch(DType dtype);
// TypeError for torch types kvmap does not store (quantized, complex32, ...).
DType from_torch(at::ScalarType type);

namespace Impl {
at::Device torch_device(DeviceSpec device);
DeviceSpec device_spec_of(const at::Tensor& tensor);
// TypeError unless `tensor` is on `want`'s torch device (kind and index): "<what> is on
// cuda:1 but ... maps to cuda:0".
void check_same_device(const at::Tensor& tensor, const DeviceSpec& want, const std::string& what);
// A tensor sharing the block's memory; it keeps block.owner alive.
at::Tensor tensor_from_block(const LocalBlock& block, DType dtype, DeviceSpec device);
// A block sharing the tensor's memory; it keeps the tensor alive. TypeError for tensors
// that are not plain strided tensors with storage (sparse, batched, meta, ...).
LocalBlock block_from_tensor(const at::Tensor& tensor);

// The bytes an array's elements span, [lo, hi) (lo == hi when empty): what the no-aliasing
// rule compares. Conservative: two interleaved strided arrays count as overlapping.
struct MemorySpan {
  std::uintptr_t lo = 0, hi = 0;
  bool overlaps(const MemorySpan& o) const { return lo < o.hi && o.lo < hi; }
};
MemorySpan span_of(const LocalBlock& block, std::size_t itemsize);
MemorySpan span_of(const at::Tensor& tensor);
}  // namespace Impl

// A zero-copy at::Tensor over a Kokkos view (which it keeps alive).
template <class View>
at::Tensor to_tensor(const View& view) {
  using T = std::remove_cv_t<typename View::value_type>;
  return Impl::tensor_from_block(Impl::block_from_view(view), dtype_of<T>(),
                                 Impl::device_of<typename View::memory_space>());
}

}  // namespace kvmap
