#pragma once
// A local shard as kvmap stores it, independent of memory space and element type
// (the DistView holds the DType). Implementation detail of the public headers.
#include "kvmap/config.hpp"
#include <cstdint>
#include <memory>
#include <vector>

KVMAP_API_BEGIN
namespace kvmap {
namespace Impl {

inline constexpr int kMaxRank = 8;

struct LocalBlock {
  void* data = nullptr;
  std::vector<std::int64_t> extents;  // local shape
  std::vector<std::int64_t> strides;  // in elements, non-negative
  std::shared_ptr<void> owner;        // keeps the memory alive (Kokkos view, tensor, ...)
};

}  // namespace Impl
}  // namespace kvmap
KVMAP_API_END
