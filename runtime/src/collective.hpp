#pragma once
// plan -> agree -> execute: the one shape of every collective entry point of kvmap.
//   plan     argument checks, every allocation and scratch buffer, generator state, output
//            metadata; anything may throw. Records the arguments every rank must pass alike
//            in a Signature, and may fill a payload every rank needs from every other.
//   agree    ONE collective: each rank's plan status, a hash of its signature and its
//            payload. If any rank's plan failed, every rank throws (the rank at fault its own
//            error, the others RemoteError); if signatures differ, ValueError/RemoteError
//            naming both calls. Nothing else communicates before it.
//   execute  MPI calls and kernels only. A failure here cannot be agreed any more (the
//            other ranks are inside the call's collectives): it ends the job with MPI_Abort
//            and a message, never a hang.
// Fault hooks (kvmap/impl/fault_injection.hpp) fire at the start of plan and of execute.
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvmap/comm.hpp"
#include "kvmap/dtype.hpp"
#include "kvmap/error.hpp"
#include "kvmap/impl/fault_injection.hpp"
#include "kvmap/layout.hpp"

namespace kvmap::Impl {

// The arguments of one call that must be the same on every rank, as text:
// "DistView::gather(comm=#1, root=0, layout=...)". Built with plain appends.
class Signature {
 public:
  Signature(const char* op, const Comm& comm);
  Signature& arg(const char* name, const std::string& value);
  Signature& arg(const char* name, const char* value) { return arg(name, std::string(value)); }
  Signature& arg(const char* name, std::int64_t value) { return arg(name, std::to_string(value)); }
  Signature& arg(const char* name, int value) { return arg(name, std::to_string(value)); }
  Signature& arg(const char* name, std::uint64_t value) { return arg(name, std::to_string(value)); }
  Signature& arg(const char* name, double value);
  Signature& arg(const char* name, DType value) {
    return arg(name, std::string(kvmap::name(value)));
  }
  Signature& arg(const char* name, const Layout& value) { return arg(name, value.str()); }
  Signature& arg(const char* name, const Shape& value) { return arg(name, to_string(value)); }
  Signature& arg(const char* name, std::optional<int> split);
  // A communicator an argument lives on (e.g. an input DistView's): by identity.
  Signature& arg(const char* name, const Comm& comm) {
    return arg(name, "#" + std::to_string(comm.id()));
  }
  std::string str() const { return text_ + ")"; }

 private:
  std::string text_;
  bool first_ = true;
};

struct NoPayload {
  char unused = 0;
};

// Writes the message to stderr and aborts every process of `comm`'s job.
[[noreturn]] void abort_after_agreement(const Comm& comm, const char* site,
                                        const std::exception_ptr& error);

// Ranks whose signature hash differs from rank 0's throw ValueError naming both calls, the
// others RemoteError (every rank has the same hashes, so all throw or none does).
void check_signatures(const Comm& comm, const char* site, const std::string& signature,
                      const std::vector<std::uint64_t>& hashes);
std::uint64_t signature_hash(const std::string& signature);

// Runs fn() after every rank has agreed to run the call: a failure ends the job.
template <class Fn>
decltype(auto) run_agreed(const char* site, const Comm& comm, Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    abort_after_agreement(comm, site, std::current_exception());
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

  // The one agreement (see above); every rank's payload, in rank order.
  std::vector<Payload> agree() {
    struct Packet {
      std::uint64_t hash;
      Payload payload;
    };
    const std::string text = signature_.str();
    const std::vector<Packet> all =
        comm_.agree_gather(error_, Packet{signature_hash(text), payload_});
    std::vector<std::uint64_t> hashes;
    std::vector<Payload> payloads;
    hashes.reserve(all.size());
    payloads.reserve(all.size());
    for (const Packet& p : all) {
      hashes.push_back(p.hash);
      payloads.push_back(p.payload);
    }
    check_signatures(comm_, site_, text, hashes);
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
  std::exception_ptr error_;
  bool agreed_ = false;
};

// The common case in one call: plan(signature, payload) -> Plan; agree;
// execute(plan, every rank's payload) -> the result.
template <class Payload = NoPayload, class PlanFn, class ExecFn>
decltype(auto) collective(const char* site, const Comm& comm, PlanFn&& plan, ExecFn&& execute) {
  Collective<Payload> call(site, comm);
  auto planned = call.plan(plan);
  const std::vector<Payload> all = call.agree();
  return call.execute([&]() -> decltype(auto) { return execute(*planned, all); });
}

}  // namespace kvmap::Impl
