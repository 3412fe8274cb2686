// The vmap scheduler: validate, agree on options, run the chunks under functorch, agree on
// the results, assemble the output DistViews.
#include "kvmap/vmap.hpp"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>

#include <Kokkos_Core.hpp>

#include <atomic>
#include <mutex>
#include <sstream>

#include "kvmap/error.hpp"
#include "kvmap/impl/out_dims.hpp"
#include "kvmap/impl/fault_injection.hpp"
#include "kvmap/impl/torch_compat.hpp"
#include "kvmap/impl/vmap_randomness.hpp"
#include "kvmap/random.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"

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

// ---- 1. validation (deterministic: every rank sees the same layouts) ------------------
std::int64_t validate_inputs(const std::vector<MappedInput>& inputs) {
  KVMAP_CHECK(!inputs.empty(), ValueError,
              "kvmap::vmap: no mapped input; pass at least one DistView with a split axis "
              "(replicated DistViews and other arguments are passed to the function whole)");
  const Layout& first = *inputs[0].layout;
  const std::int64_t batch = first.gshape()[*first.split()];
  for (std::size_t k = 1; k < inputs.size(); ++k) {
    const Layout& l = *inputs[k].layout;
    KVMAP_CHECK(l.gshape()[*l.split()] == batch && l.counts() == first.counts(), ValueError,
                "kvmap::vmap: mapped inputs need the same batch length and the same per-rank "
                "counts along their split axes, but mapped input 0 has "
                    << first << " and mapped input " << k << " has " << l);
    KVMAP_CHECK(inputs[k].device.kind == inputs[0].device.kind &&
                    inputs[k].device.index == inputs[0].device.index,
                TypeError, "kvmap::vmap: mapped inputs live in different memory spaces");
  }
  KVMAP_CHECK(batch > 0, ValueError,
              "kvmap::vmap: the mapped inputs have an empty batch (" << first
                                                                     << "); output shapes would be unknown");
  return batch;
}

// Built on every call: plain string appends, no stream.
std::string options_signature(const VmapOptions& o, const StreamState& stream) {
  std::string s = "vmap(out_dims=[";
  for (std::size_t i = 0; i < o.out_dims().size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(o.out_dims()[i]);
  }
  s += "], randomness=";
  s += name(o.randomness());
  // The per-sample random stream (kvmap::sample_uniform/normal): the same on every rank
  // unless ranks seeded differently (kvmap::manual_seed on part of the communicator).
  s += ", ";
  s += stream.describe();
  s += ")";
  return s;
}

// ---- per-output metadata, fixed by chunk 0 and agreed across ranks ----------------------
constexpr int kInlineOutputs = 8;
struct OutputMeta {
  std::int32_t ndim;   // per sample
  std::int32_t dtype;
  std::int32_t out_dim;  // normalized
  std::int32_t pad;
  std::int64_t shape[kMaxRank];  // per sample
};
struct ResultMeta {
  std::int32_t ran;   // 1 when this rank ran f (non-empty local batch)
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
  return std::string(reinterpret_cast<const char*>(metas.data()), metas.size() * sizeof(OutputMeta));
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
  const std::vector<MappedInput>& inputs;
  const std::vector<at::Tensor>& locals;  // zero-copy views of the local shards
  const VmapOptions& options;
  const BatchedCall& call;
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
  std::vector<at::Tensor> run_checked(std::int64_t start, std::int64_t len, std::vector<OutputMeta>* record,
                                      const std::vector<OutputMeta>& metas) const {
    // torch's current device is the inputs' device for the whole chunk, on any thread.
    c10::OptionalDeviceGuard device_guard;
    if (device.kind != DeviceKind::CPU) device_guard.reset_device(torch_device(device));
    std::vector<at::Tensor> chunk_inputs;
    chunk_inputs.reserve(inputs.size());
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const int split = *inputs[k].layout->split();
      const bool whole = start == 0 && len == locals[k].size(split);
      chunk_inputs.push_back(whole ? locals[k] : locals[k].narrow(split, start, len));
    }
    auto lock = torch_compat::vmap_region_lock();
    generator.before_chunk();
    torch_compat::VmapLevel level(len, to_compat(options.randomness()));
    std::vector<at::Tensor> batched;
    batched.reserve(inputs.size());
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      batched.push_back(level.add_batch_dim(chunk_inputs[k], *inputs[k].layout->split()));
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
                                                      << start << ", " << start + len
                                                      << ") but " << metas.size()
                                                      << " on the first chunk");
    std::vector<at::Tensor> physical(results.size());
    for (std::size_t k = 0; k < results.size(); ++k) {
      KVMAP_CHECK(results[k].defined(), ValueError,
                  "kvmap::vmap: output " << k << " of the function is an undefined tensor");
      const std::int64_t ndim = results[k].dim();  // logical: per sample
      OutputMeta m;
      std::memset(&m, 0, sizeof m);
      m.ndim = static_cast<std::int32_t>(ndim);
      m.dtype = static_cast<std::int32_t>(from_torch(results[k].scalar_type()));
      m.out_dim = static_cast<std::int32_t>(normalize_out_dim(options.out_dims(), k, results.size(), ndim));
      for (std::int64_t d = 0; d < ndim; ++d) m.shape[d] = results[k].size(d);
      const DeviceSpec dev = device_spec_of(results[k]);
      KVMAP_CHECK(dev.kind == device.kind, TypeError,
                  "kvmap::vmap: output " << k << " is on " << results[k].device()
                                         << " but the inputs' memory space maps to "
                                         << torch_device(device));
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

LocalRun run_local(const VmapOptions& options, std::int64_t n_local, const ChunkRunner& runner, Allocate allocate,
                   const std::vector<MemorySpan>& unmapped_inputs) {
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
    std::vector<MemorySpan> taken = unmapped_inputs;
    for (const MappedInput& in : runner.inputs) taken.push_back(span_of(*in.block, size_of(in.dtype)));
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
      out.outputs[k].narrow(out.metas[k].out_dim, start, chunk[k].size(out.metas[k].out_dim)).copy_(chunk[k]);
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
      std::lock_guard<std::mutex> lock(error_mutex);
      if (c < failed_chunk) {
        failed_chunk = c;
        error = std::current_exception();
      }
    }
  };
  // Chunks in flight at once run on the threads of the host execution space, each under the
  // caller's torch thread-local state (grad mode, inference mode, dispatch keys, functorch
  // layers). They stay on the calling thread, in order, where that is not possible: Same-mode
  // randomness restores one generator state per chunk, LibTorch 1.13's functorch bookkeeping
  // is not thread-safe, and a host space with one thread gives no second chunk in flight.
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int in_flight = options.randomness() == Randomness::Same ||
                                !torch_compat::concurrent_vmap_supported()
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
          Kokkos::RangePolicy<Host, Kokkos::Schedule<Kokkos::Static>, Kokkos::IndexType<std::int64_t>>(wave, end, Kokkos::ChunkSize(1)),
          body_in_caller_state);
      Host().fence();
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace

