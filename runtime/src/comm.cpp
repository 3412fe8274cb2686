#include "kvmap/comm.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "kvmap/config.hpp"
#include "kvmap/stats.hpp"

namespace kvmap {

namespace {

std::atomic<std::size_t> g_count_limit{static_cast<std::size_t>(INT_MAX)};

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("kvmap: ") + call + " failed: " + std::string(text, len));
}

void require_mpi() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    throw Error(
        "kvmap: MPI is not initialized (create a kvmap::ScopeGuard, or call MPI_Init, first)");
  }
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::Bool: return MPI_C_BOOL;
    case DType::UInt8: return MPI_UINT8_T;
    case DType::Int8: return MPI_INT8_T;
    case DType::Int16: return MPI_INT16_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Int64: return MPI_INT64_T;
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Complex64: return MPI_C_FLOAT_COMPLEX;
    case DType::Complex128: return MPI_C_DOUBLE_COMPLEX;
    case DType::Float16:
    case DType::BFloat16: break;
  }
  throw TypeError(std::string("kvmap: MPI reductions do not support dtype ") + name(dtype));
}

bool fits(std::size_t n) {
  return n <= g_count_limit.load();
}
std::atomic<bool> g_force_host_staging{false};

}  // namespace

// One duplicate per user communicator, shared by every Comm made of it: found again through
// an MPI attribute on the user's communicator, so making a Comm of a communicator kvmap
// already knows is local (no MPI_Comm_dup per call, as from Python), and its stream counter
// (next_sequence) is the user communicator's. Duplicates are freed together, by increasing
// id (the same order on every rank), in release_cached_comms() before MPI_Finalize: never
// when a Comm is destroyed, since garbage collection (Python's) destroys them at different
// times on different ranks. The user may free their communicator at any time after making a
// Comm of it; the duplicate stays usable.
struct Comm::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  std::uint64_t id = 0;  // the same on every rank of the communicator, unique in the process
  std::mutex sequence_mutex;
  std::uint64_t sequence_epoch = 0;
  std::uint64_t sequence = 0;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

namespace {

std::mutex g_registry_mutex;
int g_keyval = MPI_KEYVAL_INVALID;
std::uint64_t g_last_id = 0;
std::map<std::uint64_t, std::shared_ptr<Comm::Handle>> g_registry;

// Frees the duplicate (collective over it); later calls on copies of the Comm throw.
void free_duplicate(const std::shared_ptr<Comm::Handle>& handle) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && handle->comm != MPI_COMM_NULL) MPI_Comm_free(&handle->comm);
  handle->comm = MPI_COMM_NULL;
}

}  // namespace

std::shared_ptr<Comm::Handle> Comm::handle_for(MPI_Comm user) {
  require_mpi();
  KVMAP_CHECK(user != MPI_COMM_NULL, ValueError,
              "kvmap::Comm: MPI_COMM_NULL is not a communicator");
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    if (g_keyval == MPI_KEYVAL_INVALID) {
      check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &g_keyval,
                                       nullptr),
                "MPI_Comm_create_keyval");
    }
    void* value = nullptr;
    int found = 0;
    check_mpi(MPI_Comm_get_attr(user, g_keyval, &value, &found), "MPI_Comm_get_attr");
    if (found) {
      auto it =
          g_registry.find(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(value)));
      if (it != g_registry.end()) return it->second;
    }
  }
  // New to kvmap: duplicate it (collective) and agree on an id no rank has used yet.
  auto h = std::make_shared<Handle>();
  check_mpi(MPI_Comm_dup(user, &h->comm), "MPI_Comm_dup");
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    id = g_last_id + 1;
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &id, 1, MPI_UINT64_T, MPI_MAX, h->comm), "MPI_Allreduce");
  h->id = id;
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_last_id = std::max(g_last_id, id);
  g_registry[id] = h;
  // The attribute value is the id itself, not a pointer (MPI attributes are void*).
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  void* const value = reinterpret_cast<void*>(static_cast<std::uintptr_t>(id));
  check_mpi(MPI_Comm_set_attr(user, g_keyval, value), "MPI_Comm_set_attr");
  return h;
}

Comm::Comm(std::shared_ptr<Handle> handle) : handle_(std::move(handle)) {
  MPI_Comm_rank(handle_->comm, &rank_);
  MPI_Comm_size(handle_->comm, &size_);
}

Comm::Comm() : Comm(world()) {}

