// kvmap::GhostExchange (kvmap/ghost_exchange.hpp): its routes found in the sparse rounds of
// arithmetic/ghost_plan.hpp, then forward and reverse as torch kernels on the tensor's device
// around the transport's point-to-point messages. Every call: plan (checks, every buffer and
// message) -> one agreement -> execute (kernels and MPI only).
#include "kvmap/ghost_exchange.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "agreement.hpp"
#include "ghost_state.hpp"
#include "ghost_plan.hpp"
#include "ghost_rows.hpp"
#include "gpu_aware_mpi.hpp"
#include "kvmap/error.hpp"
#include "kvmap/tensor_bridge.hpp"
#include "mpi_transport.hpp"
#include "stats_counters.hpp"
#include "tensor_blocks.hpp"
#include "torch_stream.hpp"

namespace kvmap::Detail {

namespace {

at::Tensor ghost_index(const std::vector<std::int64_t>& rows, std::int64_t shift = 0) {
  at::Tensor t = at::tensor(rows, at::TensorOptions().dtype(at::kLong));
  return shift == 0 ? t : t.add_(shift);
}

std::vector<std::int64_t> ids_of(const at::Tensor& ids, const char* what) {
  KVMAP_CHECK(ids.defined() && ids.dim() == 1, ValueError,
              "kvmap::GhostExchange: " << what << " must be a 1-D tensor of int64 ids");
  KVMAP_CHECK(ids.scalar_type() == at::kLong, TypeError,
              "kvmap::GhostExchange: " << what << " must be int64, got " << ids.scalar_type());
  const at::Tensor host = ids.to(at::kCPU).contiguous();
  const std::int64_t* p = host.data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(p, p + host.numel());
}

void check_owned_distinct(const std::vector<std::int64_t>& owned) {
  std::vector<std::int64_t> sorted(owned);
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  KVMAP_CHECK(twice == sorted.end(), ValueError,
              "kvmap::GhostExchange: owned id " << *twice
                                                << " is listed twice on this rank (a rank's "
                                                   "owned ids must be distinct)");
}

// One call: its tensors, buffers and messages, made before the agreement.
struct GhostCall {
  const GhostIndices* idx = nullptr;
  at::Tensor in, out;
  at::Tensor sent, received;            // packed rows: [rows_sent, ...], [rows_received, ...]
  at::Tensor gathered, own;             // ghost rows from received rows; from this rank's own rows
  at::Tensor sent_host, received_host;  // host copies (staged only)
  bool staged = false;
  bool host = false;  // the rows moved by ghost_rows.hpp's host loops (no gathered / own)
  Messages messages;
};

// Forward messages receive the owners' rows into `received` and send `sent`; reverse ones the
// other way round.
GhostCall plan_ghost_call(GhostPlan& plan, const at::Tensor& x, bool reverse, bool in_place,
                          const char* who, Signature& sig, const Shape& rows_shape) {
  KVMAP_CHECK(x.defined() && x.dim() >= 1, ValueError,
              who << ": the tensor must have at least one dimension (rows: owned + ghosts)");
  const DType dtype = from_torch(x.scalar_type());  // TypeError for unsupported dtypes
  KVMAP_CHECK(!(reverse && dtype == DType::Bool), TypeError,
              who << ": gradients of bool tensors have no sum");
  sig.arg("dtype", dtype).arg("row shape", rows_shape);
  KVMAP_CHECK(x.size(0) == plan.owned + plan.ghosts, ValueError,
              who << ": the tensor has " << x.size(0) << " rows, the plan " << plan.owned
                  << " owned + " << plan.ghosts << " ghost rows on this rank");
  GhostCall c;
  c.idx = &plan.on(x.device());
  c.in = x;
  const at::TensorOptions opts = x.options().memory_format(at::MemoryFormat::Contiguous);
  KVMAP_CHECK(!in_place || x.is_contiguous(), ValueError,
              who << ": the tensor must be contiguous (its ghost rows are filled in place)");
  c.out = in_place ? x : at::empty(x.sizes(), opts);
  auto rows = [&](std::int64_t n) {
    std::vector<std::int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape[0] = n;
    return at::empty(shape, opts);
  };
  const GhostRoutes& r = plan.routes;
  c.sent = rows(r.rows_sent);
  c.received = rows(r.rows_received);
  c.host = host_rows_apply(x, reverse);
  c.gathered = rows(c.host ? 0 : static_cast<std::int64_t>(r.remote_ghost.size()));
  c.own = rows(c.host ? 0 : static_cast<std::int64_t>(r.self_ghost.size()));
  c.staged = !mpi_reads_directly(x.is_cpu());
  if (c.staged) {
    c.sent_host = at::empty(c.sent.sizes(), c.sent.options().device(at::kCPU));
    c.received_host = at::empty(c.received.sizes(), c.received.options().device(at::kCPU));
  }
  const auto per_row = static_cast<std::size_t>(ghost_row_bytes(x));
  std::size_t offset = 0;
  for (const GhostRoutes::Count& p : r.recvs) {
    const std::size_t bytes = static_cast<std::size_t>(p.rows) * per_row;
    if (reverse)
      c.messages.send(p.peer, offset, bytes);
    else
      c.messages.recv(p.peer, offset, bytes);
    offset += bytes;
  }
  offset = 0;
  for (const GhostRoutes::Peer& p : r.sends) {
    const std::size_t bytes = p.rows.size() * per_row;
    if (reverse)
      c.messages.recv(p.peer, offset, bytes);
    else
      c.messages.send(p.peer, offset, bytes);
    offset += bytes;
  }
  return c;
}

// `from` to the peers, into `to` (through host copies when staged).
void run_ghost_messages(const Transport& transport, GhostCall& c, const at::Tensor& from,
                        const at::Tensor& from_host, at::Tensor& to, at::Tensor& to_host) {
  if (c.messages.size() == 0) return;
  const void* send = from.data_ptr();
  void* recv = to.data_ptr();
  if (c.staged) {
    from_host.copy_(from);
    count_bytes_copied(bytes_of(from));
    send = from_host.data_ptr();
    recv = to_host.data_ptr();
  }
  finish_torch_work(from);
  transport.run(c.messages, send, recv);
  if (c.staged) {
    to.copy_(to_host);
    count_bytes_copied(bytes_of(to));
  }
}

void run_ghost_forward(const Transport& transport, const GhostRoutes& r, std::int64_t owned,
                       GhostCall& c) {
  if (c.host) {
    const auto row = static_cast<std::size_t>(ghost_row_bytes(c.in));
    const bool in_place = c.out.data_ptr() == c.in.data_ptr();
    host_forward_local(r, owned, c.in, c.out, c.sent);
    count_bytes_copied(row *
                           static_cast<std::size_t>((in_place ? 0 : owned) + r.self_ghost.size()) +
                       bytes_of(c.sent));
    run_ghost_messages(transport, c, c.sent, c.sent_host, c.received, c.received_host);
    host_forward_remote(r, owned, c.received, c.out);
    count_bytes_copied(row * r.remote_ghost.size());
    return;
  }
  const GhostIndices& idx = *c.idx;
  const at::Tensor mine = c.in.narrow(0, 0, owned);
  if (c.out.data_ptr() != c.in.data_ptr()) {
    c.out.narrow(0, 0, owned).copy_(mine);
    count_bytes_copied(bytes_of(mine));
  }
  if (c.sent.size(0) > 0) {
    at::index_select_out(c.sent, mine, 0, idx.send_rows);
    count_bytes_copied(bytes_of(c.sent));
  }
  if (c.own.size(0) > 0) {
    at::index_select_out(c.own, mine, 0, idx.self_row);
    c.out.index_copy_(0, idx.self_dst, c.own);
    count_bytes_copied(2 * bytes_of(c.own));
  }
  run_ghost_messages(transport, c, c.sent, c.sent_host, c.received, c.received_host);
  if (c.gathered.size(0) > 0) {
    at::index_select_out(c.gathered, c.received, 0, idx.remote_pos);
    c.out.index_copy_(0, idx.remote_dst, c.gathered);
    count_bytes_copied(2 * bytes_of(c.gathered));
  }
}

void run_ghost_reverse(const Transport& transport, const GhostRoutes& r, std::int64_t owned,
                       GhostCall& c) {
  if (c.host) {
    const auto row = static_cast<std::size_t>(ghost_row_bytes(c.in));
    host_reverse_local(r, owned, c.in, c.out, c.received);
    count_bytes_copied(row * static_cast<std::size_t>(owned + r.remote_ghost.size()));
    run_ghost_messages(transport, c, c.received, c.received_host, c.sent, c.sent_host);
    host_reverse_remote(r, owned, c.in, c.sent, c.out);
    count_bytes_copied(bytes_of(c.sent) + row * r.self_ghost.size());
    return;
  }
  const GhostIndices& idx = *c.idx;
  at::Tensor mine = c.out.narrow(0, 0, owned);
  mine.copy_(c.in.narrow(0, 0, owned));
  count_bytes_copied(bytes_of(mine));
  c.out.narrow(0, owned, c.out.size(0) - owned).zero_();
  if (c.gathered.size(0) > 0) {
    at::index_select_out(c.gathered, c.in, 0, idx.remote_dst);
    c.received.zero_();
    c.received.index_add_(0, idx.remote_pos, c.gathered);
    count_bytes_copied(2 * bytes_of(c.gathered));
  }
  run_ghost_messages(transport, c, c.received, c.received_host, c.sent, c.sent_host);
  if (c.sent.size(0) > 0) {
    mine.index_add_(0, idx.send_rows, c.sent);
    count_bytes_copied(bytes_of(c.sent));
  }
  if (c.own.size(0) > 0) {
    at::index_select_out(c.own, c.in, 0, idx.self_dst);
    mine.index_add_(0, idx.self_row, c.own);
    count_bytes_copied(2 * bytes_of(c.own));
  }
}

at::Tensor run_ghost_call(GhostPlan& plan, const at::Tensor& x, bool reverse, bool in_place) {
  // The messages are invisible to autograd: results carry no history (the operators in
  // ghost_ops.cpp are the differentiable form).
  const c10::NoGradGuard no_grad;
  const char* who = reverse    ? "kvmap::GhostExchange::reverse"
                    : in_place ? "kvmap::GhostExchange::forward_"
                               : "kvmap::GhostExchange::forward";
  Shape rows_shape;
  if (x.defined() && x.dim() >= 1) rows_shape.assign(x.sizes().begin() + 1, x.sizes().end());
  const auto start = std::chrono::steady_clock::now();
  struct Account {  // the call's time, also when it fails
    GhostPlan& plan;
    bool reverse;
    std::chrono::steady_clock::time_point start;
    ~Account() {
      const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start)
                                  .count();
      (reverse ? plan.reverse_ns : plan.forward_ns) += ns;
      ++(reverse ? plan.reverse_calls : plan.forward_calls);
    }
  } account{plan, reverse, start};
  return collective(
      who, plan.comm,
      [&](Signature& sig, NoPayload&) {
        return plan_ghost_call(plan, x, reverse, in_place, who, sig, rows_shape);
      },
      [&](GhostCall& c, const NoPayload&) {
        const Transport& t = transport(plan.comm);
        if (reverse)
          run_ghost_reverse(t, plan.routes, plan.owned, c);
        else
          run_ghost_forward(t, plan.routes, plan.owned, c);
        return c.out;
      });
}

using IdLists = std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>;

// How many ranks found a problem in the rounds (an id owned twice, a ghost id nobody owns).
struct LookupFailures {
  std::uint32_t ranks = 0;
  static void combine(const LookupFailures& in, LookupFailures& inout) { inout.ranks += in.ranks; }
};

// Collective: the routes, or an error on every rank. The ids are checked first; every rank
// then takes part in the rounds (a rank whose ids failed with none), finishes its routes and
// records any problem they showed; one agreement reports the checks' failures, or else the
// rounds' problems.
template <class Ids>
std::shared_ptr<GhostPlan> build_ghost_plan(const Comm& comm, Ids&& ids) {
  constexpr const char* who = "kvmap::GhostExchange";
  Collective<LookupFailures> call(who, comm);
  std::optional<IdLists> lists = call.plan([&](Signature&, LookupFailures&) {
    IdLists l = ids();
    check_owned_distinct(l.first);
    return l;
  });
  const Transport& t = transport(comm);
  const int P = comm.size();
  const std::vector<std::int64_t> none;
  const std::vector<std::int64_t>& owned = lists ? lists->first : none;
  const std::vector<std::int64_t>& ghosts = lists ? lists->second : none;
  DirectoryAnswer answer;
  std::vector<IdMessage> records;
  run_agreed(who, comm, [&] {
    const std::vector<IdMessage> owned_in = t.sparse_exchange(to_directories(owned, P), 0);
    const std::vector<IdMessage> queries_in = t.sparse_exchange(to_directories(ghosts, P), 1);
    answer = answer_queries(owned_in, queries_in);
    records = t.sparse_exchange(answer.records, 2);
  });
  auto plan = std::make_shared<GhostPlan>();
  std::exception_ptr late;
  try {
    KVMAP_CHECK(answer.problem.empty(), ValueError, who << ": " << answer.problem);
    plan->comm = comm;
    plan->owned = static_cast<std::int64_t>(owned.size());
    plan->ghosts = static_cast<std::int64_t>(ghosts.size());
    plan->routes = finish_routes(comm.rank(), owned, ghosts, records);
    KVMAP_CHECK(plan->routes.problem.empty(), ValueError, who << ": " << plan->routes.problem);
  } catch (...) {
    late = std::current_exception();
  }
  call.plan([&](Signature&, LookupFailures& f) {
    f.ranks = late ? 1 : 0;
    return 0;
  });
  const bool any_late = call.reduce().payload.ranks > 0;
  call.judge_late(late, any_late);
  return plan;
}

}  // namespace

