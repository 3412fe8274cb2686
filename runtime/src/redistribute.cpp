// Redistribution of DistViews between layouts: one MPI collective per operation, with
// packing and unpacking done by Kokkos kernels on the data's execution space.
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <complex>
#include <mutex>
#include <optional>
#include <sstream>

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

// Address of global index sub.lo inside a block that holds the box `whole`.
const unsigned char* address(const Impl::LocalBlock& block, const Box& whole, const Box& sub,
                             std::size_t itemsize) {
  std::int64_t off = 0;
  for (int d = 0; d < whole.ndim; ++d) off += (sub.lo[d] - whole.lo[d]) * block.strides[d];
  return static_cast<const unsigned char*>(block.data) + off * static_cast<std::int64_t>(itemsize);
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

// True when `sub` is one contiguous run of memory inside a block holding `whole`.
bool contiguous_in(const Impl::LocalBlock& block, const Box& sub) {
  if (sub.volume() <= 1) return true;
  const auto g = Impl::make_box_geometry(sub.extents(), block.strides, block.strides);
  return g.ndim == 1 && g.src_strides[0] == 1;
}

// True when the block's elements fill its span without gaps or overlaps.
bool dense(const Impl::LocalBlock& block, std::size_t itemsize) {
  std::int64_t n = 1;
  for (std::int64_t e : block.extents) n *= e;
  return Impl::checked_span_bytes(block.extents, block.strides, itemsize) ==
         static_cast<std::size_t>(n) * itemsize;
}

std::size_t offset_bytes(const Impl::LocalBlock& block, const Box& whole, const Box& sub,
                         std::size_t itemsize) {
  if (sub.volume() == 0) return 0;
  return static_cast<std::size_t>(address(block, whole, sub, itemsize) -
                                  static_cast<const unsigned char*>(block.data));
}

// One side of an exchange: MPI reads (or writes) the block in place when every piece is a
// contiguous run of a dense block; otherwise the pieces go through a packed scratch buffer.
struct Side {
  bool direct = false;
  std::vector<std::size_t> counts, displs;
  std::size_t total = 0;
};

Side plan_side(const Impl::LocalBlock& block, const Box& whole, const std::vector<Box>& pieces,
               int me, std::size_t itemsize, bool include_self, bool packed) {
  const int P = static_cast<int>(pieces.size());
  Side side;
  side.counts.assign(P, 0);
  side.displs.assign(P, 0);
  side.direct = !packed && dense(block, itemsize);
  for (int p = 0; p < P && side.direct; ++p) {
    if (p != me || include_self) side.direct = contiguous_in(block, pieces[p]);
  }
  for (int p = 0; p < P; ++p) {
    if (p == me && !include_self) continue;
    side.counts[p] = static_cast<std::size_t>(pieces[p].volume()) * itemsize;
    side.displs[p] = side.direct ? offset_bytes(block, whole, pieces[p], itemsize) : side.total;
    side.total += side.counts[p];
  }
  return side;
}

// One MPI datatype per peer for a sub-box of a block (hvectors over its strides, the
// contiguous innermost run as one piece, placed at the box's byte offset): MPI reads and
// writes the blocks in place and packs itself. Freed with the exchange.
class BoxTypes {
 public:
  explicit BoxTypes(std::size_t n) {
    peers_.counts.assign(n, 0);
    peers_.displs.assign(n, 0);
    peers_.types.assign(n, MPI_BYTE);
  }
  ~BoxTypes() {
    for (std::size_t p = 0; p < peers_.types.size(); ++p) {
      if (peers_.counts[p] != 0) MPI_Type_free(&peers_.types[p]);
    }
  }
  BoxTypes(const BoxTypes&) = delete;
  BoxTypes& operator=(const BoxTypes&) = delete;
  BoxTypes(BoxTypes&& other) noexcept : peers_(std::move(other.peers_)) {
    other.peers_ = Comm::PeerTypes{};
  }
  BoxTypes& operator=(BoxTypes&&) = delete;

  void set(std::size_t peer, const Impl::LocalBlock& block, const Box& whole, const Box& sub,
           std::size_t itemsize) {
    if (sub.volume() == 0) return;
    const auto ext = sub.extents();
    int d = static_cast<int>(ext.size()) - 1;
    std::int64_t run = static_cast<std::int64_t>(itemsize);
    while (d >= 0 &&
           (ext[d] == 1 || block.strides[d] * static_cast<std::int64_t>(itemsize) == run)) {
      run *= ext[d];
      --d;
    }
    MPI_Datatype t = MPI_DATATYPE_NULL;
    check(MPI_Type_contiguous(static_cast<int>(run), MPI_BYTE, &t));
    for (; d >= 0; --d) {
      if (ext[d] == 1) continue;
      MPI_Datatype outer = MPI_DATATYPE_NULL;
      check(MPI_Type_create_hvector(
          static_cast<int>(ext[d]), 1,
          static_cast<MPI_Aint>(block.strides[d]) * static_cast<MPI_Aint>(itemsize), t, &outer));
      MPI_Type_free(&t);
      t = outer;
    }
    int one = 1;
    const auto at = static_cast<MPI_Aint>(offset_bytes(block, whole, sub, itemsize));
    MPI_Datatype placed = MPI_DATATYPE_NULL;
    check(MPI_Type_create_struct(1, &one, &at, &t, &placed));
    MPI_Type_free(&t);
    check(MPI_Type_commit(&placed));
    peers_.types[peer] = placed;
    peers_.counts[peer] = 1;
  }
  const Comm::PeerTypes& peers() const { return peers_; }

 private:
  static void check(int rc) {
    KVMAP_CHECK(rc == MPI_SUCCESS, Error, "kvmap: building an MPI datatype failed (" << rc << ")");
  }
  Comm::PeerTypes peers_;
};

// Moving src's data into a fresh DistView of layout `target`, planned: the destination and
// every scratch buffer are allocated by plan_exchange (before the agreement), so that
// run_exchange (after it) only runs kernels and MPI.
enum class ExchangeKind { Local, Allgather, AllToAll };

template <class M>
struct Exchange {
  Exchange(DistView<M> source, Layout target_layout)
      : src(std::move(source)), target(std::move(target_layout)) {}
  DistView<M> src;
  Layout target;
  ExchangeKind kind = ExchangeKind::Local;
  Impl::LocalBlock src_block, dst;
  Box my_src, my_dst;
  std::vector<Box> send_boxes, recv_boxes;
  Side send, recv;
  std::size_t global_max = 0;
  std::optional<Scratch<M>> send_buf, recv_buf;
  // Staged exchanges: MPI's copies of send_buf and recv_buf in host memory.
  std::optional<Scratch<Kokkos::HostSpace>> send_host, recv_host;
  // All-to-all on host-readable memory within MPI's count limit: MPI packs (MPI_Alltoallw
  // with a datatype per peer), no scratch buffers.
  std::optional<BoxTypes> send_types, recv_types;
  // The bytes MPI copies on kvmap's behalf there, counted as the packed path counts its
  // kernels: the local part, and each side that is not read (written) in place.
  std::size_t copied_by_mpi = 0;
};

// MPI's send and receive memory: the packed buffers where a side is not read in place, and
// their host copies when staged.
template <class M>
void allocate_buffers(Exchange<M>& x, bool staged) {
  if (!x.send.direct) x.send_buf.emplace(x.send.total);
  if (!x.recv.direct) x.recv_buf.emplace(x.recv.total);
  if (staged) {
    x.send_host.emplace(x.send.total);
    x.recv_host.emplace(x.recv.total);
  }
}

template <class M>
Exchange<M> plan_exchange(const DistView<M>& src, const Layout& target) {
  const Comm& comm = src.comm();
  const int me = comm.rank(), P = comm.size();
  const std::size_t itemsize = src.itemsize();
  const Layout& S = src.layout();
  Exchange<M> x(src, target);
  x.src_block = Impl::DistViewAccess::block(src);
  x.dst = Impl::allocate_block<M>(target.lshape(me), itemsize);
  x.my_src = held(S, me);
  x.my_dst = held(target, me);
  // Staged: both sides packed (contiguous buffers to move to and from host memory).
  const bool staged = staged_through_host<M>();
  if (S.is_replicated() || target == S) {
    // Every rank already holds its part (replicated source, or an unchanged layout): a local
    // copy into the new DistView's own memory, no communication.
    x.kind = ExchangeKind::Local;
    return x;
  }
  if (target.is_replicated()) {
    // Every rank's block goes to every rank: one allgatherv.
    x.kind = ExchangeKind::Allgather;
    x.recv_boxes.resize(P);
    for (int r = 0; r < P; ++r) x.recv_boxes[r] = held(S, r);
    x.send =
        plan_side(x.src_block, x.my_src, std::vector<Box>(P, x.my_src), me, itemsize, true, staged);
    x.send.total = x.send.counts[me];  // sent once, to every rank
    x.recv = plan_side(x.dst, x.my_dst, x.recv_boxes, me, itemsize, true, staged);
    allocate_buffers(x, staged);
    return x;
  }
  x.kind = ExchangeKind::AllToAll;
  x.send_boxes.resize(P);
  x.recv_boxes.resize(P);
  for (int p = 0; p < P; ++p) {
    x.send_boxes[p] = intersect(x.my_src, held(target, p));
    x.recv_boxes[p] = intersect(held(S, p), x.my_dst);
  }
  // A bound every rank computes alike: no rank sends or receives beyond its dense blocks.
  for (int r = 0; r < P; ++r) {
    x.global_max = std::max<std::size_t>(
        x.global_max,
        static_cast<std::size_t>(std::max(held(S, r).volume(), held(target, r).volume())) *
            itemsize);
  }
  // The local part is copied directly, the rest exchanged: in place where every piece is a
  // contiguous run of a dense block (rows of a split-0 array), else packed.
  x.send = plan_side(x.src_block, x.my_src, x.send_boxes, me, itemsize, false, staged);
  x.recv = plan_side(x.dst, x.my_dst, x.recv_boxes, me, itemsize, false, staged);
  // Split axes other than 0 (pieces strided in row-major blocks), on memory MPI reads, within
  // MPI's count limit: MPI packs straight from the source block into the destination block
  // (a datatype per peer, the local part included), measured faster than pack kernels +
  // MPI_Alltoallv on a quiet machine and as fast after torch work (perf/, scenario
  // redistribution). Decided from the agreed layouts only, so every rank calls the same
  // collective (whether its own block is dense decides only how it packs on the other path).
  const bool row_pieces = *S.split() == 0 && *target.split() == 0;
  if (!row_pieces && !staged && Impl::is_host_accessible<M> &&
      x.global_max <= Impl::mpi_count_limit()) {
    x.send_types.emplace(P);
    x.recv_types.emplace(P);
    for (int p = 0; p < P; ++p) {
      x.send_types->set(p, x.src_block, x.my_src, x.send_boxes[p], itemsize);
      x.recv_types->set(p, x.dst, x.my_dst, x.recv_boxes[p], itemsize);
    }
    // Counted as the packed path counts its kernels: the local part and each packed side.
    x.copied_by_mpi = static_cast<std::size_t>(x.send_boxes[me].volume()) * itemsize +
                      (x.send.direct ? 0 : x.send.total) + (x.recv.direct ? 0 : x.recv.total);
    return x;
  }
  allocate_buffers(x, staged);
  return x;
}

template <class M>
DistView<M> run_exchange(Exchange<M>& x) {
  using Exec = typename DistView<M>::execution_space;
  Exec exec;
  const Comm& comm = x.src.comm();
  const int me = comm.rank(), P = comm.size();
  const std::size_t itemsize = x.src.itemsize();
  const Impl::LocalBlock& src = x.src_block;
  if (x.kind == ExchangeKind::Local) {
    copy_sub_box(exec, src, x.my_src, x.dst, x.my_dst, x.my_dst, itemsize);
  } else if (x.kind == ExchangeKind::Allgather) {
    const unsigned char* send_ptr = static_cast<const unsigned char*>(src.data) + x.send.displs[me];
    if (x.send_buf) {
      copy_sub_box(exec, src, x.my_src, buffer_block(x.send_buf->data(), x.my_src), x.my_src,
                   x.my_src, itemsize);
      send_ptr = x.send_buf->data();
    }
    unsigned char* recv_base =
        x.recv_buf ? x.recv_buf->data() : static_cast<unsigned char*>(x.dst.data);
    exec.fence();
    if (x.send_host) {
      copy_bytes<Kokkos::HostSpace, M>(x.send_host->data(), send_ptr, x.send.total);
      comm.allgatherv_bytes(x.send_host->data(), x.send.counts[me], x.recv_host->data(),
                            x.recv.counts, x.recv.displs);
      copy_bytes<M, Kokkos::HostSpace>(recv_base, x.recv_host->data(), x.recv.total);
    } else {
      comm.allgatherv_bytes(send_ptr, x.send.counts[me], recv_base, x.recv.counts, x.recv.displs);
    }
    if (x.recv_buf) {
      for (int r = 0; r < P; ++r) {
        copy_sub_box(exec, buffer_block(recv_base + x.recv.displs[r], x.recv_boxes[r]),
                     x.recv_boxes[r], x.dst, x.my_dst, x.recv_boxes[r], itemsize);
      }
    }
  } else if (x.send_types) {
    exec.fence();  // every kernel's writes to the source before MPI reads it
    comm.alltoallw(src.data, x.send_types->peers(), x.dst.data, x.recv_types->peers());
    Impl::count_bytes_copied(x.copied_by_mpi);
  } else {
    const unsigned char* send_base = static_cast<const unsigned char*>(src.data);
    unsigned char* recv_base = static_cast<unsigned char*>(x.dst.data);
    if (x.send_buf) {
      send_base = x.send_buf->data();
      for (int p = 0; p < P; ++p) {
        if (p == me) continue;
        copy_sub_box(exec, src, x.my_src,
                     buffer_block(x.send_buf->data() + x.send.displs[p], x.send_boxes[p]),
                     x.send_boxes[p], x.send_boxes[p], itemsize);
      }
    }
    if (x.recv_buf) recv_base = x.recv_buf->data();
    copy_sub_box(exec, src, x.my_src, x.dst, x.my_dst, x.send_boxes[me], itemsize);
    exec.fence();
    if (x.send_host) {
      copy_bytes<Kokkos::HostSpace, M>(x.send_host->data(), send_base, x.send.total);
      comm.alltoallv_bytes(x.send_host->data(), x.send.counts, x.send.displs, x.recv_host->data(),
                           x.recv.counts, x.recv.displs, x.global_max);
      copy_bytes<M, Kokkos::HostSpace>(recv_base, x.recv_host->data(), x.recv.total);
    } else {
      comm.alltoallv_bytes(send_base, x.send.counts, x.send.displs, recv_base, x.recv.counts,
                           x.recv.displs, x.global_max);
    }
    if (x.recv_buf) {
      for (int q = 0; q < P; ++q) {
        if (q == me) continue;
        copy_sub_box(exec, buffer_block(recv_base + x.recv.displs[q], x.recv_boxes[q]),
                     x.recv_boxes[q], x.dst, x.my_dst, x.recv_boxes[q], itemsize);
      }
    }
  }
  exec.fence();
  x.send_buf.reset();
  x.recv_buf.reset();
  x.send_host.reset();
  x.recv_host.reset();
  x.send_types.reset();
  x.recv_types.reset();
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
      [](Exchange<M>& x, const std::vector<Impl::NoPayload>&) { return run_exchange(x); });
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
      [](Exchange<M>& x, const std::vector<Impl::NoPayload>&) { return run_exchange(x); });
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
  Layout target = Layout::replicated(v.gshape(), comm.size());
  if (root >= 0) {
    std::vector<std::int64_t> counts(comm.size(), 0);
    counts[root] = v.gshape()[*v.split()];
    target = Layout::from_counts(v.gshape(), *v.split(), std::move(counts));
  }
  plan.exchange.emplace(plan_exchange(v, target));
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
      [&](GatherPlan<M>& plan, const std::vector<Impl::NoPayload>&) {
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
      [&](GatherPlan<M>& plan, const std::vector<Impl::NoPayload>&) {
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
      [](Plan& plan, const std::vector<Impl::NoPayload>&) {
        return plan.slice ? run_exchange(*plan.slice) : std::move(*plan.whole);
      });
}

namespace {
// What root tells every rank about the tensor it scatters.
struct ScatterMeta {
  std::int32_t ndim;
  std::int32_t dtype;
  std::int64_t extents[Impl::kMaxRank];
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
  const ScatterMeta meta = arguments.agree()[root];
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
          std::vector<std::int64_t> counts(comm.size(), 0);
          counts[root] = gshape[s];
          source = Layout::from_counts(gshape, s, std::move(counts));
        }
        if (me != root) {
          block.extents = source->lshape(me);
          block.strides = Impl::row_major_strides(block.extents);
          if (meta.ndim == 0) block = Impl::allocate_block<M>(gshape, size_of(dtype));
        }
        return plan_exchange(Impl::DistViewAccess::make<M>(*source, dtype, comm, std::move(block)),
                             target);
      },
      [&](Exchange<M>& x, const std::vector<Impl::NoPayload>&) {
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
