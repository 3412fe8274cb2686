#pragma once
// The bytes a kvmap::Comm moves: every MPI communication call of the library goes through the
// Transport of a Comm (Detail::transport(comm)), which counts it in kvmap::stats(). The transport
// is chosen once, when the Comm's duplicate is made: MPI, or the emulated transport of
// emulated_comm (testing/hooks.hpp), on which every other rank is taken to do what this one
// does and no MPI call is made. Every rank must call the collectives in the same order; on a
// one-rank communicator the agreements' collectives (allgather, bcast, allreduce_bytes) make
// no MPI call. Private to kvmap (layer 2 of ARCHITECTURE.md).
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "detail.hpp"
#include "ghost_plan.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/dtype.hpp"

namespace kvmap::Detail {

// Largest element count kvmap passes to one MPI call (INT_MAX unless lowered by a test,
// testing/hooks.hpp).
std::size_t mpi_count_limit();

// An MPI datatype kvmap built; freed with its last copy (unless MPI is finalized by then).
class MpiDatatype {
 public:
  MpiDatatype() = default;
  MPI_Datatype raw() const { return type_ ? *type_ : MPI_DATATYPE_NULL; }
  explicit operator bool() const { return type_ != nullptr; }

 private:
  friend MpiDatatype box_type(const std::vector<std::int64_t>&, const std::vector<std::int64_t>&,
                              std::size_t, std::size_t);
  std::shared_ptr<MPI_Datatype> type_;
};
// A box of a strided block for MPI to pack: `extents` elements of `itemsize` bytes, byte
// strides `byte_strides`, starting `offset` bytes after the block's base. Committed once;
// ValueError where an extent or the contiguous run exceeds MPI's count limit.
MpiDatatype box_type(const std::vector<std::int64_t>& extents,
                     const std::vector<std::int64_t>& byte_strides, std::size_t itemsize,
                     std::size_t offset);

// The point-to-point messages of a planned exchange with the peers that hold data: each is
// contiguous bytes at an offset of the send (receive) base, or one box datatype placed relative
// to it. Contiguous messages above MPI's count limit are cut into pieces when they are added
// (the same pieces on both sides). Built in a plan, run any number of times (Transport::run);
// running allocates nothing.
class Messages {
 public:
  void send(int peer, std::size_t offset, std::size_t bytes);
  void send(int peer, MpiDatatype type);
  void recv(int peer, std::size_t offset, std::size_t bytes);
  void recv(int peer, MpiDatatype type);
  std::size_t size() const { return messages_.size(); }

 private:
  friend class MpiTransport;
  struct Message {
    int peer;
    bool is_recv;
    int count;  // bytes, or 1 with a datatype
    std::size_t offset;
    std::size_t bytes;
    MpiDatatype type;
  };
  void add(bool is_recv, int peer, std::size_t offset, std::size_t bytes);
  std::vector<Message> messages_;
  std::vector<MPI_Request> requests_;
};

// One side of an all-to-all where MPI packs (MPI_Alltoallw): per peer a box datatype placed
// relative to the buffer (count 1), or nothing (count 0). For a change of split axis, where
// every pair of ranks exchanges; built once with a plan.
class PeerTypes {
 public:
  explicit PeerTypes(int nranks = 0);
  void set(int peer, MpiDatatype type);
  std::size_t bytes() const { return bytes_; }

 private:
  friend class MpiTransport;
  std::vector<int> counts_, displs_;
  std::vector<MPI_Datatype> types_;
  std::vector<MpiDatatype> owned_;
  std::size_t bytes_ = 0;
};

enum class Reduction { Sum, Max };

struct NodeRank {
  int rank = 0;  // this rank's place among the communicator's ranks that share its node
  int size = 1;  // how many of the communicator's ranks share its node
};

class Transport {
 public:
  Transport(int rank, int size) : rank_(rank), size_(size) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The MPI communicator (Error on an emulated or a freed one).
  virtual MPI_Comm raw() const = 0;
  // Frees the MPI communicator (collective; before MPI_Finalize); later calls throw.
  virtual void release() = 0;

