#include "device_map.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#elif defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime_api.h>
#endif

#include "kvmap/error.hpp"
#include "kvmap/impl/kokkos_compat.hpp"
#include "gpu_aware_mpi.hpp"
#include "torch_stream.hpp"

namespace kvmap::Detail {

namespace {

// Kokkos' device flags, every spelling from 3.4 on (Kokkos accepts them as --flag=value).
constexpr const char* kDeviceFlags[] = {
    "--kokkos-device-id", "--kokkos-device",           "--device-id",
    "--device",           "--kokkos-map-device-id-by", "--kokkos-num-devices",
    "--num-devices",      "--kokkos-ndevices",         "--ndevices"};
// Kokkos' device environment variables (3.4 to 4.x).
constexpr const char* kDeviceVariables[] = {"KOKKOS_DEVICE_ID",   "KOKKOS_MAP_DEVICE_ID_BY",
                                            "KOKKOS_NUM_DEVICES", "KOKKOS_RAND_DEVICES",
                                            "KOKKOS_SKIP_DEVICE", "KOKKOS_VISIBLE_DEVICES"};

bool names_flag(const char* arg, const char* flag) {
  const std::size_t n = std::strlen(flag);
  return std::strncmp(arg, flag, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

const char* system_getenv(const char* name) {
  return std::getenv(name);
}

// How this rank's device was chosen, recorded by initialize_kokkos.
struct Choice {
  bool made_by_kvmap_init = false;
  NodeRank node;
  int devices = 0;
  const char* how = "";
};
std::mutex g_choice_mutex;
Choice g_choice;

// The GPU Kokkos runs on now (CPU when it has no GPU backend or is not initialized).
DeviceSpec kokkos_device() {
  if (!Kokkos::is_initialized()) return {};
#if defined(KOKKOS_ENABLE_CUDA)
  return device_of<Kokkos::CudaSpace>();
#elif defined(KOKKOS_ENABLE_HIP)
  return device_of<HIPSpace>();
#else
  return {};
#endif
}

constexpr bool kHasGpuBackend =
#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
    true;
#else
    false;
#endif

}  // namespace

int device_for_rank(int node_local_rank, int visible_devices) {
  KVMAP_CHECK(visible_devices >= 1 && node_local_rank >= 0, Error,
              "kvmap: no device for node-local rank " << node_local_rank << " among "
                                                      << visible_devices << " devices");
  return node_local_rank % visible_devices;
}

bool user_chose_device(int argc, const char* const* argv, const char* (*getenv)(const char*)) {
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    for (const char* flag : kDeviceFlags) {
      if (names_flag(argv[i], flag)) return true;
    }
  }
  for (const char* name : kDeviceVariables) {
    const char* value = getenv(name);
    if (value != nullptr && *value != '\0') return true;
  }
  return false;
}

NodeRank node_local_rank(const Comm& comm) {
  return transport(comm).node_rank();
}

int visible_devices() {
  int n = 0;
#if defined(KOKKOS_ENABLE_CUDA)
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#elif defined(KOKKOS_ENABLE_HIP)
  if (hipGetDeviceCount(&n) != hipSuccess) n = 0;
#endif
  return n;
}

void initialize_kokkos(int& argc, char**& argv) {
  decide_gpu_aware_mpi_on_every_rank();  // a bad KVMAP_GPU_AWARE_MPI stops every rank here
  Choice choice;
  choice.made_by_kvmap_init = true;
  std::string device_flag;
  if (kHasGpuBackend) {
    // Every rank takes part, whatever it then decides (a site's wrapper may set
    // KOKKOS_DEVICE_ID on some ranks only).
    choice.node = node_local_rank(Comm::world());
    choice.devices = visible_devices();
    if (user_chose_device(argc, argv, system_getenv)) {
      choice.how = "chosen by the user (Kokkos flag or environment)";
    } else if (choice.devices > 1) {
      device_flag =
          "--kokkos-device-id=" + std::to_string(device_for_rank(choice.node.rank, choice.devices));
      choice.how = "mapped by kvmap: node-local rank mod devices";
    } else {
      choice.how = choice.devices == 1 ? "the one visible device" : "no device visible";
    }
  }
  if (device_flag.empty()) {
    Kokkos::initialize(argc, argv);
  } else {
    // The user's arguments and kvmap's device flag; Kokkos removes the flags it consumes, the
    // rest goes back to the caller's argv as Kokkos::initialize(argc, argv) would leave it.
    std::vector<char*> args(argv, argv + argc);
    args.push_back(device_flag.data());
    args.push_back(nullptr);
    int n = argc + 1;
    char** p = args.data();
    Kokkos::initialize(n, p);
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      if (p[i] != device_flag.data()) argv[kept++] = p[i];
    }
    if (kept < argc) argv[kept] = nullptr;
    argc = kept;
  }
  torch_use_device(kokkos_device());
  {
    std::lock_guard<std::mutex> lock(g_choice_mutex);
    g_choice = choice;
  }
}

int node_ranks() {
  {
    std::lock_guard<std::mutex> lock(g_choice_mutex);
    if (g_choice.made_by_kvmap_init && kHasGpuBackend) return std::max(1, g_choice.node.size);
  }
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(value, &end, 10);
    if (end != value && n >= 1) return static_cast<int>(std::min<long>(n, 1 << 20));
  }
  return 1;
}

std::string device_report() {
  const DeviceSpec device = kokkos_device();
  if (device.kind == DeviceKind::CPU) return "host";
  Choice choice;
  {
    std::lock_guard<std::mutex> lock(g_choice_mutex);
    choice = g_choice;
  }
#if defined(KOKKOS_ENABLE_HIP)
  std::string text = "hip:" + std::to_string(device.index);
#else
  std::string text = "cuda:" + std::to_string(device.index);
#endif
  if (!choice.made_by_kvmap_init) return text + " (Kokkos was initialized before kvmap)";
  return text + " (node-local rank " + std::to_string(choice.node.rank) + " of " +
         std::to_string(choice.node.size) + ", " + std::to_string(choice.devices) +
         " devices visible, " + choice.how + ")";
}

}  // namespace kvmap::Detail
