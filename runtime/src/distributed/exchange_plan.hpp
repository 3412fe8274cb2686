#pragma once
// The plan of a redistribution: which boxes this rank sends to and receives from which
// ranks, and how each side travels. Made from the layouts alone (no data, no memory space),
// once per layouts, strides, element size and settings, and cached.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/layout.hpp"

#include "box.hpp"
#include "mpi_transport.hpp"

namespace kvmap::Detail {

//   Local         every rank already holds its part (replicated source, unchanged layout):
//                 a local copy into the new array's own memory.
//   Allgather     a replicated target: every rank's block to every rank (MPI_Allgatherv, or
//                 point-to-point messages above MPI's count limit).
//   PointToPoint  everything else: a kernel copies the local part, and this rank exchanges
//                 messages only with the ranks whose rows meet its own (found by bisection
//                 over the layouts' offsets, O(log P)); with every rank when the split axis
//                 changes, since then every pair does exchange.
// A side of the exchange (what this rank sends, what it receives) travels in place (each
// piece a contiguous run of the block, or an MPI datatype MPI packs from it: host memory) or
// packed by kernels into a contiguous scratch buffer (device memory with strided pieces, and
// staged sides, whose scratch buffers are copied to and from host memory around MPI).
enum class ExchangeKind { Local, Allgather, PointToPoint };

struct Piece {
  int peer;
  Box box;
  std::size_t packed_offset;  // in the side's scratch buffer, when the side is packed
};

struct Side {
  std::vector<Piece> pieces;
  bool packed = false;
  std::size_t packed_bytes = 0;  // scratch size when packed
  std::size_t mpi_packs = 0;     // bytes MPI packs itself (datatypes): counted as copies
};

struct ExchangePlan {
  ExchangeKind kind = ExchangeKind::Local;
  std::size_t itemsize = 0;
  bool staged = false;
  Box my_src, my_dst, local;
  Side send, recv;
  // Allgather: every rank's block, packed in rank order or in place (split 0).
  std::vector<Box> blocks;
  std::vector<int> counts, displs;  // bytes, when within the count limit
  bool allgatherv = false;
  Messages messages;  // point-to-point; offsets relative to the sides' bases
  // A change of split axis on host memory: every pair exchanges, MPI packs every piece (the
  // local part included) in one MPI_Alltoallw, measured faster here than messages per peer
  // plus a local copy kernel.
  std::optional<PeerTypes> send_types, recv_types;
};

// What identifies a plan: the same layouts, source strides, element size and settings.
struct PlanKey {
  std::uint64_t comm_id;
  Layout source, target;
  std::vector<std::int64_t> source_strides;
  std::size_t itemsize;
  bool staged;
  std::size_t count_limit;
  bool matches(const PlanKey& o) const {
    return comm_id == o.comm_id && itemsize == o.itemsize && staged == o.staged &&
           count_limit == o.count_limit && source.fingerprint() == o.source.fingerprint() &&
           target.fingerprint() == o.target.fingerprint() && source_strides == o.source_strides &&
           source == o.source && target == o.target;
  }
};

// The plan for `key` on rank `me` of P: from the cache, or built (counted in
// stats().plans_built) and cached. Plans hold MPI datatypes: the cache is emptied when
// kvmap releases its communicators.
std::shared_ptr<ExchangePlan> find_or_build_plan(PlanKey key, int me, int P, bool host_accessible);

}  // namespace kvmap::Detail
