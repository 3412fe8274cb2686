#pragma once
// The device and stream contract between Kokkos and torch, in one place. For the whole of a
// kvmap call that runs torch on Kokkos memory (vmap), torch's current device is the device
// of that memory and torch's current stream is the stream of the Kokkos execution space
// instance kvmap's kernels use (DeviceSpec::stream):
//   - CUDA (a CUDA LibTorch): the Kokkos stream is made a torch stream
//     (c10::cuda::getStreamFromExternal) and guarded; Kokkos kernels and torch operations
//     are ordered on one stream, no fence is needed in either direction, and memory torch's
//     caching allocator hands out is used in stream order by both;
//   - other devices (ROCm, or a LibTorch without its CUDA stream headers): the device is
//     guarded, Kokkos' instance is fenced before torch starts (the caller does that:
//     kokkos_fence_needed()) and torch's current stream is synchronized by finish(), which
//     the caller runs before Kokkos or MPI touch what torch wrote;
//   - CPU: nothing.
// The Kokkos side fills DeviceSpec (kokkos_compat.hpp); torch_stream.cpp calls torch only.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "detail.hpp"
#include "kvmap/impl/kokkos_compat.hpp"

namespace kvmap::Detail {

class TorchStreamScope {
 public:
  explicit TorchStreamScope(const DeviceSpec& device);
  ~TorchStreamScope();
  TorchStreamScope(const TorchStreamScope&) = delete;
  TorchStreamScope& operator=(const TorchStreamScope&) = delete;

  // Waits for torch's work where torch does not run on the Kokkos stream (may throw).
  void finish();

  // True when torch runs on the Kokkos instance's own stream for `device` (no fences).
  static bool shares_stream(const DeviceSpec& device);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Makes `device` torch's current device (from now on, not only for one call): kvmap's
// initialization points torch at the GPU Kokkos was given (platform/device_map.hpp).
void torch_use_device(const DeviceSpec& device);

// The free memory of a CUDA device in bytes (cudaMemGetInfo, on that device), where this
// build talks to CUDA through torch (KVMAP_TORCH_CUDA); std::nullopt otherwise.
std::optional<std::int64_t> device_free_bytes(const DeviceSpec& device);

// Waits for torch's queued work on the tensor's device (nothing for a CPU tensor): before MPI
// reads or writes memory outside torch's stream order.
void finish_torch_work(const at::Tensor& t);

// Whether the Kokkos instance must be fenced before torch reads what Kokkos wrote.
inline bool kokkos_fence_needed(const DeviceSpec& device) {
  return device.kind != DeviceKind::CPU && !TorchStreamScope::shares_stream(device);
}

}  // namespace kvmap::Detail
