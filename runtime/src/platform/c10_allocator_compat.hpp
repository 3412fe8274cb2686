#pragma once
// The c10::Allocator interface across the LibTorch versions kvmap builds with (1.13, 2.x): one
// owner for the allocators kvmap puts in torch's CPU slot (host_allocator.cpp, and the tests'
// counting allocator, testing/memory_meter.cpp). LibTorch 2.3 made allocate() non-const and
// requires copy_data(); 1.13 has a const allocate() and no copy_data().
#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// Written after `allocate(std::size_t n)` in a derived c10::Allocator.
#define KVMAP_C10_ALLOCATE_CONST
// Whether c10::Allocator declares copy_data (pure virtual) and default_copy_data.
#define KVMAP_C10_ALLOCATOR_COPY_DATA 1
#else
#define KVMAP_C10_ALLOCATE_CONST const
#define KVMAP_C10_ALLOCATOR_COPY_DATA 0
#endif
