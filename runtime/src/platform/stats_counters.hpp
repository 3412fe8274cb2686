#pragma once
// The runtime's side of kvmap::stats(): what each module counts. Users read the counters
// (kvmap/stats.hpp); only kvmap writes them.
#include <cstdint>

#include "detail.hpp"
#include "kvmap/stats.hpp"

namespace kvmap {

namespace Detail {
void count_bytes_copied(std::uint64_t n);
void count_vmap_call();
void count_chunks(std::uint64_t n);
void count_collective();
void count_received(std::uint64_t n);
void count_plan_built();
void count_chunk_retry();
void record_auto_chunk(std::int64_t chunk_size, std::int64_t bytes_per_sample);
void count_allocation(std::uint64_t n);
void count_deallocation(std::uint64_t n);
// Kokkos allocations of kvmap still alive, empty ones included (each holds a Kokkos record).
std::int64_t live_allocations();
}  // namespace Detail

}  // namespace kvmap
