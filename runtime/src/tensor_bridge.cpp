#include "kvmap/tensor_bridge.hpp"

#include <ATen/Functions.h>

#include "kvmap/error.hpp"
#include "kvmap/layout.hpp"

namespace kvmap {

at::ScalarType to_torch(DType dtype) {
  switch (dtype) {
    case DType::Bool: return at::kBool;
    case DType::UInt8: return at::kByte;
    case DType::Int8: return at::kChar;
    case DType::Int16: return at::kShort;
    case DType::Int32: return at::kInt;
    case DType::Int64: return at::kLong;
    case DType::Float16: return at::kHalf;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Float32: return at::kFloat;
    case DType::Float64: return at::kDouble;
    case DType::Complex64: return at::kComplexFloat;
    case DType::Complex128: return at::kComplexDouble;
  }
  throw ValueError("kvmap::to_torch: invalid DType " + std::to_string(static_cast<int>(dtype)));
}

DType from_torch(at::ScalarType type) {
  switch (type) {
    case at::kBool: return DType::Bool;
    case at::kByte: return DType::UInt8;
    case at::kChar: return DType::Int8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kComplexFloat: return DType::Complex64;
    case at::kComplexDouble: return DType::Complex128;
    default: break;
  }
  throw TypeError(std::string("kvmap: torch dtype ") + c10::toString(type) +
                  " has no kvmap::DType");
}

namespace Impl {

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

at::Tensor tensor_from_block(const LocalBlock& block, DType dtype, DeviceSpec device) {
  // The tensor's storage holds a copy of the block's owner (one allocation, a plain deleter:
  // this runs on every vmap call).
  return at::for_blob(block.data, block.extents)
      .strides(block.strides)
      .context(new std::shared_ptr<void>(block.owner),
               [](void* owner) { delete static_cast<std::shared_ptr<void>*>(owner); })
      .options(at::TensorOptions().dtype(to_torch(dtype)).device(torch_device(device)))
      .make_tensor();
}

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
MemorySpan span_from(const void* data, c10::IntArrayRef extents, c10::IntArrayRef strides,
                     std::size_t itemsize) {
  std::int64_t low = 0, high = 0;  // element offsets of the first and last element
  for (std::size_t d = 0; d < extents.size(); ++d) {
    if (extents[d] == 0) return {};
    (strides[d] < 0 ? low : high) += strides[d] * (extents[d] - 1);
  }
  const auto base = reinterpret_cast<std::uintptr_t>(data);
  return {base + static_cast<std::uintptr_t>(low * static_cast<std::int64_t>(itemsize)),
          base + static_cast<std::uintptr_t>((high + 1) * static_cast<std::int64_t>(itemsize))};
}
}  // namespace

MemorySpan span_of(const LocalBlock& block, std::size_t itemsize) {
  return span_from(block.data, block.extents, block.strides, itemsize);
}

MemorySpan span_of(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage() || tensor.layout() != at::kStrided) return {};
  return span_from(tensor.data_ptr(), tensor.sizes(), tensor.strides(), tensor.element_size());
}

}  // namespace Impl
}  // namespace kvmap
