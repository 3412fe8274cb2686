// The vmap scheduler: validate, agree on options, run the chunks under functorch, agree on
// the results, assemble the output DistViews.
#include "kvmap/vmap.hpp"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>

#include <Kokkos_Core.hpp>

#include <atomic>
#include <mutex>
#include <sstream>

#include "kvmap/error.hpp"
#include "kvmap/impl/out_dims.hpp"
#include "kvmap/impl/torch_compat.hpp"
#include "kvmap/impl/vmap_randomness.hpp"
#include "kvmap/random.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"

#include "collective.hpp"
#include "dist_view_access.hpp"
#include "torch_stream.hpp"

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
  return *this;
}

VmapOptions& VmapOptions::concurrency(int chunks_in_flight) {
  KVMAP_CHECK(chunks_in_flight >= 1, ValueError,
              "kvmap::VmapOptions::concurrency: expected >= 1, got " << chunks_in_flight);
  concurrency_ = chunks_in_flight;
  return *this;
}

namespace Impl {

namespace {

using Allocate = LocalBlock (*)(const std::vector<std::int64_t>&, std::size_t);

// Kokkos Tools region for one phase, so users' tools show where the time goes.
class Region {
 public:
  explicit Region(const char* name) { Kokkos::Profiling::pushRegion(name); }
  ~Region() { Kokkos::Profiling::popRegion(); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
};

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
  LocalBlock block;
  DType dtype;
  const Layout& layout;  // split axis normalized; the DistView's own, alive for the call
  std::uint64_t comm_id;
};

// ---- 1. validation (deterministic on what the agreement compares) --------------------
std::int64_t validate_arrays(const std::vector<ArrayArg>& arrays, const std::vector<int>& mapped) {
  KVMAP_CHECK(!mapped.empty(), ValueError,
              "kvmap::vmap: no mapped input; pass at least one DistView with a split axis "
              "(replicated DistViews and other arguments are passed to the function whole)");
  for (std::size_t k = 1; k < arrays.size(); ++k) {
    KVMAP_CHECK(arrays[k].comm_id == arrays[0].comm_id, ValueError,
                "kvmap::vmap: DistView argument " << k << " lives on another communicator than "
                                                  << "DistView argument 0");
  }
  const Layout& first = arrays[mapped[0]].layout;
  const std::int64_t batch = first.gshape()[*first.split()];
  for (std::size_t j = 1; j < mapped.size(); ++j) {
    const Layout& l = arrays[mapped[j]].layout;
    KVMAP_CHECK(l.gshape()[*l.split()] == batch && l.counts() == first.counts(), ValueError,
                "kvmap::vmap: mapped inputs need the same batch length and the same per-rank "
                "counts along their split axes, but mapped input 0 has "
                    << first << " and mapped input " << j << " has " << l);
  }
  KVMAP_CHECK(batch > 0, ValueError,
              "kvmap::vmap: the mapped inputs have an empty batch ("
                  << first << "); output shapes would be unknown");
  return batch;
}

// Built on every call: plain string appends, no stream.
void describe_options(Signature& sig, const VmapOptions& o, const StreamState& stream) {
  std::string dims = "[";
  for (std::size_t i = 0; i < o.out_dims().size(); ++i) {
    if (i) dims += ", ";
    dims += std::to_string(o.out_dims()[i]);
  }
  dims += "]";
  sig.arg("out_dims", dims).arg("randomness", name(o.randomness()));
  // The per-sample random stream (kvmap::sample_uniform/normal): the same on every rank
  // unless ranks seeded differently (kvmap::manual_seed on part of the communicator).
  sig.arg("stream", stream.describe());
}

// ---- per-output metadata, fixed by chunk 0 and agreed across ranks ----------------------
constexpr int kInlineOutputs = 8;
struct OutputMeta {
  std::int32_t ndim;  // per sample
  std::int32_t dtype;
  std::int32_t out_dim;  // normalized
  std::int32_t pad;
  std::int64_t shape[kMaxRank];  // per sample
};
struct ResultMeta {
  std::int32_t ran;  // 1 when this rank ran f (non-empty local batch)
  std::int32_t nout;
  OutputMeta out[kInlineOutputs];
};

std::string describe(const OutputMeta& m) {
  std::ostringstream os;
  os << "per-sample shape " << to_string(Shape(m.shape, m.shape + m.ndim)) << " and dtype "
     << name(dtype_from_int(m.dtype));
  return os.str();
}

std::string serialize(const std::vector<OutputMeta>& metas) {
  return std::string(reinterpret_cast<const char*>(metas.data()),
                     metas.size() * sizeof(OutputMeta));
}

std::vector<OutputMeta> deserialize(const std::string& s) {
  std::vector<OutputMeta> out(s.size() / sizeof(OutputMeta));
  if (!out.empty()) std::memcpy(out.data(), s.data(), out.size() * sizeof(OutputMeta));
  return out;
}

// ---- 3./4. the local run ------------------------------------------------------------------
struct LocalRun {
  std::vector<OutputMeta> metas;
  std::vector<at::Tensor> outputs;  // physical, local batch along out_dim
  std::int64_t chunks = 0;
};

struct ChunkRunner {
  const std::vector<ArrayArg>& arrays;
  const std::vector<at::Tensor>& locals;  // zero-copy views of every array's local shard
  const VmapOptions& options;
  const ArgsCall& call;
  GeneratorScope& generator;
  DeviceSpec device;
  std::int64_t global_offset;
  std::uint64_t sample_key;

