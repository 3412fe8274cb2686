#include "vmap_memory.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <new>
#include <string>

#include <unistd.h>

#include "kvmap/error.hpp"
#include "device_map.hpp"
#include "torch_compat.hpp"
#include "torch_stream.hpp"

namespace kvmap::Detail {

struct MemoryProbe::State {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
  std::optional<torch_compat::MemoryReporting> reporting;
};

MemoryProbe::MemoryProbe() : state_(std::make_shared<State>()) {
  // The reporter may outlive nothing it refers to: it holds the state.
  std::shared_ptr<State> state = state_;
  state_->reporting.emplace([state](std::int64_t bytes) {
    const std::int64_t now = state->live.fetch_add(bytes) + bytes;
    std::int64_t peak = state->peak.load();
    while (now > peak && !state->peak.compare_exchange_weak(peak, now)) {
    }
  });
}

MemoryProbe::~MemoryProbe() {
  state_->reporting.reset();
}

std::int64_t MemoryProbe::peak_bytes() const {
  return state_->peak.load();
}

namespace {
// MemAvailable of /proc/meminfo in bytes, or -1.
std::int64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}
}  // namespace

std::optional<std::int64_t> default_memory_budget(DeviceSpec device) {
  if (device.kind == DeviceKind::CPU) {
    const std::int64_t available = host_available_bytes();
    if (available < 0) return std::nullopt;
    return available / 2 / node_ranks();
  }
  const std::optional<std::int64_t> free_bytes = device_free_bytes(device);
  if (!free_bytes) return std::nullopt;
  return *free_bytes / 10 * 8;
}

std::int64_t chunk_for_budget(const ChunkSizing& s) {
  const std::int64_t left = s.budget - s.output_bytes;
  if (s.n_local <= 1 || left <= 0) return 1;
  if (s.bytes_per_sample <= 0) return s.n_local;
  const std::int64_t per_chunk =
      left / std::max<std::int64_t>(1, s.chunks_in_flight) - s.bytes_per_chunk;
  std::int64_t chunk = per_chunk / s.bytes_per_sample;
  if (s.working_set > 0) {
    chunk = std::min(chunk, std::max(kMinPreferredChunk, s.working_set / s.bytes_per_sample));
  }
  return std::clamp<std::int64_t>(chunk, 1, s.n_local);
}

std::int64_t host_chunk_working_set(int threads) {
  std::int64_t l2 = 0;
#if defined(_SC_LEVEL2_CACHE_SIZE)
  l2 = static_cast<std::int64_t>(sysconf(_SC_LEVEL2_CACHE_SIZE));
#endif
  if (l2 <= 0) l2 = std::int64_t{1} << 20;
  return 2 * l2 * std::max(1, threads);
}

bool out_of_memory(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::OutOfMemoryError&) {
    return true;
  } catch (const kvmap::OutOfMemoryError&) {
    return true;
  } catch (const std::bad_alloc&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace kvmap::Detail
