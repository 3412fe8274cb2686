// ChunkRunner (chunk_runner.hpp): f on one chunk of this rank's samples.
#include "chunk_runner.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <cstring>
#include <mutex>
#include <string>

#include "kvmap/error.hpp"
#include "kvmap/random.hpp"
#include "out_dims.hpp"
#include "stats_counters.hpp"

namespace kvmap::Detail {

torch_compat::VmapRandomness to_compat(Randomness r) {
  switch (r) {
    case Randomness::Same: return torch_compat::VmapRandomness::Same;
    case Randomness::Different: return torch_compat::VmapRandomness::Different;
    case Randomness::Error: break;
  }
  return torch_compat::VmapRandomness::Error;
}

std::vector<at::Tensor> ChunkRunner::run_checked(std::int64_t start, std::int64_t len,
                                                 std::int64_t padded,
                                                 std::vector<OutputMeta>* record,
                                                 const std::vector<OutputMeta>& metas) const {
  std::vector<at::Tensor> inputs = chunk_inputs(start, len, padded);
  // vmap: f sees one sample, through functorch's batching at a new level; map_batches: f
  // sees the chunk's plain tensors.
  std::unique_lock<std::recursive_mutex> lock;
  std::optional<torch_compat::VmapLevel> level;
  if (call_.per_sample()) lock = torch_compat::vmap_region_lock();
  generator_.before_chunk();
  if (call_.per_sample()) level.emplace(len, to_compat(call_.options.randomness()));
  batch(inputs, level);
  std::vector<at::Tensor> results = call_f(inputs, level, start, len, padded);
  const bool first = record != nullptr;
  KVMAP_CHECK(first || results.size() == metas.size(), ValueError,
              call_.who() << ": the function returned " << results.size() << " outputs on samples ["
                          << start << ", " << start + len << ") but " << metas.size()
                          << " on the first chunk");
  if (first) record->reserve(results.size());
  for (std::size_t k = 0; k < results.size(); ++k) {
    const OutputMeta m = output_meta(results[k], k, results.size(), start, padded);
    if (first) {
      record->push_back(m);
    } else {
      KVMAP_CHECK(std::memcmp(&m, &metas[k], sizeof m) == 0, ValueError,
                  call_.who() << ": output " << k << " has " << describe(m) << " on samples ["
                              << start << ", " << start + len << ") but " << describe(metas[k])
                              << " on the first chunk");
    }
    to_physical(results[k], m, level);
    if (padded > len) results[k] = results[k].narrow(m.out_dim, 0, len);
  }
  return results;
}

std::vector<at::Tensor> ChunkRunner::chunk_inputs(std::int64_t start, std::int64_t len,
                                                  std::int64_t padded) const {
  std::vector<at::Tensor> inputs;
  inputs.reserve(call_.arrays.size());
  for (std::size_t k = 0; k < call_.arrays.size(); ++k) {
    const std::optional<int> split = call_.arrays[k].layout.split();
    const bool whole = !split || (start == 0 && len == locals_[k].size(*split));
    at::Tensor piece = whole ? locals_[k] : locals_[k].narrow(*split, start, len);
    if (split && padded > len && len > 0) {
      std::vector<std::int64_t> fill(piece.sizes().begin(), piece.sizes().end());
      fill[static_cast<std::size_t>(*split)] = padded - len;
      piece = at::cat({piece, piece.narrow(*split, len - 1, 1).expand(fill)}, *split);
      count_bytes_copied(static_cast<std::uint64_t>(piece.numel()) * piece.element_size());
    }
    inputs.push_back(std::move(piece));
  }
  return inputs;
}

void ChunkRunner::batch(std::vector<at::Tensor>& inputs,
                        std::optional<torch_compat::VmapLevel>& level) const {
  for (std::size_t k = 0; k < call_.arrays.size(); ++k) {
    const std::optional<int> split = call_.arrays[k].layout.split();
    if (!split) continue;
    if (level) {
      inputs[k] = level->add_batch_dim(inputs[k], *split);
    } else if (*split != 0) {
      inputs[k] = inputs[k].movedim(*split, 0);
    }
  }
}

std::vector<at::Tensor> ChunkRunner::call_f(const std::vector<at::Tensor>& batched,
                                            const std::optional<torch_compat::VmapLevel>& level,
                                            std::int64_t start, std::int64_t len,
                                            std::int64_t padded) const {
  SampleContext context;
  context.level = level ? level->level() : SampleContext::kPlain;
  context.global_offset = global_offset_ + start;
  context.batch = padded;
  context.rows = len;
  context.key = sample_key_;
  context.device = call_.device;
  SampleContextGuard guard(&context);
  // TorchScript under functorch runs unoptimized on this thread (a thread-local switch of
  // LibTorch's graph executor): an optimized plan of a scripted MLP (its autodiff
  // subgraphs) reads tensors' `data`, which batched tensors refuse ("accessing `data`
  // under vmap transform is not allowed": torch.vmap fails so from the second call on).
  // Calls outside vmap keep their optimized plan (docs/models.md, TorchScript).
  std::optional<torch::jit::GraphOptimizerEnabledGuard> script_unoptimized;
  if (level) script_unoptimized.emplace(false);
  return call_.f(batched);
}

OutputMeta ChunkRunner::output_meta(const at::Tensor& r, std::size_t k, std::size_t nout,
                                    std::int64_t start, std::int64_t len) const {
  const bool per_sample = call_.per_sample();
  KVMAP_CHECK(r.defined(), ValueError,
              call_.who() << ": output " << k << " of the function is an undefined tensor");
  // The per-sample shape: vmap's outputs are logical (per sample); map_batches' lead with
  // the chunk's samples.
  KVMAP_CHECK(per_sample || (r.dim() >= 1 && r.size(0) == len), ValueError,
              call_.who() << ": output " << k << " of the function has shape " << r.sizes()
                          << " on samples [" << start << ", " << start + len
                          << "): its first axis must be the chunk length " << len);
  const std::int64_t skip = per_sample ? 0 : 1;
  const std::int64_t ndim = r.dim() - skip;
  KVMAP_CHECK(ndim < kMaxRank, ValueError,
              call_.who() << ": output " << k << " has " << ndim << " per-sample axes; at most "
                          << kMaxRank - 1 << " are supported");
  OutputMeta m;
  std::memset(&m, 0, sizeof m);
  m.ndim = static_cast<std::int32_t>(ndim);
  m.dtype = static_cast<std::int32_t>(from_torch(r.scalar_type()));
  // out_dims that do not fit the number of outputs are every rank's ValueError after the
  // agreement (check_out_dims_count in run_core), also where f did not run.
  const std::vector<std::int64_t>& dims = call_.options.out_dims();
  const bool per_output = call_.options.out_dims_per_output();
  m.out_dim = out_dims_fit(dims, per_output, nout)
                  ? static_cast<std::int32_t>(normalize_out_dim(dims, per_output, k, nout, ndim))
                  : 0;
  for (std::int64_t d = 0; d < ndim; ++d) m.shape[d] = r.size(d + skip);
  const DeviceSpec have = device_spec_of(r);
  if (have.kind != call_.device.kind ||
      (call_.device.kind != DeviceKind::CPU && have.index != call_.device.index))
    check_same_device(r, call_.device, std::string(call_.who()) + ": output " + std::to_string(k));
  return m;
}

void ChunkRunner::to_physical(at::Tensor& r, const OutputMeta& m,
                              std::optional<torch_compat::VmapLevel>& level) {
  if (level) r = level->remove_batch_dim(r, m.out_dim);
  if (r.requires_grad()) r = r.detach();
  if (!level && m.out_dim != 0) r = r.movedim(0, m.out_dim);
}

}  // namespace kvmap::Detail
