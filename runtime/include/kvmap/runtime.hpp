#pragma once
// ScopeGuard: initializes MPI and Kokkos unless already initialized, and finalizes only
// what it started.
namespace kvmap {

class ScopeGuard {
 public:
  ScopeGuard(int& argc, char**& argv);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

  bool started_mpi() const { return started_mpi_; }
  bool started_kokkos() const { return started_kokkos_; }

 private:
  bool started_mpi_ = false;
  bool started_kokkos_ = false;
};

}  // namespace kvmap
