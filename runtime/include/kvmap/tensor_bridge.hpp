#pragma once
/// \file
/// Kokkos memory <-> at::Tensor without copies, and DType <-> torch ScalarType.
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "kvmap/config.hpp"
#include "kvmap/dtype.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "kvmap/impl/local_block.hpp"
#include "kvmap/impl/view_block.hpp"

KVMAP_API_BEGIN
namespace kvmap {

/// The torch ScalarType of a DType.
at::ScalarType to_torch(DType dtype);
/// TypeError for torch types kvmap does not store (quantized, complex32, ...).
DType from_torch(at::ScalarType type);

namespace Impl {
/// A tensor sharing the block's memory; it keeps block.owner alive.
at::Tensor tensor_from_block(const LocalBlock& block, DType dtype, DeviceSpec device);
}  // namespace Impl

/// A zero-copy at::Tensor over a Kokkos view (which it keeps alive).
template <class View>
at::Tensor to_tensor(const View& view) {
  using T = std::remove_cv_t<typename View::value_type>;
  return Impl::tensor_from_block(Impl::block_from_view(view), dtype_of<T>(),
                                 Impl::device_of<typename View::memory_space>());
}

}  // namespace kvmap
KVMAP_API_END
