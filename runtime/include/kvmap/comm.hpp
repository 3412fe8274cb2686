#pragma once
// The MPI communicator kvmap works on: a handle to kvmap's duplicate of the user's
// communicator. What kvmap sends over it is private to kvmap (its transport,
// runtime/src/detail/mpi_transport.hpp); an application talks MPI on raw().
#include <mpi.h>

#include <cstdint>
#include <memory>

namespace kvmap {

namespace Impl {
struct CommAccess;  // kvmap's own access to the duplicate (runtime/src/detail/comm.hpp)
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

 private:
  friend struct Impl::CommAccess;
  explicit Comm(std::shared_ptr<Handle> handle);
  static std::shared_ptr<Handle> handle_for(MPI_Comm user);

  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace kvmap
