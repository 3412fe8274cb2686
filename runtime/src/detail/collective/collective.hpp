#pragma once
// plan -> agree -> execute: the one shape of every collective entry point of kvmap, and the
// agreement protocol behind it (kvmap::Comm only transports the bytes).
//   plan     argument checks, every allocation and scratch buffer, generator state, output
//            metadata; anything may throw. Records the arguments every rank must pass alike
//            in a Signature (fingerprinted as they are recorded), and fills a payload.
//   agree    ONE collective whose size does not depend on the number of ranks: an
//            MPI_Allreduce of {ranks whose plan failed, min and max of the signature
//            fingerprints, the payload reduced field by field}. Equal minimum and maximum
//            fingerprints mean every rank signed alike. Only when a plan failed or the
//            fingerprints differ does per-rank data travel (which ranks, their messages,
//            their calls): every rank then throws, the rank at fault its own error (ValueError
//            naming both calls for differing arguments), the others RemoteError. On one rank
//            nothing communicates. (from_local, whose result needs every rank's count, agrees
//            with one gather instead: agree_gather.)
//   execute  MPI calls and kernels only. A failure here cannot be agreed any more (the
//            other ranks are inside the call's collectives): it ends the job with MPI_Abort
//            and a message, never a hang.
// Fault hooks (detail/collective/fault_injection.hpp) fire at the start of plan and of execute.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/detail.hpp"
#include "kvmap/comm.hpp"
#include "detail/platform/mpi_transport.hpp"
#include "kvmap/dtype.hpp"
#include "kvmap/error.hpp"
#include "detail/collective/fault_injection.hpp"
#include "kvmap/layout.hpp"

namespace kvmap::Detail {

// The arguments of one call that must be the same on every rank. Each argument is folded
// into a 64-bit fingerprint as it is recorded; the text ("DistView::gather(comm=#1, root=0,
// layout=...)") is made only for an error message. Layouts and integer lists are kept by
// reference: they must outlive the call's agreement (they are the call's own arguments).
class Signature {
 public:
  Signature(const char* op, const Comm& comm);
  Signature& arg(const char* name, std::int64_t value);
  Signature& arg(const char* name, int value) { return arg(name, std::int64_t{value}); }
  Signature& arg(const char* name, std::uint64_t value);
  Signature& arg(const char* name, double value);
  Signature& arg(const char* name, DType value);
  Signature& arg(const char* name, const Layout& value);
  Signature& arg(const char* name, const Shape& value);
  Signature& arg(const char* name, std::optional<int> split);
  // A communicator an argument lives on (e.g. an input DistView's): by identity.
  Signature& arg(const char* name, const Comm& comm);
  // A name from a fixed set (a string literal: "error", "same", ...).
  Signature& text(const char* name, const char* literal);
  Signature& ints(const char* name, const std::vector<std::int64_t>& values);

  std::uint64_t fingerprint() const { return hash_; }
  std::string str() const;

 private:
  enum class Kind : std::uint8_t {
    Int,
    UInt,
    Double,
    DType,
    Layout,
    Shape,
    Split,
    Comm,
    Text,
    Ints
  };
  static constexpr int kShapeInline = 8;
  struct Arg {
    const char* name;
    Kind kind;
    std::int8_t ndim;  // Shape: extents kept (at most kShapeInline); -1: more, not kept
    union {
      std::int64_t i;
      std::uint64_t u;
      double d;
      const char* text;
      const kvmap::Layout* layout;
      const std::vector<std::int64_t>* ints;
    };
    std::int64_t shape[kShapeInline];
  };
  Arg& push(const char* name, Kind kind, std::uint64_t bits);

