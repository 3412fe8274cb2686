// Redistribution of DistViews between layouts: a plan (which rows go to and come from which
// ranks, how each side travels), built once per layouts, strides and dtype and cached, and
// its run: Kokkos kernels for the local part and any packing, MPI with the peers that hold
// data.
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <climits>
#include <complex>
#include <mutex>
#include <optional>
#include <tuple>

#include "kvmap/dist_view.hpp"
#include "kvmap/error.hpp"
#include "kvmap/impl/box_copy.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"

#include "collective.hpp"
#include "dist_view_access.hpp"

namespace kvmap {

namespace {

// A half-open box of global indices.
struct Box {
  int ndim = 0;
  std::int64_t lo[Impl::kMaxRank] = {};
  std::int64_t hi[Impl::kMaxRank] = {};

  std::int64_t volume() const {
    std::int64_t v = 1;
    for (int d = 0; d < ndim; ++d) v *= std::max<std::int64_t>(0, hi[d] - lo[d]);
    return v;
  }
  std::vector<std::int64_t> extents() const {
    std::vector<std::int64_t> e(ndim);
    for (int d = 0; d < ndim; ++d) e[d] = std::max<std::int64_t>(0, hi[d] - lo[d]);
    return e;
  }
};

// The global indices rank r holds under layout L.
Box held(const Layout& L, int r) {
  Box b;
  b.ndim = L.ndim();
  for (int d = 0; d < b.ndim; ++d) b.hi[d] = L.gshape()[d];
  if (L.split()) {
    const int s = *L.split();
    b.lo[s] = L.offset(r);
    b.hi[s] = L.offset(r) + L.count(r);
  }
  return b;
}

Box intersect(const Box& a, const Box& b) {
  Box c;
  c.ndim = a.ndim;
  for (int d = 0; d < a.ndim; ++d) {
    c.lo[d] = std::max(a.lo[d], b.lo[d]);
    c.hi[d] = std::max(c.lo[d], std::min(a.hi[d], b.hi[d]));
  }
  return c;
}

// Contiguous (row-major) block over buffer memory.
Impl::LocalBlock buffer_block(unsigned char* data, const Box& box) {
  Impl::LocalBlock b;
  b.data = data;
  b.extents = box.extents();
  b.strides = Impl::row_major_strides(b.extents);
  return b;
}

// Packing memory comes from allocate_block, whose cache recycles large blocks: fresh
// allocations cost page faults on every call, which dominate the exchange on many machines.
template <class M>
struct Scratch {
  Impl::LocalBlock block;
  explicit Scratch(std::size_t bytes)
      : block(Impl::allocate_block<M>({static_cast<std::int64_t>(bytes)}, 1)) {}
  unsigned char* data() const { return static_cast<unsigned char*>(block.data); }
};

// MPI and device memory: without a GPU-aware MPI (or when tests force it), the packed bytes
// go through host buffers on their way to and from MPI.
template <class M>
bool staged_through_host() {
  return !Impl::mpi_reads_directly(Impl::is_host_accessible<M>);
}

// n bytes from memory space Src to memory space Dst (a blocking Kokkos deep_copy), counted.
template <class Dst, class Src>
void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  Kokkos::View<unsigned char*, Dst, Kokkos::MemoryTraits<Kokkos::Unmanaged>> d(
      static_cast<unsigned char*>(dst), n);
  Kokkos::View<const unsigned char*, Src, Kokkos::MemoryTraits<Kokkos::Unmanaged>> s(
      static_cast<const unsigned char*>(src), n);
  Kokkos::deep_copy(d, s);
  Impl::count_bytes_copied(n);
}

// A broadcast of one element (at most 16 bytes: complex128) of M memory from root; staged
// through a buffer on the stack, so nothing is allocated after the agreement.
template <class M>
void bcast_element(const Comm& comm, void* data, DType dtype, int root) {
  const std::size_t n = size_of(dtype);
  if (!staged_through_host<M>()) {
    comm.bcast_bytes(data, n, root);
    return;
  }
  std::array<unsigned char, 16> host{};
  static_assert(sizeof(std::complex<double>) <= sizeof(host), "an element fits the buffer");
  if (comm.rank() == root) copy_bytes<Kokkos::HostSpace, M>(host.data(), data, n);
  comm.bcast_bytes(host.data(), n, root);
  if (comm.rank() != root) copy_bytes<M, Kokkos::HostSpace>(data, host.data(), n);
}

// True when `sub` is one contiguous run of memory inside a block with these strides.
bool contiguous_in(const std::vector<std::int64_t>& strides, const Box& sub) {
  if (sub.volume() <= 1) return true;
  const auto g = Impl::make_box_geometry(sub.extents(), strides, strides);
  return g.ndim == 1 && g.src_strides[0] == 1;
}

// Byte offset of global index sub.lo inside a block with these strides holding `whole`.
std::size_t offset_bytes(const std::vector<std::int64_t>& strides, const Box& whole, const Box& sub,
                         std::size_t itemsize) {
  std::int64_t off = 0;
  for (int d = 0; d < whole.ndim; ++d) off += (sub.lo[d] - whole.lo[d]) * strides[d];
  return static_cast<std::size_t>(off) * itemsize;
}

// Address of global index sub.lo inside a block that holds the box `whole`.
const unsigned char* address(const Impl::LocalBlock& block, const Box& whole, const Box& sub,
                             std::size_t itemsize) {
  return static_cast<const unsigned char*>(block.data) +
         offset_bytes(block.strides, whole, sub, itemsize);
}

template <class Exec>
void copy_sub_box(const Exec& exec, const Impl::LocalBlock& src, const Box& src_whole,
                  const Impl::LocalBlock& dst, const Box& dst_whole, const Box& sub,
                  std::size_t itemsize) {
  if (sub.volume() == 0) return;
  const auto g = Impl::make_box_geometry(sub.extents(), src.strides, dst.strides);
  Impl::box_copy(exec, address(src, src_whole, sub, itemsize),
                 const_cast<unsigned char*>(address(dst, dst_whole, sub, itemsize)), g, itemsize);
  Impl::count_bytes_copied(static_cast<std::uint64_t>(sub.volume()) * itemsize);
}

// ---- the plan: which rows go where, built once and cached -------------------------------
//
//   Local         every rank already holds its part (replicated source, unchanged layout):
//                 a local copy into the new array's own memory.
//   Allgather     a replicated target: every rank's block to every rank (MPI_Allgatherv, or
//                 point-to-point messages above MPI's count limit).
//   PointToPoint  everything else: a kernel copies the local part, and this rank exchanges
//                 messages only with the ranks whose rows meet its own (found by bisection
//                 over the layouts' offsets, O(log P)); with every rank when the split axis
//                 changes, since then every pair does exchange.
// A side of the exchange (what this rank sends, what it receives) travels in place (each
// piece a contiguous run of the block, or an MPI datatype MPI packs from it: host memory) or
// packed by kernels into a contiguous scratch buffer (device memory with strided pieces, and
// staged sides, whose scratch buffers are copied to and from host memory around MPI).
enum class ExchangeKind { Local, Allgather, PointToPoint };

struct Piece {
  int peer;
  Box box;
  std::size_t packed_offset;  // in the side's scratch buffer, when the side is packed
};

struct Side {
  std::vector<Piece> pieces;
  bool packed = false;
  std::size_t packed_bytes = 0;  // scratch size when packed
  std::size_t mpi_packs = 0;     // bytes MPI packs itself (datatypes): counted as copies
};

struct ExchangePlan {
  ExchangeKind kind = ExchangeKind::Local;
  std::size_t itemsize = 0;
  bool staged = false;
  Box my_src, my_dst, local;
  Side send, recv;
  // Allgather: every rank's block, packed in rank order or in place (split 0).
  std::vector<Box> blocks;
  std::vector<int> counts, displs;  // bytes, when within the count limit
  bool allgatherv = false;
  Comm::Exchange exchange;  // offsets relative to the sides' bases
  // A change of split axis on host memory: every pair exchanges, MPI packs every piece (the
  // local part included) in one MPI_Alltoallw, measured faster here than messages per peer
  // plus a local copy kernel.
  std::optional<Comm::PeerTypes> send_types, recv_types;
};

// What identifies a plan: the same layouts, source strides, element size and settings.
struct PlanKey {
  std::uint64_t comm_id;
  Layout source, target;
  std::vector<std::int64_t> source_strides;
  std::size_t itemsize;
  bool staged;
  std::size_t count_limit;
  bool matches(const PlanKey& o) const {
    return comm_id == o.comm_id && itemsize == o.itemsize && staged == o.staged &&
           count_limit == o.count_limit && source.fingerprint() == o.source.fingerprint() &&
           target.fingerprint() == o.target.fingerprint() && source_strides == o.source_strides &&
           source == o.source && target == o.target;
  }
};

// Packs a side into scratch unless every piece can travel in place; in place pieces use a
// contiguous run or a datatype placed relative to the block's base.
void plan_side(Side& side, bool send, const std::vector<std::int64_t>& strides, const Box& whole,
               std::size_t itemsize, bool datatypes_allowed, bool staged, Comm::Exchange& x) {
  std::size_t off = 0;
  for (Piece& p : side.pieces) {
    p.packed_offset = off;
    off += static_cast<std::size_t>(p.box.volume()) * itemsize;
  }
  side.packed_bytes = off;
  std::vector<std::int64_t> byte_strides(strides.size());
  for (std::size_t d = 0; d < strides.size(); ++d)
    byte_strides[d] = strides[d] * static_cast<std::int64_t>(itemsize);
  side.packed = staged;
  std::vector<Comm::Datatype> types(side.pieces.size());
  for (std::size_t i = 0; i < side.pieces.size() && !side.packed; ++i) {
    const Piece& p = side.pieces[i];
    if (contiguous_in(strides, p.box)) continue;
    if (!datatypes_allowed) {
      side.packed = true;
      break;
    }
    try {
      types[i] = Comm::box_type(p.box.extents(), byte_strides, itemsize,
                                offset_bytes(strides, whole, p.box, itemsize));
    } catch (const ValueError&) {
      side.packed = true;  // beyond MPI's count limit: packed and cut into pieces instead
    }
  }
  for (std::size_t i = 0; i < side.pieces.size(); ++i) {
    const Piece& p = side.pieces[i];
    const std::size_t bytes = static_cast<std::size_t>(p.box.volume()) * itemsize;
    if (side.packed) {
      if (send) {
        x.send(p.peer, p.packed_offset, bytes);
      } else {
        x.recv(p.peer, p.packed_offset, bytes);
      }
    } else if (types[i]) {
      side.mpi_packs += bytes;
      if (send) {
        x.send(p.peer, types[i]);
      } else {
        x.recv(p.peer, types[i]);
      }
    } else {
      const std::size_t at = offset_bytes(strides, whole, p.box, itemsize);
      if (send) {
        x.send(p.peer, at, bytes);
      } else {
        x.recv(p.peer, at, bytes);
      }
    }
  }
}

// Peers whose rows (under `theirs`) meet `mine` (rows [lo, lo + n) of the split axis): a
// range of ranks by bisection, or every rank when the split axes differ.
template <class Fn>
void for_each_peer_meeting(const Layout& theirs, const Box& mine, int split_of_mine, int me, int P,
                           Fn&& fn) {
  if (mine.volume() == 0) return;
  int first = 0, last = P;
  if (*theirs.split() == split_of_mine) {
    std::tie(first, last) = theirs.ranks_meeting(mine.lo[split_of_mine], mine.hi[split_of_mine]);
  }
  for (int q = first; q < last; ++q) {
    if (q != me) fn(q);
  }
}

// Whether every rank's block of both layouts fits MPI's count limit: decided from the layouts
// alone, so every rank takes the same collective (O(P), once per plan).
bool blocks_fit(const PlanKey& key) {
  const auto per_row = [&](const Layout& L) {
    const std::int64_t extent = L.gshape()[static_cast<std::size_t>(*L.split())];
    return extent > 0 ? Impl::checked_numel(L.gshape()) / extent : 0;
  };
  const std::int64_t s_row = per_row(key.source), t_row = per_row(key.target);
  for (std::int64_t e : key.source.gshape()) {
    if (static_cast<std::size_t>(e) > key.count_limit) return false;
  }
  for (int r = 0; r < key.source.nranks(); ++r) {
    const auto bytes = static_cast<std::size_t>(
        std::max(key.source.count(r) * s_row, key.target.count(r) * t_row));
    if (bytes * key.itemsize > key.count_limit) return false;
  }
  return true;
}

// The all-to-all of a change of split axis: a datatype per peer on each side, the local part
// included.
void plan_all_to_all(ExchangePlan& x, const PlanKey& key,
                     const std::vector<std::int64_t>& dst_strides, int me, int P) {
  const std::size_t itemsize = key.itemsize;
  auto bytes_of = [&](const std::vector<std::int64_t>& strides) {
    std::vector<std::int64_t> b(strides.size());
    for (std::size_t d = 0; d < strides.size(); ++d)
      b[d] = strides[d] * static_cast<std::int64_t>(itemsize);
    return b;
  };
  const auto src_bytes = bytes_of(key.source_strides), dst_bytes = bytes_of(dst_strides);
  Comm::PeerTypes send(P), recv(P);
  auto add = [&](Comm::PeerTypes& side, int peer, const Box& box, const Box& whole,
                 const std::vector<std::int64_t>& strides,
                 const std::vector<std::int64_t>& byte_strides) {
    side.set(peer, Comm::box_type(box.extents(), byte_strides, itemsize,
                                  offset_bytes(strides, whole, box, itemsize)));
  };
  for (const Piece& q : x.send.pieces)
    add(send, q.peer, q.box, x.my_src, key.source_strides, src_bytes);
  for (const Piece& q : x.recv.pieces) add(recv, q.peer, q.box, x.my_dst, dst_strides, dst_bytes);
  if (x.local.volume() > 0) {
    add(send, me, x.local, x.my_src, key.source_strides, src_bytes);
    add(recv, me, x.local, x.my_dst, dst_strides, dst_bytes);
  }
  // Counted as the other paths count their kernels: the local part and every piece MPI packs.
  x.send.mpi_packs = send.bytes();
  x.recv.mpi_packs = recv.bytes() - static_cast<std::size_t>(x.local.volume()) * itemsize;
  x.send_types.emplace(std::move(send));
  x.recv_types.emplace(std::move(recv));
}

ExchangePlan build_plan(const PlanKey& key, int me, int P, bool host_accessible) {
  const Layout& S = key.source;
  const Layout& T = key.target;
  const std::size_t itemsize = key.itemsize;
  ExchangePlan x;
  x.itemsize = itemsize;
  x.staged = key.staged;
  x.my_src = held(S, me);
  x.my_dst = held(T, me);
  const std::vector<std::int64_t> dst_strides = Impl::row_major_strides(T.lshape(me));
  const bool datatypes_allowed = host_accessible && !key.staged;
  if (S.is_replicated() || T == S) {
    x.kind = ExchangeKind::Local;
    x.local = x.my_dst;
    return x;
  }
  if (T.is_replicated()) {
    // Every holder's block to every rank.
    x.kind = ExchangeKind::Allgather;
    const int s = *S.split();
    const std::size_t row =
        static_cast<std::size_t>(x.my_dst.volume() / std::max<std::int64_t>(1, S.gshape()[s])) *
        itemsize;
    const bool in_place_recv = s == 0 && !key.staged;
    const bool in_place_send = s == 0 && !key.staged && contiguous_in(key.source_strides, x.my_src);
    x.send.packed = !in_place_send;
    x.send.packed_bytes = static_cast<std::size_t>(x.my_src.volume()) * itemsize;
    x.recv.packed = !in_place_recv;
    std::size_t total = 0;
    bool fits = true;
    x.blocks.resize(P);
    x.counts.assign(P, 0);
    x.displs.assign(P, 0);
    std::vector<std::size_t> displs(P);
    for (int r = 0; r < P; ++r) {
      x.blocks[r] = held(S, r);
      const auto bytes = static_cast<std::size_t>(x.blocks[r].volume()) * itemsize;
      displs[r] = in_place_recv ? static_cast<std::size_t>(S.offset(r)) * row : total;
      total += bytes;
      fits = fits && bytes <= key.count_limit && displs[r] + bytes <= key.count_limit &&
             displs[r] + bytes <= static_cast<std::size_t>(INT_MAX);
      if (fits) {
        x.counts[r] = static_cast<int>(bytes);
        x.displs[r] = static_cast<int>(displs[r]);
      }
    }
    x.recv.packed_bytes = total;
    x.allgatherv = fits;
    if (!fits) {
      // In pieces, point to point; its own block too goes through MPI (a message to itself).
      const std::size_t mine = x.send.packed_bytes;
      const std::size_t send_at =
          in_place_send ? offset_bytes(key.source_strides, x.my_src, x.my_src, itemsize) : 0;
      for (int r = 0; r < P; ++r) {
        const auto bytes = static_cast<std::size_t>(x.blocks[r].volume()) * itemsize;
        if (bytes > 0) x.exchange.recv(r, displs[r], bytes);
        if (mine > 0) x.exchange.send(r, send_at, mine);
      }
    }
    return x;
  }
  x.kind = ExchangeKind::PointToPoint;
  const int s_src = *S.split(), s_dst = *T.split();
  for_each_peer_meeting(T, x.my_src, s_src, me, P, [&](int q) {
    const Box b = intersect(x.my_src, held(T, q));
    if (b.volume() > 0) x.send.pieces.push_back(Piece{q, b, 0});
  });
  for_each_peer_meeting(S, x.my_dst, s_dst, me, P, [&](int q) {
    const Box b = intersect(held(S, q), x.my_dst);
    if (b.volume() > 0) x.recv.pieces.push_back(Piece{q, b, 0});
  });
  x.local = intersect(x.my_src, x.my_dst);
  if (s_src != s_dst && P > 1 && datatypes_allowed && blocks_fit(key)) {
    plan_all_to_all(x, key, dst_strides, me, P);
    return x;
  }
  plan_side(x.recv, false, dst_strides, x.my_dst, itemsize, datatypes_allowed, key.staged,
            x.exchange);
  plan_side(x.send, true, key.source_strides, x.my_src, itemsize, datatypes_allowed, key.staged,
            x.exchange);
  return x;
}

// A bounded cache of plans, most recently used first; emptied before MPI is finalized (the
// plans hold MPI datatypes).
class PlanCache {
 public:
  static constexpr std::size_t kCapacity = 32;
  static PlanCache& instance() {
    static PlanCache* cache = [] {
      auto* c = new PlanCache();
      Impl::on_release([] { PlanCache::instance().clear(); });
      return c;
    }();
    return *cache;
  }
  std::shared_ptr<ExchangePlan> find(const PlanKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first.matches(key)) {
        std::rotate(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(i),
                    entries_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
        return entries_.front().second;
      }
    }
    return nullptr;
  }
  void put(PlanKey key, std::shared_ptr<ExchangePlan> plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.insert(entries_.begin(), {std::move(key), std::move(plan)});
    if (entries_.size() > kCapacity) entries_.pop_back();
  }
  void clear() {
    std::vector<std::pair<PlanKey, std::shared_ptr<ExchangePlan>>> gone;
    std::lock_guard<std::mutex> lock(mutex_);
    gone.swap(entries_);
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<PlanKey, std::shared_ptr<ExchangePlan>>> entries_;
};

// One call's redistribution, planned: the destination and every scratch buffer are
// allocated here (before the agreement), so that run_exchange (after it) only runs kernels
// and MPI.
template <class M>
struct Exchange {
  Exchange(DistView<M> source, Layout target_layout)
      : src(std::move(source)), target(std::move(target_layout)) {}
  DistView<M> src;
  Layout target;
  std::shared_ptr<ExchangePlan> plan;
  Impl::LocalBlock src_block, dst;
  std::optional<Scratch<M>> send_buf, recv_buf;
  // Staged exchanges: MPI's copies of send_buf and recv_buf in host memory.
  std::optional<Scratch<Kokkos::HostSpace>> send_host, recv_host;
};

template <class M>
Exchange<M> plan_exchange(const DistView<M>& src, const Layout& target) {
  const Comm& comm = src.comm();
  const int me = comm.rank();
  Exchange<M> x(src, target);
  x.src_block = Impl::DistViewAccess::block(src);
  PlanKey key{comm.id(),
              src.layout(),
              target,
              x.src_block.strides,
              src.itemsize(),
              staged_through_host<M>(),
              Impl::mpi_count_limit()};
  x.plan = PlanCache::instance().find(key);
  if (!x.plan) {
    x.plan = std::make_shared<ExchangePlan>(
        build_plan(key, me, comm.size(), Impl::is_host_accessible<M>));
    Impl::count_plan_built();
    PlanCache::instance().put(std::move(key), x.plan);
  }
  const ExchangePlan& p = *x.plan;
  x.dst = Impl::allocate_block<M>(target.lshape(me), src.itemsize());
  if (p.send.packed && p.send.packed_bytes > 0) x.send_buf.emplace(p.send.packed_bytes);
  if (p.recv.packed && p.recv.packed_bytes > 0) x.recv_buf.emplace(p.recv.packed_bytes);
  if (p.staged) {
    if (p.send.packed_bytes > 0) x.send_host.emplace(p.send.packed_bytes);
    if (p.recv.packed_bytes > 0) x.recv_host.emplace(p.recv.packed_bytes);
  }
  return x;
}

template <class M>
DistView<M> run_exchange(Exchange<M>& x) {
  using Exec = typename DistView<M>::execution_space;
  Exec exec;
  const Comm& comm = x.src.comm();
  ExchangePlan& p = *x.plan;
  const std::size_t itemsize = p.itemsize;
  const Impl::LocalBlock& src = x.src_block;
  unsigned char* send_scratch = x.send_buf ? x.send_buf->data() : nullptr;
  unsigned char* recv_scratch = x.recv_buf ? x.recv_buf->data() : nullptr;
  if (p.kind == ExchangeKind::Local) {
    copy_sub_box(exec, src, p.my_src, x.dst, p.my_dst, p.local, itemsize);
  } else if (p.kind == ExchangeKind::Allgather) {
    const unsigned char* send_ptr = static_cast<const unsigned char*>(src.data);
    if (p.send.packed) {
      if (send_scratch) {
        copy_sub_box(exec, src, p.my_src, buffer_block(send_scratch, p.my_src), p.my_src, p.my_src,
                     itemsize);
      }
      send_ptr = send_scratch;
    }
    unsigned char* recv_base =
        p.recv.packed ? recv_scratch : static_cast<unsigned char*>(x.dst.data);
    exec.fence();
    const void* mpi_send = send_ptr;
    void* mpi_recv = recv_base;
    if (p.staged) {
      if (x.send_host)
        copy_bytes<Kokkos::HostSpace, M>(x.send_host->data(), send_ptr, p.send.packed_bytes);
      mpi_send = x.send_host ? x.send_host->data() : nullptr;
      mpi_recv = x.recv_host ? x.recv_host->data() : nullptr;
    }
    if (p.allgatherv) {
      comm.allgatherv_bytes(mpi_send, p.counts[comm.rank()], mpi_recv, p.counts, p.displs);
    } else {
      comm.run(p.exchange, mpi_send, mpi_recv);
    }
    if (p.staged && x.recv_host)
      copy_bytes<M, Kokkos::HostSpace>(recv_base, x.recv_host->data(), p.recv.packed_bytes);
    if (p.recv.packed) {
      std::size_t off = 0;
      for (const Box& b : p.blocks) {
        copy_sub_box(exec, buffer_block(recv_base + off, b), b, x.dst, p.my_dst, b, itemsize);
        off += static_cast<std::size_t>(b.volume()) * itemsize;
      }
    }
  } else if (p.send_types) {
    exec.fence();  // every kernel's writes to the source before MPI reads it
    comm.alltoallw(src.data, *p.send_types, x.dst.data, *p.recv_types);
    Impl::count_bytes_copied(p.send.mpi_packs + p.recv.mpi_packs);
  } else {
    copy_sub_box(exec, src, p.my_src, x.dst, p.my_dst, p.local, itemsize);
    if (p.send.packed) {
      for (const Piece& q : p.send.pieces) {
        copy_sub_box(exec, src, p.my_src, buffer_block(send_scratch + q.packed_offset, q.box),
                     q.box, q.box, itemsize);
      }
    }
    exec.fence();  // every kernel's writes before MPI reads them
    const void* send_base = p.send.packed ? send_scratch : src.data;
    void* recv_base = p.recv.packed ? recv_scratch : x.dst.data;
    if (p.staged) {
      if (x.send_host)
        copy_bytes<Kokkos::HostSpace, M>(x.send_host->data(), send_scratch, p.send.packed_bytes);
      comm.run(p.exchange, x.send_host ? x.send_host->data() : nullptr,
               x.recv_host ? x.recv_host->data() : nullptr);
      if (x.recv_host)
        copy_bytes<M, Kokkos::HostSpace>(recv_scratch, x.recv_host->data(), p.recv.packed_bytes);
    } else {
      comm.run(p.exchange, send_base, recv_base);
    }
    Impl::count_bytes_copied(p.send.mpi_packs + p.recv.mpi_packs);
    if (p.recv.packed) {
      for (const Piece& q : p.recv.pieces) {
        copy_sub_box(exec, buffer_block(recv_scratch + q.packed_offset, q.box), q.box, x.dst,
                     p.my_dst, q.box, itemsize);
      }
    }
  }
  exec.fence();
  x.send_buf.reset();
  x.recv_buf.reset();
  x.send_host.reset();
  x.recv_host.reset();
  return Impl::DistViewAccess::make<M>(x.target, x.src.dtype(), comm, std::move(x.dst));
}

// The arguments of a redistribution that every rank must pass alike: the array's layout and
// dtype (so ranks passing different arrays are told, not left in mismatched exchanges).
template <class M>
void describe_source(Impl::Signature& sig, const DistView<M>& v) {
  sig.arg("layout", v.layout()).arg("dtype", v.dtype());
}

}  // namespace

