#include "kvmap/stats.hpp"
#include "gpu_aware_mpi.hpp"
#include "stats_counters.hpp"

#include <atomic>

namespace kvmap {

namespace {
struct Counters {
  std::atomic<std::uint64_t> bytes_copied{0};
  std::atomic<std::uint64_t> vmap_calls{0};
  std::atomic<std::uint64_t> chunks_run{0};
  std::atomic<std::uint64_t> collectives{0};
  std::atomic<std::uint64_t> bytes_received{0};
  std::atomic<std::uint64_t> bytes_allocated{0};
  std::atomic<std::int64_t> bytes_live{0};
  std::atomic<std::int64_t> allocations_live{0};  // zero-byte blocks included
  std::atomic<std::uint64_t> plans_built{0};
  std::atomic<std::uint64_t> chunk_retries{0};
  std::atomic<std::int64_t> auto_chunk_size{0};
  std::atomic<std::int64_t> auto_bytes_per_sample{0};
};
Counters& counters() {
  static Counters c;
  return c;
}
}  // namespace

Stats stats() {
  Counters& c = counters();
  Stats s;
  s.bytes_copied = c.bytes_copied.load();
  s.vmap_calls = c.vmap_calls.load();
  s.chunks_run = c.chunks_run.load();
  s.collectives = c.collectives.load();
  s.bytes_received = c.bytes_received.load();
  s.bytes_allocated = c.bytes_allocated.load();
  s.bytes_live = c.bytes_live.load();
  s.plans_built = c.plans_built.load();
  s.chunk_retries = c.chunk_retries.load();
  s.auto_chunk_size = c.auto_chunk_size.load();
  s.auto_bytes_per_sample = c.auto_bytes_per_sample.load();
  s.gpu_aware_mpi = Detail::gpu_aware_mpi_if_decided();
  return s;
}

void reset_stats() {
  Counters& c = counters();
  c.bytes_copied = 0;
  c.vmap_calls = 0;
  c.chunks_run = 0;
  c.collectives = 0;
  c.bytes_received = 0;
  c.bytes_allocated = 0;
  c.plans_built = 0;
  c.chunk_retries = 0;
  c.auto_chunk_size = 0;
  c.auto_bytes_per_sample = 0;
}

namespace Detail {
void count_bytes_copied(std::uint64_t n) {
  counters().bytes_copied += n;
}
void count_vmap_call() {
  ++counters().vmap_calls;
}
void count_chunks(std::uint64_t n) {
  counters().chunks_run += n;
}
void count_collective() {
  ++counters().collectives;
}
void count_received(std::uint64_t n) {
  counters().bytes_received += n;
}
void count_plan_built() {
  ++counters().plans_built;
}
void count_chunk_retry() {
  ++counters().chunk_retries;
}
void record_auto_chunk(std::int64_t chunk_size, std::int64_t bytes_per_sample) {
  counters().auto_chunk_size = chunk_size;
  counters().auto_bytes_per_sample = bytes_per_sample;
}
void count_allocation(std::uint64_t n) {
  counters().bytes_allocated += n;
  counters().bytes_live += static_cast<std::int64_t>(n);
  ++counters().allocations_live;
}
void count_deallocation(std::uint64_t n) {
  counters().bytes_live -= static_cast<std::int64_t>(n);
  --counters().allocations_live;
}
std::int64_t live_allocations() {
  return counters().allocations_live.load();
}
}  // namespace Detail

}  // namespace kvmap
