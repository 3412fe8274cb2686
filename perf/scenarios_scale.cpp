// Scenario "scale": what one call costs a rank as the number of ranks grows, beyond the
// machine's cores. kvmap's real code paths (vmap, balance, a factory) run on an emulated
// communicator of P ranks (kvmap::Detail::emulated_comm: this process plays one rank, no MPI
// call is made, every other rank is taken to do the same), timed and counted in bytes
// allocated per call; then a latency-bandwidth projection of the agreement and of balance at
// each P, with its parameters printed.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>

#include "harness.hpp"
#include "kvmap/kvmap.hpp"
#include "hooks.hpp"

namespace kvmap_perf {

namespace {

using View = kvmap::DistView<>;

// The per-rank figures the projection takes (printed with the results).
constexpr double kLatencyUs = 1.5;
constexpr double kBandwidthsGBs[] = {10.0, 25.0};

// Recursive doubling: ceil(log2 P) steps of one message of `bytes`.
double allreduce_us(int P, double bytes, double gbs) {
  const double steps = P > 1 ? std::ceil(std::log2(static_cast<double>(P))) : 0.0;
  return steps * (kLatencyUs + bytes / (gbs * 1e3));
}
// An all-gather of `bytes` per rank by recursive doubling: log2 P latencies, (P - 1) blocks.
double allgather_us(int P, double bytes, double gbs) {
  const double steps = P > 1 ? std::ceil(std::log2(static_cast<double>(P))) : 0.0;
  return steps * kLatencyUs + (P - 1) * bytes / (gbs * 1e3);
}

struct PerCall {
  Timing time;
  double bytes = 0;        // C++ allocations per call
  double allocations = 0;  // their number
};

PerCall per_call(const kvmap::Comm& world, const Settings& s, const std::function<void()>& op,
                 int reps) {
  op();  // warm: plans, caches
  count_allocations(true);
  const int counted = 20;
  for (int i = 0; i < counted; ++i) op();
  count_allocations(false);
  PerCall out;
  out.bytes = static_cast<double>(allocated_bytes()) / counted;
  out.allocations = static_cast<double>(allocations()) / counted;
  out.time = measure(world, s, op, reps);
  return out;
}

// Counts alternating around c (c - 1, c + 1, ...): every rank holds rows, balance moves one
// row between neighbours.
kvmap::Layout uneven(std::int64_t c, std::int64_t cols, int P) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) counts[r] = c + (P % 2 == 0 ? (r % 2 == 0 ? -1 : 1) : 0);
  std::int64_t n = 0;
  for (std::int64_t k : counts) n += k;
  return kvmap::Layout::from_counts({n, cols}, 0, std::move(counts));
}

// Rows this rank sends to / receives from other ranks in a balance from `from`, and the number
// of peers on each side: from the layouts alone.
struct Moves {
  double sent_bytes = 0, received_bytes = 0;
  int send_peers = 0, recv_peers = 0;
};
Moves balance_moves(const kvmap::Layout& from, int me, std::size_t row_bytes) {
  const kvmap::Layout to = kvmap::Layout::balanced(from.gshape(), 0, from.nranks());
  Moves m;
  auto side = [&](const kvmap::Layout& mine, const kvmap::Layout& theirs, double& bytes,
                  int& peers) {
    const std::int64_t lo = mine.offset(me), hi = lo + mine.count(me);
    if (hi <= lo) return;
    const auto [first, last] = theirs.ranks_meeting(lo, hi);
    for (int q = first; q < last; ++q) {
      if (q == me) continue;
      const std::int64_t a = std::max(lo, theirs.offset(q));
      const std::int64_t b = std::min(hi, theirs.offset(q) + theirs.count(q));
      if (b > a) {
        bytes += static_cast<double>(b - a) * static_cast<double>(row_bytes);
        ++peers;
      }
    }
  };
  side(from, to, m.sent_bytes, m.send_peers);
  side(to, from, m.received_bytes, m.recv_peers);
  return m;
}

}  // namespace