template <class M>
DistView<M> DistView<M>::redistribute(const Layout& target) const {
  return Impl::collective(
      "DistView::redistribute", comm_,
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        describe_source(sig, *this);
        sig.arg("target", target);
        KVMAP_CHECK(target.nranks() == comm_.size(), ValueError,
                    "kvmap::DistView::redistribute: the target "
                        << target << " is for " << target.nranks()
                        << " ranks but the communicator has " << comm_.size());
        KVMAP_CHECK(target.gshape() == gshape(), ValueError,
                    "kvmap::DistView::redistribute: the target "
                        << target << " has global shape " << to_string(target.gshape())
                        << ", the array " << to_string(gshape()));
        return plan_exchange(*this, target);  // its own memory, also when the layout is unchanged
      },
      [](Exchange<M>& x, const Impl::NoPayload&) { return run_exchange(x); });
}

namespace {
template <class M>
DistView<M> to_balanced(const DistView<M>& v, std::optional<int> split, const char* site) {
  return Impl::collective(
      site, v.comm(),
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        describe_source(sig, v);
        sig.arg("split", split);
        return plan_exchange(v, Layout::balanced(v.gshape(), split, v.comm().size()));
      },
      [](Exchange<M>& x, const Impl::NoPayload&) { return run_exchange(x); });
}
}  // namespace

