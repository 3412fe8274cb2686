// Torch on the Kokkos instance's device and stream (see torch_stream.hpp). The CUDA part is
// compiled against the CUDA LibTorch's c10/cuda headers in builds whose Kokkos has the CUDA
// backend (KVMAP_TORCH_CUDA; also on machines without a GPU); it calls no Kokkos.
#include "torch_stream.hpp"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>

#if defined(KVMAP_TORCH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "kvmap/tensor_bridge.hpp"
#include "tensor_blocks.hpp"

namespace kvmap::Detail {

struct TorchStreamScope::State {
  c10::DeviceGuard device_guard;
#if defined(KVMAP_TORCH_CUDA)
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
#endif
  bool synchronize_on_exit = false;
  explicit State(c10::Device d) : device_guard(d) {}
};

bool TorchStreamScope::shares_stream(const DeviceSpec& device) {
#if defined(KVMAP_TORCH_CUDA) && !defined(USE_ROCM)
  return device.kind == DeviceKind::CUDA && device.stream != nullptr;
#else
  (void)device;
  return false;
#endif
}

TorchStreamScope::TorchStreamScope(const DeviceSpec& device) {
  if (device.kind == DeviceKind::CPU) return;
  state_ = std::make_unique<State>(torch_device(device));
#if defined(KVMAP_TORCH_CUDA) && !defined(USE_ROCM)
  if (shares_stream(device)) {
    state_->stream_guard.emplace(c10::cuda::getStreamFromExternal(
        static_cast<cudaStream_t>(device.stream), static_cast<c10::DeviceIndex>(device.index)));
    return;
  }
#endif
  state_->synchronize_on_exit = true;
}

TorchStreamScope::~TorchStreamScope() = default;

std::optional<std::int64_t> device_free_bytes(const DeviceSpec& device) {
#if defined(KVMAP_TORCH_CUDA) && !defined(USE_ROCM)
  if (device.kind == DeviceKind::CUDA) {
    const c10::cuda::CUDAGuard on(static_cast<c10::DeviceIndex>(device.index));
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
      return static_cast<std::int64_t>(free_bytes);
  }
#else
  (void)device;
#endif
  return std::nullopt;
}

void TorchStreamScope::finish() {
  if (!state_ || !state_->synchronize_on_exit) return;
  const c10::Device d = state_->device_guard.current_device();
  c10::impl::VirtualGuardImpl(d.type()).getStream(d).synchronize();
}

void torch_use_device(const DeviceSpec& device) {
  if (device.kind != DeviceKind::CUDA || device.index < 0) return;
  const c10::Device d(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index));
  c10::impl::VirtualGuardImpl(d.type()).setDevice(d);
}

void finish_torch_work(const at::Tensor& t) {
  if (t.is_cpu()) return;
  c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device()).synchronize();
}

}  // namespace kvmap::Detail
