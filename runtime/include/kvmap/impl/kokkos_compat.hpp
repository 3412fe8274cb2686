#pragma once
// The only place in kvmap that knows how Kokkos versions (3.4 .. 4.x) and backends differ:
// memory space names, device ids, and the list of memory spaces kvmap is built for.
#include <Kokkos_Core.hpp>

#include <type_traits>

namespace kvmap::Impl {

// Torch's device kinds kvmap maps to (ROCm devices are "CUDA" to torch).
enum class DeviceKind { CPU, CUDA };
struct DeviceSpec {
  DeviceKind kind = DeviceKind::CPU;
  int index = -1;
};

#if defined(KOKKOS_ENABLE_HIP)
#if KOKKOS_VERSION >= 40000
using HIPSpace = Kokkos::HIPSpace;
using HIPExec = Kokkos::HIP;
#else
using HIPSpace = Kokkos::Experimental::HIPSpace;
using HIPExec = Kokkos::Experimental::HIP;
#endif
#endif

template <class>
inline constexpr bool always_false = false;

// Math functions usable in kernels: Kokkos::Experimental in 3.x, Kokkos in 4.x.
namespace math {
#if KOKKOS_VERSION >= 40000
using Kokkos::cos;
using Kokkos::log;
using Kokkos::sqrt;
#else
using Kokkos::Experimental::cos;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
#endif
}  // namespace math

// The torch device that shares memory with MemorySpace. Decided by memory space, not by
// execution space: host-pinned memory is a CPU tensor, device memory a CUDA tensor.
template <class MemorySpace>
DeviceSpec device_of() {
  if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>) {
    return {DeviceKind::CPU, -1};
#if defined(KOKKOS_ENABLE_CUDA)
  } else if constexpr (std::is_same_v<MemorySpace, Kokkos::CudaSpace> ||
                       std::is_same_v<MemorySpace, Kokkos::CudaUVMSpace>) {
    return {DeviceKind::CUDA, Kokkos::Cuda().cuda_device()};
  } else if constexpr (std::is_same_v<MemorySpace, Kokkos::CudaHostPinnedSpace>) {
    return {DeviceKind::CPU, -1};
#endif
#if defined(KOKKOS_ENABLE_HIP)
  } else if constexpr (std::is_same_v<MemorySpace, HIPSpace>) {
    return {DeviceKind::CUDA, HIPExec().hip_device()};
#endif
  } else {
    static_assert(always_false<MemorySpace>,
                  "kvmap: this Kokkos memory space has no torch device (supported: HostSpace, "
                  "CudaSpace, CudaUVMSpace, CudaHostPinnedSpace, HIPSpace)");
    return {};
  }
}

// The execution space kvmap runs its kernels on for data in MemorySpace.
template <class MemorySpace>
using exec_space_of = typename MemorySpace::execution_space;

template <class MemorySpace>
inline constexpr bool is_host_accessible =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

}  // namespace kvmap::Impl

// X-macro over the memory spaces kvmap instantiates its templates for.
#if defined(KOKKOS_ENABLE_CUDA)
#define KVMAP_FOR_EACH_DEVICE_SPACE(M) M(Kokkos::CudaSpace) M(Kokkos::CudaUVMSpace)
#elif defined(KOKKOS_ENABLE_HIP)
#define KVMAP_FOR_EACH_DEVICE_SPACE(M) M(kvmap::Impl::HIPSpace)
#else
#define KVMAP_FOR_EACH_DEVICE_SPACE(M)
#endif
#define KVMAP_FOR_EACH_MEMORY_SPACE(M) M(Kokkos::HostSpace) KVMAP_FOR_EACH_DEVICE_SPACE(M)
