// Agreed failure (agreed_failure.hpp) and the public agree/abort_job (kvmap/agreement.hpp).
#include "agreed_failure.hpp"

#include <algorithm>
#include <string>

#include "agreement.hpp"
#include "kvmap/agreement.hpp"
#include "mpi_process.hpp"
#include "mpi_transport.hpp"
#include "signature.hpp"

namespace kvmap {

namespace Detail {

std::string message_of(const std::exception_ptr& error) {
  if (!error) return {};
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

void abort_after_agreement(const Comm& comm, const char* site, const std::exception_ptr& error) {
  abort_job(std::string("kvmap: ") + site + " failed on rank " + std::to_string(comm.rank()) +
            " after every rank had agreed to run it: " + message_of(error) +
            "\nkvmap: aborting the job, since the other ranks cannot leave the call's collectives");
}

std::vector<RankStatus> gather_statuses(const Comm& comm, const RankStatus& mine) {
  return Detail::transport(comm).allgather(mine);
}

std::vector<int> ranks_differing(const std::vector<RankStatus>& statuses, int reference) {
  std::vector<int> differing;
  const std::uint64_t key = statuses[static_cast<std::size_t>(reference)].key;
  for (int r = 0; r < static_cast<int>(statuses.size()); ++r) {
    const RankStatus& s = statuses[static_cast<std::size_t>(r)];
    if (s.takes_part && s.key != key) differing.push_back(r);
  }
  return differing;
}

int first_taking_part(const std::vector<RankStatus>& statuses) {
  const auto it = std::find_if(statuses.begin(), statuses.end(),
                               [](const RankStatus& s) { return s.takes_part != 0; });
  return static_cast<int>(it - statuses.begin());
}

void raise_failed(const Comm& comm, const std::vector<RankStatus>& statuses,
                  const std::exception_ptr& error) {
  std::vector<int> failing;
  for (int r = 0; r < static_cast<int>(statuses.size()); ++r) {
    if (statuses[static_cast<std::size_t>(r)].failed) failing.push_back(r);
  }
  if (failing.empty()) return;
  // The first failing rank's message to everyone; the failing ranks rethrow their own.
  const std::string first =
      Detail::transport(comm).bcast_string(message_of(error), failing.front());
  if (error) std::rethrow_exception(error);
  throw RemoteError(failing, first);
}

void raise_differing(
    const Comm& comm, int reference, const std::vector<int>& differing, const std::string& mine,
    const std::function<std::string(int, const std::string&, const std::string&)>& message,
    Blame blame) {
  const Transport& t = Detail::transport(comm);
  const std::string theirs_reference = t.bcast_string(mine, reference);
  const std::string theirs_other = t.bcast_string(mine, differing.front());
  const bool blamed = blame == Blame::EveryRank ||
                      std::find(differing.begin(), differing.end(), comm.rank()) != differing.end();
  if (blamed && blame == Blame::DifferingRanks) {
    throw ValueError(message(comm.rank(), mine, theirs_reference));
  }
  const std::string first = message(differing.front(), theirs_other, theirs_reference);
  if (blamed) throw ValueError(first);
  throw RemoteError(differing, first);
}

void raise_disagreement(const Comm& comm, const char* site, const std::exception_ptr& error,
                        const Signature& signature, const std::vector<RankStatus>& statuses) {
  raise_failed(comm, statuses, error);
  const std::vector<int> differing = ranks_differing(statuses, 0);
  if (differing.empty()) {
    throw Error(std::string("kvmap: internal error: ") + site +
                "'s agreement failed but no rank differs");
  }
  // Only now are the calls written out: rank 0's and the first differing rank's.
  raise_differing(comm, 0, differing, signature.str(),
                  [&](int r, const std::string& theirs, const std::string& rank0s) {
                    return std::string("kvmap: ") + site +
                           " is collective and needs the same arguments on every rank, but "
                           "rank " +
                           std::to_string(r) + " called " + theirs + " while rank 0 called " +
                           rank0s;
                  });
}

void raise_disagreement(const Comm& comm, const char* site, const std::exception_ptr& error,
                        const Signature& signature) {
  RankStatus mine;
  mine.failed = error ? 1 : 0;
  mine.key = signature.fingerprint();
  raise_disagreement(comm, site, error, signature, gather_statuses(comm, mine));
}

}  // namespace Detail

void agree(const Comm& comm, const std::exception_ptr& error, const char* site) {
  Detail::Collective<> call(site, comm);
  call.plan([&](Detail::Signature&, Detail::NoPayload&) {
    if (error) std::rethrow_exception(error);
    return 0;
  });
  call.agree();
}

void abort_job(const Comm& comm, const std::string& message) {
  (void)comm;  // the whole job ends: MPICH ends only the caller when given another communicator
  Detail::abort_job(message);
}

}  // namespace kvmap