  // Runs f on samples [start, start + len) and returns each output with its batch moved to
  // its normalized out_dim. Chunk 0 fills `metas` (passed empty); later chunks check
  // their outputs against it.
  std::vector<at::Tensor> run_first(std::int64_t len, std::vector<OutputMeta>& metas) const {
    return run_checked(0, len, &metas, metas);
  }
  std::vector<at::Tensor> run_next(std::int64_t start, std::int64_t len,
                                   const std::vector<OutputMeta>& expected) const {
    return run_checked(start, len, nullptr, expected);
  }

 private:
  std::vector<at::Tensor> run_checked(std::int64_t start, std::int64_t len,
                                      std::vector<OutputMeta>* record,
                                      const std::vector<OutputMeta>& metas) const {
    // Mapped arrays: this chunk's samples; replicated ones: the whole shard.
    std::vector<at::Tensor> chunk_inputs;
    chunk_inputs.reserve(arrays.size());
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      const std::optional<int> split = arrays[k].layout.split();
      const bool whole = !split || (start == 0 && len == locals[k].size(*split));
      chunk_inputs.push_back(whole ? locals[k] : locals[k].narrow(*split, start, len));
    }
    auto lock = torch_compat::vmap_region_lock();
    generator.before_chunk();
    torch_compat::VmapLevel level(len, to_compat(options.randomness()));
    std::vector<at::Tensor> batched;
    batched.reserve(arrays.size());
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      const std::optional<int> split = arrays[k].layout.split();
      batched.push_back(split ? level.add_batch_dim(chunk_inputs[k], *split) : chunk_inputs[k]);
    }
    SampleContext context;
    context.level = level.level();
    context.global_offset = global_offset + start;
    context.batch = len;
    context.key = sample_key;
    context.device = device;
    std::vector<at::Tensor> results;
    {
      SampleContextGuard guard(&context);
      results = call(batched);
    }
    const bool first = record != nullptr;
    KVMAP_CHECK(first || results.size() == metas.size(), ValueError,
                "kvmap::vmap: the function returned " << results.size() << " outputs on samples ["
                                                      << start << ", " << start + len << ") but "
                                                      << metas.size() << " on the first chunk");
    std::vector<at::Tensor> physical(results.size());
    for (std::size_t k = 0; k < results.size(); ++k) {
      KVMAP_CHECK(results[k].defined(), ValueError,
                  "kvmap::vmap: output " << k << " of the function is an undefined tensor");
      const std::int64_t ndim = results[k].dim();  // logical: per sample
      OutputMeta m;
      std::memset(&m, 0, sizeof m);
      m.ndim = static_cast<std::int32_t>(ndim);
      m.dtype = static_cast<std::int32_t>(from_torch(results[k].scalar_type()));
      m.out_dim =
          static_cast<std::int32_t>(normalize_out_dim(options.out_dims(), k, results.size(), ndim));
      for (std::int64_t d = 0; d < ndim; ++d) m.shape[d] = results[k].size(d);
      check_same_device(results[k], device, "kvmap::vmap: output " + std::to_string(k));
      if (first) {
        record->push_back(m);
      } else {
        KVMAP_CHECK(std::memcmp(&m, &metas[k], sizeof m) == 0, ValueError,
                    "kvmap::vmap: output " << k << " has " << describe(m) << " on samples ["
                                           << start << ", " << start + len << ") but "
                                           << describe(metas[k]) << " on the first chunk");
      }
      physical[k] = level.remove_batch_dim(results[k], m.out_dim);
    }
    return physical;
  }
};

