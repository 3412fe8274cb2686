#include "mpi_transport.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <utility>

#include "kvmap/error.hpp"
#include "comm_registry.hpp"
#include "mpi_process.hpp"
#include "stats_counters.hpp"
#include "switches.hpp"

namespace kvmap::Detail {

namespace {

bool fits(std::size_t n) {
  return n <= test_switches().mpi_count_limit.load();
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

// In-place reduction in pieces of at most the MPI count limit (the same pieces on every
// rank, since every rank passes the same n).
void allreduce_in_pieces(MPI_Comm comm, void* data, std::size_t n, DType dtype, MPI_Op op) {
  const std::size_t limit = std::max<std::size_t>(1, test_switches().mpi_count_limit.load());
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

// An all-gather's counts and displacements: one of each per rank; returns the rank count.
std::size_t check_per_rank(const std::vector<int>& counts, const std::vector<int>& displs,
                           int size) {
  const auto n = static_cast<std::size_t>(size);
  KVMAP_CHECK(counts.size() == n && displs.size() == n, ValueError,
              "kvmap: allgatherv needs one count and displacement per rank");
  return n;
}

void check_type(int rc) {
  KVMAP_CHECK(rc == MPI_SUCCESS, Error, "kvmap: building an MPI datatype failed (" << rc << ")");
}

}  // namespace

// ---- MPI ----------------------------------------------------------------------------------

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(MPI_Comm comm) : Transport(comm_rank(comm), comm_size(comm)), comm_(comm) {}

  MPI_Comm raw() const override {
    KVMAP_CHECK(comm_ != MPI_COMM_NULL, Error,
                "kvmap::Comm: the communicator was freed (its MPI communicator was freed, or MPI "
                "is finalizing)");
    return comm_;
  }

  void release() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  void barrier() const override {
    count_collective();
    check_mpi(MPI_Barrier(raw()), "MPI_Barrier");
  }

  void allgather_bytes(const void* mine, std::size_t nbytes, void* all) const override {
    if (size() == 1) {
      if (nbytes > 0) std::memcpy(all, mine, nbytes);
      return;
    }
    count_collective();
    count_received(nbytes * static_cast<std::size_t>(size()));
    KVMAP_CHECK(fits(nbytes * static_cast<std::size_t>(size())), Error,
                "kvmap: an all-gather of " << nbytes << " bytes per rank over " << size()
                                           << " ranks exceeds MPI's count limit");
    check_mpi(MPI_Allgather(mine, static_cast<int>(nbytes), MPI_BYTE, all, static_cast<int>(nbytes),
                            MPI_BYTE, raw()),
              "MPI_Allgather");
  }

  void bcast_bytes(void* data, std::size_t nbytes, int root) const override {
    if (size() == 1) return;  // the root's bytes are already there
    count_collective();
    if (rank() != root) count_received(nbytes);
    const std::size_t limit = std::max<std::size_t>(1, test_switches().mpi_count_limit.load());
    auto* p = static_cast<unsigned char*>(data);
    // Every rank knows nbytes, so every rank cuts the same pieces.
    std::size_t done = 0;
    do {
      const std::size_t piece = std::min(limit, nbytes - done);
      check_mpi(MPI_Bcast(p + done, static_cast<int>(piece), MPI_BYTE, root, raw()), "MPI_Bcast");
      done += piece;
    } while (done < nbytes);
  }

  std::string bcast_string(const std::string& mine, int root) const override {
    if (size() == 1) return mine;
    std::uint64_t length = mine.size();
    bcast_bytes(&length, sizeof length, root);
    std::string out = rank() == root ? mine : std::string(length, '\0');
    if (length > 0) bcast_bytes(out.data(), length, root);
    return out;
  }

  void allreduce_bytes(void* record, std::size_t nbytes,
                       MPI_User_function* combine) const override {
    if (size() == 1) return;  // the one rank's record is the result
    count_collective();
    count_received(nbytes);
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

  void allreduce(void* data, std::size_t n, DType dtype, Reduction op) const override {
    count_collective();
    count_received(n * size_of(dtype));
    if (op == Reduction::Max) {
      KVMAP_CHECK(!is_complex(dtype), TypeError, "kvmap: max-reduction of complex values");
    }
    allreduce_in_pieces(raw(), data, n, dtype, op == Reduction::Sum ? MPI_SUM : MPI_MAX);
  }

  void allgatherv_bytes(const void* send, int send_count, void* recv,
                        const std::vector<int>& counts,
                        const std::vector<int>& displs) const override {
    const std::size_t n = check_per_rank(counts, displs, size());
    count_collective();
    for (int c : counts) count_received(static_cast<std::uint64_t>(c));
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
    check_mpi(MPI_Allgatherv(send, send_count, MPI_BYTE, recv, counts.data(), displs.data(),
                             MPI_BYTE, raw()),
              "MPI_Allgatherv");
  }

  void run(Messages& x, const void* send_base, void* recv_base) const override {
    constexpr int kTag = 0x6b76;
    const MPI_Comm c = raw();
    std::size_t k = 0;
    // Receives first, so that every send finds its receive posted.
    for (int pass = 0; pass < 2; ++pass) {
      const bool recvs = pass == 0;
      for (const Messages::Message& m : x.messages_) {
        if (m.is_recv != recvs) continue;
        const MPI_Datatype type = m.type ? m.type.raw() : MPI_BYTE;
        if (recvs) {
          count_received(m.bytes);
          check_mpi(MPI_Irecv(static_cast<unsigned char*>(recv_base) + m.offset, m.count, type,
                              m.peer, kTag, c, &x.requests_[k++]),
                    "MPI_Irecv");
        } else {
          check_mpi(MPI_Isend(static_cast<const unsigned char*>(send_base) + m.offset, m.count,
                              type, m.peer, kTag, c, &x.requests_[k++]),
                    "MPI_Isend");
        }
      }
    }
    check_mpi(MPI_Waitall(static_cast<int>(k), x.requests_.data(), MPI_STATUSES_IGNORE),
              "MPI_Waitall");
  }

  void alltoallw(const void* send, const PeerTypes& send_types, void* recv,
                 const PeerTypes& recv_types) const override {
    count_collective();
    const auto n = static_cast<std::size_t>(size());
    for (const PeerTypes* t : {&send_types, &recv_types}) {
      KVMAP_CHECK(t->counts_.size() == n, ValueError,
                  "kvmap: alltoallw needs one count, displacement and datatype per rank");
    }
    count_received(recv_types.bytes_);
    check_mpi(MPI_Alltoallw(send, send_types.counts_.data(), send_types.displs_.data(),
                            send_types.types_.data(), recv, recv_types.counts_.data(),
                            recv_types.displs_.data(), recv_types.types_.data(), raw()),
              "MPI_Alltoallw");
  }

  std::vector<IdMessage> sparse_exchange(std::vector<IdMessage> sends, int round) const override {
    const int kTag = 0x6b80 + (round & 7);
    const MPI_Comm c = raw();
    std::vector<IdMessage> received;
    std::vector<MPI_Request> requests;
    requests.reserve(sends.size());
    for (IdMessage& m : sends) {
      if (m.peer == rank()) {
        received.push_back(std::move(m));
        continue;
      }
      KVMAP_CHECK(
          fits(m.words.size()), Error,
          "kvmap: a plan message of " << m.words.size() << " ids exceeds MPI's count limit");
      requests.emplace_back();
      check_mpi(MPI_Issend(m.words.data(), static_cast<int>(m.words.size()), MPI_INT64_T, m.peer,
                           kTag, c, &requests.back()),
                "MPI_Issend");
    }
    // Receive what arrives until every send of this rank was received (synchronous sends
    // complete then) and, after that, every rank's (the barrier completes).
    MPI_Request barrier = MPI_REQUEST_NULL;
    bool in_barrier = false;
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kTag, c, &arrived, &status), "MPI_Iprobe");
      if (arrived) {
        int count = 0;
        MPI_Get_count(&status, MPI_INT64_T, &count);
        IdMessage m{status.MPI_SOURCE, std::vector<std::int64_t>(static_cast<std::size_t>(count))};
        check_mpi(MPI_Recv(m.words.data(), count, MPI_INT64_T, status.MPI_SOURCE, kTag, c,
                           MPI_STATUS_IGNORE),
                  "MPI_Recv");
        count_received(static_cast<std::uint64_t>(count) * sizeof(std::int64_t));
        received.push_back(std::move(m));
      }
      int done = 0;
      if (!in_barrier) {
        check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                              MPI_STATUSES_IGNORE),
                  "MPI_Testall");
        if (done) {
          count_collective();
          check_mpi(MPI_Ibarrier(c, &barrier), "MPI_Ibarrier");
          in_barrier = true;
        }
      } else {
        check_mpi(MPI_Test(&barrier, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) break;
      }
    }
    return received;
  }

  NodeRank node_rank() const override {
    count_collective();
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(raw(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    NodeRank r;
    MPI_Comm_rank(node, &r.rank);
    MPI_Comm_size(node, &r.size);
    MPI_Comm_free(&node);
    return r;
  }

 private:
  static int comm_rank(MPI_Comm comm) {
    int r = 0;
    MPI_Comm_rank(comm, &r);
    return r;
  }
  static int comm_size(MPI_Comm comm) {
    int n = 1;
    MPI_Comm_size(comm, &n);
    return n;
  }

  MPI_Comm comm_;
};

std::unique_ptr<Transport> duplicate_transport(MPI_Comm user) {
  count_collective();
  MPI_Comm duplicate = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(user, &duplicate), "MPI_Comm_dup");
  return std::make_unique<MpiTransport>(duplicate);
}

