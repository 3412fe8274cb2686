#pragma once
// KVMAP_HOST_ALLOCATOR_MIB: kvmap's host allocator installed from the environment
// (host_allocator.cpp), when libkvmap is loaded and again when kvmap starts (runtime.cpp).
#include "detail.hpp"

namespace kvmap::Detail {

// Installs kvmap's host allocator with KVMAP_HOST_ALLOCATOR_MIB MiB of cache, once per process,
// where the variable is set and not 0. Throws kvmap::ValueError for a value that is not a whole
// number of MiB.
void apply_host_allocator_environment();

}  // namespace kvmap::Detail
