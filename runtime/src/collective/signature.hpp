#pragma once
// The arguments of a collective call that every rank must pass alike, folded into a 64-bit
// fingerprint as they are recorded (the agreement compares fingerprints; agreement.hpp).
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "detail.hpp"
#include "kvmap/comm.hpp"
#include "kvmap/dtype.hpp"
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

}  // namespace kvmap::Detail
