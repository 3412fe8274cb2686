// The fingerprint and the text of a collective call's arguments (signature.hpp).
#include "signature.hpp"

#include <cstring>
#include <sstream>

#include "hash.hpp"

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

}  // namespace kvmap::Detail
