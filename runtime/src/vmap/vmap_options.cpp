// kvmap::VmapOptions: each setter checks its value where the user gives it.
#include "kvmap/error.hpp"
#include "kvmap/vmap.hpp"

namespace kvmap {

const char* name(Randomness r) {
  switch (r) {
    case Randomness::Error: return "error";
    case Randomness::Different: return "different";
    case Randomness::Same: return "same";
  }
  return "invalid";
}

VmapOptions& VmapOptions::out_dims(std::vector<std::int64_t> dims) {
  KVMAP_CHECK(!dims.empty(), ValueError, "kvmap::VmapOptions::out_dims: give at least one dim");
  out_dims_ = std::move(dims);
  out_dims_per_output_ = false;
  return *this;
}

VmapOptions& VmapOptions::out_dims_per_output(std::vector<std::int64_t> dims) {
  out_dims(std::move(dims));
  out_dims_per_output_ = true;
  return *this;
}

VmapOptions& VmapOptions::randomness(Randomness r) {
  KVMAP_CHECK(r == Randomness::Error || r == Randomness::Same || r == Randomness::Different,
              ValueError, "kvmap::VmapOptions::randomness: invalid value " << static_cast<int>(r));
  randomness_ = r;
  return *this;
}

VmapOptions& VmapOptions::chunk_size(std::optional<std::int64_t> c) {
  KVMAP_CHECK(!c || *c >= 1, ValueError,
              "kvmap::VmapOptions::chunk_size: expected a chunk size >= 1 or none, got " << *c);
  chunk_size_ = c;
  auto_chunk_ = false;
  return *this;
}

VmapOptions& VmapOptions::chunk_size(AutoChunk) {
  chunk_size_.reset();
  auto_chunk_ = true;
  return *this;
}

VmapOptions& VmapOptions::memory_budget(std::optional<std::int64_t> bytes) {
  KVMAP_CHECK(!bytes || *bytes >= 1, ValueError,
              "kvmap::VmapOptions::memory_budget: expected bytes >= 1 or none, got " << *bytes);
  memory_budget_ = bytes;
  return *this;
}

VmapOptions& VmapOptions::pad_to_chunk(bool pad) {
  pad_to_chunk_ = pad;
  return *this;
}

VmapOptions& VmapOptions::concurrency(int chunks_in_flight) {
  KVMAP_CHECK(chunks_in_flight >= 1, ValueError,
              "kvmap::VmapOptions::concurrency: expected >= 1, got " << chunks_in_flight);
  concurrency_ = chunks_in_flight;
  return *this;
}

}  // namespace kvmap
