#pragma once
// The MPI communicator kvmap works on: an RAII duplicate of the user's communicator,
// the typed collectives the runtime needs, large-count safety and error agreement.
// This module is the only place in kvmap that calls MPI.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kvmap/dtype.hpp"
#include "kvmap/error.hpp"

namespace kvmap {

namespace Impl {
struct CommAccess;  // kvmap's own constructor of emulated communicators (detail/testing.hpp)
}  // namespace Impl

class Comm {
 public:
  struct Handle;  // opaque: kvmap's duplicate of one user communicator

  // kvmap's duplicate of MPI_COMM_WORLD.
  Comm();
  // kvmap's duplicate of `comm`: made (collective over `comm`) the first time, the same one
  // after that, so every Comm of one user communicator shares its state (the stream counter
  // of kvmap::random). `comm` may be freed right after. Duplicates are freed together before
  // MPI_Finalize (kvmap::ScopeGuard, Python's exit), never when a Comm is destroyed.
  explicit Comm(MPI_Comm comm);

  static Comm world();
  static Comm self();
  // Duplicates the communicator with this Fortran handle (what mpi4py's Comm.py2f() gives).
  static Comm from_fortran(std::int64_t handle);

  // The same on every rank of this communicator, different for every other communicator
  // kvmap has made in this process (part of every collective's agreed signature).
  std::uint64_t id() const;
  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm raw() const;
  void barrier() const;

  // The next number of a sequence kept per communicator (shared by every copy of this
  // Comm): 1, 2, 3, ... and back to 1 whenever `epoch` differs from the previous call's.
  // Collective calls that advance it in the same order on every rank see the same numbers
  // on every rank, whatever other communicators each rank used in between.
  std::uint64_t next_sequence(std::uint64_t epoch) const;

  // ---- transport (every rank must call the collectives in the same order) -------------
  // kvmap's agreement protocol and redistribution plans (runtime/src/collective.hpp,
  // redistribute.cpp) are built on these; on a one-rank communicator no collective here makes
  // an MPI call.

  // Each rank contributes one trivially copyable value; returns all of them in rank order.
  template <class T>
  std::vector<T> allgather(const T& value) const {
    static_assert(std::is_trivially_copyable_v<T>, "Comm::allgather needs a trivially copyable T");
    std::vector<T> out(static_cast<std::size_t>(size_));
    allgather_bytes(&value, sizeof(T), out.data());
    return out;
  }
  void allgather_bytes(const void* mine, std::size_t nbytes, void* all) const;
  void bcast_bytes(void* data, std::size_t nbytes, int root) const;
  // Root's string on every rank (its length, then its bytes).
  std::string bcast_string(const std::string& mine, int root) const;
  // In-place reduction of one `nbytes`-byte record with a commutative and associative MPI
  // user function (kvmap's agreements). The MPI operation and the record's datatype are made
  // once per function and size and kept until MPI is finalized.
  void allreduce_bytes(void* record, std::size_t nbytes, MPI_User_function* combine) const;
  // In-place sum/max over ranks of n values of the given dtype.
  void allreduce_sum(void* data, std::size_t n, DType dtype) const;
  void allreduce_max(void* data, std::size_t n, DType dtype) const;
  template <class T>
  T allreduce_sum(T value) const {
    allreduce_sum(&value, 1, dtype_of<T>());
    return value;
  }
  template <class T>
  T allreduce_max(T value) const {
    allreduce_max(&value, 1, dtype_of<T>());
    return value;
  }
  // Byte-wise all-gather of variable-size blocks, counts and displacements (in bytes) known on
  // every rank and within MPI's count limit (Exchange takes larger ones).
  void allgatherv_bytes(const void* send, int send_count, void* recv,
                        const std::vector<int>& counts, const std::vector<int>& displs) const;

  // An MPI datatype kvmap built; freed with its last copy (unless MPI is finalized by then).
  class Datatype {
   public:
    Datatype() = default;
    MPI_Datatype raw() const { return type_ ? *type_ : MPI_DATATYPE_NULL; }
    explicit operator bool() const { return type_ != nullptr; }

   private:
    friend class Comm;
    std::shared_ptr<MPI_Datatype> type_;
  };
  // A box of a strided block for MPI to pack: `extents` elements of `itemsize` bytes, byte
  // strides `byte_strides`, starting `offset` bytes after the block's base. Committed once;
  // ValueError where an extent or the contiguous run exceeds MPI's count limit.
  static Datatype box_type(const std::vector<std::int64_t>& extents,
                           const std::vector<std::int64_t>& byte_strides, std::size_t itemsize,
                           std::size_t offset);

  // A planned point-to-point exchange with the peers that hold data: each message is
  // contiguous bytes at an offset of the send (receive) base, or one box datatype placed
  // relative to it. Contiguous messages above MPI's count limit are cut into pieces when they
  // are added (the same pieces on both sides). Built in a plan, run any number of times;
  // running allocates nothing.
  class Exchange {
   public:
    void send(int peer, std::size_t offset, std::size_t bytes);
    void send(int peer, Datatype type);
    void recv(int peer, std::size_t offset, std::size_t bytes);
    void recv(int peer, Datatype type);
    std::size_t messages() const { return messages_.size(); }

   private:
    friend class Comm;
    struct Message {
      int peer;
      bool is_recv;
      int count;  // bytes, or 1 with a datatype
      std::size_t offset;
      std::size_t bytes;
      Datatype type;
    };
    void add(bool is_recv, int peer, std::size_t offset, std::size_t bytes);
    std::vector<Message> messages_;
    std::vector<MPI_Request> requests_;
  };
  // Posts every receive, then every send, and waits for all.
  void run(Exchange& exchange, const void* send_base, void* recv_base) const;

  // One side of an all-to-all where MPI packs (MPI_Alltoallw): per peer a box datatype placed
  // relative to the buffer (count 1), or nothing (count 0). For a change of split axis, where
  // every pair of ranks exchanges; built once with a plan.
  class PeerTypes {
   public:
    explicit PeerTypes(int nranks = 0);
    void set(int peer, Datatype type);
    std::size_t bytes() const { return bytes_; }

   private:
    friend class Comm;
    std::vector<int> counts_, displs_;
    std::vector<MPI_Datatype> types_;
    std::vector<Datatype> owned_;
    std::size_t bytes_ = 0;
  };
  void alltoallw(const void* send, const PeerTypes& send_types, void* recv,
                 const PeerTypes& recv_types) const;

  // Writes `message` to stderr and ends the whole job (MPI_Abort): for failures after every
  // rank has agreed to run a call, when the other ranks can no longer be told.
  [[noreturn]] void abort(const std::string& message) const;

 private:
  friend struct Impl::CommAccess;
  explicit Comm(std::shared_ptr<Handle> handle);
  static std::shared_ptr<Handle> handle_for(MPI_Comm user);
  bool emulated() const;

  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

std::string message_of(const std::exception_ptr& error);

}  // namespace kvmap
