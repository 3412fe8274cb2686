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

  // ---- typed collectives (every rank must call them in the same order) -------------
  // Each rank contributes one trivially copyable value; returns all of them in rank order.
  template <class T>
  std::vector<T> allgather(const T& value) const {
    static_assert(std::is_trivially_copyable_v<T>, "Comm::allgather needs a trivially copyable T");
    std::vector<T> out(static_cast<std::size_t>(size_));
    allgather_bytes(&value, sizeof(T), out.data());
    return out;
  }
  std::vector<std::string> allgather_strings(const std::string& mine) const;
  void allgather_bytes(const void* mine, std::size_t nbytes, void* all) const;
  void bcast_bytes(void* data, std::size_t nbytes, int root) const;
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

  // Byte-wise all-to-all with per-peer counts and displacements of any size.
  // `global_max` must be the same on every rank and at least every count and every
  // displacement + count on any rank; above the MPI count limit the exchange is done
  // in pieces by point-to-point messages instead of one MPI_Alltoallv.
  void alltoallv_bytes(const void* send, const std::vector<std::size_t>& send_counts,
                       const std::vector<std::size_t>& send_displs, void* recv,
                       const std::vector<std::size_t>& recv_counts,
                       const std::vector<std::size_t>& recv_displs, std::size_t global_max) const;
  // Per-peer arguments of MPI_Alltoallw, ready to pass: count 1 and a datatype that places
  // its bytes relative to the buffer, or count 0 (nothing to or from that peer);
  // displacements 0.
  struct PeerTypes {
    std::vector<int> counts, displs;
    std::vector<MPI_Datatype> types;
  };
  // All-to-all where MPI packs (MPI_Alltoallw). Allocates nothing.
  void alltoallw(const void* send, const PeerTypes& send_types, void* recv,
                 const PeerTypes& recv_types) const;
  // Byte-wise all-gather of variable-size blocks (counts/displs known on every rank).
  void allgatherv_bytes(const void* send, std::size_t send_count, void* recv,
                        const std::vector<std::size_t>& counts,
                        const std::vector<std::size_t>& displs) const;

  // ---- error agreement ---------------------------------------------------------------
  // Every rank passes its local outcome (null when it succeeded). If any rank failed,
  // every rank throws: a failing rank rethrows its own exception, the others throw
  // RemoteError naming the failed ranks. One small collective when all succeeded.
  void agree(const std::exception_ptr& local_error) const;
  // agree() that also gathers a trivially copyable payload from every rank, in one
  // collective on success (none on a one-rank communicator).
  template <class T>
  std::vector<T> agree_gather(const std::exception_ptr& local_error, const T& payload) const {
    static_assert(std::is_trivially_copyable_v<T>,
                  "Comm::agree_gather needs a trivially copyable T");
    std::vector<unsigned char> all = agree_gather_bytes(local_error, &payload, sizeof(T));
    std::vector<T> out(static_cast<std::size_t>(size_));
    if (!all.empty()) std::memcpy(out.data(), all.data(), all.size());
    return out;
  }
  // Raises a failure that every rank has detected identically from gathered data: ranks in
  // `failed` throw E(their message), the others RemoteError. `messages` aligns with `failed`.
  template <class E>
  [[noreturn]] void raise_detected(const std::vector<int>& failed,
                                   const std::vector<std::string>& messages) const {
    for (std::size_t i = 0; i < failed.size(); ++i) {
      if (failed[i] == rank_) throw E(messages[i]);
    }
    throw_remote(failed, messages.empty() ? std::string() : messages.front());
  }

  // Writes `message` to stderr and ends the whole job (MPI_Abort): for failures after every
  // rank has agreed to run a call, when the other ranks can no longer be told.
  [[noreturn]] void abort(const std::string& message) const;

 private:
  explicit Comm(std::shared_ptr<Handle> handle);
  static std::shared_ptr<Handle> handle_for(MPI_Comm user);
  std::vector<unsigned char> agree_gather_bytes(const std::exception_ptr& local_error,
                                                const void* payload, std::size_t nbytes) const;
  [[noreturn]] void throw_remote(const std::vector<int>& failed, const std::string& first) const;

  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

std::string message_of(const std::exception_ptr& error);

namespace Impl {
// Largest element count kvmap passes to one MPI call (INT_MAX unless lowered for tests).
std::size_t mpi_count_limit();
void set_mpi_count_limit(std::size_t limit);
// Whether MPI is given this memory directly: host memory always, device memory only where
// kvmap was built for a GPU-aware MPI (KVMAP_ENABLE_GPU_AWARE_MPI); otherwise kvmap stages
// the bytes through host buffers (counted in stats().bytes_copied). Tests force staging for
// host memory too, so the staged path runs on every backend.
bool mpi_reads_directly(bool host_accessible);
void set_force_host_staging(bool force);
// Frees every duplicate kvmap made (collective, in the same order on every rank; before
// MPI_Finalize). Comms still held afterwards throw on use.
void release_cached_comms();
bool mpi_initialized();
// Initializes MPI with at least MPI_THREAD_FUNNELED, or checks the thread level of an MPI
// that is already initialized (Error when it is below FUNNELED). True when this call
// initialized MPI.
bool init_mpi(int& argc, char**& argv);
// Releases the cached communicators, then finalizes MPI.
void finalize_mpi();
}  // namespace Impl

}  // namespace kvmap