void scenario_scale(Report& report) {
  const kvmap::Comm& world = report.comm();
  const std::vector<int> ranks = {2, 1024, 16384, 131072};
  const std::int64_t local = 16, cols = 64;
  const int reps = report.settings().quick ? 50 : 200;
  std::map<std::string, double> at_two;
  auto f = [](const at::Tensor& v) { return v.sin() * 2 + 1; };
  auto vf = kvmap::vmap(f);
  for (int P : ranks) {
    report.progress("scale: emulated P = " + std::to_string(P));
    const int me = P / 2;
    const kvmap::Comm comm = kvmap::Detail::emulated_comm(me, P);
    const std::string at_p = " P=" + std::to_string(P);
    // Inputs of P ranks: this rank's shard, laid out balanced and uneven.
    View even = View::from_local(at::randn({local, cols}), 0, comm);
    const kvmap::Layout odd = uneven(local, cols, P);
    View skewed = even.redistribute(kvmap::Layout::balanced(odd.gshape(), 0, P)).redistribute(odd);
    require_same(even.layout().is_balanced() && even.local().size(0) == local, "scale",
                 "emulated from_local");
    require_same(vf(skewed).layout() == odd, "scale", "emulated vmap");
    const std::vector<std::pair<std::string, std::function<void()>>> calls = {
        {"vmap, balanced", [&] { View y = vf(even); }},
        {"vmap, uneven", [&] { View y = vf(skewed); }},
        {"balance, uneven", [&] { View y = skewed.balance(); }},
        {"zeros",
         [&] {
           View y = View::zeros({local * P, cols}, kvmap::DType::Float32, 0, comm);
         }},
    };
    for (const auto& [name, op] : calls) {
      const PerCall c = per_call(world, report.settings(), op, reps);
      if (P == ranks.front()) at_two[name] = c.time.median;
      report.add({"scale",
                  name + at_p,
                  "kvmap (emulated rank " + std::to_string(me) + ")",
                  c.time,
                  {{"bytes_allocated_per_call", c.bytes},
                   {"allocations_per_call", c.allocations},
                   {"over_P2", c.time.median / at_two[name]}},
                  {}});
    }
    // Projection at this P.
    const std::size_t row_bytes = cols * sizeof(float);
    const Moves m = balance_moves(odd, me, row_bytes);
    for (double gbs : kBandwidthsGBs) {
      // Built up by appends: GCC 12's -Wrestrict misfires on "literal" + std::string at -O3.
      std::string bw = " ";
      bw += std::to_string(static_cast<int>(gbs));
      bw += " GB/s";
      const double vmap_agreement = allreduce_us(P, 120.0, gbs);
      const double before = allgather_us(P, 664.0, gbs);
      report.add({"scale",
                  "vmap agreement" + at_p + bw,
                  "projected",
                  {},
                  {{"agreement_projected_us", vmap_agreement},
                   {"allgather_664B_us", before},
                   {"bytes_received", 120.0}},
                  {{"model", "MPI_Allreduce of 120 B by recursive doubling, latency 1.5 us"}}});
      const double exchange = std::max(m.send_peers, m.recv_peers) * kLatencyUs +
                              std::max(m.sent_bytes, m.received_bytes) / (gbs * 1e3);
      const double all_to_all =
          P * kLatencyUs + std::max(m.sent_bytes, m.received_bytes) / (gbs * 1e3);
      report.add({"scale",
                  "balance" + at_p + bw,
                  "projected",
                  {},
                  {{"balance_projected_us", allreduce_us(P, 32.0, gbs) + exchange},
                   {"alltoallv_us", allgather_us(P, 664.0, gbs) + all_to_all},
                   {"peers", static_cast<double>(m.send_peers + m.recv_peers)}},
                  {{"model",
                    "agreement (MPI_Allreduce of 32 B) + one latency per peer + bytes / bandwidth; "
                    "before: an allgather of 664 B + a pairwise all-to-all of P steps"}}});
    }
  }
  // What the agreement of one vmap call receives on this rank, on the real communicator.
  View x = View::from_local(at::randn({local, cols}), 0, world);
  (void)vf(x);
  const std::uint64_t before = kvmap::stats().bytes_received;
  (void)vf(x);
  report.add({"scale",
              "vmap agreement at " + std::to_string(world.size()) + " ranks (measured)",
              "kvmap::vmap",
              {},
              {{"bytes_received", static_cast<double>(kvmap::stats().bytes_received - before)}},
              {}});
  if (world.rank() == 0) {
    std::printf("scale: projection with latency %.1f us per message and %.0f or %.0f GB/s\n",
                kLatencyUs, kBandwidthsGBs[0], kBandwidthsGBs[1]);
  }
}

}  // namespace kvmap_perf