bool needs_materializing(const at::Tensor& t) {
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0 && t.size(d) > 1) return true;
  }
  return false;
}

LocalRun run_local(const VmapOptions& options, std::int64_t n_local, const ChunkRunner& runner,
                   Allocate allocate, const std::vector<MemorySpan>& input_spans) {
  LocalRun out;
  const std::int64_t cs = std::min(options.chunk_size().value_or(n_local), n_local);
  const std::int64_t nchunks = (n_local + cs - 1) / cs;
  out.chunks = nchunks;

  // Chunk 0 alone fixes the outputs' shapes and dtypes.
  std::vector<at::Tensor> first;
  {
    Region region("kvmap::vmap/chunk");
    first = runner.run_first(cs, out.metas);
  }
  if (nchunks == 1) {
    // Adopted as they are, unless a stride-0 broadcast has to be materialized once, or the
    // output shares memory with an input (f returned it, or a view of it) or with an earlier
    // output ({t, t}): outputs never alias, whatever the chunking.
    std::vector<MemorySpan> taken = input_spans;
    for (at::Tensor& t : first) {
      const MemorySpan span = span_of(t);
      bool shared = false;
      for (const MemorySpan& other : taken) shared = shared || span.overlaps(other);
      if (shared || needs_materializing(t)) {
        t = t.clone(at::MemoryFormat::Contiguous);
        count_bytes_copied(static_cast<std::uint64_t>(t.numel()) * t.element_size());
      }
      taken.push_back(span_of(t));
    }
    out.outputs = std::move(first);
    return out;
  }
  // Preallocated once; every chunk writes its slice.
  for (std::size_t k = 0; k < first.size(); ++k) {
    const OutputMeta& m = out.metas[k];
    Shape shape(m.shape, m.shape + m.ndim);
    shape.insert(shape.begin() + m.out_dim, n_local);
    const DType dt = static_cast<DType>(m.dtype);
    out.outputs.push_back(tensor_from_block(allocate(shape, size_of(dt)), dt, runner.device));
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

  // The error of the lowest failing chunk is rethrown once the policy has completed.
  std::mutex error_mutex;
  std::int64_t failed_chunk = nchunks;
  std::exception_ptr error;
  const std::vector<OutputMeta>& expected = out.metas;
  // After a failure no further chunk starts (only those already in flight finish).
  std::atomic<bool> failed{false};
  auto body = [&](const std::int64_t c) {
    if (failed.load()) return;
    try {
      const std::int64_t start = c * cs, len = std::min(cs, n_local - start);
      write(start, runner.run_next(start, len, expected));
    } catch (...) {
      failed.store(true);
      // A replaced error is released after the lock (its destructor may wait for the GIL).
      std::exception_ptr mine = std::current_exception();
      std::lock_guard<std::mutex> lock(error_mutex);
      if (c < failed_chunk) {
        failed_chunk = c;
        std::swap(error, mine);
      }
    }
  };
  // Chunks in flight at once run on the threads of the host execution space, each under the
  // caller's torch thread-local state (grad mode, inference mode, dispatch keys, functorch
  // layers). They stay on the calling thread, in order, where that is not possible: Same-mode
  // randomness restores one generator state per chunk, LibTorch 1.13's functorch bookkeeping
  // is not thread-safe, a host space with one thread gives no second chunk in flight, and on
  // a GPU every chunk's torch work goes to the one Kokkos stream the calling thread set
  // (torch_stream.hpp; the device runs each chunk's kernels in parallel).
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int in_flight = options.randomness() == Randomness::Same ||
                                !torch_compat::concurrent_vmap_supported() ||
                                runner.device.kind != DeviceKind::CPU
                            ? 1
                            : std::min(options.concurrency(), Host().concurrency());
  if (in_flight <= 1) {
    // Plain loop: the user function may call Kokkos itself (a dispatch or fence inside a
    // Kokkos policy would wait on that policy's own lock).
    for (std::int64_t c = 1; c < nchunks && !failed.load(); ++c) {
      Region region("kvmap::vmap/chunk");
      body(c);
    }
  } else {
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
      Region region("kvmap::vmap/chunk");
      Kokkos::parallel_for(
          "kvmap::vmap/chunks",
          Kokkos::RangePolicy<Host, Kokkos::Schedule<Kokkos::Static>,
                              Kokkos::IndexType<std::int64_t>>(wave, end, Kokkos::ChunkSize(1)),
          body_in_caller_state);
      Host().fence();
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}

// Output metadata of the ranks that ran f, checked identical: every rank sees the same data
// and reaches the same verdict (throws alike).
std::vector<OutputMeta> agreed_outputs(const Comm& comm, const std::vector<ResultMeta>& all,
                                       const std::vector<OutputMeta>& mine) {
  int nout_max = 0;
  for (const ResultMeta& r : all) nout_max = std::max(nout_max, static_cast<int>(r.nout));
  std::vector<std::vector<OutputMeta>> metas(all.size());
  if (nout_max > kInlineOutputs) {
    const std::vector<std::string> s = comm.allgather_strings(serialize(mine));
    for (std::size_t r = 0; r < all.size(); ++r) metas[r] = deserialize(s[r]);
  } else {
    for (std::size_t r = 0; r < all.size(); ++r)
      metas[r].assign(all[r].out, all[r].out + all[r].nout);
  }
  int ref = -1;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ran) continue;
    if (ref < 0) {
      ref = static_cast<int>(r);
      continue;
    }
    const auto& a = metas[ref];
    const auto& b = metas[r];
    bool same = a.size() == b.size();
    for (std::size_t k = 0; same && k < a.size(); ++k)
      same = std::memcmp(&a[k], &b[k], sizeof(OutputMeta)) == 0;
    if (!same) {
      std::ostringstream os;
      os << "kvmap::vmap: the function's outputs differ between ranks: rank " << ref << " returned "
         << a.size() << " output(s)";
      for (const auto& m : a) os << " [" << describe(m) << "]";
      os << ", rank " << r << " returned " << b.size();
      for (const auto& m : b) os << " [" << describe(m) << "]";
      throw ValueError(os.str());
    }
  }
  return metas[ref];
}