template <class M>
DistView<M> DistView<M>::resplit(std::optional<int> split) const {
  return to_balanced(*this, split, "DistView::resplit");
}

template <class M>
DistView<M> DistView<M>::balance() const {
  return to_balanced(*this, layout_.split(), "DistView::balance");
}

namespace {
// Gathering to `root` (-1: every rank). A replicated array is copied by the receiving ranks
// (a copy, like every other gather, never an alias of the storage); a split one exchanged.
template <class M>
struct GatherPlan {
  std::optional<Exchange<M>> exchange;
  at::Tensor copy;
};

template <class M>
GatherPlan<M> plan_gather(const DistView<M>& v, int root) {
  GatherPlan<M> plan;
  const Comm& comm = v.comm();
  if (!v.split()) {
    if (root < 0 || comm.rank() == root) plan.copy = v.local().clone();
    return plan;
  }
  // Every row on root (O(1), whatever the number of ranks), or everything everywhere.
  plan.exchange.emplace(
      plan_exchange(v, root >= 0 ? Layout::on_rank(v.gshape(), *v.split(), root, comm.size())
                                 : Layout::replicated(v.gshape(), comm.size())));
  return plan;
}

template <class M>
at::Tensor run_gather(GatherPlan<M>& plan, int root, int me) {
  if (!plan.exchange) {
    if (plan.copy.defined()) {
      Impl::count_bytes_copied(static_cast<std::uint64_t>(plan.copy.numel()) *
                               plan.copy.element_size());
    }
    return plan.copy;
  }
  DistView<M> gathered = run_exchange(*plan.exchange);
  return root < 0 || me == root ? gathered.local() : at::Tensor();
}
}  // namespace

