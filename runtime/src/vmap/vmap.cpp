// The vmap scheduler: validate, run the chunks (under functorch for vmap, on plain batched
// tensors for map_batches), agree once (status, signature, outputs), assemble the output
// DistViews.
#include "kvmap/vmap.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/jit/runtime/graph_executor.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <sstream>
#include <tuple>

#include "kvmap/error.hpp"
#include "detail/layout/out_dims.hpp"
#include "detail/platform/torch_compat.hpp"
#include "detail/vmap/vmap_randomness.hpp"
#include "kvmap/random.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"

#include "detail/collective/collective.hpp"
#include "detail/vmap/vmap_agreement.hpp"
#include "detail/distributed/dist_view_access.hpp"
#include "detail/platform/torch_stream.hpp"
#include "detail/platform/stats.hpp"
#include "detail/distributed/random.hpp"
#include "detail/platform/allocation.hpp"
#include "detail/platform/tensor_bridge.hpp"
#include "detail/layout/hash.hpp"
#include "detail/vmap/vmap_memory.hpp"

namespace kvmap {

const char* name(Randomness r) {
  switch (r) {
    case Randomness::Error: return "error";
    case Randomness::Different: return "different";
    case Randomness::Same: return "same";
  }
  return "invalid";
}

VmapOptions& VmapOptions::out_dims(std::vector<std::int64_t> dims) {
  KVMAP_CHECK(!dims.empty(), ValueError, "kvmap::VmapOptions::out_dims: give at least one dim");
  out_dims_ = std::move(dims);
  out_dims_per_output_ = false;
  return *this;
}

VmapOptions& VmapOptions::out_dims_per_output(std::vector<std::int64_t> dims) {
  out_dims(std::move(dims));
  out_dims_per_output_ = true;
  return *this;
}

VmapOptions& VmapOptions::randomness(Randomness r) {
  KVMAP_CHECK(r == Randomness::Error || r == Randomness::Same || r == Randomness::Different,
              ValueError, "kvmap::VmapOptions::randomness: invalid value " << static_cast<int>(r));
  randomness_ = r;
  return *this;
}

VmapOptions& VmapOptions::chunk_size(std::optional<std::int64_t> c) {
  KVMAP_CHECK(!c || *c >= 1, ValueError,
              "kvmap::VmapOptions::chunk_size: expected a chunk size >= 1 or none, got " << *c);
  chunk_size_ = c;
  auto_chunk_ = false;
  return *this;
}

VmapOptions& VmapOptions::chunk_size(AutoChunk) {
  chunk_size_.reset();
  auto_chunk_ = true;
  return *this;
}

VmapOptions& VmapOptions::memory_budget(std::optional<std::int64_t> bytes) {
  KVMAP_CHECK(!bytes || *bytes >= 1, ValueError,
              "kvmap::VmapOptions::memory_budget: expected bytes >= 1 or none, got " << *bytes);
  memory_budget_ = bytes;
  return *this;
}

VmapOptions& VmapOptions::pad_to_chunk(bool pad) {
  pad_to_chunk_ = pad;
  return *this;
}

VmapOptions& VmapOptions::concurrency(int chunks_in_flight) {
  KVMAP_CHECK(chunks_in_flight >= 1, ValueError,
              "kvmap::VmapOptions::concurrency: expected >= 1, got " << chunks_in_flight);
  concurrency_ = chunks_in_flight;
  return *this;
}

namespace Detail {

namespace {

using Allocate = LocalBlock (*)(const std::vector<std::int64_t>&, std::size_t);

torch_compat::VmapRandomness to_compat(Randomness r) {
  switch (r) {
    case Randomness::Same: return torch_compat::VmapRandomness::Same;
    case Randomness::Different: return torch_compat::VmapRandomness::Different;
    case Randomness::Error: break;
  }
  return torch_compat::VmapRandomness::Error;
}

// One DistView argument as the core sees it (its block keeps the memory alive).
struct ArrayArg {
  const LocalBlock& block;  // the DistView's own (vmap_core's copies), alive for the call
  DType dtype;
  const Layout& layout;  // split axis normalized; the DistView's own, alive for the call
  std::uint64_t comm_id;
};

// ---- 1. validation (deterministic on what the agreement compares) --------------------
// The first mapped array's index (the lead, whose layout the outputs follow) and the batch.
// An empty batch (0 samples on every rank) is valid: f then runs once on a batch of 0, on
// every rank, as torch.vmap does, to give the outputs' per-sample shapes and dtypes.
std::pair<int, std::int64_t> validate_arrays(const std::vector<ArrayArg>& arrays, const char* who) {
  int lead = -1, j = 0;
  for (std::size_t k = 0; k < arrays.size(); ++k) {
    KVMAP_CHECK(arrays[k].comm_id == arrays[0].comm_id, ValueError,
                who << ": DistView argument " << k << " lives on another communicator than "
                    << "DistView argument 0");
    if (!arrays[k].layout.split()) continue;
    if (lead < 0) {
      lead = static_cast<int>(k);
      ++j;
      continue;
    }
    const Layout& first = arrays[lead].layout;
    const Layout& l = arrays[k].layout;
    KVMAP_CHECK(l.gshape()[*l.split()] == first.gshape()[*first.split()] && l.same_rows(first),
                ValueError,
                who << ": mapped inputs need the same batch length and the same per-rank "
                       "counts along their split axes, but mapped input 0 has "
                    << first << " and mapped input " << j << " has " << l);
    ++j;
  }
  KVMAP_CHECK(lead >= 0, ValueError,
              who << ": no mapped input; pass at least one DistView with a split axis "
                     "(replicated DistViews and other arguments are passed to the function whole)");
  const Layout& first = arrays[lead].layout;
  return {lead, first.gshape()[*first.split()]};
}

void describe_options(Signature& sig, const VmapOptions& o, const StreamState& stream) {
  sig.ints("out_dims", o.out_dims())
      .arg("out_dims_per_output", o.out_dims_per_output() ? 1 : 0)
      .text("randomness", name(o.randomness()));
  // The per-sample random stream (kvmap::sample_uniform/normal): the same on every rank
  // unless ranks seeded differently (kvmap::manual_seed on part of the communicator).
  sig.arg("seed", stream.seed).arg("stream", stream.stream);
}

// ---- 3./4. the local run ------------------------------------------------------------------
struct LocalRun {
  std::vector<OutputMeta> metas;
  std::vector<at::Tensor> outputs;  // physical, local batch along out_dim
  std::int64_t chunks = 0;
};

const char* name_of(Mapping mapping) {
  return mapping == Mapping::Samples ? "kvmap::vmap" : "kvmap::map_batches";
}

// One vmap or map_batches call as the scheduler sees it, fixed before anything runs.
struct VmapCall {
  const std::vector<ArrayArg>& arrays;
  const std::vector<MemorySpan>& tensor_spans;  // the tensor arguments' memory (no aliasing)
  const Comm& comm;
  DeviceSpec device;
  const VmapOptions& options;
  Mapping mapping;
  const ArgsCall& call;  // f on the chunk's inputs
  Allocate allocate;     // blocks in the DistViews' memory space
  bool per_sample() const { return mapping == Mapping::Samples; }
  const char* who() const { return name_of(mapping); }
};

// Runs f on chunks of this rank's samples. Chunk 0 fixes the outputs' metadata; later chunks
// are checked against it.
class ChunkRunner {
 public:
  ChunkRunner(const VmapCall& call, const std::vector<at::Tensor>& locals,
              GeneratorScope& generator, std::int64_t global_offset, std::uint64_t sample_key)
      : c_(call),
        locals_(locals),
        generator_(generator),
        global_offset_(global_offset),
        sample_key_(sample_key) {}