  virtual void barrier() const = 0;
  // Each rank's `nbytes` bytes, in rank order, into `all` (size() * nbytes bytes).
  virtual void allgather_bytes(const void* mine, std::size_t nbytes, void* all) const = 0;
  virtual void bcast_bytes(void* data, std::size_t nbytes, int root) const = 0;
  // Root's string on every rank (its length, then its bytes).
  virtual std::string bcast_string(const std::string& mine, int root) const = 0;
  // In-place reduction of one `nbytes`-byte record with a commutative and associative MPI
  // user function (kvmap's agreements). The MPI operation and the record's datatype are made
  // once per function and size and kept until MPI is finalized.
  virtual void allreduce_bytes(void* record, std::size_t nbytes,
                               MPI_User_function* combine) const = 0;
  // In-place sum or maximum over ranks of n values of the given dtype.
  virtual void allreduce(void* data, std::size_t n, DType dtype, Reduction op) const = 0;
  // Byte-wise all-gather of variable-size blocks, counts and displacements (in bytes) known on
  // every rank and within MPI's count limit (Messages take larger ones).
  virtual void allgatherv_bytes(const void* send, int send_count, void* recv,
                                const std::vector<int>& counts,
                                const std::vector<int>& displs) const = 0;
  // Posts every receive, then every send, and waits for all.
  virtual void run(Messages& messages, const void* send_base, void* recv_base) const = 0;
  virtual void alltoallw(const void* send, const PeerTypes& send_types, void* recv,
                         const PeerTypes& recv_types) const = 0;
  // One round of a plan whose receivers do not know their senders (ghost_plan.hpp): each
  // message goes to its peer, and every message sent to this rank comes back (in no fixed
  // order; its own to itself without MPI). MPI: synchronous sends, probes and one
  // non-blocking barrier (the NBX protocol: Hoefler, Siebert and Lumsdaine, PPoPP 2010), so
  // the cost is the messages plus one barrier, with no count exchanged among all ranks.
  // Emulated: only its own messages to itself arrive. `round` (0-7) tells a plan's
  // consecutive rounds apart: a rank may start the next round while another still receives.
  virtual std::vector<IdMessage> sparse_exchange(std::vector<IdMessage> sends, int round) const = 0;
  // This rank among the ranks on its node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), the
  // split freed again; emulated: every rank on a node of its own).
  virtual NodeRank node_rank() const = 0;

  // Each rank contributes one trivially copyable value; returns all of them in rank order.
  template <class T>
  std::vector<T> allgather(const T& value) const {
    static_assert(std::is_trivially_copyable_v<T>, "allgather needs a trivially copyable T");
    std::vector<T> out(static_cast<std::size_t>(size_));
    allgather_bytes(&value, sizeof(T), out.data());
    return out;
  }
  void allreduce_sum(void* data, std::size_t n, DType dtype) const {
    allreduce(data, n, dtype, Reduction::Sum);
  }
  void allreduce_max(void* data, std::size_t n, DType dtype) const {
    allreduce(data, n, dtype, Reduction::Max);
  }
  template <class T>
  T allreduce_sum(T value) const {
    allreduce(&value, 1, dtype_of<T>(), Reduction::Sum);
    return value;
  }
  template <class T>
  T allreduce_max(T value) const {
    allreduce(&value, 1, dtype_of<T>(), Reduction::Max);
    return value;
  }

 private:
  int rank_;
  int size_;
};

// A Comm's transport.
const Transport& transport(const Comm& comm);
// The transport of a new duplicate of `user` (MPI_Comm_dup, counted like every collective of
// a transport; comm.cpp's registry makes them). The emulated transport is the testing
// target's (testing/emulated_transport.cpp).
std::unique_ptr<Transport> duplicate_transport(MPI_Comm user);
// The transport's cached MPI operations and datatypes, freed by release_cached_comms.
void release_reduction_cache();

}  // namespace kvmap::Detail