template <class M>
at::Tensor DistView<M>::gather(int root) const {
  return Impl::collective(
      "DistView::gather", comm_,
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        describe_source(sig, *this);
        sig.arg("root", root);
        KVMAP_CHECK(root >= 0 && root < comm_.size(), ValueError,
                    "kvmap::DistView::gather: root " << root << " out of range for " << comm_.size()
                                                     << " ranks");
        return plan_gather(*this, root);
      },
      [&](GatherPlan<M>& plan, const Impl::NoPayload&) {
        return run_gather(plan, root, comm_.rank());
      });
}

template <class M>
at::Tensor DistView<M>::allgather() const {
  return Impl::collective(
      "DistView::allgather", comm_,
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        describe_source(sig, *this);
        return plan_gather(*this, -1);
      },
      [&](GatherPlan<M>& plan, const Impl::NoPayload&) {
        return run_gather(plan, -1, comm_.rank());
      });
}

template <class M>
DistView<M> DistView<M>::from_global(const at::Tensor& full, std::optional<int> split, Comm comm) {
  struct Plan {
    std::optional<DistView<M>> whole;  // replicated: the tensor adopted as it is
    std::optional<Exchange<M>> slice;  // split: a copy of this rank's slice
  };
  return Impl::collective(
      "DistView::from_global", comm,
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        sig.arg("split", split);
        Impl::LocalBlock block = Impl::block_from_tensor(full);
        const DType dtype = from_torch(full.scalar_type());
        sig.arg("shape", block.extents).arg("dtype", dtype);
        Impl::check_same_device(full, Impl::device_of<M>(),
                                "kvmap::DistView::from_global: the tensor");
        const Layout target = Layout::balanced(block.extents, split, comm.size());
        Layout whole = Layout::replicated(block.extents, comm.size());
        Plan plan;
        plan.whole.emplace(
            Impl::DistViewAccess::make<M>(std::move(whole), dtype, comm, std::move(block)));
        if (split) plan.slice.emplace(plan_exchange(*plan.whole, target));
        return plan;
      },
      [](Plan& plan, const Impl::NoPayload&) {
        return plan.slice ? run_exchange(*plan.slice) : std::move(*plan.whole);
      });
}

