#pragma once
// kvmap's registry of communicator duplicates (comm.cpp): what a Comm refers to, its
// transport and sequence numbers, and their collective release before MPI_Finalize.
#include <cstdint>
#include <memory>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "mpi_transport.hpp"

namespace kvmap::Detail {

struct CommAccess {
  static Comm make(std::shared_ptr<Comm::Handle> handle);
  static const Transport& transport(const Comm& comm);
  static std::uint64_t next_sequence(const Comm& comm, std::uint64_t epoch);
};

// The next number of a sequence kept per communicator (shared by every copy of this Comm):
// 1, 2, 3, ... and back to 1 whenever `epoch` differs from the previous call's. Collective
// calls that advance it in the same order on every rank see the same numbers on every rank,
// whatever other communicators each rank used in between.
inline std::uint64_t next_sequence(const Comm& comm, std::uint64_t epoch) {
  return CommAccess::next_sequence(comm, epoch);
}

// Frees every duplicate kvmap made (collective, in the same order on every rank; before
// MPI_Finalize), the agreement's MPI operations and datatypes, and whatever the hooks
// registered with on_release hold (cached redistribution plans). Comms still held afterwards
// throw on use.
void release_cached_comms();
void on_release(void (*hook)());
// A Comm over a transport of kvmap's own, registered with a fresh id (the testing target's
// emulated communicators).
Comm comm_over(std::unique_ptr<Transport> transport);

}  // namespace kvmap::Detail
