#pragma once
// The state behind a kvmap::GhostExchange (kvmap/ghost_exchange.hpp), shared by its copies:
// the routes (arithmetic/ghost_plan.hpp), their index tensors per device, and the handle the
// torch operators find it by (ghost_ops.cpp owns the handles).
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>

#include "detail.hpp"
#include "ghost_plan.hpp"
#include "kvmap/comm.hpp"

namespace kvmap::Detail {

// The routes as index tensors on one device.
struct GhostIndices {
  c10::Device device = c10::Device(c10::kCPU);
  at::Tensor send_rows;   // owned rows sent, packed in peer order
  at::Tensor remote_dst;  // rows of the tensor (owned + ghost index) filled from received rows
  at::Tensor remote_pos;  // their packed received rows
  at::Tensor self_dst;    // rows filled from this rank's own rows
  at::Tensor self_row;    // those owned rows
};

struct GhostPlan {
  Comm comm;
  std::int64_t owned = 0;
  std::int64_t ghosts = 0;
  GhostRoutes routes;
  std::mutex mutex;                  // guards the device copies and the handle
  std::deque<GhostIndices> indices;  // references stay valid as devices are added
  std::int64_t handle = 0;
  // What its calls cost on this rank (GhostExchange::usage): calls, and nanoseconds in them.
  std::atomic<std::int64_t> forward_calls{0}, reverse_calls{0};
  std::atomic<std::int64_t> forward_ns{0}, reverse_ns{0};
  ~GhostPlan();
  const GhostIndices& on(const c10::Device& device);
};

// Removes a handle from the registry (the plan's destructor; ghost_ops.cpp).
void forget_ghost_handle(std::int64_t handle);

}  // namespace kvmap::Detail
