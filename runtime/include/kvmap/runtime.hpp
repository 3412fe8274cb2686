#pragma once
#include "kvmap/config.hpp"
/// \file
/// ScopeGuard: initializes MPI and Kokkos unless already initialized, and finalizes only
/// what it started.
KVMAP_API_BEGIN
namespace kvmap {

/// `kvmap::ScopeGuard guard(argc, argv);` at the top of main(): MPI (at least
/// MPI_THREAD_FUNNELED) and Kokkos (on the GPU this rank maps to, unless the user chose one)
/// for the guard's lifetime.
class ScopeGuard {
 public:
  /// Initializes MPI and Kokkos where they are not yet, with the program's arguments; makes
  /// the GPU-aware MPI decision on every rank (a bad KVMAP_GPU_AWARE_MPI throws on all).
  ScopeGuard(int& argc, char**& argv);
  /// Finalizes Kokkos, then MPI, if this guard started them.
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

  /// Whether this guard initialized MPI (and will finalize it).
  bool started_mpi() const { return started_mpi_; }
  /// Whether this guard initialized Kokkos (and will finalize it).
  bool started_kokkos() const { return started_kokkos_; }

 private:
  bool started_mpi_ = false;
  bool started_kokkos_ = false;
};

}  // namespace kvmap
KVMAP_API_END