void release_reduction_cache() {
  ReductionCache& cache = reduction_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  for (auto& [fn, op] : cache.ops) MPI_Op_free(&op);
  for (auto& [n, type] : cache.types) MPI_Type_free(&type);
  cache.ops.clear();
  cache.types.clear();
}

// ---- count limit, messages, datatypes ------------------------------------------------------

std::size_t mpi_count_limit() {
  return test_switches().mpi_count_limit.load();
}

void Messages::add(bool is_recv, int peer, std::size_t offset, std::size_t bytes) {
  // Pieces of at most the count limit; messages between one pair are non-overtaking, so the
  // receiver's pieces meet the sender's in order.
  const std::size_t limit = std::max<std::size_t>(1, test_switches().mpi_count_limit.load());
  for (std::size_t done = 0; done < bytes; done += limit) {
    const std::size_t piece = std::min(limit, bytes - done);
    messages_.push_back(Message{peer, is_recv, static_cast<int>(piece), offset + done, piece, {}});
  }
  requests_.resize(messages_.size());
}

void Messages::send(int peer, std::size_t offset, std::size_t bytes) {
  add(false, peer, offset, bytes);
}

void Messages::recv(int peer, std::size_t offset, std::size_t bytes) {
  add(true, peer, offset, bytes);
}