Comm::Comm(MPI_Comm comm) : Comm(handle_for(comm)) {}

Comm Comm::world() {
  return Comm(MPI_COMM_WORLD);
}

Comm Comm::self() {
  return Comm(MPI_COMM_SELF);
}

MPI_Comm Comm::raw() const {
  KVMAP_CHECK(handle_->comm != MPI_COMM_NULL, Error,
              "kvmap::Comm: the communicator was freed (its MPI communicator was freed, or MPI "
              "is finalizing)");
  return handle_->comm;
}

std::uint64_t Comm::id() const {
  return handle_->id;
}

Comm Comm::from_fortran(std::int64_t handle) {
  return Comm(MPI_Comm_f2c(static_cast<MPI_Fint>(handle)));
}

std::uint64_t Comm::next_sequence(std::uint64_t epoch) const {
  std::lock_guard<std::mutex> lock(handle_->sequence_mutex);
  if (handle_->sequence_epoch != epoch) {
    handle_->sequence_epoch = epoch;
    handle_->sequence = 0;
  }
  return ++handle_->sequence;
}

void Comm::barrier() const {
  Impl::count_collective();
  check_mpi(MPI_Barrier(raw()), "MPI_Barrier");
}

void Comm::allgather_bytes(const void* mine, std::size_t nbytes, void* all) const {
  Impl::count_collective();
  if (fits(nbytes * static_cast<std::size_t>(size_))) {
    check_mpi(MPI_Allgather(mine, static_cast<int>(nbytes), MPI_BYTE, all, static_cast<int>(nbytes),
                            MPI_BYTE, raw()),
              "MPI_Allgather");
    return;
  }
  std::vector<std::size_t> counts(size_, nbytes), displs(size_);
  for (int r = 0; r < size_; ++r) displs[r] = nbytes * static_cast<std::size_t>(r);
  allgatherv_bytes(mine, nbytes, all, counts, displs);
}

std::vector<std::string> Comm::allgather_strings(const std::string& mine) const {
  const std::vector<std::uint64_t> lengths = allgather<std::uint64_t>(mine.size());
  std::vector<std::size_t> counts(size_), displs(size_);
  std::size_t total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = lengths[r];
    displs[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  allgatherv_bytes(mine.data(), mine.size(), all.data(), counts, displs);
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) out[r] = all.substr(displs[r], counts[r]);
  return out;
}

void Comm::bcast_bytes(void* data, std::size_t nbytes, int root) const {
  if (size_ == 1) return;  // the root's bytes are already there
  Impl::count_collective();
  const std::size_t limit = std::max<std::size_t>(1, g_count_limit.load());
  auto* p = static_cast<unsigned char*>(data);
  // Every rank knows nbytes, so every rank cuts the same pieces.
  std::size_t done = 0;
  do {
    const std::size_t piece = std::min(limit, nbytes - done);
    check_mpi(MPI_Bcast(p + done, static_cast<int>(piece), MPI_BYTE, root, raw()), "MPI_Bcast");
    done += piece;
  } while (done < nbytes);
}

namespace {
// In-place reduction in pieces of at most the MPI count limit (the same pieces on every
// rank, since every rank passes the same n).
void allreduce_in_pieces(MPI_Comm comm, void* data, std::size_t n, DType dtype, MPI_Op op) {
  const std::size_t limit = std::max<std::size_t>(1, g_count_limit.load());
  auto* p = static_cast<unsigned char*>(data);
  const std::size_t elem = size_of(dtype);
  std::size_t done = 0;
  do {
    const std::size_t piece = std::min(limit, n - done);
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + done * elem, static_cast<int>(piece), mpi_type(dtype),
                            op, comm),
              "MPI_Allreduce");
    done += piece;
  } while (done < n);
}
}  // namespace

void Comm::allreduce_sum(void* data, std::size_t n, DType dtype) const {
  Impl::count_collective();
  allreduce_in_pieces(raw(), data, n, dtype, MPI_SUM);
}

void Comm::allreduce_max(void* data, std::size_t n, DType dtype) const {
  Impl::count_collective();
  KVMAP_CHECK(!is_complex(dtype), TypeError, "kvmap: max-reduction of complex values");
  allreduce_in_pieces(raw(), data, n, dtype, MPI_MAX);
}

