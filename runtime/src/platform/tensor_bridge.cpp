#include "kvmap/tensor_bridge.hpp"

#include <ATen/Functions.h>

#include "kvmap/error.hpp"
#include "kvmap/layout.hpp"

#include "local_block.hpp"
#include "tensor_blocks.hpp"

namespace kvmap {

at::ScalarType to_torch(DType dtype) {
  switch (dtype) {
#define KVMAP_DTYPE_TO_TORCH(E, name, T, torch_type, mpi_type) \
  case DType::E: return at::ScalarType::torch_type;
    KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_TO_TORCH)
#undef KVMAP_DTYPE_TO_TORCH
  }
  throw ValueError("kvmap::to_torch: invalid DType " + std::to_string(static_cast<int>(dtype)));
}

DType from_torch(at::ScalarType type) {
  switch (type) {
#define KVMAP_DTYPE_FROM_TORCH(E, name, T, torch_type, mpi_type) \
  case at::ScalarType::torch_type: return DType::E;
    KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_FROM_TORCH)
#undef KVMAP_DTYPE_FROM_TORCH
    default: break;
  }
  throw TypeError(std::string("kvmap: torch dtype ") + c10::toString(type) +
                  " has no kvmap::DType");
}

namespace Detail {

at::Device torch_device(DeviceSpec device) {
  if (device.kind == DeviceKind::CPU) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
}

DeviceSpec device_spec_of(const at::Tensor& tensor) {
  const at::Device d = tensor.device();
  if (d.is_cpu()) return {DeviceKind::CPU, -1};
  if (d.is_cuda()) return {DeviceKind::CUDA, d.has_index() ? d.index() : 0};
  throw TypeError("kvmap: tensors on device " + d.str() + " are not supported (CPU or CUDA/ROCm)");
}

void check_same_device(const at::Tensor& tensor, const DeviceSpec& want, const std::string& what) {
  const DeviceSpec have = device_spec_of(tensor);
  KVMAP_CHECK(have.kind == want.kind && (want.kind == DeviceKind::CPU || have.index == want.index),
              TypeError,
              what << " is on " << tensor.device() << " but the memory space maps to "
                   << torch_device(want));
}

}  // namespace Detail

namespace Impl {
at::Tensor tensor_from_block(const LocalBlock& block, DType dtype, DeviceSpec device) {
  using namespace Detail;
  // The tensor's storage holds a copy of the block's owner (one allocation, a plain deleter:
  // this runs on every vmap call).
  return at::for_blob(block.data, block.extents)
      .strides(block.strides)
      .context(new std::shared_ptr<void>(block.owner),
               [](void* owner) { delete static_cast<std::shared_ptr<void>*>(owner); })
      .options(at::TensorOptions().dtype(to_torch(dtype)).device(torch_device(device)))
      .make_tensor();
}
}  // namespace Impl

namespace Detail {

LocalBlock block_from_tensor(const at::Tensor& tensor) {
  KVMAP_CHECK(tensor.defined(), ValueError,
              "kvmap: expected a defined tensor, got an undefined one");
  KVMAP_CHECK(tensor.layout() == at::kStrided && tensor.has_storage(), TypeError,
              "kvmap: expected a strided tensor with storage, got layout "
                  << tensor.layout() << " (sparse, batched and meta tensors cannot be adopted)");
  from_torch(tensor.scalar_type());  // TypeError for unsupported dtypes
  LocalBlock block;
  block.extents.assign(tensor.sizes().begin(), tensor.sizes().end());
  block.strides.assign(tensor.strides().begin(), tensor.strides().end());
  checked_span_bytes(block.extents, block.strides, tensor.element_size());
  block.data = tensor.data_ptr();
  block.owner = std::make_shared<at::Tensor>(tensor);
  return block;
}

namespace {
MemorySpan span_from(const void* data, const std::int64_t* extents, const std::int64_t* strides,
                     std::size_t ndim, std::size_t itemsize) {
  const ElementSpan span = element_span(extents, strides, ndim);
  if (span.empty) return {};
  const auto base = reinterpret_cast<std::uintptr_t>(data);
  const auto size = static_cast<std::int64_t>(itemsize);
  return {base + static_cast<std::uintptr_t>(span.lo * size),
          base + static_cast<std::uintptr_t>((span.hi + 1) * size)};
}
}  // namespace

MemorySpan span_of(const LocalBlock& block, std::size_t itemsize) {
  return span_from(block.data, block.extents.data(), block.strides.data(), block.extents.size(),
                   itemsize);
}

MemorySpan span_of(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage() || tensor.layout() != at::kStrided) return {};
  return span_from(tensor.data_ptr(), tensor.sizes().data(), tensor.strides().data(),
                   tensor.sizes().size(), tensor.element_size());
}

}  // namespace Detail
}  // namespace kvmap
