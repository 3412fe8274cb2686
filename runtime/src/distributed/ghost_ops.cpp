// kvmap::GhostExchange as torch operators, for models that exchange ghost features between
// their layers and stay scriptable and exportable:
//   kvmap::ghost_exchange(Tensor x, int plan) -> Tensor          GhostExchange::forward
//   kvmap::ghost_exchange_reverse(Tensor g, int plan) -> Tensor  GhostExchange::reverse
// `plan` is a handle (GhostExchange::handle()). One device-generic kernel each
// (CompositeExplicitAutograd: CPU, CUDA, HIP), a Meta kernel (shapes only: a new contiguous
// tensor of x's shape, so tracing and export see the op as opaque), and autograd: the
// backward of each is the other, called through the dispatcher, so gradients of any order
// (forces from an energy, then training on forces) are exchanges too.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "ghost_state.hpp"
#include "kvmap/error.hpp"
#include "kvmap/ghost_exchange.hpp"

namespace kvmap::Detail {

namespace {

struct GhostHandles {
  std::mutex mutex;
  std::int64_t next = 1;
  std::unordered_map<std::int64_t, std::weak_ptr<GhostPlan>> plans;
};

GhostHandles& ghost_handles() {
  static GhostHandles* r = new GhostHandles();  // outlives every plan (never destroyed)
  return *r;
}

using ExchangeOp = c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, std::int64_t)>;

// The operator itself (through the dispatcher: below autograd, or with it in a backward).
const ExchangeOp& ghost_op(bool reverse) {
  static const ExchangeOp forward = c10::Dispatcher::singleton()
                                        .findSchemaOrThrow("kvmap::ghost_exchange", "")
                                        .typed<at::Tensor(const at::Tensor&, std::int64_t)>();
  static const ExchangeOp backward = c10::Dispatcher::singleton()
                                         .findSchemaOrThrow("kvmap::ghost_exchange_reverse", "")
                                         .typed<at::Tensor(const at::Tensor&, std::int64_t)>();
  return reverse ? backward : forward;
}

at::Tensor forward_kernel(const at::Tensor& x, std::int64_t plan) {
  return GhostExchange::from_handle(plan).forward(x);
}
at::Tensor reverse_kernel(const at::Tensor& g, std::int64_t plan) {
  return GhostExchange::from_handle(plan).reverse(g);
}
at::Tensor meta_kernel(const at::Tensor& x, std::int64_t) {
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One direction of the exchange with the other as its backward.
template <bool Reverse>
struct GhostAutograd : public torch::autograd::Function<GhostAutograd<Reverse>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::int64_t plan) {
    ctx->saved_data["plan"] = plan;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return ghost_op(Reverse).call(x, plan);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::int64_t plan = ctx->saved_data["plan"].toInt();
    return {ghost_op(!Reverse).call(grads[0], plan), at::Tensor()};
  }
};

at::Tensor forward_autograd(const at::Tensor& x, std::int64_t plan) {
  return GhostAutograd<false>::apply(x, plan);
}
at::Tensor reverse_autograd(const at::Tensor& g, std::int64_t plan) {
  return GhostAutograd<true>::apply(g, plan);
}

}  // namespace

void forget_ghost_handle(std::int64_t handle) {
  GhostHandles& r = ghost_handles();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.plans.erase(handle);
}

}  // namespace kvmap::Detail

namespace kvmap {

std::int64_t GhostExchange::handle() const {
  Detail::GhostHandles& r = Detail::ghost_handles();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::lock_guard<std::mutex> plan_lock(plan_->mutex);
  if (plan_->handle == 0) {
    plan_->handle = r.next++;
    r.plans.emplace(plan_->handle, plan_);
  }
  return plan_->handle;
}

GhostExchange GhostExchange::from_handle(std::int64_t handle) {
  Detail::GhostHandles& r = Detail::ghost_handles();
  std::shared_ptr<Detail::GhostPlan> plan;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.plans.find(handle);
    if (it != r.plans.end()) plan = it->second.lock();
  }
  KVMAP_CHECK(plan != nullptr, Error,
              "kvmap: no GhostExchange plan has handle "
                  << handle
                  << " (build one with kvmap::GhostExchange and pass its handle(); a handle is "
                     "valid while its plan lives)");
  return GhostExchange(std::move(plan));
}

}  // namespace kvmap

TORCH_LIBRARY(kvmap, m) {
  m.def("ghost_exchange(Tensor x, int plan) -> Tensor");
  m.def("ghost_exchange_reverse(Tensor g, int plan) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvmap, CompositeExplicitAutograd, m) {
  m.impl("ghost_exchange", &kvmap::Detail::forward_kernel);
  m.impl("ghost_exchange_reverse", &kvmap::Detail::reverse_kernel);
}

TORCH_LIBRARY_IMPL(kvmap, Meta, m) {
  m.impl("ghost_exchange", &kvmap::Detail::meta_kernel);
  m.impl("ghost_exchange_reverse", &kvmap::Detail::meta_kernel);
}

TORCH_LIBRARY_IMPL(kvmap, Autograd, m) {
  m.impl("ghost_exchange", &kvmap::Detail::forward_autograd);
  m.impl("ghost_exchange_reverse", &kvmap::Detail::reverse_autograd);
}
