#include "detail/vmap/vmap_memory.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <new>
#include <string>

#include "kvmap/error.hpp"
#include "detail/platform/device_map.hpp"
#include "detail/platform/torch_compat.hpp"
#include "detail/platform/torch_stream.hpp"

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

std::int64_t chunk_for_budget(std::int64_t budget, std::int64_t bytes_per_sample,
                              std::int64_t output_bytes, std::int64_t n_local) {
  const std::int64_t left = budget - output_bytes;
  if (n_local <= 1 || left <= 0) return 1;
  if (bytes_per_sample <= 0) return n_local;
  return std::clamp<std::int64_t>(left / bytes_per_sample, 1, n_local);
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