Layout output_layout(const OutputMeta& m, std::int64_t batch,
                     const std::vector<std::int64_t>& counts) {
  Shape gshape(m.shape, m.shape + m.ndim);
  gshape.insert(gshape.begin() + m.out_dim, batch);
  return Layout::from_counts(gshape, m.out_dim, counts);
}

struct CoreResult {
  std::vector<LocalBlock> blocks;
  std::vector<DType> dtypes;
  std::vector<Layout> layouts;
};

// The plan: validation, and the signature every rank must share (each argument's layout,
// dtype and communicator, the options, the random stream; in Same mode the generator state
// size, so the state broadcast needs no agreement of its own).
struct Plan {
  std::vector<int> mapped;
  std::int64_t batch = 0;
};

Plan plan_call(Signature& sig, const std::vector<ArrayArg>& arrays, DeviceSpec device,
               const VmapOptions& options, const StreamState& stream) {
  Region region("kvmap::vmap/validate");
  describe_options(sig, options, stream);
  if (options.randomness() == Randomness::Same) {
    sig.arg("generator_state_bytes", GeneratorScope::state_bytes(device));
  }
  Plan p;
  for (std::size_t k = 0; k < arrays.size(); ++k) {
    sig.arg("array", arrays[k].layout).arg("dtype", arrays[k].dtype);
    sig.arg("array_comm", "#" + std::to_string(arrays[k].comm_id));
    if (arrays[k].layout.split()) p.mapped.push_back(static_cast<int>(k));
  }
  p.batch = validate_arrays(arrays, p.mapped);
  return p;
}