  // Runs f on samples [start, start + len) and returns each output with its batch moved to
  // its normalized out_dim. Chunk 0 fills `metas` (passed empty); later chunks check
  // their outputs against it.
  // `padded` >= len: the rows f sees (map_batches with pad_to_chunk), the last real row
  // repeated; only the real rows' outputs are returned.
  std::vector<at::Tensor> run_first(std::int64_t len, std::int64_t padded,
                                    std::vector<OutputMeta>& metas) const {
    return run_checked(0, len, padded, &metas, metas);
  }
  std::vector<at::Tensor> run_next(std::int64_t start, std::int64_t len, std::int64_t padded,
                                   const std::vector<OutputMeta>& expected) const {
    return run_checked(start, len, padded, nullptr, expected);
  }

 private:
  std::vector<at::Tensor> run_checked(std::int64_t start, std::int64_t len, std::int64_t padded,
                                      std::vector<OutputMeta>* record,
                                      const std::vector<OutputMeta>& metas) const {
    std::vector<at::Tensor> inputs = chunk_inputs(start, len, padded);
    // vmap: f sees one sample, through functorch's batching at a new level; map_batches: f
    // sees the chunk's plain tensors.
    std::unique_lock<std::recursive_mutex> lock;
    std::optional<torch_compat::VmapLevel> level;
    if (c_.per_sample()) lock = torch_compat::vmap_region_lock();
    generator_.before_chunk();
    if (c_.per_sample()) level.emplace(len, to_compat(c_.options.randomness()));
    batch(inputs, level);
    std::vector<at::Tensor> results = call_f(inputs, level, start, len, padded);
    const bool first = record != nullptr;
    KVMAP_CHECK(first || results.size() == metas.size(), ValueError,
                c_.who() << ": the function returned " << results.size() << " outputs on samples ["
                         << start << ", " << start + len << ") but " << metas.size()
                         << " on the first chunk");
    if (first) record->reserve(results.size());
    for (std::size_t k = 0; k < results.size(); ++k) {
      const OutputMeta m = output_meta(results[k], k, results.size(), start, padded);
      if (first) {
        record->push_back(m);
      } else {
        KVMAP_CHECK(std::memcmp(&m, &metas[k], sizeof m) == 0, ValueError,
                    c_.who() << ": output " << k << " has " << describe(m) << " on samples ["
                             << start << ", " << start + len << ") but " << describe(metas[k])
                             << " on the first chunk");
      }
      to_physical(results[k], m, level);
      if (padded > len) results[k] = results[k].narrow(m.out_dim, 0, len);
    }
    return results;
  }

