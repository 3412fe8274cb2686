#pragma once
/// \file
/// kvmap's agree-or-abort step for applications: the discipline kvmap's own collective calls
/// keep (plan -> one agreement -> execute), offered for an application's own steps, so that a
/// failure seen on some ranks (a file one rank cannot read, a bad input on one rank) becomes an
/// error on every rank instead of a hang, and a failure after the agreement ends the job.
#include "kvmap/comm.hpp"
#include "kvmap/config.hpp"
#include <exception>
#include <string>

KVMAP_API_BEGIN
namespace kvmap {

/// Collective over `comm`: every rank passes what its own plan raised (or nothing). Returns
/// on every rank when no rank failed; otherwise every rank throws: each failed rank its own
/// exception again, every other rank kvmap::RemoteError naming the failed ranks with the first
/// one's message. One fixed-size reduction when no rank failed (nothing on one rank); the
/// failing ranks and one message travel only when one did. `site` names the step in messages.
void agree(const Comm& comm, const std::exception_ptr& error = nullptr,
           const char* site = "kvmap::agree");

/// Writes `message` to standard error as it is and ends every process of `comm`'s job
/// (MPI_Abort, after a moment for the launcher to forward the message): for a failure after an
/// agreement, when the other ranks are already inside the step's collectives and cannot be
/// told otherwise. Never returns.
[[noreturn]] void abort_job(const Comm& comm, const std::string& message);

}  // namespace kvmap
KVMAP_API_END
