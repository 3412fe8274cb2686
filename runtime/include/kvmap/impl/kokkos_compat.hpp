#pragma once
// The only place in kvmap that knows how Kokkos versions (3.4 .. 4.x) and backends differ:
// memory space names, device ids, Tools regions, and the list of memory spaces kvmap is
// built for.
#include "kvmap/config.hpp"
#include <Kokkos_Core.hpp>
#if __has_include(<Kokkos_Profiling_ScopedRegion.hpp>)  // Kokkos 4
#include <Kokkos_Profiling_ScopedRegion.hpp>
#define KVMAP_KOKKOS_HAS_SCOPED_REGION 1
#else
#define KVMAP_KOKKOS_HAS_SCOPED_REGION 0
#endif

#include <optional>
#include <type_traits>

KVMAP_API_BEGIN
namespace kvmap {
namespace Impl {

// Torch's device kinds kvmap maps to (ROCm devices are "CUDA" to torch).
enum class DeviceKind { CPU, CUDA };
// Where torch works on a memory space's data: the device, and the stream of the Kokkos
// execution space instance kvmap's kernels run on (cudaStream_t / hipStream_t; null on the
// host). Torch runs on that stream for the whole of a kvmap call (torch_stream.hpp).
struct DeviceSpec {
  DeviceKind kind = DeviceKind::CPU;
  int index = -1;
  void* stream = nullptr;
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

// Kokkos 3.x joins the partial results of a parallel_reduce functor through volatile
// references; 4.x through plain ones (and no longer accepts volatile joins).
#if KOKKOS_VERSION < 40000
#define KVMAP_KOKKOS_VOLATILE_JOIN 1
#else
#define KVMAP_KOKKOS_VOLATILE_JOIN 0
#endif

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

// The torch device that shares memory with MemorySpace, and the stream of the default
// instance of the execution space kvmap uses for it. Decided by memory space, not by
// execution space: host-pinned memory is a CPU tensor, device memory a CUDA tensor.
// CudaUVMSpace has no torch device: tensors torch allocates (vmap outputs) are plain device
// memory, which a DistView<CudaUVMSpace> would wrongly promise to be host-accessible.
template <class MemorySpace>
DeviceSpec device_of() {
  if constexpr (std::is_same_v<MemorySpace, Kokkos::HostSpace>) {
    return {DeviceKind::CPU, -1, nullptr};
#if defined(KOKKOS_ENABLE_CUDA)
  } else if constexpr (std::is_same_v<MemorySpace, Kokkos::CudaSpace>) {
    const Kokkos::Cuda instance;
    return {DeviceKind::CUDA, instance.cuda_device(), static_cast<void*>(instance.cuda_stream())};
  } else if constexpr (std::is_same_v<MemorySpace, Kokkos::CudaUVMSpace>) {
    static_assert(always_false<MemorySpace>,
                  "kvmap: DistView<Kokkos::CudaUVMSpace> is not supported: memory torch allocates "
                  "is not UVM memory. Use Kokkos::CudaSpace (and deep_copy to a UVM view)");
    return {};
  } else if constexpr (std::is_same_v<MemorySpace, Kokkos::CudaHostPinnedSpace>) {
    return {DeviceKind::CPU, -1, nullptr};
#endif
#if defined(KOKKOS_ENABLE_HIP)
  } else if constexpr (std::is_same_v<MemorySpace, HIPSpace>) {
    const HIPExec instance;
    return {DeviceKind::CUDA, instance.hip_device(), static_cast<void*>(instance.hip_stream())};
#endif
  } else {
    static_assert(always_false<MemorySpace>,
                  "kvmap: this Kokkos memory space has no torch device (supported: HostSpace, "
                  "CudaSpace, HIPSpace)");
    return {};
  }
}

// The execution space kvmap runs its kernels on for data in MemorySpace.
template <class MemorySpace>
using exec_space_of = typename MemorySpace::execution_space;

template <class MemorySpace>
inline constexpr bool is_host_accessible =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible;

// A Kokkos Tools region for one scope, so users' tools show where kvmap's time goes:
// Kokkos::Profiling::ScopedRegion where Kokkos has it (4.x), push/popRegion on 3.4. Made
// only while a tool is loaded: ScopedRegion takes a std::string, which would otherwise be
// built (and allocated, for names over 15 characters) on every chunk of every call.
class ScopedRegion {
 public:
  explicit ScopedRegion(const char* name) {
    if (!Kokkos::Tools::profileLibraryLoaded()) return;
#if KVMAP_KOKKOS_HAS_SCOPED_REGION
    region_.emplace(name);
#else
    Kokkos::Profiling::pushRegion(name);
    pushed_ = true;
#endif
  }
  ~ScopedRegion() {
#if !KVMAP_KOKKOS_HAS_SCOPED_REGION
    if (pushed_) Kokkos::Profiling::popRegion();
#endif
  }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;

 private:
#if KVMAP_KOKKOS_HAS_SCOPED_REGION
  std::optional<Kokkos::Profiling::ScopedRegion> region_;
#else
  bool pushed_ = false;
#endif
};

}  // namespace Impl
}  // namespace kvmap
KVMAP_API_END

// X-macro over the memory spaces kvmap instantiates its templates for.
#if defined(KOKKOS_ENABLE_CUDA)
#define KVMAP_FOR_EACH_DEVICE_SPACE(M) M(Kokkos::CudaSpace)
#elif defined(KOKKOS_ENABLE_HIP)
#define KVMAP_FOR_EACH_DEVICE_SPACE(M) M(kvmap::Impl::HIPSpace)
#else
#define KVMAP_FOR_EACH_DEVICE_SPACE(M)
#endif
#define KVMAP_FOR_EACH_MEMORY_SPACE(M) M(Kokkos::HostSpace) KVMAP_FOR_EACH_DEVICE_SPACE(M)
