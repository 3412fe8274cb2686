#include "detail/collective/collective.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "kvmap/error.hpp"

#include "detail/layout/hash.hpp"
#include "detail/platform/mpi_process.hpp"

namespace kvmap::Detail {

Signature::Signature(const char* op, const Comm& comm) : op_(op), hash_(fnv1a(kFnvOffset, op)) {
  arg("comm", comm);
}

Signature::Arg& Signature::push(const char* name, Kind kind, std::uint64_t bits) {
  hash_ = combine64(combine64(hash_, static_cast<std::uint64_t>(kind)), bits);
  Arg* a = nullptr;
  if (n_ < kInline) {
    a = &inline_args_[n_];
  } else {
    more_args_.emplace_back();
    a = &more_args_.back();
  }
  ++n_;
  a->name = name;
  a->kind = kind;
  a->ndim = 0;
  a->u = 0;
  return *a;
}

Signature& Signature::arg(const char* name, std::int64_t value) {
  push(name, Kind::Int, static_cast<std::uint64_t>(value)).i = value;
  return *this;
}

Signature& Signature::arg(const char* name, std::uint64_t value) {
  push(name, Kind::UInt, value).u = value;
  return *this;
}

Signature& Signature::arg(const char* name, double value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  push(name, Kind::Double, bits).d = value;
  return *this;
}

Signature& Signature::arg(const char* name, DType value) {
  push(name, Kind::DType, static_cast<std::uint64_t>(value)).i = static_cast<std::int64_t>(value);
  return *this;
}

Signature& Signature::arg(const char* name, const Layout& value) {
  push(name, Kind::Layout, value.fingerprint()).layout = &value;
  return *this;
}

Signature& Signature::arg(const char* name, const Shape& value) {
  std::uint64_t h = value.size();
  for (std::int64_t e : value) h = combine64(h, static_cast<std::uint64_t>(e));
  Arg& a = push(name, Kind::Shape, h);
  if (value.size() <= static_cast<std::size_t>(kShapeInline)) {
    a.ndim = static_cast<std::int8_t>(value.size());
    for (std::size_t d = 0; d < value.size(); ++d) a.shape[d] = value[d];
  } else {
    a.ndim = -1;
    a.u = value.size();
  }
  return *this;
}

Signature& Signature::arg(const char* name, std::optional<int> split) {
  const std::int64_t v = split ? *split : -1000;
  push(name, Kind::Split, static_cast<std::uint64_t>(v)).i = v;
  return *this;
}

Signature& Signature::arg(const char* name, const Comm& comm) {
  push(name, Kind::Comm, comm.id()).u = comm.id();
  return *this;
}

Signature& Signature::text(const char* name, const char* literal) {
  push(name, Kind::Text, fnv1a(kFnvOffset, literal)).text = literal;
  return *this;
}

Signature& Signature::ints(const char* name, const std::vector<std::int64_t>& values) {
  std::uint64_t h = values.size();
  for (std::int64_t v : values) h = combine64(h, static_cast<std::uint64_t>(v));
  push(name, Kind::Ints, h).ints = &values;
  return *this;
}

std::string Signature::str() const {
  std::ostringstream os;
  os.precision(17);
  os << op_ << "(";
  for (int k = 0; k < n_; ++k) {
    const Arg& a = k < kInline ? inline_args_[k] : more_args_[k - kInline];
    if (k) os << ", ";
    os << a.name << "=";
    switch (a.kind) {
      case Kind::Int: os << a.i; break;
      case Kind::UInt: os << a.u; break;
      case Kind::Double: os << a.d; break;
      case Kind::DType: os << name(static_cast<DType>(a.i)); break;
      case Kind::Layout: os << a.layout->str(); break;
      case Kind::Shape:
        if (a.ndim < 0) {
          os << "(a shape of " << a.u << " dimensions)";
        } else {
          os << to_string(Shape(a.shape, a.shape + a.ndim));
        }
        break;
      case Kind::Split:
        if (a.i == -1000) {
          os << "None";
        } else {
          os << a.i;
        }
        break;
      case Kind::Comm: os << "#" << a.u; break;
      case Kind::Text: os << a.text; break;
      case Kind::Ints: os << to_string(*a.ints); break;
    }
  }
  os << ")";
  return os.str();
}

void raise_gathered(const Comm& comm, const char* site, const std::exception_ptr& error,
                    const Signature& signature, const std::vector<std::uint32_t>& failed,
                    const std::vector<std::uint64_t>& fingerprints) {
  std::vector<int> failing;
  for (int r = 0; r < comm.size(); ++r) {
    if (failed[r]) failing.push_back(r);
  }
  if (!failing.empty()) {
    // The first failing rank's message to everyone; the failing ranks rethrow their own.
    const std::string first =
        Detail::transport(comm).bcast_string(message_of(error), failing.front());
    if (error) std::rethrow_exception(error);
    throw RemoteError(failing, first);
  }
  const std::vector<int> differing = ranks_differing(fingerprints, 0);
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

TwoDescriptions describe_two(const Comm& comm, int reference, int other, const std::string& mine) {
  TwoDescriptions two;
  two.reference = Detail::transport(comm).bcast_string(mine, reference);
  two.other = Detail::transport(comm).bcast_string(mine, other);
  return two;
}

void raise_differing(
    const Comm& comm, int reference, const std::vector<int>& differing, const std::string& mine,
    const std::function<std::string(int, const std::string&, const std::string&)>& message) {
  const TwoDescriptions two = describe_two(comm, reference, differing.front(), mine);
  if (std::find(differing.begin(), differing.end(), comm.rank()) != differing.end()) {
    throw ValueError(message(comm.rank(), mine, two.reference));
  }
  throw RemoteError(differing, message(differing.front(), two.other, two.reference));
}

void raise_disagreement(const Comm& comm, const char* site, const std::exception_ptr& error,
                        const Signature& signature) {
  struct Record {
    std::uint32_t failed;
    std::uint32_t unused;
    std::uint64_t fingerprint;
  };
  const std::vector<Record> all =
      Detail::transport(comm).allgather(Record{error ? 1u : 0u, 0u, signature.fingerprint()});
  std::vector<std::uint32_t> failed;
  std::vector<std::uint64_t> fingerprints;
  for (const Record& r : all) {
    failed.push_back(r.failed);
    fingerprints.push_back(r.fingerprint);
  }
  raise_gathered(comm, site, error, signature, failed, fingerprints);
}

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

}  // namespace kvmap::Detail