// What this rank's run of f leaves for assembly.
struct LocalOutputs {
  LocalRun run;
  std::vector<Layout> layouts;
  std::vector<LocalBlock> blocks;
};

// Runs f on this rank's samples (none on a rank without any): torch on the device and stream
// of the Kokkos instance throughout. Makes no MPI call, except the generator state broadcast
// of Same mode (every rank constructs the GeneratorScope, with or without samples).
LocalOutputs run_here(const Plan& plan, const std::vector<ArrayArg>& arrays,
                      const std::vector<MemorySpan>& tensor_spans, const Comm& comm,
                      DeviceSpec device, const VmapOptions& options, const StreamState& stream,
                      const ArgsCall& call, Allocate allocate) {
  LocalOutputs out;
  const Layout& lead = arrays[plan.mapped[0]].layout;
  const int me = comm.rank();
  const std::int64_t n_local = lead.counts()[me];
  std::optional<TorchStreamScope> torch_on_kokkos;
  std::optional<GeneratorScope> generator;
  auto set_up = [&] {
    if (kokkos_fence_needed(device)) Kokkos::fence();  // Kokkos' writes before torch reads them
    torch_on_kokkos.emplace(device);
    generator.emplace(options.randomness(), comm, device);
  };
  // In Same mode every rank must reach the broadcast: a failure before it ends the job.
  if (options.randomness() == Randomness::Same) {
    run_agreed("vmap", comm, set_up);
  } else {
    set_up();
  }
  if (n_local > 0) {
    std::vector<at::Tensor> locals;
    locals.reserve(arrays.size());
    for (const ArrayArg& a : arrays) locals.push_back(tensor_from_block(a.block, a.dtype, device));
    std::vector<MemorySpan> input_spans = tensor_spans;
    for (const ArrayArg& a : arrays) input_spans.push_back(span_of(a.block, size_of(a.dtype)));
    ChunkRunner runner{arrays,     locals, options,         call,
                       *generator, device, lead.offset(me), stream.key()};
    out.run = run_local(options, n_local, runner, allocate, input_spans);
    count_chunks(static_cast<std::uint64_t>(out.run.chunks));
    // Everything assembly needs from the outputs, checked before the result agreement.
    for (const OutputMeta& m : out.run.metas)
      out.layouts.push_back(output_layout(m, plan.batch, lead.counts()));
    for (const at::Tensor& t : out.run.outputs) out.blocks.push_back(block_from_tensor(t));
  }
  torch_on_kokkos->finish();
  return out;
}

// This rank's status and output metadata, as the result agreement carries them.
ResultMeta summarize(const LocalOutputs& here, bool ran) {
  ResultMeta mine;
  std::memset(&mine, 0, sizeof mine);
  mine.ran = ran ? 1 : 0;
  mine.nout = static_cast<std::int32_t>(here.run.metas.size());
  for (int k = 0; k < std::min<int>(mine.nout, kInlineOutputs); ++k)
    mine.out[k] = here.run.metas[k];
  return mine;
}

// After the agreement; cannot fail (zero-byte blocks on ranks without samples).
CoreResult assemble(LocalOutputs& here, const std::vector<OutputMeta>& agreed, const Plan& plan,
                    const std::vector<ArrayArg>& arrays, int me, Allocate allocate) {
  Region region("kvmap::vmap/assemble");
  const std::vector<std::int64_t>& counts = arrays[plan.mapped[0]].layout.counts();
  const bool ran = counts[me] > 0;
  CoreResult result;
  for (std::size_t k = 0; k < agreed.size(); ++k) {
    const DType dt = static_cast<DType>(agreed[k].dtype);
    Layout layout = ran ? std::move(here.layouts[k]) : output_layout(agreed[k], plan.batch, counts);
    result.blocks.push_back(ran ? std::move(here.blocks[k])
                                : allocate(layout.lshape(me), size_of(dt)));
    result.dtypes.push_back(dt);
    result.layouts.push_back(std::move(layout));
  }
  return result;
}

