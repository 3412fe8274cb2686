#pragma once
// vmap's agreement on the wire: what each rank's outputs look like (OutputMeta, fixed by its
// first chunk), the fixed-size payload every vmap and map_batches call reduces once
// (VmapAgreement: the outputs' fingerprint, Same mode's generator state, and the outputs'
// metadata packed for ranks without samples), and the failure path when ranks' outputs
// differ. Private to the vmap scheduler (vmap.cpp).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/layout.hpp"
#include "agreement.hpp"
#include "local_block.hpp"

namespace kvmap::Detail {

struct OutputMeta {
  std::int32_t ndim;  // per sample
  std::int32_t dtype;
  std::int32_t out_dim;  // normalized
  std::int32_t pad;
  std::int64_t shape[kMaxRank];  // per sample
};

// "per-sample shape [3, 4] and dtype float32"
std::string describe(const OutputMeta& m);
std::uint64_t fingerprint(const std::vector<OutputMeta>& metas);

// What one vmap call agrees on, besides status and signature: 96 bytes, whatever the number
// of ranks or outputs (the whole agreement packet is 120 bytes).
//   outputs  fingerprint of every output's metadata, over the ranks that ran f;
//   state    Same mode: fingerprint of the generator state each rank starts from;
//   words    the metadata itself for ranks without samples, reduced by maximum (0 from the
//            ranks that did not run f, so the ranks that did give it): word 0 holds
//            nout + 1, an overflow bit and up to 3 outputs' (dtype, ndim, out_dim) in 12 bits
//            each, words 1..7 their per-sample extents. Metadata that does not fit is
//            broadcast by the first rank with samples, only when some rank holds none.
struct VmapAgreement {
  static constexpr int kWords = 8, kInlineOutputs = 3;
  MinMax64 outputs;
  MinMax64 state;
  HeldWords<kWords> held;
  static void combine(const VmapAgreement& in, VmapAgreement& inout) {
    inout.outputs.combine(in.outputs);
    inout.state.combine(in.state);
    HeldWords<kWords>::combine(in.held, inout.held);
  }
};

// Packs the outputs' metadata into the agreement's held words (an overflow bit where it does
// not fit), and reads it back (nullopt when it did not fit).
void encode(const std::vector<OutputMeta>& metas, VmapAgreement& a);
std::optional<std::vector<OutputMeta>> decode(const VmapAgreement& a);
// The number of outputs of the ranks that ran f, from the reduced words (also when their
// metadata did not fit).
std::size_t agreed_output_count(const VmapAgreement& a);

// The outputs of the ranks that ran f differ: every rank learns which ranks and what they
// returned (the failure path: per-rank fingerprints, then two ranks' metadata), and throws
// the same ValueError.
[[noreturn]] void raise_different_outputs(const Comm& comm, bool ran,
                                          const std::vector<OutputMeta>& mine, const char* who);

// The outputs' metadata on every rank, after an agreement in which every rank succeeded: a
// rank that ran f has its own (checked equal to every other's by the fingerprints); the
// others decode it from the agreement, or receive it from the first rank with samples when it
// did not fit there. With an empty batch every rank ran f.
std::vector<OutputMeta> agreed_outputs(const Comm& comm, const VmapAgreement& agreed,
                                       const Layout& lead, bool ran,
                                       const std::vector<OutputMeta>& mine);

}  // namespace kvmap::Detail
