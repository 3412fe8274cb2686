#include "kvmap/error.hpp"

#include <sstream>

namespace kvmap {

namespace {
std::string remote_message(const std::vector<int>& ranks, const std::string& first) {
  std::ostringstream os;
  os << "kvmap: failed on rank" << (ranks.size() > 1 ? "s " : " ");
  for (std::size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << ": " << first;
  return os.str();
}
}  // namespace

RemoteError::RemoteError(std::vector<int> failed_ranks, const std::string& first_message)
    : Error(remote_message(failed_ranks, first_message)), failed_ranks_(std::move(failed_ranks)) {}

namespace Impl {
void throw_value_error(const std::string& message) {
  throw ValueError(message);
}
void throw_type_error(const std::string& message) {
  throw TypeError(message);
}
}  // namespace Impl

}  // namespace kvmap