namespace {
// Pairwise exchange in pieces of at most `limit` bytes; used above the MPI count limit.
void exchange_in_pieces(MPI_Comm comm, int rank, int size, const unsigned char* send,
                        const std::vector<std::size_t>& send_counts,
                        const std::vector<std::size_t>& send_displs, unsigned char* recv,
                        const std::vector<std::size_t>& recv_counts,
                        const std::vector<std::size_t>& recv_displs) {
  const std::size_t limit = std::max<std::size_t>(1, g_count_limit.load());
  std::vector<MPI_Request> requests;
  auto post = [&](bool is_recv, int peer, std::size_t count, std::size_t displ) {
    std::size_t piece_index = 0;
    for (std::size_t done = 0; done < count; done += limit, ++piece_index) {
      const int n = static_cast<int>(std::min(limit, count - done));
      // Messages between one pair are non-overtaking, so wrapping tags keep the order.
      const int tag = static_cast<int>(piece_index % 32768);
      MPI_Request req;
      if (is_recv) {
        check_mpi(MPI_Irecv(recv + displ + done, n, MPI_BYTE, peer, tag, comm, &req), "MPI_Irecv");
      } else {
        check_mpi(MPI_Isend(send + displ + done, n, MPI_BYTE, peer, tag, comm, &req), "MPI_Isend");
      }
      requests.push_back(req);
    }
  };
  for (int p = 0; p < size; ++p) {
    if (p != rank) post(true, p, recv_counts[p], recv_displs[p]);
  }
  for (int k = 1; k < size; ++k) {
    const int p = (rank + k) % size;
    post(false, p, send_counts[p], send_displs[p]);
  }
  // Its own part too goes through MPI (a message to itself), never a host memcpy: with a
  // GPU-aware MPI these are device pointers.
  post(true, rank, recv_counts[rank], recv_displs[rank]);
  post(false, rank, send_counts[rank], send_displs[rank]);
  check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
}

std::vector<int> to_int(const std::vector<std::size_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}
}  // namespace

void Comm::alltoallv_bytes(const void* send, const std::vector<std::size_t>& send_counts,
                           const std::vector<std::size_t>& send_displs, void* recv,
                           const std::vector<std::size_t>& recv_counts,
                           const std::vector<std::size_t>& recv_displs,
                           std::size_t global_max) const {
  Impl::count_collective();
  const auto n = static_cast<std::size_t>(size_);
  KVMAP_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n &&
                  recv_displs.size() == n,
              ValueError, "kvmap: alltoallv needs one count and displacement per rank");
  if (fits(global_max)) {
    const auto sc = to_int(send_counts), sd = to_int(send_displs), rc = to_int(recv_counts),
               rd = to_int(recv_displs);
    check_mpi(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                            MPI_BYTE, raw()),
              "MPI_Alltoallv");
    return;
  }
  exchange_in_pieces(raw(), rank_, size_, static_cast<const unsigned char*>(send), send_counts,
                     send_displs, static_cast<unsigned char*>(recv), recv_counts, recv_displs);
}

void Comm::alltoallw(const void* send, const PeerTypes& send_types, void* recv,
                     const PeerTypes& recv_types) const {
  Impl::count_collective();
  const auto n = static_cast<std::size_t>(size_);
  for (const PeerTypes* t : {&send_types, &recv_types}) {
    KVMAP_CHECK(t->counts.size() == n && t->displs.size() == n && t->types.size() == n, ValueError,
                "kvmap: alltoallw needs one count, displacement and datatype per rank");
  }
  check_mpi(MPI_Alltoallw(send, send_types.counts.data(), send_types.displs.data(),
                          send_types.types.data(), recv, recv_types.counts.data(),
                          recv_types.displs.data(), recv_types.types.data(), raw()),
            "MPI_Alltoallw");
}

void Comm::allgatherv_bytes(const void* send, std::size_t send_count, void* recv,
                            const std::vector<std::size_t>& counts,
                            const std::vector<std::size_t>& displs) const {
  Impl::count_collective();
  const auto n = static_cast<std::size_t>(size_);
  KVMAP_CHECK(counts.size() == n && displs.size() == n, ValueError,
              "kvmap: allgatherv needs one count and displacement per rank");
  KVMAP_CHECK(counts[rank_] == send_count, ValueError,
              "kvmap: allgatherv send count " << send_count << " differs from counts[" << rank_
                                              << "] = " << counts[rank_]);
  std::size_t global_max = 0;
  for (std::size_t r = 0; r < n; ++r) global_max = std::max(global_max, displs[r] + counts[r]);
  if (fits(global_max)) {
    const auto c = to_int(counts), d = to_int(displs);
    check_mpi(MPI_Allgatherv(send, static_cast<int>(send_count), MPI_BYTE, recv, c.data(), d.data(),
                             MPI_BYTE, raw()),
              "MPI_Allgatherv");
    return;
  }
  std::vector<std::size_t> send_counts(n, send_count), send_displs(n, 0);
  exchange_in_pieces(raw(), rank_, size_, static_cast<const unsigned char*>(send), send_counts,
                     send_displs, static_cast<unsigned char*>(recv), counts, displs);
}

