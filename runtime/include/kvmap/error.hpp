#pragma once
/// \file
/// Exception types of kvmap and the checks that raise them.
#include "kvmap/config.hpp"
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

KVMAP_API_BEGIN
namespace kvmap {

/// Base of everything kvmap throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad values or shapes.
class ValueError : public Error {
 public:
  using Error::Error;
};

/// Bad dtype, device, memory space or kind of argument.
class TypeError : public Error {
 public:
  using Error::Error;
};

/// The function kvmap ran on a chunk ran out of memory. Front-ends raise it for their
/// language's own out-of-memory errors (Python's MemoryError, torch.OutOfMemoryError); the
/// scheduler treats it like std::bad_alloc and c10::OutOfMemoryError: it runs the chunk again
/// as two halves (VmapOptions).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

/// Thrown on ranks that did not fail themselves when another rank failed inside a
/// collective call. what() carries the first failing rank's message.
class RemoteError : public Error {
 public:
  /// `failed_ranks`: the ranks whose own check or function failed, ascending.
  RemoteError(std::vector<int> failed_ranks, const std::string& first_message);
  /// The ranks that failed, ascending (the same list on every rank).
  const std::vector<int>& failed_ranks() const noexcept { return failed_ranks_; }

 private:
  std::vector<int> failed_ranks_;
};

namespace Impl {
[[noreturn]] void throw_value_error(const std::string& message);
[[noreturn]] void throw_type_error(const std::string& message);
}  // namespace Impl

}  // namespace kvmap
KVMAP_API_END

/// \def KVMAP_CHECK(cond, ExceptionType, message)
/// Throws ExceptionType with the streamed `message` when `cond` is false:
/// `KVMAP_CHECK(s >= 0, kvmap::ValueError, "split " << s << " out of range")`.
// KVMAP_CHECK(cond, kvmap::ValueError, "split " << s << " out of range"): throws the given
// exception type with a streamed message when cond is false. `message` is a chain of <<
// operands, so it cannot be parenthesized; ExceptionType is a type.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KVMAP_CHECK(cond, ExceptionType, message)     \
  do {                                                \
    if (!(cond)) {                                    \
      std::ostringstream kvmap_check_stream_;         \
      kvmap_check_stream_ << message;                 \
      throw ExceptionType(kvmap_check_stream_.str()); \
    }                                                 \
  } while (false)
// NOLINTEND(bugprone-macro-parentheses)
