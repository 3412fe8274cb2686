#include "kvmap/comm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "kvmap/config.hpp"
#include "kvmap/stats.hpp"
#include "detail/comm.hpp"
#include "detail/testing.hpp"
#include "detail/stats.hpp"

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
  MPI_Datatype type = MPI_DATATYPE_NULL;
  switch (dtype) {
#define KVMAP_DTYPE_TO_MPI(E, name, T, torch_type, mpi_type) \
  case DType::E: type = mpi_type; break;
    KVMAP_FOR_EACH_DTYPE(KVMAP_DTYPE_TO_MPI)
#undef KVMAP_DTYPE_TO_MPI
  }
  if (type == MPI_DATATYPE_NULL) {
    throw TypeError(std::string("kvmap: MPI reductions do not support dtype ") + name(dtype));
  }
  return type;
}

bool fits(std::size_t n) {
  return n <= g_count_limit.load();
}

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
  int emulated_rank = 0, emulated_size = 0;  // emulated_comm(): no MPI communicator
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
  if (emulated()) {
    rank_ = handle_->emulated_rank;
    size_ = handle_->emulated_size;
    return;
  }
  MPI_Comm_rank(handle_->comm, &rank_);
  MPI_Comm_size(handle_->comm, &size_);
}

bool Comm::emulated() const {
  return handle_->emulated_size > 0;
}

namespace Impl {
Comm CommAccess::make(std::shared_ptr<Comm::Handle> handle) {
  return Comm(std::move(handle));
}

Comm emulated_comm(int rank, int size) {
  KVMAP_CHECK(size >= 1 && rank >= 0 && rank < size, ValueError,
              "kvmap: an emulated communicator needs 0 <= rank < size, got rank " << rank << " of "
                                                                                  << size);
  auto h = std::make_shared<Comm::Handle>();
  h->emulated_rank = rank;
  h->emulated_size = size;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    h->id = ++g_last_id;
  }
  return CommAccess::make(std::move(h));
}
}  // namespace Impl

Comm::Comm() : Comm(world()) {}

Comm::Comm(MPI_Comm comm) : Comm(handle_for(comm)) {}

Comm Comm::world() {
  return Comm(MPI_COMM_WORLD);
}

Comm Comm::self() {
  return Comm(MPI_COMM_SELF);
}

MPI_Comm Comm::raw() const {
  KVMAP_CHECK(!emulated(), Error, "kvmap::Comm: an emulated communicator has no MPI communicator");
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
  if (emulated()) return;
  Impl::count_collective();
  check_mpi(MPI_Barrier(raw()), "MPI_Barrier");
}

void Comm::allgather_bytes(const void* mine, std::size_t nbytes, void* all) const {
  if (size_ == 1 || emulated()) {
    for (int r = 0; r < size_ && nbytes > 0; ++r)
      std::memcpy(static_cast<unsigned char*>(all) + nbytes * r, mine, nbytes);
    return;
  }
  Impl::count_collective();
  Impl::count_received(nbytes * static_cast<std::size_t>(size_));
  KVMAP_CHECK(fits(nbytes * static_cast<std::size_t>(size_)), Error,
              "kvmap: an all-gather of " << nbytes << " bytes per rank over " << size_
                                         << " ranks exceeds MPI's count limit");
  check_mpi(MPI_Allgather(mine, static_cast<int>(nbytes), MPI_BYTE, all, static_cast<int>(nbytes),
                          MPI_BYTE, raw()),
            "MPI_Allgather");
}

std::string Comm::bcast_string(const std::string& mine, int root) const {
  if (size_ == 1 || emulated()) return mine;  // root is taken to have passed this rank's string
  std::uint64_t length = mine.size();
  bcast_bytes(&length, sizeof length, root);
  std::string out = rank_ == root ? mine : std::string(length, '\0');
  if (length > 0) bcast_bytes(out.data(), length, root);
  return out;
}

namespace {
// The agreement's MPI operations (one per reduction function) and record datatypes (one per
// size), made on first use and freed before MPI_Finalize (release_cached_comms).
struct ReductionCache {
  std::mutex mutex;
  std::vector<std::pair<MPI_User_function*, MPI_Op>> ops;
  std::vector<std::pair<std::size_t, MPI_Datatype>> types;
};
ReductionCache& reduction_cache() {
  static ReductionCache cache;
  return cache;
}
}  // namespace

void Comm::allreduce_bytes(void* record, std::size_t nbytes, MPI_User_function* combine) const {
  if (size_ == 1 || emulated()) return;  // the one rank's record is the result
  Impl::count_collective();
  Impl::count_received(nbytes);
  MPI_Op op = MPI_OP_NULL;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  {
    ReductionCache& cache = reduction_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (const auto& [fn, o] : cache.ops) {
      if (fn == combine) op = o;
    }
    for (const auto& [n, t] : cache.types) {
      if (n == nbytes) type = t;
    }
    if (op == MPI_OP_NULL) {
      check_mpi(MPI_Op_create(combine, 1, &op), "MPI_Op_create");
      cache.ops.emplace_back(combine, op);
    }
    if (type == MPI_DATATYPE_NULL) {
      check_mpi(MPI_Type_contiguous(static_cast<int>(nbytes), MPI_BYTE, &type),
                "MPI_Type_contiguous");
      check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
      cache.types.emplace_back(nbytes, type);
    }
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, record, 1, type, op, raw()), "MPI_Allreduce");
}