std::string message_of(const std::exception_ptr& error) {
  if (!error) return {};
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

void Comm::agree(const std::exception_ptr& local_error) const {
  agree_gather_bytes(local_error, nullptr, 0);
}

std::vector<unsigned char> Comm::agree_gather_bytes(const std::exception_ptr& local_error,
                                                    const void* payload, std::size_t nbytes) const {
  // One rank agrees with itself: no MPI call.
  if (size_ == 1) {
    if (local_error) std::rethrow_exception(local_error);
    const auto* p = static_cast<const unsigned char*>(payload);
    return nbytes > 0 ? std::vector<unsigned char>(p, p + nbytes) : std::vector<unsigned char>();
  }
  constexpr std::size_t kHeader = 8;  // status word, padded so payloads stay aligned
  const std::size_t stride = kHeader + nbytes;
  std::vector<unsigned char> mine(stride, 0), all(stride * static_cast<std::size_t>(size_));
  const std::int32_t failed_flag = local_error ? 1 : 0;
  std::memcpy(mine.data(), &failed_flag, sizeof failed_flag);
  if (nbytes > 0) std::memcpy(mine.data() + kHeader, payload, nbytes);
  allgather_bytes(mine.data(), stride, all.data());

  std::vector<int> failed;
  for (int r = 0; r < size_; ++r) {
    std::int32_t flag = 0;
    std::memcpy(&flag, all.data() + stride * r, sizeof flag);
    if (flag) failed.push_back(r);
  }
  if (!failed.empty()) {
    // Only on the failure path: the failing ranks' messages travel to everyone.
    const std::vector<std::string> messages = allgather_strings(message_of(local_error));
    if (local_error) std::rethrow_exception(local_error);
    throw_remote(failed, messages[failed.front()]);
  }
  std::vector<unsigned char> payloads(nbytes * static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (nbytes > 0)
      std::memcpy(payloads.data() + nbytes * r, all.data() + stride * r + kHeader, nbytes);
  }
  return payloads;
}

void Comm::abort(const std::string& message) const {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(handle_->comm != MPI_COMM_NULL ? handle_->comm : MPI_COMM_WORLD, 70);
  std::abort();
}

void Comm::throw_remote(const std::vector<int>& failed, const std::string& first) const {
  throw RemoteError(failed, first);
}

namespace Impl {
std::size_t mpi_count_limit() {
  return g_count_limit.load();
}
void set_mpi_count_limit(std::size_t limit) {
  g_count_limit = std::min<std::size_t>(std::max<std::size_t>(limit, 1), INT_MAX);
}
bool mpi_reads_directly(bool host_accessible) {
  if (!host_accessible) return KVMAP_GPU_AWARE_MPI != 0;
  return !g_force_host_staging.load();
}
void set_force_host_staging(bool force) {
  g_force_host_staging = force;
}
bool mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

bool init_mpi(int& argc, char**& argv) {
  int provided = MPI_THREAD_SINGLE;
  if (mpi_initialized()) {
    MPI_Query_thread(&provided);
    KVMAP_CHECK(provided >= MPI_THREAD_FUNNELED, Error,
                "kvmap: MPI was initialized with thread level "
                    << provided << ", kvmap needs at least MPI_THREAD_FUNNELED");
    return false;
  }
  check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    throw Error("kvmap: MPI provides no MPI_THREAD_FUNNELED support");
  }
  return true;
}

void finalize_mpi() {
  release_cached_comms();
  MPI_Finalize();
}

void release_cached_comms() {
  // By increasing id: the same order on every rank.
  std::map<std::uint64_t, std::shared_ptr<Comm::Handle>> all;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    all.swap(g_registry);
  }
  for (auto& [id, handle] : all) free_duplicate(handle);
}
}  // namespace Impl

}  // namespace kvmap