void Messages::send(int peer, MpiDatatype type) {
  int bytes = 0;
  MPI_Type_size(type.raw(), &bytes);
  messages_.push_back(Message{peer, false, 1, 0, static_cast<std::size_t>(bytes), std::move(type)});
  requests_.resize(messages_.size());
}

void Messages::recv(int peer, MpiDatatype type) {
  int bytes = 0;
  MPI_Type_size(type.raw(), &bytes);
  messages_.push_back(Message{peer, true, 1, 0, static_cast<std::size_t>(bytes), std::move(type)});
  requests_.resize(messages_.size());
}

PeerTypes::PeerTypes(int nranks)
    : counts_(static_cast<std::size_t>(nranks), 0),
      displs_(static_cast<std::size_t>(nranks), 0),
      types_(static_cast<std::size_t>(nranks), MPI_BYTE),
      owned_(static_cast<std::size_t>(nranks)) {}

void PeerTypes::set(int peer, MpiDatatype type) {
  int bytes = 0;
  MPI_Type_size(type.raw(), &bytes);
  bytes_ += static_cast<std::size_t>(bytes);
  counts_[peer] = 1;
  types_[peer] = type.raw();
  owned_[peer] = std::move(type);
}

MpiDatatype box_type(const std::vector<std::int64_t>& extents,
                     const std::vector<std::int64_t>& byte_strides, std::size_t itemsize,
                     std::size_t offset) {
  const std::size_t limit = test_switches().mpi_count_limit.load();
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
  MpiDatatype out;
  out.type_ = std::shared_ptr<MPI_Datatype>(new MPI_Datatype(placed), [](MPI_Datatype* p) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Type_free(p);
    delete p;
  });
  return out;
}

}  // namespace kvmap::Detail