void Comm::bcast_bytes(void* data, std::size_t nbytes, int root) const {
  if (size_ == 1 || emulated()) return;  // the root's bytes are already there
  Impl::count_collective();
  if (rank_ != root) Impl::count_received(nbytes);
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
  if (emulated()) return;
  Impl::count_collective();
  Impl::count_received(n * size_of(dtype));
  allreduce_in_pieces(raw(), data, n, dtype, MPI_SUM);
}

void Comm::allreduce_max(void* data, std::size_t n, DType dtype) const {
  if (emulated()) return;
  Impl::count_collective();
  Impl::count_received(n * size_of(dtype));
  KVMAP_CHECK(!is_complex(dtype), TypeError, "kvmap: max-reduction of complex values");
  allreduce_in_pieces(raw(), data, n, dtype, MPI_MAX);
}

void Comm::allgatherv_bytes(const void* send, int send_count, void* recv,
                            const std::vector<int>& counts, const std::vector<int>& displs) const {
  const auto n = static_cast<std::size_t>(size_);
  KVMAP_CHECK(counts.size() == n && displs.size() == n, ValueError,
              "kvmap: allgatherv needs one count and displacement per rank");
  if (emulated()) {  // every rank's block is this rank's, repeated where each rank's goes
    for (std::size_t r = 0; r < n; ++r) {
      const auto bytes = static_cast<std::size_t>(std::min(send_count, counts[r]));
      if (bytes > 0) std::memcpy(static_cast<unsigned char*>(recv) + displs[r], send, bytes);
    }
    return;
  }
  Impl::count_collective();
  for (int c : counts) Impl::count_received(static_cast<std::uint64_t>(c));
  if (n == 1) {
    // MPICH 4.0.2 ignores the displacement on a communicator of one rank (it copies to recv
    // itself): the displacement goes into the pointer instead.
    const int zero = 0;
    check_mpi(
        MPI_Allgatherv(send, send_count, MPI_BYTE, static_cast<unsigned char*>(recv) + displs[0],
                       counts.data(), &zero, MPI_BYTE, raw()),
        "MPI_Allgatherv");
    return;
  }
  check_mpi(MPI_Allgatherv(send, send_count, MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE,
                           raw()),
            "MPI_Allgatherv");
}

void Comm::Exchange::add(bool is_recv, int peer, std::size_t offset, std::size_t bytes) {
  // Pieces of at most the count limit; messages between one pair are non-overtaking, so the
  // receiver's pieces meet the sender's in order.
  const std::size_t limit = std::max<std::size_t>(1, g_count_limit.load());
  for (std::size_t done = 0; done < bytes; done += limit) {
    const std::size_t piece = std::min(limit, bytes - done);
    messages_.push_back(Message{peer, is_recv, static_cast<int>(piece), offset + done, piece, {}});
  }
  requests_.resize(messages_.size());
}

void Comm::Exchange::send(int peer, std::size_t offset, std::size_t bytes) {
  add(false, peer, offset, bytes);
}

void Comm::Exchange::recv(int peer, std::size_t offset, std::size_t bytes) {
  add(true, peer, offset, bytes);
}

void Comm::Exchange::send(int peer, Datatype type) {
  int bytes = 0;
  MPI_Type_size(type.raw(), &bytes);
  messages_.push_back(Message{peer, false, 1, 0, static_cast<std::size_t>(bytes), std::move(type)});
  requests_.resize(messages_.size());
}

void Comm::Exchange::recv(int peer, Datatype type) {
  int bytes = 0;
  MPI_Type_size(type.raw(), &bytes);
  messages_.push_back(Message{peer, true, 1, 0, static_cast<std::size_t>(bytes), std::move(type)});
  requests_.resize(messages_.size());
}

