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
// Fault points (platform/switches.hpp) fire at the start of plan and of execute. The failure
// path is agreed_failure.hpp's; the arguments' fingerprint is signature.hpp's.
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "agreed_failure.hpp"
#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/error.hpp"
#include "mpi_transport.hpp"
#include "signature.hpp"
#include "switches.hpp"

namespace kvmap::Detail {

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
  // After reduce(), for a failure that can only be found once every rank's plan succeeded
  // (from messages the ranks exchanged after their checks): `late` is this rank's (or null),
  // `any` whether some rank has one (the same on every rank: from the reduced payload). A
  // plan's failure is judged first (it may cause the late ones); then, where `any`, every
  // rank throws as for a failed plan. Returns when there is nothing to throw.
  void judge_late(const std::exception_ptr& late, bool any) {
    judge();
    if (!any) return;
    error_ = late;
    raise_failed(comm_, gather_statuses(comm_, RankStatus{late ? 1u : 0u, 1, 0}), error_);
    throw Error(std::string(site_) + ": internal error: a late failure was not raised");
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
    std::vector<RankStatus> statuses;
    std::vector<Payload> payloads;
    bool ok = true;
    for (const auto& p : all) {
      statuses.push_back(RankStatus{p.head.failed, 1, p.head.fingerprint_min});
      payloads.push_back(p.payload);
      ok = ok && p.head.failed == 0 && p.head.fingerprint_min == all[0].head.fingerprint_min;
    }
    if (!ok) raise_disagreement(comm_, site_, error_, signature_, statuses);
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