  const char* op_;
  std::uint64_t hash_;
  int n_ = 0;
  static constexpr int kInline = 12;
  std::array<Arg, kInline> inline_args_;
  std::vector<Arg> more_args_;
};

// Every rank's plan status and signature, as the agreement reduces them.
struct AgreementHeader {
  std::uint32_t failed = 0;  // ranks whose plan failed
  std::uint32_t unused = 0;
  std::uint64_t fingerprint_min = 0;
  std::uint64_t fingerprint_max = 0;
};

// A 64-bit value every rank should hold alike: equal iff minimum == maximum over the ranks
// that took part (the identity, min > max, from the others).
struct MinMax64 {
  std::uint64_t min = ~0ull;
  std::uint64_t max = 0;
  void set(std::uint64_t v) { min = max = v; }
  bool same() const { return min == max; }
  void combine(const MinMax64& in) {
    if (in.min < min) min = in.min;
    if (in.max > max) max = in.max;
  }
};

// The payload of calls that agree on nothing but their arguments.
struct NoPayload {
  static void combine(const NoPayload&, NoPayload&) {}
};

// Metadata only some ranks hold (scatter's root, the ranks that ran vmap's function), carried
// by an agreement's reduction: the holders write their words, every other rank leaves zeros,
// and the reduction keeps each word's maximum, so every rank receives the holders' words in a
// record whose size does not depend on the number of ranks. The holders must hold the same
// words (their signatures or fingerprints check that).
template <int N>
struct HeldWords {
  static constexpr int kWords = N;
  std::uint64_t words[N] = {};
  static void combine(const HeldWords& in, HeldWords& inout) {
    for (int k = 0; k < N; ++k) {
      if (in.words[k] > inout.words[k]) inout.words[k] = in.words[k];
    }
  }
};

// An exception's message ("" for none): what travels when a plan failed.
std::string message_of(const std::exception_ptr& error);

// Writes the message to stderr and aborts every process of `comm`'s job.
[[noreturn]] void abort_after_agreement(const Comm& comm, const char* site,
                                        const std::exception_ptr& error);

// The failure path of an agreement, once the reduction showed a failed plan or differing
// fingerprints: per-rank status and fingerprints are gathered, then the first failing rank's
// message (or both calls) travel; every rank throws.
[[noreturn]] void raise_disagreement(const Comm& comm, const char* site,
                                     const std::exception_ptr& error, const Signature& signature);
// The same when every rank's status and fingerprint are already known (agree_gather).
[[noreturn]] void raise_gathered(const Comm& comm, const char* site,
                                 const std::exception_ptr& error, const Signature& signature,
                                 const std::vector<std::uint32_t>& failed,
                                 const std::vector<std::uint64_t>& fingerprints);

// The failure path of every check that something is the same on every rank, once every rank
// holds every rank's key (gathered; on the failure path only). The ranks whose key differs
// from `reference`'s, ascending, among the ranks that take part (all when `takes_part` is
// empty).
template <class Key>
std::vector<int> ranks_differing(const std::vector<Key>& keys, int reference,
                                 const std::vector<bool>& takes_part = {}) {
  std::vector<int> differing;
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    if (!takes_part.empty() && !takes_part[static_cast<std::size_t>(r)]) continue;
    if (keys[static_cast<std::size_t>(r)] != keys[static_cast<std::size_t>(reference)])
      differing.push_back(r);
  }
  return differing;
}
// What a message naming two ranks needs: `mine` of rank `reference` and of rank `other`, on
// every rank (two broadcasts).
struct TwoDescriptions {
  std::string reference;
  std::string other;
};
TwoDescriptions describe_two(const Comm& comm, int reference, int other, const std::string& mine);
// Every rank throws: the ranks in `differing` (non-empty, ascending) ValueError with
// message(rank, that rank's description, the reference's), every other rank RemoteError
// naming them with the first differing rank's message. Descriptions are each rank's `mine`.
[[noreturn]] void raise_differing(
    const Comm& comm, int reference, const std::vector<int>& differing, const std::string& mine,
    const std::function<std::string(int rank, const std::string& theirs,
                                    const std::string& reference)>& message);
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

// Runs fn() after every rank has agreed to run the call: a failure ends the job.
template <class Fn>
decltype(auto) run_agreed(const char* site, const Comm& comm, Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    abort_after_agreement(comm, site, std::current_exception());
  }
}

template <class Payload>
struct AgreementPacket {
  AgreementHeader head;
  Payload payload;
};

// The reduction of the agreement (an MPI user function: commutative and associative).
template <class Payload>
void reduce_agreements(void* in, void* inout, int* len, MPI_Datatype*) {
  using Packet = AgreementPacket<Payload>;
  for (int i = 0; i < *len; ++i) {
    // Copies: MPI's buffers carry no alignment promise for the packet's fields.
    Packet a, b;
    std::memcpy(&a, static_cast<const unsigned char*>(in) + i * sizeof(Packet), sizeof(Packet));
    std::memcpy(&b, static_cast<unsigned char*>(inout) + i * sizeof(Packet), sizeof(Packet));
    b.head.failed += a.head.failed;
    if (a.head.fingerprint_min < b.head.fingerprint_min)
      b.head.fingerprint_min = a.head.fingerprint_min;
    if (a.head.fingerprint_max > b.head.fingerprint_max)
      b.head.fingerprint_max = a.head.fingerprint_max;
    Payload::combine(a.payload, b.payload);
    std::memcpy(static_cast<unsigned char*>(inout) + i * sizeof(Packet), &b, sizeof(Packet));
  }
}

