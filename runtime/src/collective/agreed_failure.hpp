#pragma once
// Agreed failure: how every rank throws alike once an agreement (agreement.hpp) showed that a
// rank failed or that ranks differ. Per-rank data travels only here, on the failure path:
// each rank's status is gathered (gather_statuses), then at most two descriptions or the first
// failing rank's message. The exception each case gives is the contract's: a rank that failed
// rethrows its own error and the others throw RemoteError naming it (raise_failed); ranks that
// passed different arguments throw ValueError and the others RemoteError naming them
// (raise_differing, Blame::DifferingRanks); a difference only seen together, such as the
// outputs of the function ranks ran, is every rank's ValueError (Blame::EveryRank).
// Also the public kvmap::agree and kvmap::abort_job (kvmap/agreement.hpp).
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/error.hpp"

namespace kvmap::Detail {

class Signature;

// An exception's message ("" for none): what travels when a rank failed.
std::string message_of(const std::exception_ptr& error);

// Writes the message to stderr and aborts every process of `comm`'s job.
[[noreturn]] void abort_after_agreement(const Comm& comm, const char* site,
                                        const std::exception_ptr& error);

// One rank's part in a failed agreement: whether it failed, whether it takes part in the
// comparison, and the key (a fingerprint) compared among those that take part.
struct RankStatus {
  std::uint32_t failed = 0;
  std::uint32_t takes_part = 1;
  std::uint64_t key = 0;
};
// Every rank's status, in rank order (one all-gather; the failure path only).
std::vector<RankStatus> gather_statuses(const Comm& comm, const RankStatus& mine);
// The ranks taking part whose key differs from `reference`'s, ascending.
std::vector<int> ranks_differing(const std::vector<RankStatus>& statuses, int reference);
// The first rank taking part (size() when none does).
int first_taking_part(const std::vector<RankStatus>& statuses);

// Every rank throws when a rank failed: the failed ranks their own `error`, the others
// RemoteError naming the failed ranks with the first one's message. Returns when none failed.
void raise_failed(const Comm& comm, const std::vector<RankStatus>& statuses,
                  const std::exception_ptr& error);

// Which ranks a difference blames.
enum class Blame {
  DifferingRanks,  // they throw ValueError, every other rank RemoteError naming them
  EveryRank,       // every rank throws the same ValueError
};
// Every rank throws for ranks `differing` (non-empty, ascending) that differ from rank
// `reference`: the message is message(rank, that rank's description, the reference's), each
// description being that rank's `mine` (two broadcasts).
[[noreturn]] void raise_differing(
    const Comm& comm, int reference, const std::vector<int>& differing, const std::string& mine,
    const std::function<std::string(int rank, const std::string& theirs,
                                    const std::string& reference)>& message,
    Blame blame = Blame::DifferingRanks);

// The failure path of an agreement (a failed plan, or differing signatures), from every rank's
// status (key: its signature's fingerprint): every rank throws.
[[noreturn]] void raise_disagreement(const Comm& comm, const char* site,
                                     const std::exception_ptr& error, const Signature& signature,
                                     const std::vector<RankStatus>& statuses);
// The same when the statuses are not yet gathered.
[[noreturn]] void raise_disagreement(const Comm& comm, const char* site,
                                     const std::exception_ptr& error, const Signature& signature);

// A failure every rank has detected identically from data they all hold: ranks in `failed`
// throw E(their message), the others RemoteError. `messages` aligns with `failed`.
template <class E>
[[noreturn]] void raise_detected(const Comm& comm, const std::vector<int>& failed,
                                 const std::vector<std::string>& messages) {
  for (std::size_t i = 0; i < failed.size(); ++i) {
    if (failed[i] == comm.rank()) throw E(messages[i]);
  }
  throw RemoteError(failed, messages.empty() ? std::string() : messages.front());
}

// A trivially copyable record as a description's bytes, and back.
template <class T>
std::string bytes_of(const T& value) {
  static_assert(std::is_trivially_copyable_v<T>, "bytes_of needs a trivially copyable T");
  return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
}
template <class T>
std::string bytes_of(const std::vector<T>& values) {
  static_assert(std::is_trivially_copyable_v<T>, "bytes_of needs a trivially copyable T");
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}
template <class T>
T from_bytes(const std::string& bytes) {
  static_assert(std::is_trivially_copyable_v<T>, "from_bytes needs a trivially copyable T");
  T value{};
  std::memcpy(&value, bytes.data(), std::min(bytes.size(), sizeof(T)));
  return value;
}
template <class T>
std::vector<T> vector_from_bytes(const std::string& bytes) {
  static_assert(std::is_trivially_copyable_v<T>, "vector_from_bytes needs a trivially copyable T");
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

// Runs fn() after every rank has agreed to run the call: a failure ends the job.
template <class Fn>
decltype(auto) run_agreed(const char* site, const Comm& comm, Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    abort_after_agreement(comm, site, std::current_exception());
  }
}

}  // namespace kvmap::Detail
