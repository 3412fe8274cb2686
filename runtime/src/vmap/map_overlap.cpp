// kvmap::map_overlap's core: plan (checks, the halo exchanges and every buffer) -> one
// agreement -> the halo rows -> f on each rank's extended blocks -> one agreement on f's status
// and outputs (vmap's wire format, vmap_agreement.hpp) -> the output DistViews, trimmed.
#include <ATen/ATen.h>
#include <Kokkos_Core.hpp>

#include <cstring>
#include <optional>
#include <string>

#include "agreement.hpp"
#include "allocation.hpp"
#include "dist_view_access.hpp"
#include "halo_exchange.hpp"
#include "halo_options.hpp"
#include "kvmap/error.hpp"
#include "kvmap/overlap.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "kvmap/vmap.hpp"
#include "outputs.hpp"
#include "run_exchange.hpp"
#include "stats_counters.hpp"
#include "tensor_blocks.hpp"
#include "torch_stream.hpp"
#include "vmap_agreement.hpp"

namespace kvmap {
namespace Detail {
namespace {

constexpr const char* kWho = "kvmap::map_overlap";

// The arrays of a call, checked: at least one, one communicator, every one split, with the
// same rows along its split axis as the first (each along its own split axis).
void check_arrays(const std::vector<ArrayArg>& arrays) {
  KVMAP_CHECK(!arrays.empty(), ValueError,
              kWho << ": no DistView argument; pass the arrays to extend positionally");
  const Layout& first = arrays[0].layout;
  for (std::size_t k = 0; k < arrays.size(); ++k) {
    const Layout& l = arrays[k].layout;
    KVMAP_CHECK(arrays[k].comm_id == arrays[0].comm_id, ValueError,
                kWho << ": DistView argument " << k << " lives on another communicator than "
                     << "DistView argument 0");
    KVMAP_CHECK(l.split().has_value(), ValueError,
                kWho << ": DistView argument " << k << " is replicated (split=None); map_overlap "
                     << "extends arrays split along one axis");
    KVMAP_CHECK(!first.split() || (l.gshape()[*l.split()] == first.gshape()[*first.split()] &&
                                   l.same_rows(first)),
                ValueError,
                kWho << ": the arrays need the same length and the same per-rank counts along "
                        "their split axes, but argument 0 has "
                     << first << " and argument " << k << " has " << l);
  }
}

// What f's outputs are on this rank: the tensors (trimmed), their metadata, their blocks.
struct OverlapOutputs {
  std::vector<at::Tensor> outputs;
  std::vector<OutputMeta> metas;
  std::vector<LocalBlock> blocks;
};

// f on the extended blocks; each output checked (its rows along the split axis: the block's
// with trim, the rank's own without), trimmed, detached and adopted without aliasing.
OverlapOutputs run_f(const std::vector<HaloExchange>& halos, const std::vector<ArrayArg>& arrays,
                     const std::vector<MemorySpan>& tensor_spans, const OverlapOptions& options,
                     const ArgsCall& call, const DeviceSpec& device) {
  OverlapOutputs out;
  std::vector<at::Tensor> inputs;
  inputs.reserve(halos.size());
  for (const HaloExchange& x : halos) inputs.push_back(x.extended);
  std::vector<at::Tensor> results = call(inputs);
  KVMAP_CHECK(results.size() < 0xffff, ValueError,
              kWho << ": the function returned " << results.size()
                   << " outputs; at most 65534 are supported");
  const HaloWindow& w = halos[0].window;
  const int split = halos[0].split;
  const std::int64_t expected = options.trim() ? w.rows() : w.count;
  for (std::size_t k = 0; k < results.size(); ++k) {
    at::Tensor r = results[k];
    KVMAP_CHECK(r.defined(), ValueError,
                kWho << ": output " << k << " of the function is an undefined tensor");
    KVMAP_CHECK(r.dim() > split && r.size(split) == expected, ValueError,
                kWho << ": output " << k << " of the function has shape " << r.sizes()
                     << "; along the split axis " << split << " it must have "
                     << (options.trim() ? "the extended block's " : "the block's own ") << expected
                     << " rows ("
                     << (options.trim() ? "trim=true: kvmap removes the halo rows"
                                        : "trim=false: the function removes them")
                     << ")");
    KVMAP_CHECK(r.dim() - 1 < kMaxRank, ValueError,
                kWho << ": output " << k << " has " << r.dim() << " axes; at most " << kMaxRank
                     << " are supported");
    check_same_device(r, device, std::string(kWho) + ": output " + std::to_string(k));
    if (options.trim()) r = r.narrow(split, w.before, w.count);
    if (r.requires_grad()) r = r.detach();  // a DistView holds data, not autograd history
    OutputMeta m;
    std::memset(&m, 0, sizeof m);
    m.ndim = static_cast<std::int32_t>(r.dim() - 1);
    m.dtype = static_cast<std::int32_t>(from_torch(r.scalar_type()));
    m.out_dim = split;
    for (std::int64_t d = 0, s = 0; d < r.dim(); ++d) {
      if (d != split) m.shape[s++] = r.size(d);
    }
    out.metas.push_back(m);
    out.outputs.push_back(std::move(r));
  }
  adopt_unaliased(out.outputs, tensor_spans, arrays);
  for (const at::Tensor& t : out.outputs) out.blocks.push_back(block_from_tensor(t));
  return out;
}

template <class M>
std::vector<OutputArray> run_overlap(const std::vector<ArrayArg>& arrays,
                                     const std::vector<MemorySpan>& tensor_spans,
                                     const std::vector<at::Tensor>& locals, const Comm& comm,
                                     const OverlapOptions& options, const ArgsCall& call) {
  const HaloDepth depth{options.depth_before(), options.depth_after()};
  const HaloBoundary boundary = halo_boundary(options.boundary());
  const DeviceSpec device = Impl::device_of<M>();
  const int me = comm.rank();

  // 1. Plan and agree: checks, and every halo exchange's buffers and messages.
  Collective<NoPayload> before(kWho, comm);
  std::optional<std::vector<HaloExchange>> halos = before.plan([&](Signature& sig, NoPayload&) {
    describe_halo(sig, options);
    sig.arg("trim", options.trim() ? 1 : 0);
    for (const ArrayArg& a : arrays) {
      sig.arg("array", a.layout).arg("dtype", a.dtype).arg("array_comm", a.comm_id);
    }
    check_arrays(arrays);
    std::vector<HaloExchange> planned;
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      check_halo(arrays[k].layout, depth, boundary, kWho);
      planned.push_back(plan_halo_exchange(locals[k], arrays[k].layout, me, depth, boundary,
                                           options.constant(), staged_through_host<M>()));
    }
    return planned;
  });
  before.agree();