  // Mapped arrays: this chunk's samples, padded to `padded` rows with copies of the last
  // (a new tensor, counted in bytes_copied); replicated ones: the whole shard.
  std::vector<at::Tensor> chunk_inputs(std::int64_t start, std::int64_t len,
                                       std::int64_t padded) const {
    std::vector<at::Tensor> inputs;
    inputs.reserve(c_.arrays.size());
    for (std::size_t k = 0; k < c_.arrays.size(); ++k) {
      const std::optional<int> split = c_.arrays[k].layout.split();
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

  // In place: the batch at functorch's level, or moved first (a view) for map_batches.
  void batch(std::vector<at::Tensor>& inputs, std::optional<torch_compat::VmapLevel>& level) const {
    for (std::size_t k = 0; k < c_.arrays.size(); ++k) {
      const std::optional<int> split = c_.arrays[k].layout.split();
      if (!split) continue;
      if (level) {
        inputs[k] = level->add_batch_dim(inputs[k], *split);
      } else if (*split != 0) {
        inputs[k] = inputs[k].movedim(*split, 0);
      }
    }
  }

  std::vector<at::Tensor> call_f(const std::vector<at::Tensor>& batched,
                                 const std::optional<torch_compat::VmapLevel>& level,
                                 std::int64_t start, std::int64_t len, std::int64_t padded) const {
    SampleContext context;
    context.level = level ? level->level() : SampleContext::kPlain;
    context.global_offset = global_offset_ + start;
    context.batch = padded;
    context.rows = len;
    context.key = sample_key_;
    context.device = c_.device;
    SampleContextGuard guard(&context);
    // TorchScript under functorch runs unoptimized on this thread (a thread-local switch of
    // LibTorch's graph executor): an optimized plan of a scripted MLP (its autodiff
    // subgraphs) reads tensors' `data`, which batched tensors refuse ("accessing `data`
    // under vmap transform is not allowed": torch.vmap fails so from the second call on).
    // Calls outside vmap keep their optimized plan (docs/models.md, TorchScript).
    std::optional<torch::jit::GraphOptimizerEnabledGuard> script_unoptimized;
    if (level) script_unoptimized.emplace(false);
    return c_.call(batched);
  }

  // Output k's per-sample metadata, checked: defined, on the call's device, within kvmap's
  // rank limit, and for map_batches leading with the chunk's samples.
  OutputMeta output_meta(const at::Tensor& r, std::size_t k, std::size_t nout, std::int64_t start,
                         std::int64_t len) const {
    const bool per_sample = c_.per_sample();
    KVMAP_CHECK(r.defined(), ValueError,
                c_.who() << ": output " << k << " of the function is an undefined tensor");
    // The per-sample shape: vmap's outputs are logical (per sample); map_batches' lead with
    // the chunk's samples.
    KVMAP_CHECK(per_sample || (r.dim() >= 1 && r.size(0) == len), ValueError,
                c_.who() << ": output " << k << " of the function has shape " << r.sizes()
                         << " on samples [" << start << ", " << start + len
                         << "): its first axis must be the chunk length " << len);
    const std::int64_t skip = per_sample ? 0 : 1;
    const std::int64_t ndim = r.dim() - skip;
    KVMAP_CHECK(ndim < kMaxRank, ValueError,
                c_.who() << ": output " << k << " has " << ndim << " per-sample axes; at most "
                         << kMaxRank - 1 << " are supported");
    OutputMeta m;
    std::memset(&m, 0, sizeof m);
    m.ndim = static_cast<std::int32_t>(ndim);
    m.dtype = static_cast<std::int32_t>(from_torch(r.scalar_type()));
    // out_dims that do not fit the number of outputs are every rank's ValueError after the
    // agreement (check_out_dims_count in run_core), also where f did not run.
    const std::vector<std::int64_t>& dims = c_.options.out_dims();
    const bool per_output = c_.options.out_dims_per_output();
    m.out_dim = out_dims_fit(dims, per_output, nout)
                    ? static_cast<std::int32_t>(normalize_out_dim(dims, per_output, k, nout, ndim))
                    : 0;
    for (std::int64_t d = 0; d < ndim; ++d) m.shape[d] = r.size(d + skip);
    const DeviceSpec have = device_spec_of(r);
    if (have.kind != c_.device.kind ||
        (c_.device.kind != DeviceKind::CPU && have.index != c_.device.index))
      check_same_device(r, c_.device, std::string(c_.who()) + ": output " + std::to_string(k));
    return m;
  }

  // Physical from now on: the batch along out_dim. A DistView holds data, not autograd
  // history: outputs computed with grad mode on (a model whose parameters require grad) are
  // detached.
  static void to_physical(at::Tensor& r, const OutputMeta& m,
                          std::optional<torch_compat::VmapLevel>& level) {
    if (level) r = level->remove_batch_dim(r, m.out_dim);
    if (r.requires_grad()) r = r.detach();
    if (!level && m.out_dim != 0) r = r.movedim(0, m.out_dim);
  }

  const VmapCall& c_;
  const std::vector<at::Tensor>& locals_;  // zero-copy views of every array's local shard
  GeneratorScope& generator_;
  std::int64_t global_offset_;
  std::uint64_t sample_key_;
};

bool needs_materializing(const at::Tensor& t) {
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) return true;
  }
  return false;
}

// The outputs of a call run as one chunk, adopted as they are, unless a stride-0 broadcast
// has to be materialized once, or the output shares memory with an input (f returned it, or
// a view of it) or with an earlier output ({t, t}): outputs never alias, whatever the
// chunking.
void adopt_unaliased(std::vector<at::Tensor>& outputs, const VmapCall& c) {
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    at::Tensor& t = outputs[k];
    const MemorySpan span = span_of(t);
    bool shared = false;
    for (const MemorySpan& other : c.tensor_spans) shared = shared || span.overlaps(other);
    for (const ArrayArg& a : c.arrays)
      shared = shared || span.overlaps(span_of(a.block, size_of(a.dtype)));
    for (std::size_t j = 0; j < k; ++j) shared = shared || span.overlaps(span_of(outputs[j]));
    if (shared || needs_materializing(t)) {
      t = t.clone(at::MemoryFormat::Contiguous);
      count_bytes_copied(static_cast<std::uint64_t>(t.numel()) * t.element_size());
    }
  }
}

// How many chunks run at once. Chunks in flight at once run on the threads of the host
// execution space, each under the caller's torch thread-local state (grad mode, inference
// mode, dispatch keys, functorch layers). They stay on the calling thread, in order, where
// that is not possible: Same-mode randomness restores one generator state per chunk,
// LibTorch 1.13's functorch bookkeeping is not thread-safe (map_batches, which uses none,
// runs chunks at once there too), a host space with one thread gives no second chunk in
// flight, and on a GPU every chunk's torch work goes to the one Kokkos stream the calling
// thread set (torch_stream.hpp; the device runs each chunk's kernels in parallel).
int chunks_in_flight(const VmapCall& c) {
  if (c.options.randomness() == Randomness::Same ||
      (c.per_sample() && !torch_compat::concurrent_vmap_supported()) ||
      c.device.kind != DeviceKind::CPU) {
    return 1;
  }
  return std::min(c.options.concurrency(), Kokkos::DefaultHostExecutionSpace().concurrency());
}

// Runs body(c) for chunks 1 .. nchunks - 1, `in_flight` at once, until `failed`.
template <class Body>
void for_each_later_chunk(std::int64_t nchunks, int in_flight, const std::atomic<bool>& failed,
                          const Body& body) {
  if (in_flight <= 1) {
    // Plain loop: the user function may call Kokkos itself (a dispatch or fence inside a
    // Kokkos policy would wait on that policy's own lock).
    for (std::int64_t c = 1; c < nchunks && !failed.load(); ++c) {
      ScopedRegion region("kvmap::vmap/chunk");
      body(c);
    }
    return;
  }
  using Host = Kokkos::DefaultHostExecutionSpace;
  const at::ThreadLocalState caller_state;
  auto body_in_caller_state = [&](const std::int64_t c) {
    at::ThreadLocalStateGuard state_guard(caller_state);
    body(c);
  };
  for (std::int64_t wave = 1; wave < nchunks && !failed.load(); wave += in_flight) {
    const std::int64_t end = std::min<std::int64_t>(nchunks, wave + in_flight);
    // One chunk per thread (static, chunk size 1): a wave's chunks run at once. Regions are
    // pushed by the calling thread only: Kokkos >= 4 fences every execution space on a
    // region push while a profiler is attached, which inside the policy waits on the policy.
    ScopedRegion region("kvmap::vmap/chunk");
    Kokkos::parallel_for(
        "kvmap::vmap/chunks",
        Kokkos::RangePolicy<Host, Kokkos::Schedule<Kokkos::Static>,
                            Kokkos::IndexType<std::int64_t>>(wave, end, Kokkos::ChunkSize(1)),
        body_in_caller_state);
    Host().fence();
  }
}

// How one rank's samples are cut: chunk 0 of `first` samples (it fixes the outputs' metadata
// and, for chunk_size(auto_chunk), is the probe), then chunks of `rest`. With pad_to_chunk
// f sees `first_rows` and `rest_rows` rows, else as many as are real.
struct ChunkPlan {
  std::int64_t first = 0;
  std::int64_t rest = 0;
  bool pad = false;
  std::int64_t first_rows = 0;
  std::int64_t rest_rows = 0;
  std::int64_t rows(std::int64_t len, std::int64_t padded) const {
    return pad && len > 0 ? padded : len;
  }
};

// Samples in the first probe chunk of chunk_size(auto_chunk): one, so that the probes stay
// within the budget unless a single sample does not fit it.
constexpr std::int64_t kProbeSamples = 1;

ChunkPlan initial_plan(const VmapOptions& o, std::int64_t n_local) {
  ChunkPlan p;
  p.pad = o.pad_to_chunk();
  if (o.auto_chunk_size()) {
    p.first = std::min(kProbeSamples, n_local);
    p.first_rows = p.first;
  } else {
    p.first = std::min(o.chunk_size().value_or(n_local), n_local);
    p.first_rows = o.chunk_size().value_or(n_local);
  }
  p.rest = p.first;
  p.rest_rows = p.first_rows;
  return p;
}

// A padded chunk cannot shrink: the program f runs was made for its shape.
[[noreturn]] void padded_out_of_memory(const VmapCall& c, std::int64_t rows,
                                       const std::exception_ptr& e) {
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    what = err.what();
  } catch (...) {
    what = "unknown exception";
  }
  throw OutOfMemoryError(std::string(c.who()) + ": a chunk padded to " + std::to_string(rows) +
                         " rows ran out of memory (" + what +
                         "); pad_to_chunk keeps every chunk at that shape, so kvmap cannot run it "
                         "in halves: use a smaller chunk_size (e.g. " +
                         std::to_string(std::max<std::int64_t>(1, rows / 2)) +
                         ") for a program made for it");
}

// Whether a chunk of `len` samples that threw `e` runs again as two halves; otherwise
// rethrows (an error that is not out of memory, one sample, or a padded chunk).
void halve_or_rethrow(const VmapCall& c, const ChunkPlan& plan, std::int64_t len,
                      std::int64_t padded_rows, const std::exception_ptr& e) {
  if (!out_of_memory(e) || len <= 1) std::rethrow_exception(e);
  if (plan.pad) padded_out_of_memory(c, padded_rows, e);
  count_chunk_retry();
}

// Chunk 0: run, and on out of memory run again on its first half until it fits. `plan.first`
// ends as the samples it ran; with `peak`, what f allocated at most (MemoryProbe).
std::vector<at::Tensor> run_first_chunk(const VmapCall& c, const ChunkRunner& runner,
                                        ChunkPlan& plan, std::vector<OutputMeta>& metas,
                                        std::int64_t* peak) {
  ScopedRegion region("kvmap::vmap/chunk");
  for (;;) {
    std::exception_ptr failure;
    try {
      std::optional<MemoryProbe> probe;
      if (peak) probe.emplace();
      std::vector<at::Tensor> first =
          runner.run_first(plan.first, plan.rows(plan.first, plan.first_rows), metas);
      if (peak) *peak = probe->peak_bytes();
      return first;
    } catch (...) {
      failure = std::current_exception();
    }
    halve_or_rethrow(c, plan, plan.first, plan.first_rows, failure);
    failure = nullptr;  // released (a Python traceback holds the chunk's tensors) before rerunning
    metas.clear();
    plan.first /= 2;
    plan.first_rows = plan.first;
  }
}

// The budget of chunk_size(auto_chunk): the user's, or read now.
std::int64_t memory_budget_now(const VmapCall& c) {
  if (c.options.memory_budget()) return *c.options.memory_budget();
  const std::optional<std::int64_t> budget = default_memory_budget(c.device);
  KVMAP_CHECK(budget, ValueError,
              c.who() << ": chunk_size=auto cannot read the free memory of "
                      << torch_device(c.device) << " in this build; give memory_budget");
  return *budget;
}

// What chunk_size(auto_chunk) measured: the peak of chunk 0 (one sample), and of chunk 1 (the
// chunk size chunk 0 allowed, as if each sample cost what chunk 0 cost), which separates what
// f needs per sample from what it needs per chunk (the slope and the intercept).
struct ProbedMemory {
  std::int64_t first_peak = 0, first_len = 0;
  std::int64_t second_peak = 0, second_len = 0;  // second_len 0: no second probe
};

// The chunk size that fits the budget, given what the probes measured. On the host also a
// chunk whose temporaries stay in cache (see host_chunk_working_set): each chunk in flight
// runs on one thread, a single one on torch's intra-op threads.
void choose_chunk(const VmapCall& c, ChunkPlan& plan, const std::vector<OutputMeta>& metas,
                  std::int64_t n_local, std::int64_t budget, const ProbedMemory& probed) {
  ChunkSizing sizing;
  sizing.budget = budget;
  if (probed.second_len > probed.first_len) {
    sizing.bytes_per_sample = std::max<std::int64_t>(
        0, (probed.second_peak - probed.first_peak + probed.second_len - probed.first_len - 1) /
               (probed.second_len - probed.first_len));
    sizing.bytes_per_chunk =
        std::max<std::int64_t>(0, probed.first_peak - sizing.bytes_per_sample * probed.first_len);
  } else if (probed.first_len > 0) {
    sizing.bytes_per_sample = (probed.first_peak + probed.first_len - 1) / probed.first_len;
  }
  for (const OutputMeta& m : metas) {
    std::int64_t per = static_cast<std::int64_t>(size_of(static_cast<DType>(m.dtype)));
    for (std::int32_t d = 0; d < m.ndim; ++d) per *= m.shape[d];
    sizing.output_bytes += per * n_local;
  }
  sizing.n_local = n_local;
  sizing.chunks_in_flight = chunks_in_flight(c);
  if (c.device.kind == DeviceKind::CPU) {
    sizing.working_set =
        host_chunk_working_set(sizing.chunks_in_flight > 1 ? 1 : at::get_num_threads());
  }
  plan.rest = chunk_for_budget(sizing);
  plan.rest_rows = plan.rest;
  record_auto_chunk(plan.rest, sizing.bytes_per_sample);
}

LocalRun run_local(const VmapCall& c, std::int64_t n_local, const ChunkRunner& runner) {
  LocalRun out;
  const VmapOptions& o = c.options;
  // An empty batch (every rank empty): f runs once, on 0 samples.
  ChunkPlan plan = initial_plan(o, n_local);
  const bool automatic = o.auto_chunk_size();
  const std::int64_t budget = automatic ? memory_budget_now(c) : 0;
  ProbedMemory probed;
  std::vector<at::Tensor> first =
      run_first_chunk(c, runner, plan, out.metas, automatic ? &probed.first_peak : nullptr);
  probed.first_len = plan.first;
  if (automatic) {
    choose_chunk(c, plan, out.metas, n_local, budget, probed);
  } else if (plan.first < plan.rest) {
    plan.rest = plan.rest_rows = plan.first;  // what fit chunk 0 is the chunk size from now on
  }
  out.chunks = 1;
  if (plan.first == n_local) {
    adopt_unaliased(first, c);
    out.outputs = std::move(first);
    return out;
  }
  // Preallocated once; every chunk writes its slice.
  for (std::size_t k = 0; k < first.size(); ++k) {
    const OutputMeta& m = out.metas[k];
    Shape shape(m.shape, m.shape + m.ndim);
    shape.insert(shape.begin() + m.out_dim, n_local);
    const DType dt = static_cast<DType>(m.dtype);
    out.outputs.push_back(tensor_from_block(c.allocate(shape, size_of(dt)), dt, c.device));
  }
  auto write = [&](std::int64_t start, const std::vector<at::Tensor>& chunk) {
    for (std::size_t k = 0; k < chunk.size(); ++k) {
      out.outputs[k]
          .narrow(out.metas[k].out_dim, start, chunk[k].size(out.metas[k].out_dim))
          .copy_(chunk[k]);
      count_bytes_copied(static_cast<std::uint64_t>(chunk[k].numel()) * chunk[k].element_size());
    }
  };
  write(0, first);
  first.clear();

  const std::vector<OutputMeta>& expected = out.metas;
  // Samples [start, start + len), in halves while f runs out of memory; with `fitted`, the
  // shortest length that ran is kept there.
  auto run_fitting = [&](auto& self, std::int64_t start, std::int64_t len,
                         std::int64_t* fitted) -> void {
    std::exception_ptr failure;
    try {
      write(start, runner.run_next(start, len, plan.rows(len, plan.rest_rows), expected));
      if (fitted) *fitted = std::min(*fitted, len);
      return;
    } catch (...) {
      failure = std::current_exception();
    }
    halve_or_rethrow(c, plan, len, plan.rest_rows, failure);
    failure = nullptr;
    self(self, start, len / 2, fitted);
    self(self, start + len / 2, len - len / 2, fitted);
  };
  std::int64_t done = plan.first;  // samples written
  if (automatic && plan.rest > 1) {
    // The second probe: chunk 1, of the size chunk 0 allowed, measured on this thread.
    ScopedRegion region("kvmap::vmap/chunk");
    probed.second_len = std::min(plan.rest, n_local - done);
    std::int64_t fitted = probed.second_len;
    {
      MemoryProbe probe;
      run_fitting(run_fitting, done, probed.second_len, &fitted);
      probed.second_peak = probe.peak_bytes();
    }
    done += probed.second_len;
    out.chunks += 1;
    if (fitted == probed.second_len) {
      choose_chunk(c, plan, out.metas, n_local, budget, probed);
    } else {  // it did not fit as a whole: what did is the chunk size from now on
      plan.rest = plan.rest_rows = fitted;
      record_auto_chunk(fitted, probed.first_len > 0 ? probed.first_peak / probed.first_len : 0);
    }
  }
  if (done == n_local) return out;

  // Chunks 1 .. nchunks - 1 of the loop: samples [done, n_local) by plan.rest.
  const std::int64_t nchunks = 1 + (n_local - done + plan.rest - 1) / plan.rest;
  out.chunks += nchunks - 1;
  // The error of the lowest failing chunk is rethrown once the policy has completed.
  std::mutex error_mutex;
  std::int64_t failed_chunk = nchunks;
  std::exception_ptr error;
  // After a failure no further chunk starts (only those already in flight finish).
  std::atomic<bool> failed{false};
  auto body = [&](const std::int64_t chunk) {
    if (failed.load()) return;
    try {
      const std::int64_t start = done + (chunk - 1) * plan.rest;
      run_fitting(run_fitting, start, std::min(plan.rest, n_local - start), nullptr);
    } catch (...) {
      failed.store(true);
      // A replaced error is released after the lock (its destructor may wait for the GIL).
      std::exception_ptr mine = std::current_exception();
      std::lock_guard<std::mutex> lock(error_mutex);
      if (chunk < failed_chunk) {
        failed_chunk = chunk;
        std::swap(error, mine);
      }
    }
  };
  for_each_later_chunk(nchunks, chunks_in_flight(c), failed, body);
  if (error) std::rethrow_exception(error);
  return out;
}

struct CoreOutput {
  LocalBlock block;
  DType dtype;
  Layout layout;
};
using CoreResult = std::vector<CoreOutput>;

// The plan: validation, and the signature every rank must share (each argument's layout,
// dtype and communicator, the options, the random stream; in Same mode the generator state
// size).
struct Plan {
  int lead = 0;  // the first mapped array
  std::int64_t batch = 0;
  // Whether f runs on `rank`: where it holds samples, and everywhere for an empty batch.
  bool runs_f(const Layout& lead_layout, int rank) const {
    return batch == 0 || lead_layout.count(rank) > 0;
  }
};

// Whether a shard of `extents` is what `layout` gives `rank` (lshape, without allocating).
bool shard_fits(const Shape& extents, const Layout& layout, int rank) {
  const Shape& g = layout.gshape();
  if (extents.size() != g.size()) return false;
  for (std::size_t d = 0; d < g.size(); ++d) {
    const bool split = layout.split() && static_cast<std::size_t>(*layout.split()) == d;
    if (extents[d] != (split ? layout.count(rank) : g[d])) return false;
  }
  return true;
}

Plan plan_call(Signature& sig, const VmapCall& c, const StreamState& stream) {
  ScopedRegion region("kvmap::vmap/validate");
  const VmapOptions& options = c.options;
  // In map_batches f is an ordinary batched call: torch's random functions draw from torch's
  // generator as anywhere else, and nothing (no functorch) could intercept them.
  KVMAP_CHECK(c.per_sample() || options.randomness() == Randomness::Error, ValueError,
              "kvmap::map_batches: randomness=" << name(options.randomness())
                                                << " applies to kvmap::vmap only; inside "
                                                   "map_batches use kvmap::sample_uniform/"
                                                   "sample_normal for per-sample random values");
  KVMAP_CHECK(!options.pad_to_chunk() || !c.per_sample(), ValueError,
              "kvmap::vmap: pad_to_chunk applies to kvmap::map_batches only (under vmap f sees "
              "one sample whatever the chunk)");
  KVMAP_CHECK(!options.pad_to_chunk() || options.chunk_size() || options.auto_chunk_size(),
              ValueError,
              c.who() << ": pad_to_chunk needs a chunk size (chunk_size(n) or "
                         "chunk_size(kvmap::auto_chunk)) to pad to");
  describe_options(sig, options, stream);
  if (options.randomness() == Randomness::Same) {
    sig.arg("generator_state_bytes", GeneratorScope::state_bytes(c.device));
  }
  Plan p;
  for (const ArrayArg& a : c.arrays) {
    sig.arg("array", a.layout).arg("dtype", a.dtype);
    sig.arg("array_comm", a.comm_id);
  }
  std::tie(p.lead, p.batch) = validate_arrays(c.arrays, c.who());
  // A DistView's shard has its layout's shape; one adopted by a front-end without an
  // agreement of its own (a Heat DNDarray in Python) is checked here, so that a shard of
  // another shape is an error on every rank. (All arrays live on the call's communicator.)
  const int rank = c.comm.rank();
  for (std::size_t k = 0; k < c.arrays.size(); ++k) {
    const ArrayArg& a = c.arrays[k];
    KVMAP_CHECK(shard_fits(a.block.extents, a.layout, rank), ValueError,
                c.who() << ": argument " << k << "'s shard on rank " << rank << " has shape "
                        << to_string(a.block.extents) << ", but its layout " << a.layout
                        << " gives it " << to_string(a.layout.lshape(rank)));
  }
  return p;
}

// What this rank's run of f leaves for assembly.
struct LocalOutputs {
  LocalRun run;
  std::vector<LocalBlock> blocks;
};

// Runs f on this rank's samples (none on a rank without any): torch on the device and stream
// of the Kokkos instance throughout. Makes no MPI call. `start` is the generator state Same
// mode starts every chunk from.
LocalOutputs run_here(const Plan& plan, const VmapCall& c, const StreamState& stream,
                      const at::Tensor& start) {
  LocalOutputs out;
  const Layout& lead = c.arrays[plan.lead].layout;
  const int me = c.comm.rank();
  const std::int64_t n_local = lead.count(me);
  if (kokkos_fence_needed(c.device)) Kokkos::fence();  // Kokkos' writes before torch reads them
  TorchStreamScope torch_on_kokkos(c.device);
  GeneratorScope generator(c.options.randomness(), c.comm, c.device, start);
  if (plan.runs_f(lead, me)) {
    std::vector<at::Tensor> locals;
    locals.reserve(c.arrays.size());
    for (const ArrayArg& a : c.arrays)
      locals.push_back(tensor_from_block(a.block, a.dtype, c.device));
    const ChunkRunner runner(c, locals, generator, lead.offset(me), stream.key());
    out.run = run_local(c, n_local, runner);
    count_chunks(static_cast<std::uint64_t>(out.run.chunks));
    KVMAP_CHECK(out.run.metas.size() < 0xffff, ValueError,
                c.who() << ": the function returned " << out.run.metas.size()
                        << " outputs; at most 65534 are supported");
    // Everything assembly needs from the outputs, checked before the result agreement.
    out.blocks.reserve(out.run.outputs.size());
    for (const at::Tensor& t : out.run.outputs) out.blocks.push_back(block_from_tensor(t));
  }
  torch_on_kokkos.finish();
  return out;
}

Layout output_layout(const Layout& lead, const OutputMeta& m) {
  Shape gshape;
  gshape.reserve(static_cast<std::size_t>(m.ndim) + 1);
  gshape.assign(m.shape, m.shape + m.ndim);
  gshape.insert(gshape.begin() + m.out_dim, lead.gshape()[*lead.split()]);
  return lead.with_shape(std::move(gshape), m.out_dim);
}

// After the agreement; cannot fail (zero-byte blocks on ranks without samples).
CoreResult assemble(LocalOutputs& here, const std::vector<OutputMeta>& metas, const Layout& lead,
                    bool ran, int me, Allocate allocate) {
  ScopedRegion region("kvmap::vmap/assemble");
  CoreResult result;
  result.reserve(metas.size());
  for (std::size_t k = 0; k < metas.size(); ++k) {
    const DType dt = static_cast<DType>(metas[k].dtype);
    Layout layout = output_layout(lead, metas[k]);
    LocalBlock block = ran ? std::move(here.blocks[k]) : allocate(layout.lshape(me), size_of(dt));
    result.push_back(CoreOutput{std::move(block), dt, std::move(layout)});
  }
  return result;
}

// ONE collective per call, in every randomness mode: each rank validates, runs f on its
// samples (f makes no MPI call) and then agrees once: its plan/f status, the fingerprint of
// its signature, the fingerprint of its outputs' metadata (and in Same mode of the generator
// state it started from) travel together in a fixed-size reduction. On one rank nothing
// communicates. Same mode starts every rank from its own generator state: when the states
// turn out to differ (ranks seeded differently), rank 0's state is broadcast and f runs again
// from it (its first results are dropped).
CoreResult run_core(const VmapCall& c) {
  ScopedRegion whole("kvmap::vmap");
  count_vmap_call();
  const Comm& comm = c.comm;
  const int me = comm.rank();
  // Every rank takes the next stream, whatever happens next.
  const StreamState stream = next_stream(comm);
  const bool same = c.options.randomness() == Randomness::Same;
  at::Tensor start = same ? GeneratorScope::current_state(c.device) : at::Tensor();
  for (int attempt = 0;; ++attempt) {
    Collective<VmapAgreement> once(c.per_sample() ? "vmap" : "map_batches", comm);
    LocalOutputs here;
    std::optional<Plan> plan = once.plan([&](Signature& sig, VmapAgreement& payload) {
      if (same) payload.state.set(GeneratorScope::fingerprint(start));
      Plan p = plan_call(sig, c, stream);
      here = run_here(p, c, stream, start);
      if (p.runs_f(c.arrays[p.lead].layout, me)) {
        payload.outputs.set(fingerprint(here.run.metas));
        encode(here.run.metas, payload);
      }
      return p;
    });
    VmapAgreement agreed;
    {
      ScopedRegion region("kvmap::vmap/agree");
      const AgreementPacket<VmapAgreement>& packet = once.reduce();
      agreed = packet.payload;
      if (same && attempt == 0 && !agreed.state.same() &&
          packet.head.fingerprint_min == packet.head.fingerprint_max) {
        // Every rank made the same call, from different generator states: again, from rank
        // 0's. (A rank whose plan failed signed alike only if f failed, whose result is
        // dropped with the rest.)
        Detail::transport(comm).bcast_bytes(start.data_ptr(),
                                            static_cast<std::size_t>(start.numel()), 0);
        continue;
      }
      once.judge();
    }
    const Layout& lead = c.arrays[plan->lead].layout;
    const bool ran = plan->runs_f(lead, me);
    // Outputs that differ between ranks are seen alike by every rank: all throw.
    if (!agreed.outputs.same()) raise_different_outputs(comm, ran, here.run.metas, c.who());
    // The number of outputs is agreed: out_dims that do not fit it fail alike everywhere.
    check_out_dims_count(c.options.out_dims(), c.options.out_dims_per_output(),
                         agreed_output_count(agreed));
    return once.execute([&] {
      const std::vector<OutputMeta> metas = agreed_outputs(comm, agreed, lead, ran, here.run.metas);
      return assemble(here, metas, lead, ran, me, c.allocate);
    });
  }
}

}  // namespace
}  // namespace Detail