namespace {
// What root tells every rank about the tensor it scatters: root's values, zeros elsewhere,
// reduced by maximum (so every rank receives root's, whatever the number of ranks).
struct ScatterMeta {
  std::int32_t ndim;
  std::int32_t dtype;
  std::int64_t extents[Impl::kMaxRank];
  static void combine(const ScatterMeta& in, ScatterMeta& inout) {
    inout.ndim = std::max(inout.ndim, in.ndim);
    inout.dtype = std::max(inout.dtype, in.dtype);
    for (int d = 0; d < Impl::kMaxRank; ++d)
      inout.extents[d] = std::max(inout.extents[d], in.extents[d]);
  }
};
}  // namespace

template <class M>
DistView<M> DistView<M>::scatter(const at::Tensor& full_on_root, std::optional<int> split,
                                 Comm comm, int root) {
  // Two agreements: the other ranks learn root's shape and dtype from the first, and
  // allocate their part before the second.
  const int me = comm.rank();
  Impl::Collective<ScatterMeta> arguments("DistView::scatter", comm);
  std::optional<Impl::LocalBlock> root_block =
      arguments.plan([&](Impl::Signature& sig, ScatterMeta& meta) {
        sig.arg("split", split).arg("root", root);
        KVMAP_CHECK(root >= 0 && root < comm.size(), ValueError,
                    "kvmap::DistView::scatter: root " << root << " out of range for " << comm.size()
                                                      << " ranks");
        Impl::LocalBlock block;
        if (me == root) {
          block = Impl::block_from_tensor(full_on_root);
          Impl::check_same_device(full_on_root, Impl::device_of<M>(),
                                  "kvmap::DistView::scatter: the tensor");
          meta.ndim = static_cast<std::int32_t>(block.extents.size());
          meta.dtype = static_cast<std::int32_t>(from_torch(full_on_root.scalar_type()));
          for (int d = 0; d < meta.ndim; ++d) meta.extents[d] = block.extents[d];
          Layout::balanced(block.extents, split, comm.size());  // validates split for this shape
        }
        return block;
      });
  const ScatterMeta meta = arguments.agree();
  const Shape gshape(meta.extents, meta.extents + meta.ndim);
  const DType dtype = static_cast<DType>(meta.dtype);

  return Impl::collective(
      "DistView::scatter", comm,
      [&](Impl::Signature& sig, Impl::NoPayload&) {
        sig.arg("gshape", gshape).arg("dtype", dtype).arg("split", split).arg("root", root);
        const Layout target = Layout::balanced(gshape, split, comm.size());
        // Root holds the whole array (a scalar: replicated), everyone else an empty piece.
        Impl::LocalBlock block = me == root ? std::move(*root_block) : Impl::LocalBlock{};
        std::optional<Layout> source;
        if (meta.ndim == 0) {
          source = Layout::replicated(gshape, comm.size());
        } else {
          const int s = Impl::normalize_axis(split.value_or(0), meta.ndim, "split axis");
          source = Layout::on_rank(gshape, s, root, comm.size());
        }
        if (me != root) {
          block.extents = source->lshape(me);
          block.strides = Impl::row_major_strides(block.extents);
          if (meta.ndim == 0) block = Impl::allocate_block<M>(gshape, size_of(dtype));
        }
        return plan_exchange(Impl::DistViewAccess::make<M>(*source, dtype, comm, std::move(block)),
                             target);
      },
      [&](Exchange<M>& x, const Impl::NoPayload&) {
        if (meta.ndim == 0) {
          // A scalar: root's one element, broadcast into every rank's copy.
          bcast_element<M>(comm, x.src_block.data, dtype, root);
        }
        return run_exchange(x);
      });
}

#define KVMAP_INSTANTIATE_REDISTRIBUTE(Space)                                                    \
  template DistView<Space> DistView<Space>::redistribute(const Layout&) const;                   \
  template DistView<Space> DistView<Space>::resplit(std::optional<int>) const;                   \
  template DistView<Space> DistView<Space>::balance() const;                                     \
  template at::Tensor DistView<Space>::gather(int) const;                                        \
  template at::Tensor DistView<Space>::allgather() const;                                        \
  template DistView<Space> DistView<Space>::from_global(const at::Tensor&, std::optional<int>,   \
                                                        Comm);                                   \
  template DistView<Space> DistView<Space>::scatter(const at::Tensor&, std::optional<int>, Comm, \
                                                    int);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_REDISTRIBUTE)

}  // namespace kvmap