  // 2. The halo rows (after the agreement: kernels and MPI only).
  before.execute([&] {
    if (kokkos_fence_needed(device)) Kokkos::fence();  // Kokkos' writes before torch reads
    TorchStreamScope torch_on_kokkos(device);
    for (HaloExchange& x : *halos) run_halo_exchange(Detail::transport(comm), x);
    torch_on_kokkos.finish();
    return 0;
  });

  // 3. f where the rank holds rows (everywhere for an empty array, for the outputs' shapes),
  // agreed with its outputs' metadata.
  const Layout& lead = arrays[0].layout;
  const bool ran = lead.gshape()[*lead.split()] == 0 || lead.count(me) > 0;
  OverlapOutputs here;
  Collective<VmapAgreement> after(kWho, comm);
  after.plan([&](Signature& sig, VmapAgreement& payload) {
    describe_halo(sig, options);
    if (!ran) return 0;
    TorchStreamScope torch_on_kokkos(device);
    here = run_f(*halos, arrays, tensor_spans, options, call, device);
    torch_on_kokkos.finish();
    payload.outputs.set(fingerprint(here.metas));
    encode(here.metas, payload);
    return 0;
  });
  const VmapAgreement agreed = after.reduce().payload;
  after.judge();
  if (!agreed.outputs.same()) raise_different_outputs(comm, ran, here.metas, kWho);
  return after.execute([&] {
    const std::vector<OutputMeta> metas = agreed_outputs(comm, agreed, lead, ran, here.metas);
    return assemble(here.blocks, metas, lead, ran, me, &allocate_block<M>,
                    "kvmap::map_overlap/assemble");
  });
}

}  // namespace
}  // namespace Detail

namespace Impl {
using namespace Detail;

template <class M>
std::vector<DistView<M>> map_overlap_core(const DistView<M>* const* arrays, std::size_t count,
                                          const std::vector<at::Tensor>& tensors,
                                          const OverlapOptions& options, const ArgsCall& call) {
  ScopedRegion region("kvmap::map_overlap");
  const Comm comm = count == 0 ? Comm::world() : arrays[0]->comm();
  const std::vector<ArrayArg> args = array_args(arrays, count);
  std::vector<at::Tensor> locals;
  locals.reserve(count);
  for (std::size_t k = 0; k < count; ++k) locals.push_back(arrays[k]->local());
  std::vector<OutputArray> result =
      run_overlap<M>(args, tensor_spans(tensors), locals, comm, options, call);
  return to_dist_views<M>(result, comm);
}

// NOLINTBEGIN(bugprone-macro-parentheses): Space is a type
#define KVMAP_INSTANTIATE_MAP_OVERLAP_CORE(Space)                                 \
  template KVMAP_EXPORT std::vector<DistView<Space>> map_overlap_core<Space>(     \
      const DistView<Space>* const*, std::size_t, const std::vector<at::Tensor>&, \
      const OverlapOptions&, const ArgsCall&);
// NOLINTEND(bugprone-macro-parentheses)
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_MAP_OVERLAP_CORE)

}  // namespace Impl
}  // namespace kvmap