VmapResult run_vmap(const std::vector<MappedInput>& inputs, const VmapOptions& options,
                    const Comm& comm, DeviceSpec device, const BatchedCall& call,
                    Allocate allocate, const std::vector<MemorySpan>& unmapped_inputs) {
  Region whole("kvmap::vmap");
  count_vmap_call();
  const int me = comm.rank();
  std::int64_t batch = 0;
  const StreamState stream = next_stream(comm);
  {
    // Ranks may pass different arrays: a failed check is agreed like any other, and the
    // signature carries the mapped inputs' layouts, so no rank runs f on arguments the others
    // did not pass.
    Region region("kvmap::vmap/validate");
    std::exception_ptr invalid;
    try {
      batch = validate_inputs(inputs);
    } catch (...) {
      invalid = std::current_exception();
    }
    std::string signature = options_signature(options, stream);
    for (const MappedInput& in : inputs) {
      signature += " ";
      signature += in.layout->str();
    }
    comm.agree_arguments(invalid, "kvmap::vmap", signature);
  }
  const Layout& lead = *inputs[0].layout;
  const std::vector<std::int64_t>& counts = lead.counts();
  const std::int64_t n_local = counts[me];

  std::exception_ptr error;
  LocalRun local;
  {
    GeneratorScope generator(options.randomness(), comm, device);
    const std::uint64_t sample_key = stream.key();
    try {
      fault_point("vmap", me);
      if (n_local > 0) {
        std::vector<at::Tensor> locals;
        for (const MappedInput& in : inputs) locals.push_back(tensor_from_block(*in.block, in.dtype, device));
        ChunkRunner runner{inputs, locals, options, call, generator, device, lead.offset(me), sample_key};
        local = run_local(options, n_local, runner, allocate, unmapped_inputs);
        count_chunks(static_cast<std::uint64_t>(local.chunks));
      }
    } catch (...) {
      error = std::current_exception();
    }
  }

  // ---- 5. agree on the result: status and output metadata, one collective -----------------
  Region agree_region("kvmap::vmap/agree");
  ResultMeta mine;
  std::memset(&mine, 0, sizeof mine);
  mine.ran = (n_local > 0 && !error) ? 1 : 0;
  mine.nout = static_cast<std::int32_t>(local.metas.size());
  for (int k = 0; k < std::min<int>(mine.nout, kInlineOutputs); ++k) mine.out[k] = local.metas[k];
  const std::vector<ResultMeta> all = comm.agree_gather(error, mine);
  int nout_max = 0;
  for (const ResultMeta& r : all) nout_max = std::max(nout_max, static_cast<int>(r.nout));
  std::vector<std::vector<OutputMeta>> metas(all.size());
  if (nout_max > kInlineOutputs) {
    const std::vector<std::string> s = comm.allgather_strings(serialize(local.metas));
    for (std::size_t r = 0; r < all.size(); ++r) metas[r] = deserialize(s[r]);
  } else {
    for (std::size_t r = 0; r < all.size(); ++r) metas[r].assign(all[r].out, all[r].out + all[r].nout);
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
    for (std::size_t k = 0; same && k < a.size(); ++k) same = std::memcmp(&a[k], &b[k], sizeof(OutputMeta)) == 0;
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
  const std::vector<OutputMeta>& agreed = metas[ref];

  // ---- 6. assemble -----------------------------------------------------------------------
  Region assemble_region("kvmap::vmap/assemble");
  VmapResult result;
  for (std::size_t k = 0; k < agreed.size(); ++k) {
    const OutputMeta& m = agreed[k];
    const DType dt = static_cast<DType>(m.dtype);
    Shape gshape(m.shape, m.shape + m.ndim);
    gshape.insert(gshape.begin() + m.out_dim, batch);
    Layout layout = Layout::from_counts(gshape, m.out_dim, counts);
    if (n_local > 0) {
      result.blocks.push_back(block_from_tensor(local.outputs[k]));
    } else {
      result.blocks.push_back(allocate(layout.lshape(me), size_of(dt)));
    }
    result.dtypes.push_back(dt);
    result.layouts.push_back(std::move(layout));
  }
  return result;
}

}  // namespace Impl
}  // namespace kvmap