GhostPlan::~GhostPlan() {
  if (handle != 0) forget_ghost_handle(handle);
}

const GhostIndices& GhostPlan::on(const c10::Device& device) {
  std::lock_guard<std::mutex> lock(mutex);
  if (indices.empty()) {
    GhostIndices cpu;
    std::vector<std::int64_t> sends;
    for (const GhostRoutes::Peer& p : routes.sends)
      sends.insert(sends.end(), p.rows.begin(), p.rows.end());
    cpu.send_rows = ghost_index(sends);
    cpu.remote_dst = ghost_index(routes.remote_ghost, owned);
    cpu.remote_pos = ghost_index(routes.remote_pos);
    cpu.self_dst = ghost_index(routes.self_ghost, owned);
    cpu.self_row = ghost_index(routes.self_row);
    indices.push_back(std::move(cpu));
  }
  for (const GhostIndices& i : indices) {
    if (i.device == device) return i;
  }
  const GhostIndices& cpu = indices.front();
  GhostIndices d;
  d.device = device;
  d.send_rows = cpu.send_rows.to(device);
  d.remote_dst = cpu.remote_dst.to(device);
  d.remote_pos = cpu.remote_pos.to(device);
  d.self_dst = cpu.self_dst.to(device);
  d.self_row = cpu.self_row.to(device);
  indices.push_back(std::move(d));
  return indices.back();
}

}  // namespace kvmap::Detail