template <class Payload = NoPayload>
class Collective {
  static_assert(std::is_trivially_copyable_v<Payload>,
                "a Collective's payload must be trivially copyable");

 public:
  Collective(const char* site, const Comm& comm)
      : site_(site), comm_(comm), signature_(site, comm) {}
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  // Runs fn(signature, payload) and keeps its failure for the agreement; the plan it returns
  // is engaged only when it succeeded.
  template <class Fn>
  auto plan(Fn&& fn)
      -> std::optional<std::decay_t<std::invoke_result_t<Fn&, Signature&, Payload&>>> {
    try {
      fault_point(site_, FaultPhase::Plan, comm_.rank());
      return fn(signature_, payload_);
    } catch (...) {
      error_ = std::current_exception();
      return std::nullopt;
    }
  }

  // The one reduction, not yet judged: every rank holds the same reduced packet afterwards.
  const AgreementPacket<Payload>& reduce() {
    packet_.head.failed = error_ ? 1 : 0;
    packet_.head.fingerprint_min = packet_.head.fingerprint_max = signature_.fingerprint();
    packet_.payload = payload_;
    Detail::transport(comm_).allreduce_bytes(&packet_, sizeof packet_, &reduce_agreements<Payload>);
    return packet_;
  }
  // Whether every rank planned without failure and signed alike (after reduce()).
  bool consistent() const {
    return packet_.head.failed == 0 && packet_.head.fingerprint_min == packet_.head.fingerprint_max;
  }
  // Every rank throws unless consistent() (the failure path communicates).
  void judge() {
    if (!consistent()) raise_disagreement(comm_, site_, error_, signature_);
    agreed_ = true;
  }
  // The agreement: reduce and judge; the reduced payload.
  const Payload& agree() {
    reduce();
    judge();
    return packet_.payload;
  }

  // from_local's agreement: every rank's payload, in rank order (one gather; the failure
  // path then needs only the messages).
  std::vector<Payload> agree_gather() {
    AgreementPacket<Payload> mine;
    mine.head.failed = error_ ? 1 : 0;
    mine.head.fingerprint_min = mine.head.fingerprint_max = signature_.fingerprint();
    mine.payload = payload_;
    const std::vector<AgreementPacket<Payload>> all = Detail::transport(comm_).allgather(mine);
    std::vector<std::uint32_t> failed;
    std::vector<std::uint64_t> fingerprints;
    std::vector<Payload> payloads;
    bool ok = true;
    for (const auto& p : all) {
      failed.push_back(p.head.failed);
      fingerprints.push_back(p.head.fingerprint_min);
      payloads.push_back(p.payload);
      ok = ok && p.head.failed == 0 && p.head.fingerprint_min == all[0].head.fingerprint_min;
    }
    if (!ok) raise_gathered(comm_, site_, error_, signature_, failed, fingerprints);
    agreed_ = true;
    return payloads;
  }

  // After the agreement: fn() runs, and a failure ends the job.
  template <class Fn>
  decltype(auto) execute(Fn&& fn) {
    return run_agreed(site_, comm_, [&]() -> decltype(auto) {
      if (!agreed_)
        throw Error("kvmap: internal error: a collective executed before its agreement");
      fault_point(site_, FaultPhase::Execute, comm_.rank());
      return fn();
    });
  }

 private:
  const char* site_;
  const Comm& comm_;
  Signature signature_;
  Payload payload_{};
  AgreementPacket<Payload> packet_{};
  std::exception_ptr error_;
  bool agreed_ = false;
};

// The common case in one call: plan(signature, payload) -> Plan; agree;
// execute(plan, the reduced payload) -> the result.
template <class Payload = NoPayload, class PlanFn, class ExecFn>
decltype(auto) collective(const char* site, const Comm& comm, PlanFn&& plan, ExecFn&& execute) {
  Collective<Payload> call(site, comm);
  auto planned = call.plan(plan);
  const Payload& agreed = call.agree();
  return call.execute([&]() -> decltype(auto) { return execute(*planned, agreed); });
}

}  // namespace kvmap::Detail
