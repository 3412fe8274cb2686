#pragma once
// One vmap or map_batches call as the scheduler sees it, fixed before anything runs: the
// mapped arrays, the tensors f also receives (for the no-aliasing rule), the communicator,
// the device, the options, and f itself.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail.hpp"
#include "kvmap/dtype.hpp"
#include "kvmap/layout.hpp"
#include "kvmap/vmap.hpp"
#include "local_block.hpp"
#include "tensor_blocks.hpp"

namespace kvmap::Detail {

// Allocates an output's block in the DistViews' memory space.
using Allocate = LocalBlock (*)(const std::vector<std::int64_t>&, std::size_t);

// One DistView argument as the core sees it (its block keeps the memory alive).
struct ArrayArg {
  const LocalBlock& block;  // the DistView's own (vmap_core's copies), alive for the call
  DType dtype;
  const Layout& layout;  // split axis normalized; the DistView's own, alive for the call
  std::uint64_t comm_id;
};

inline const char* name_of(Mapping mapping) {
  return mapping == Mapping::Samples ? "kvmap::vmap" : "kvmap::map_batches";
}

struct VmapCall {
  const std::vector<ArrayArg>& arrays;
  const std::vector<MemorySpan>& tensor_spans;  // the tensor arguments' memory (no aliasing)
  const Comm& comm;
  DeviceSpec device;
  const VmapOptions& options;
  Mapping mapping;
  const ArgsCall& f;  // f on the chunk's inputs
  Allocate allocate;  // blocks in the DistViews' memory space
  bool per_sample() const { return mapping == Mapping::Samples; }
  const char* who() const { return name_of(mapping); }
};

}  // namespace kvmap::Detail
