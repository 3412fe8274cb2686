// The vmap scheduler's orchestration: plan (validation, the signature), run f on this rank's
// chunks (chunk_schedule.hpp), agree once (status, signature, outputs), assemble the output
// DistViews. The options are vmap_options.cpp's; one chunk is chunk_runner.cpp's; chunk sizes
// are chunk_sizing.cpp's.
#include "kvmap/vmap.hpp"

#include <ATen/ATen.h>

#include <Kokkos_Core.hpp>

#include <optional>
#include <tuple>

#include "agreement.hpp"
#include "allocation.hpp"
#include "chunk_runner.hpp"
#include "chunk_schedule.hpp"
#include "dist_view_access.hpp"
#include "kvmap/error.hpp"
#include "kvmap/random.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "out_dims.hpp"
#include "outputs.hpp"
#include "philox.hpp"
#include "stats_counters.hpp"
#include "tensor_blocks.hpp"
#include "torch_stream.hpp"
#include "vmap_agreement.hpp"
#include "vmap_call.hpp"
#include "vmap_randomness.hpp"

namespace kvmap {
namespace Detail {
namespace {

// ---- 1. validation (deterministic on what the agreement compares) --------------------
// The first mapped array's index (the lead, whose layout the outputs follow) and the batch.
// An empty batch (0 samples on every rank) is valid: f then runs agreement on a batch of 0, on
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

Plan plan_call(Signature& sig, const VmapCall& call, const StreamState& stream) {
  ScopedRegion region("kvmap::vmap/validate");
  const VmapOptions& options = call.options;
  // In map_batches f is an ordinary batched call: torch's random functions draw from torch's
  // generator as anywhere else, and nothing (no functorch) could intercept them.
  KVMAP_CHECK(call.per_sample() || options.randomness() == Randomness::Error, ValueError,
              "kvmap::map_batches: randomness=" << name(options.randomness())
                                                << " applies to kvmap::vmap only; inside "
                                                   "map_batches use kvmap::sample_uniform/"
                                                   "sample_normal for per-sample random values");
  KVMAP_CHECK(!options.pad_to_chunk() || !call.per_sample(), ValueError,
              "kvmap::vmap: pad_to_chunk applies to kvmap::map_batches only (under vmap f sees "
              "one sample whatever the chunk)");
  KVMAP_CHECK(!options.pad_to_chunk() || options.chunk_size() || options.auto_chunk_size(),
              ValueError,
              call.who() << ": pad_to_chunk needs a chunk size (chunk_size(n) or "
                            "chunk_size(kvmap::auto_chunk)) to pad to");
  describe_options(sig, options, stream);
  if (options.randomness() == Randomness::Same) {
    sig.arg("generator_state_bytes", GeneratorScope::state_bytes(call.device));
  }
  Plan p;
  for (const ArrayArg& a : call.arrays) {
    sig.arg("array", a.layout).arg("dtype", a.dtype);
    sig.arg("array_comm", a.comm_id);
  }
  std::tie(p.lead, p.batch) = validate_arrays(call.arrays, call.who());
  // A DistView's shard has its layout's shape; one adopted by a front-end without an
  // agreement of its own (a Heat DNDarray in Python) is checked here, so that a shard of
  // another shape is an error on every rank. (All arrays live on the call's communicator.)
  const int rank = call.comm.rank();
  for (std::size_t k = 0; k < call.arrays.size(); ++k) {
    const ArrayArg& a = call.arrays[k];
    KVMAP_CHECK(shard_fits(a.block.extents, a.layout, rank), ValueError,
                call.who() << ": argument " << k << "'s shard on rank " << rank << " has shape "
                           << to_string(a.block.extents) << ", but its layout " << a.layout
                           << " gives it " << to_string(a.layout.lshape(rank)));
  }
  return p;
}

// What this rank's run of f leaves for assembly: the results and their outputs as blocks.
struct RankOutputs {
  ChunkResults run;
  std::vector<LocalBlock> blocks;
};

// Runs f on this rank's samples (none on a rank without any): torch on the device and stream
// of the Kokkos instance throughout. Makes no MPI call. `start` is the generator state Same
// mode starts every chunk from.
RankOutputs run_here(const Plan& plan, const VmapCall& call, const StreamState& stream,
                     const at::Tensor& start) {
  RankOutputs out;
  const Layout& lead = call.arrays[plan.lead].layout;
  const int me = call.comm.rank();
  const std::int64_t n_local = lead.count(me);
  if (kokkos_fence_needed(call.device)) Kokkos::fence();  // Kokkos' writes before torch reads them
  TorchStreamScope torch_on_kokkos(call.device);
  GeneratorScope generator(call.options.randomness(), call.comm, call.device, start);
  if (plan.runs_f(lead, me)) {
    std::vector<at::Tensor> locals;
    locals.reserve(call.arrays.size());
    for (const ArrayArg& a : call.arrays)
      locals.push_back(tensor_from_block(a.block, a.dtype, call.device));
    const ChunkRunner runner(call, locals, generator, lead.offset(me), stream.key());
    out.run = run_chunks(call, n_local, runner);
    count_chunks(static_cast<std::uint64_t>(out.run.chunks));
    KVMAP_CHECK(out.run.metas.size() < 0xffff, ValueError,
                call.who() << ": the function returned " << out.run.metas.size()
                           << " outputs; at most 65534 are supported");
    // Everything assembly needs from the outputs, checked before the result agreement.
    out.blocks.reserve(out.run.outputs.size());
    for (const at::Tensor& t : out.run.outputs) out.blocks.push_back(block_from_tensor(t));
  }
  torch_on_kokkos.finish();
  return out;
}

// ONE collective per call, in every randomness mode: each rank validates, runs f on its
// samples (f makes no MPI call) and then agrees once: its plan/f status, the fingerprint of
// its signature, the fingerprint of its outputs' metadata (and in Same mode of the generator
// state it started from) travel together in a fixed-size reduction. On one rank nothing
// communicates. Same mode starts every rank from its own generator state: when the states
// turn out to differ (ranks seeded differently), rank 0's state is broadcast and f runs again
// from it (its first results are dropped).
std::vector<OutputArray> run_core(const VmapCall& call) {
  ScopedRegion whole("kvmap::vmap");
  count_vmap_call();
  const Comm& comm = call.comm;
  const int me = comm.rank();
  // Every rank takes the next stream, whatever happens next.
  const StreamState stream = next_stream(comm);
  const bool same = call.options.randomness() == Randomness::Same;
  at::Tensor start = same ? GeneratorScope::current_state(call.device) : at::Tensor();
  for (int attempt = 0;; ++attempt) {
    Collective<VmapAgreement> agreement(call.per_sample() ? "vmap" : "map_batches", comm);
    RankOutputs here;
    std::optional<Plan> plan = agreement.plan([&](Signature& sig, VmapAgreement& payload) {
      if (same) payload.state.set(GeneratorScope::fingerprint(start));
      Plan p = plan_call(sig, call, stream);
      here = run_here(p, call, stream, start);
      if (p.runs_f(call.arrays[p.lead].layout, me)) {
        payload.outputs.set(fingerprint(here.run.metas));
        encode(here.run.metas, payload);
      }
      return p;
    });
    VmapAgreement agreed;
    {
      ScopedRegion region("kvmap::vmap/agree");
      const AgreementPacket<VmapAgreement>& packet = agreement.reduce();
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
      agreement.judge();
    }
    const Layout& lead = call.arrays[plan->lead].layout;
    const bool ran = plan->runs_f(lead, me);
    // Outputs that differ between ranks are seen alike by every rank: all throw.
    if (!agreed.outputs.same()) raise_different_outputs(comm, ran, here.run.metas, call.who());
    // The number of outputs is agreed: out_dims that do not fit it fail alike everywhere.
    check_out_dims_count(call.options.out_dims(), call.options.out_dims_per_output(),
                         agreed_output_count(agreed));
    return agreement.execute([&] {
      const std::vector<OutputMeta> metas = agreed_outputs(comm, agreed, lead, ran, here.run.metas);
      return assemble(here.blocks, metas, lead, ran, me, call.allocate, "kvmap::vmap/assemble");
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
  const std::vector<ArrayArg> args = array_args(arrays, count);
  const std::vector<MemorySpan> spans = tensor_spans(tensors);
  const VmapCall vmap_call{args,    spans,   comm, device_of<M>(),
                           options, mapping, call, &allocate_block<M>};
  std::vector<OutputArray> result = run_core(vmap_call);
  return to_dist_views<M>(result, comm);
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