namespace Impl {
using namespace Detail;

template <class M>
std::vector<DistView<M>> vmap_core(const DistView<M>* const* arrays, std::size_t count,
                                   const std::vector<at::Tensor>& tensors,
                                   const VmapOptions& options, Mapping mapping,
                                   const ArgsCall& call) {
  const Comm comm = count == 0 ? Comm::world() : arrays[0]->comm();
  std::vector<ArrayArg> args;
  args.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    const DistView<M>& a = *arrays[k];
    args.push_back({DistViewAccess::block(a), a.dtype(), a.layout(), a.comm().id()});
  }
  std::vector<MemorySpan> tensor_spans;
  tensor_spans.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    if (t.defined()) tensor_spans.push_back(span_of(t));
  }
  const VmapCall c{args,    tensor_spans, comm, device_of<M>(),
                   options, mapping,      call, &allocate_block<M>};
  CoreResult result = run_core(c);
  std::vector<DistView<M>> outputs;
  outputs.reserve(result.size());
  for (CoreOutput& out : result) {
    outputs.push_back(
        DistViewAccess::make<M>(std::move(out.layout), out.dtype, comm, std::move(out.block)));
  }
  return outputs;
}

// NOLINTBEGIN(bugprone-macro-parentheses): Space is a type
#define KVMAP_INSTANTIATE_VMAP_CORE(Space)                                        \
  template KVMAP_EXPORT std::vector<DistView<Space>> vmap_core<Space>(            \
      const DistView<Space>* const*, std::size_t, const std::vector<at::Tensor>&, \
      const VmapOptions&, Mapping, const ArgsCall&);
// NOLINTEND(bugprone-macro-parentheses)
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_VMAP_CORE)

}  // namespace Impl
}  // namespace kvmap
