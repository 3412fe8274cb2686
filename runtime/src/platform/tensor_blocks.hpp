#pragma once
// The tensor bridge's internals: torch devices of memory spaces, adopting a tensor's
// memory as a block, and the spans the no-aliasing rule compares.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "detail.hpp"
#include "kvmap/tensor_bridge.hpp"

namespace kvmap {

namespace Detail {
at::Device torch_device(DeviceSpec device);
DeviceSpec device_spec_of(const at::Tensor& tensor);
// TypeError unless `tensor` is on `want`'s torch device (kind and index): "<what> is on
// cuda:1 but ... maps to cuda:0".
void check_same_device(const at::Tensor& tensor, const DeviceSpec& want, const std::string& what);
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

// The bytes of a tensor's elements (what copying it moves).
inline std::uint64_t bytes_of(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * t.element_size();
}
}  // namespace Detail

}  // namespace kvmap
