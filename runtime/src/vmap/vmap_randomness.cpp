#include "vmap_randomness.hpp"

#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "kvmap/error.hpp"
#include "torch_compat.hpp"
#include "kvmap/random.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "hash.hpp"
#include "philox.hpp"
#include "tensor_blocks.hpp"

namespace kvmap {

namespace Detail {

namespace {
thread_local SampleContext* t_context = nullptr;

// Eight bytes at a time: a CPU generator's state is about 5 KB, hashed on every call.
std::uint64_t hash_bytes(const at::Tensor& bytes) {
  const at::Tensor c = bytes.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  const auto n = static_cast<std::size_t>(c.numel()) * c.element_size();
  std::uint64_t h = kGolden ^ n;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + i, 8);
    h = mix64(h ^ w) + i;
  }
  for (; i < n; ++i) h = mix64(h ^ p[i]);
  return h;
}

enum class SampleKind { Uniform, Normal };

at::Tensor sample(at::IntArrayRef shape, at::ScalarType dtype, SampleKind kind, const char* what) {
  SampleContext* ctx = t_context;
  KVMAP_CHECK(
      ctx != nullptr, Error,
      "kvmap::" << what << ": called outside a function run by kvmap::vmap or kvmap::map_batches");
  KVMAP_CHECK(
      dtype == at::kFloat || dtype == at::kDouble, TypeError,
      "kvmap::" << what << ": dtype must be float32 or float64, got " << c10::toString(dtype));
  const std::int64_t call = ctx->calls++;
  std::vector<std::int64_t> full{ctx->batch};
  full.insert(full.end(), shape.begin(), shape.end());
  at::Tensor physical = at::empty(full, at::TensorOptions().dtype(at::kDouble));
  const std::int64_t per_sample = ctx->batch > 0 ? physical.numel() / ctx->batch : 0;
  const std::uint64_t key = mix64(ctx->key ^ splitmix64(static_cast<std::uint64_t>(call)));
  double* out = physical.data_ptr<double>();
  const std::int64_t offset = ctx->global_offset;
  at::parallel_for(0, ctx->batch, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const auto g = static_cast<std::uint64_t>(offset + b);
      for (std::int64_t j = 0; j < per_sample; ++j) {
        out[b * per_sample + j] = philox_element<double>(static_cast<std::uint64_t>(j), g, key,
                                                         kind == SampleKind::Normal);
      }
    }
  });
  at::Tensor typed =
      physical.to(at::TensorOptions().dtype(dtype).device(torch_device(ctx->device)));
  if (dtype == at::kFloat && kind == SampleKind::Uniform) {
    typed.clamp_max_(std::nextafter(1.0f, 0.0f));  // float rounding must not reach 1
  }
  if (ctx->level == SampleContext::kPlain) return typed;
  return torch_compat::make_batched(typed, ctx->level);
}
}  // namespace

SampleContextGuard::SampleContextGuard(SampleContext* context) : previous_(t_context) {
  t_context = context;
}
SampleContextGuard::~SampleContextGuard() {
  t_context = previous_;
}

GeneratorScope::GeneratorScope(Randomness mode, const Comm& comm, DeviceSpec device,
                               const at::Tensor& start)
    : mode_(mode) {
  if (mode_ == Randomness::Error) return;
  generator_ = at::globalContext().defaultGenerator(torch_device(device));
  std::lock_guard<std::mutex> lock(generator_.mutex());
  if (mode_ == Randomness::Same) {
    generator_.set_state(start);
    synchronized_state_ = start;
    state_hash_ = hash_bytes(start);
  } else {
    state_hash_ = hash_bytes(generator_.get_state());
    generator_.set_current_seed(
        mix64(state_hash_ ^ mix64(static_cast<std::uint64_t>(comm.rank()) + 1)) >> 1);
  }
}

std::uint64_t GeneratorScope::state_bytes(DeviceSpec device) {
  at::Generator generator = at::globalContext().defaultGenerator(torch_device(device));
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor state = generator.get_state();
  return static_cast<std::uint64_t>(state.numel() * state.element_size());
}

at::Tensor GeneratorScope::current_state(DeviceSpec device) {
  at::Generator generator = at::globalContext().defaultGenerator(torch_device(device));
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state().contiguous().clone();
}

std::uint64_t GeneratorScope::fingerprint(const at::Tensor& state) {
  return hash_bytes(state);
}

void GeneratorScope::before_chunk() {
  if (mode_ != Randomness::Same) return;
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(synchronized_state_);
}

GeneratorScope::~GeneratorScope() {
  if (mode_ == Randomness::Error) return;
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_current_seed(
      mix64(state_hash_ ^
            (mode_ == Randomness::Same ? 0x5A5A5A5A5A5A5A5Aull : 0xA5A5A5A5A5A5A5A5ull)) >>
      1);
}

}  // namespace Detail

std::int64_t chunk_rows() {
  return Detail::t_context != nullptr ? Detail::t_context->rows : 0;
}

at::Tensor sample_uniform(at::IntArrayRef shape, at::ScalarType dtype) {
  return Detail::sample(shape, dtype, Detail::SampleKind::Uniform, "sample_uniform");
}

at::Tensor sample_normal(at::IntArrayRef shape, at::ScalarType dtype) {
  return Detail::sample(shape, dtype, Detail::SampleKind::Normal, "sample_normal");
}

}  // namespace kvmap