void Comm::run(Exchange& x, const void* send_base, void* recv_base) const {
  if (emulated()) return;
  constexpr int kTag = 0x6b76;
  const MPI_Comm c = raw();
  std::size_t k = 0;
  // Receives first, so that every send finds its receive posted.
  for (int pass = 0; pass < 2; ++pass) {
    const bool recvs = pass == 0;
    for (const Exchange::Message& m : x.messages_) {
      if (m.is_recv != recvs) continue;
      const MPI_Datatype type = m.type ? m.type.raw() : MPI_BYTE;
      if (recvs) {
        Impl::count_received(m.bytes);
        check_mpi(MPI_Irecv(static_cast<unsigned char*>(recv_base) + m.offset, m.count, type,
                            m.peer, kTag, c, &x.requests_[k++]),
                  "MPI_Irecv");
      } else {
        check_mpi(MPI_Isend(static_cast<const unsigned char*>(send_base) + m.offset, m.count, type,
                            m.peer, kTag, c, &x.requests_[k++]),
                  "MPI_Isend");
      }
    }
  }
  check_mpi(MPI_Waitall(static_cast<int>(k), x.requests_.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
}

Comm::PeerTypes::PeerTypes(int nranks)
    : counts_(static_cast<std::size_t>(nranks), 0),
      displs_(static_cast<std::size_t>(nranks), 0),
      types_(static_cast<std::size_t>(nranks), MPI_BYTE),
      owned_(static_cast<std::size_t>(nranks)) {}

void Comm::PeerTypes::set(int peer, Datatype type) {
  int bytes = 0;
  MPI_Type_size(type.raw(), &bytes);
  bytes_ += static_cast<std::size_t>(bytes);
  counts_[peer] = 1;
  types_[peer] = type.raw();
  owned_[peer] = std::move(type);
}

void Comm::alltoallw(const void* send, const PeerTypes& send_types, void* recv,
                     const PeerTypes& recv_types) const {
  if (emulated()) return;
  Impl::count_collective();
  const auto n = static_cast<std::size_t>(size_);
  for (const PeerTypes* t : {&send_types, &recv_types}) {
    KVMAP_CHECK(t->counts_.size() == n, ValueError,
                "kvmap: alltoallw needs one count, displacement and datatype per rank");
  }
  Impl::count_received(recv_types.bytes_);
  check_mpi(MPI_Alltoallw(send, send_types.counts_.data(), send_types.displs_.data(),
                          send_types.types_.data(), recv, recv_types.counts_.data(),
                          recv_types.displs_.data(), recv_types.types_.data(), raw()),
            "MPI_Alltoallw");
}

namespace {
void check_type(int rc) {
  KVMAP_CHECK(rc == MPI_SUCCESS, Error, "kvmap: building an MPI datatype failed (" << rc << ")");
}
}  // namespace

Comm::Datatype Comm::box_type(const std::vector<std::int64_t>& extents,
                              const std::vector<std::int64_t>& byte_strides, std::size_t itemsize,
                              std::size_t offset) {
  const std::size_t limit = g_count_limit.load();
  // The innermost contiguous run as one piece, hvectors over the outer strides.
  int d = static_cast<int>(extents.size()) - 1;
  auto run = static_cast<std::int64_t>(itemsize);
  while (d >= 0 && (extents[d] == 1 || byte_strides[d] == run)) {
    run *= extents[d];
    --d;
  }
  KVMAP_CHECK(static_cast<std::size_t>(run) <= limit, ValueError,
              "kvmap: a contiguous run of " << run << " bytes exceeds MPI's count limit");
  MPI_Datatype t = MPI_DATATYPE_NULL;
  check_type(MPI_Type_contiguous(static_cast<int>(run), MPI_BYTE, &t));
  for (; d >= 0; --d) {
    if (extents[d] == 1) continue;
    if (static_cast<std::size_t>(extents[d]) > limit) {
      MPI_Type_free(&t);
      throw ValueError("kvmap: an extent of " + std::to_string(extents[d]) +
                       " exceeds MPI's count limit");
    }
    MPI_Datatype outer = MPI_DATATYPE_NULL;
    check_type(MPI_Type_create_hvector(static_cast<int>(extents[d]), 1,
                                       static_cast<MPI_Aint>(byte_strides[d]), t, &outer));
    MPI_Type_free(&t);
    t = outer;
  }
  int one = 1;
  const auto at = static_cast<MPI_Aint>(offset);
  MPI_Datatype placed = MPI_DATATYPE_NULL;
  check_type(MPI_Type_create_struct(1, &one, &at, &t, &placed));
  MPI_Type_free(&t);
  check_type(MPI_Type_commit(&placed));
  Datatype out;
  out.type_ = std::shared_ptr<MPI_Datatype>(new MPI_Datatype(placed), [](MPI_Datatype* p) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Type_free(p);
    delete p;
  });
  return out;
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

void Comm::abort(const std::string& message) const {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  // The launcher forwards a rank's output asynchronously, and MPICH's Hydra drops what it has
  // not forwarded when the abort reaches it: give it a moment to pass the message on.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  // The whole job: MPICH (4.0.2) ends only the caller when given another communicator, and
  // leaves the other ranks waiting in the call's collectives.
  MPI_Abort(MPI_COMM_WORLD, 70);
  std::abort();
}

namespace Impl {
std::vector<void (*)()>& release_hooks() {
  static std::vector<void (*)()> hooks;
  return hooks;
}
void on_release(void (*hook)()) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  release_hooks().push_back(hook);
}
std::size_t mpi_count_limit() {
  return g_count_limit.load();
}
void set_mpi_count_limit(std::size_t limit) {
  g_count_limit = std::min<std::size_t>(std::max<std::size_t>(limit, 1), INT_MAX);
}
std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  return std::string(text, static_cast<std::size_t>(length));
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
  {
    ReductionCache& cache = reduction_cache();
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (auto& [fn, op] : cache.ops) MPI_Op_free(&op);
    for (auto& [n, type] : cache.types) MPI_Type_free(&type);
    cache.ops.clear();
    cache.types.clear();
  }
  for (void (*hook)() : release_hooks()) hook();
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