// Error and Different modes: ONE collective per call. Each rank validates, runs f on its
// samples (f makes no MPI call) and then agrees once: its plan/f status, the hash of its
// signature and its output metadata travel together. On one rank nothing communicates.
// Same mode keeps a collective before f: the arguments are agreed, then rank 0's generator
// state is broadcast, then f runs and the results are agreed.
CoreResult run_core(const std::vector<ArrayArg>& arrays,
                    const std::vector<MemorySpan>& tensor_spans, const Comm& comm,
                    DeviceSpec device, const VmapOptions& options, const ArgsCall& call,
                    Allocate allocate) {
  Region whole("kvmap::vmap");
  count_vmap_call();
  const int me = comm.rank();
  // Every rank takes the next stream, whatever happens next.
  const StreamState stream = next_stream(comm);
  if (options.randomness() != Randomness::Same) {
    Collective<ResultMeta> once("vmap", comm);
    LocalOutputs here;
    std::optional<Plan> plan = once.plan([&](Signature& sig, ResultMeta& payload) {
      Plan p = plan_call(sig, arrays, device, options, stream);
      here = run_here(p, arrays, tensor_spans, comm, device, options, stream, call, allocate);
      payload = summarize(here, arrays[p.mapped[0]].layout.counts()[me] > 0);
      return p;
    });
    std::vector<ResultMeta> all;
    {
      Region region("kvmap::vmap/agree");
      all = once.agree();
    }
    const std::vector<OutputMeta> agreed = agreed_outputs(comm, all, here.run.metas);
    return once.execute([&] { return assemble(here, agreed, *plan, arrays, me, allocate); });
  }

  Collective<> arguments("vmap", comm);
  std::optional<Plan> plan = arguments.plan(
      [&](Signature& sig, NoPayload&) { return plan_call(sig, arrays, device, options, stream); });
  arguments.agree();
  // f's failure (and a failure of the run around it) is agreed below with the results.
  std::exception_ptr error;
  LocalOutputs here;
  arguments.execute([&] {
    try {
      here = run_here(*plan, arrays, tensor_spans, comm, device, options, stream, call, allocate);
    } catch (...) {
      error = std::current_exception();
    }
    return true;
  });
  std::vector<OutputMeta> agreed;
  {
    Region region("kvmap::vmap/agree");
    const bool ran = arrays[plan->mapped[0]].layout.counts()[me] > 0 && !error;
    const std::vector<ResultMeta> all = comm.agree_gather(error, summarize(here, ran));
    agreed = agreed_outputs(comm, all, here.run.metas);
  }
  return run_agreed("vmap", comm,
                    [&] { return assemble(here, agreed, *plan, arrays, me, allocate); });
}

}  // namespace

template <class M>
std::vector<DistView<M>> vmap_core(const std::vector<DistView<M>>& arrays,
                                   const std::vector<at::Tensor>& tensors,
                                   const VmapOptions& options, const ArgsCall& call) {
  const Comm comm = arrays.empty() ? Comm::world() : arrays.front().comm();
  std::vector<ArrayArg> args;
  args.reserve(arrays.size());
  for (const DistView<M>& a : arrays) {
    args.push_back({DistViewAccess::block(a), a.dtype(), a.layout(), a.comm().id()});
  }
  std::vector<MemorySpan> tensor_spans;
  for (const at::Tensor& t : tensors) {
    if (t.defined()) tensor_spans.push_back(span_of(t));
  }
  CoreResult result =
      run_core(args, tensor_spans, comm, device_of<M>(), options, call, &allocate_block<M>);
  std::vector<DistView<M>> outputs;
  outputs.reserve(result.blocks.size());
  for (std::size_t k = 0; k < result.blocks.size(); ++k) {
    outputs.push_back(DistViewAccess::make<M>(std::move(result.layouts[k]), result.dtypes[k], comm,
                                              std::move(result.blocks[k])));
  }
  return outputs;
}

// NOLINTBEGIN(bugprone-macro-parentheses): Space is a type
#define KVMAP_INSTANTIATE_VMAP_CORE(Space)                                                    \
  template std::vector<DistView<Space>> vmap_core<Space>(const std::vector<DistView<Space>>&, \
                                                         const std::vector<at::Tensor>&,      \
                                                         const VmapOptions&, const ArgsCall&);
// NOLINTEND(bugprone-macro-parentheses)
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_VMAP_CORE)

}  // namespace Impl
}  // namespace kvmap
