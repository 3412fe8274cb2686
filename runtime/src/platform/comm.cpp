#include "kvmap/comm.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "kvmap/error.hpp"
#include "comm_registry.hpp"
#include "mpi_process.hpp"
#include "mpi_transport.hpp"

namespace kvmap {

// One duplicate per user communicator, shared by every Comm made of it: found again through
// an MPI attribute on the user's communicator, so making a Comm of a communicator kvmap
// already knows is local (no MPI_Comm_dup per call, as from Python), and its stream counter
// (next_sequence) is the user communicator's. Duplicates are freed together, by increasing
// id (the same order on every rank), in release_cached_comms() before MPI_Finalize: never
// when a Comm is destroyed, since garbage collection (Python's) destroys them at different
// times on different ranks. The user may free their communicator at any time after making a
// Comm of it; the duplicate stays usable.
struct Comm::Handle {
  std::unique_ptr<Detail::Transport> transport;  // MPI, or emulated (chosen when made)
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

}  // namespace

std::shared_ptr<Comm::Handle> Comm::handle_for(MPI_Comm user) {
  Detail::require_mpi();
  KVMAP_CHECK(user != MPI_COMM_NULL, ValueError,
              "kvmap::Comm: MPI_COMM_NULL is not a communicator");
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    if (g_keyval == MPI_KEYVAL_INVALID) {
      Detail::check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN,
                                               &g_keyval, nullptr),
                        "MPI_Comm_create_keyval");
    }
    void* value = nullptr;
    int found = 0;
    Detail::check_mpi(MPI_Comm_get_attr(user, g_keyval, &value, &found), "MPI_Comm_get_attr");
    if (found) {
      auto it =
          g_registry.find(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(value)));
      if (it != g_registry.end()) return it->second;
    }
  }
  // New to kvmap: duplicate it and agree on an id no rank has used yet (two collectives of
  // the duplicate's transport, counted in stats()).
  auto h = std::make_shared<Handle>();
  h->transport = Detail::duplicate_transport(user);
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    id = g_last_id + 1;
  }
  // (Ids count duplicates made in this process: far below 2^63.)
  h->id = static_cast<std::uint64_t>(h->transport->allreduce_max(static_cast<std::int64_t>(id)));
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  g_last_id = std::max(g_last_id, id);
  g_registry[id] = h;
  // The attribute value is the id itself, not a pointer (MPI attributes are void*).
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  void* const value = reinterpret_cast<void*>(static_cast<std::uintptr_t>(id));
  Detail::check_mpi(MPI_Comm_set_attr(user, g_keyval, value), "MPI_Comm_set_attr");
  return h;
}

Comm::Comm(std::shared_ptr<Handle> handle)
    : handle_(std::move(handle)),
      rank_(handle_->transport->rank()),
      size_(handle_->transport->size()) {}

namespace Detail {
Comm CommAccess::make(std::shared_ptr<Comm::Handle> handle) {
  return Comm(std::move(handle));
}

const Transport& CommAccess::transport(const Comm& comm) {
  return *comm.handle_->transport;
}

std::uint64_t CommAccess::next_sequence(const Comm& comm, std::uint64_t epoch) {
  Comm::Handle& h = *comm.handle_;
  std::lock_guard<std::mutex> lock(h.sequence_mutex);
  if (h.sequence_epoch != epoch) {
    h.sequence_epoch = epoch;
    h.sequence = 0;
  }
  return ++h.sequence;
}

const Transport& transport(const Comm& comm) {
  return CommAccess::transport(comm);
}

Comm comm_over(std::unique_ptr<Transport> transport) {
  auto h = std::make_shared<Comm::Handle>();
  h->transport = std::move(transport);
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    h->id = ++g_last_id;
  }
  return CommAccess::make(std::move(h));
}

std::vector<void (*)()>& release_hooks() {
  static std::vector<void (*)()> hooks;
  return hooks;
}

void on_release(void (*hook)()) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  release_hooks().push_back(hook);
}

void release_cached_comms() {
  release_reduction_cache();
  for (void (*hook)() : release_hooks()) hook();
  // By increasing id: the same order on every rank.
  std::map<std::uint64_t, std::shared_ptr<Comm::Handle>> all;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    all.swap(g_registry);
  }
  for (auto& [id, handle] : all) handle->transport->release();
}
}  // namespace Detail

Comm::Comm() : Comm(world()) {}

Comm::Comm(MPI_Comm comm) : Comm(handle_for(comm)) {}

Comm Comm::world() {
  return Comm(MPI_COMM_WORLD);
}

Comm Comm::self() {
  return Comm(MPI_COMM_SELF);
}

MPI_Comm Comm::raw() const {
  return handle_->transport->raw();
}

std::uint64_t Comm::id() const {
  return handle_->id;
}

Comm Comm::from_fortran(std::int64_t handle) {
  return Comm(MPI_Comm_f2c(static_cast<MPI_Fint>(handle)));
}

void Comm::barrier() const {
  handle_->transport->barrier();
}

}  // namespace kvmap
