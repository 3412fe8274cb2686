#include "collective.hpp"

#include <cstdio>
#include <sstream>

#include "kvmap/error.hpp"

namespace kvmap::Impl {

Signature::Signature(const char* op, const Comm& comm) : text_(op) {
  text_.reserve(256);
  text_ += "(";
  arg("comm", comm);
}

Signature& Signature::arg(const char* name, const std::string& value) {
  if (!first_) text_ += ", ";
  first_ = false;
  text_ += name;
  text_ += "=";
  text_ += value;
  return *this;
}

Signature& Signature::arg(const char* name, double value) {
  std::ostringstream os;
  os.precision(17);
  os << value;
  return arg(name, os.str());
}

Signature& Signature::arg(const char* name, std::optional<int> split) {
  return arg(name, split ? std::to_string(*split) : std::string("None"));
}

std::uint64_t signature_hash(const std::string& signature) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : signature) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void check_signatures(const Comm& comm, const char* site, const std::string& signature,
                      const std::vector<std::uint64_t>& hashes) {
  std::vector<int> differing;
  for (int r = 1; r < comm.size(); ++r) {
    if (hashes[r] != hashes[0]) differing.push_back(r);
  }
  if (differing.empty()) return;
  // Failure path only: every rank learns what the others passed.
  const std::vector<std::string> all = comm.allgather_strings(signature);
  std::vector<std::string> messages;
  messages.reserve(differing.size());
  for (int r : differing) {
    messages.push_back(std::string("kvmap: ") + site +
                       " is collective and needs the same arguments on every "
                       "rank, but rank " +
                       std::to_string(r) + " called " + all[r] + " while rank 0 called " + all[0]);
  }
  comm.raise_detected<ValueError>(differing, messages);
}

void abort_after_agreement(const Comm& comm, const char* site, const std::exception_ptr& error) {
  comm.abort(
      std::string("kvmap: ") + site + " failed on rank " + std::to_string(comm.rank()) +
      " after every rank had agreed to run it: " + message_of(error) +
      "\nkvmap: aborting the job, since the other ranks cannot leave the call's collectives");
}

}  // namespace kvmap::Impl
