#pragma once
/// \file
/// Ghost items of a particle or graph decomposition: each rank owns some items (atoms, nodes)
/// and holds copies ("ghosts") of items other ranks own, or of its own (periodic images).
/// kvmap::GhostExchange fills the ghost rows of a feature tensor from their owners and sums
/// gradients of ghost rows back into their owners (its exact transpose), between the layers
/// of a message-passing model. Rows are [owned items..., ghost items...] along dimension 0.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kvmap/comm.hpp"
#include "kvmap/config.hpp"

namespace kvmap::Detail {
struct GhostPlan;  ///< kvmap's own (not installed, not exported)
}  // namespace kvmap::Detail

KVMAP_API_BEGIN
namespace kvmap {

/// The plan of a ghost exchange, built collectively over a communicator from each rank's
/// owned item ids and ghost item ids (int64, any order; every id owned by exactly one rank; a
/// ghost id may repeat and may be one of the rank's own ids). The owners are found through a
/// directory spread over the ranks by a hash of the ids: three rounds of messages to the ranks
/// concerned plus one fixed-size agreement, nothing of size P or of the global item count.
/// Build it again when the ghost list changes (e.g. at a neighbour-list rebuild); copies share
/// one plan.
///
/// forward() and reverse() are collective over the plan's communicator: every rank calls them
/// in the same order, with the same dtype and trailing shape. Any kvmap dtype, any trailing
/// shape, host or device tensors (device memory goes to MPI directly where MPI reads it, else
/// through host copies). Errors (a bad id list, an id owned twice, a ghost id nobody owns, a
/// tensor of the wrong row count) are raised on every rank. forward() and reverse() return
/// tensors without autograd history; for gradients call the torch operator
/// `kvmap::ghost_exchange(x, handle())` (its backward is reverse).
class GhostExchange {
 public:
  /// Collective over comm.
  GhostExchange(const std::vector<std::int64_t>& owned_ids,
                const std::vector<std::int64_t>& ghost_ids, const Comm& comm = Comm::world());
  /// The ids as 1-D int64 tensors (any device).
  GhostExchange(const at::Tensor& owned_ids, const at::Tensor& ghost_ids,
                const Comm& comm = Comm::world());

  /// x: [owned() + ghosts(), ...]. A new contiguous tensor: the owned rows x's, each ghost
  /// row its owner's row of x.
  at::Tensor forward(const at::Tensor& x) const;
  /// forward in place, as an app's own halo update does: x's ghost rows (x contiguous) are
  /// overwritten with their owners' rows; the owned rows are not copied. Returns x.
  at::Tensor& forward_(at::Tensor& x) const;
  /// The transpose of forward: g: [owned() + ghosts(), ...]. A new contiguous tensor: each
  /// owned row g's plus the sum of the ghost rows of its id on every rank, the ghost rows
  /// zero. Not for bool.
  at::Tensor reverse(const at::Tensor& g) const;

  /// Owned items on this rank.
  std::int64_t owned() const;
  /// Ghost rows on this rank.
  std::int64_t ghosts() const;
  /// Rows this rank sends to other ranks per forward (receives per reverse).
  std::int64_t rows_sent() const;
  /// Rows this rank receives from other ranks per forward (sends per reverse).
  std::int64_t rows_received() const;
  /// Ranks this rank exchanges with (senders and receivers).
  int peers() const;
  /// The communicator it exchanges over.
  const Comm& comm() const;
  /// What the plan's calls have cost on this rank since it was built (see usage()).
  struct Usage {
    std::int64_t forward_calls = 0;  ///< forward and forward_ calls (the operator's included)
    std::int64_t reverse_calls = 0;  ///< reverse calls (the operator's included)
    double forward_seconds = 0;      ///< wall seconds in them
    double reverse_seconds = 0;      ///< wall seconds in them
  };
  /// Calls of forward, forward_ and reverse (directly or through the torch operators) and the
  /// wall seconds in them on this rank since the plan was built (the agreement, packing, the
  /// messages and waiting for peers, unpacking). Local.
  Usage usage() const;

  /// A process-wide handle of the plan for torch.ops.kvmap.ghost_exchange(x, handle) (a
  /// model's call between its layers): registered at the first call, valid while a copy of
  /// this GhostExchange lives. Every rank gets the same handle where every rank registers
  /// its plans in the same order.
  std::int64_t handle() const;
  /// The plan of a handle (kvmap::Error if none is alive).
  static GhostExchange from_handle(std::int64_t handle);

 private:
  explicit GhostExchange(std::shared_ptr<Detail::GhostPlan> plan) : plan_(std::move(plan)) {}
  std::shared_ptr<Detail::GhostPlan> plan_;
};

}  // namespace kvmap
KVMAP_API_END