namespace kvmap {

GhostExchange::GhostExchange(const std::vector<std::int64_t>& owned_ids,
                             const std::vector<std::int64_t>& ghost_ids, const Comm& comm)
    : plan_(Detail::build_ghost_plan(comm, [&] { return Detail::IdLists(owned_ids, ghost_ids); })) {
}

GhostExchange::GhostExchange(const at::Tensor& owned_ids, const at::Tensor& ghost_ids,
                             const Comm& comm)
    : plan_(Detail::build_ghost_plan(comm, [&] {
        return Detail::IdLists(Detail::ids_of(owned_ids, "owned_ids"),
                               Detail::ids_of(ghost_ids, "ghost_ids"));
      })) {}

at::Tensor GhostExchange::forward(const at::Tensor& x) const {
  return Detail::run_ghost_call(*plan_, x, false, false);
}

at::Tensor& GhostExchange::forward_(at::Tensor& x) const {
  Detail::run_ghost_call(*plan_, x, false, true);
  return x;
}

at::Tensor GhostExchange::reverse(const at::Tensor& g) const {
  return Detail::run_ghost_call(*plan_, g, true, false);
}

std::int64_t GhostExchange::owned() const {
  return plan_->owned;
}
std::int64_t GhostExchange::ghosts() const {
  return plan_->ghosts;
}
std::int64_t GhostExchange::rows_sent() const {
  return plan_->routes.rows_sent;
}
std::int64_t GhostExchange::rows_received() const {
  return plan_->routes.rows_received;
}
int GhostExchange::peers() const {
  std::vector<int> ranks;
  for (const auto& p : plan_->routes.sends) ranks.push_back(p.peer);
  for (const auto& p : plan_->routes.recvs) ranks.push_back(p.peer);
  std::sort(ranks.begin(), ranks.end());
  return static_cast<int>(std::unique(ranks.begin(), ranks.end()) - ranks.begin());
}
const Comm& GhostExchange::comm() const {
  return plan_->comm;
}
GhostExchange::Usage GhostExchange::usage() const {
  Usage u;
  u.forward_calls = plan_->forward_calls.load();
  u.reverse_calls = plan_->reverse_calls.load();
  u.forward_seconds = 1e-9 * static_cast<double>(plan_->forward_ns.load());
  u.reverse_seconds = 1e-9 * static_cast<double>(plan_->reverse_ns.load());
  return u;
}

}  // namespace kvmap
