#pragma once
/// \file
/// The MPI communicator kvmap works on: a handle to kvmap's duplicate of the user's
/// communicator. What kvmap sends over it is private to kvmap (its transport,
/// runtime/src/platform/mpi_transport.hpp); an application talks MPI on raw().
#include "kvmap/config.hpp"
#include <mpi.h>

#include <cstdint>
#include <memory>

/// kvmap's private code (not installed, not exported): declared here only so that Comm can
/// name its friend.
namespace kvmap::Detail {
struct CommAccess;  ///< kvmap's own access to the duplicate
                    ///< (runtime/src/platform/comm_registry.hpp)
}  // namespace kvmap::Detail

KVMAP_API_BEGIN
namespace kvmap {

/// A copyable handle to kvmap's duplicate of an MPI communicator: what every collective of
/// kvmap (DistView factories and redistribution, vmap's agreement, random, linalg) runs on.
class Comm {
 public:
  struct Handle;  ///< opaque: kvmap's duplicate of one user communicator

  /// kvmap's duplicate of MPI_COMM_WORLD.
  Comm();
  /// kvmap's duplicate of `comm`: made (collective over `comm`) the first time, the same one
  /// after that, so every Comm of one user communicator shares its state (the stream counter
  /// of kvmap::random). `comm` may be freed right after. Duplicates are freed together before
  /// MPI_Finalize (kvmap::ScopeGuard, Python's exit), never when a Comm is destroyed.
  explicit Comm(MPI_Comm comm);

  /// kvmap's duplicate of MPI_COMM_WORLD (collective the first time).
  static Comm world();
  /// kvmap's duplicate of MPI_COMM_SELF: one rank, no communication.
  static Comm self();
  /// Duplicates the communicator with this Fortran handle (what mpi4py's Comm.py2f() gives).
  static Comm from_fortran(std::int64_t handle);

  /// The same on every rank of this communicator, different for every other communicator
  /// kvmap has made in this process (part of every collective's agreed signature).
  std::uint64_t id() const;
  /// This process's rank in the communicator.
  int rank() const { return rank_; }
  /// The number of ranks.
  int size() const { return size_; }
  /// kvmap's duplicate as an MPI communicator, for the application's own MPI calls (Error
  /// once the duplicates were freed before MPI_Finalize).
  MPI_Comm raw() const;
  /// MPI_Barrier on the duplicate (collective; counted by kvmap::stats()).
  void barrier() const;

 private:
  friend struct Detail::CommAccess;
  explicit Comm(std::shared_ptr<Handle> handle);
  static std::shared_ptr<Handle> handle_for(MPI_Comm user);

  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace kvmap
KVMAP_API_END
