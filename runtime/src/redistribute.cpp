// Redistribution of DistViews between layouts: one MPI collective per operation, with
// packing and unpacking done by Kokkos kernels on the data's execution space.
#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <sstream>

#include "kvmap/dist_view.hpp"
#include "kvmap/error.hpp"
#include "kvmap/impl/box_copy.hpp"
#include "kvmap/impl/fault_injection.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"

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

Side plan_side(const Impl::LocalBlock& block, const Box& whole, const std::vector<Box>& pieces, int me,
               std::size_t itemsize, bool include_self) {
  const int P = static_cast<int>(pieces.size());
  Side side;
  side.counts.assign(P, 0);
  side.displs.assign(P, 0);
  side.direct = dense(block, itemsize);
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

// Moves src's data into a fresh DistView of layout `target`. Arguments were agreed.
template <class M>
DistView<M> move_data(const DistView<M>& src, const Layout& target) {
  using Exec = typename DistView<M>::execution_space;
  Exec exec;
  const Comm& comm = src.comm();
  const int me = comm.rank(), P = comm.size();
  const std::size_t itemsize = src.itemsize();
  const Layout& S = src.layout();
  Impl::LocalBlock dst = Impl::allocate_block<M>(target.lshape(me), itemsize);
  const Box my_src = held(S, me), my_dst = held(target, me);

  if (S.is_replicated() || target == S) {
    // Every rank already holds its part (replicated source, or an unchanged layout): a local
    // copy into the new DistView's own memory, no communication.
    copy_sub_box(exec, src.block(), my_src, dst, my_dst, my_dst, itemsize);
    exec.fence();
    return DistView<M>::from_parts(target, src.dtype(), comm, std::move(dst));
  }

  if (target.is_replicated()) {
    // Every rank's block goes to every rank: one allgatherv.
    std::vector<Box> theirs(P);
    for (int r = 0; r < P; ++r) theirs[r] = held(S, r);
    std::vector<Box> mine(P, my_src);
    const Side send = plan_side(src.block(), my_src, mine, me, itemsize, true);
    const Side recv = plan_side(dst, my_dst, theirs, me, itemsize, true);
    std::optional<Scratch<M>> send_buf, recv_buf;
    const unsigned char* send_ptr = static_cast<const unsigned char*>(src.block().data) + send.displs[me];
    if (!send.direct) {
      send_buf.emplace(send.counts[me]);
      copy_sub_box(exec, src.block(), my_src, buffer_block(send_buf->data(), my_src), my_src, my_src, itemsize);
      send_ptr = send_buf->data();
    }
    unsigned char* recv_base = static_cast<unsigned char*>(dst.data);
    if (!recv.direct) {
      recv_buf.emplace(recv.total);
      recv_base = recv_buf->data();
    }
    exec.fence();
    comm.allgatherv_bytes(send_ptr, send.counts[me], recv_base, recv.counts, recv.displs);
    if (!recv.direct) {
      for (int r = 0; r < P; ++r) {
        copy_sub_box(exec, buffer_block(recv_base + recv.displs[r], theirs[r]), theirs[r], dst, my_dst,
                     theirs[r], itemsize);
      }
    }
    exec.fence();
    return DistView<M>::from_parts(target, src.dtype(), comm, std::move(dst));
  }

  std::vector<Box> send_boxes(P), recv_boxes(P);
  for (int p = 0; p < P; ++p) {
    send_boxes[p] = intersect(my_src, held(target, p));
    recv_boxes[p] = intersect(held(S, p), my_dst);
  }
  // The local part is copied directly, the rest exchanged.
  const Side send = plan_side(src.block(), my_src, send_boxes, me, itemsize, false);
  const Side recv = plan_side(dst, my_dst, recv_boxes, me, itemsize, false);
  // A bound every rank computes alike: no rank sends or receives beyond its dense blocks.
  std::size_t global_max = 0;
  for (int r = 0; r < P; ++r) {
    global_max = std::max<std::size_t>(
        global_max, static_cast<std::size_t>(std::max(held(S, r).volume(), held(target, r).volume())) *
                        itemsize);
  }
  std::optional<Scratch<M>> send_buf, recv_buf;
  const unsigned char* send_base = static_cast<const unsigned char*>(src.block().data);
  unsigned char* recv_base = static_cast<unsigned char*>(dst.data);
  if (!send.direct) {
    send_buf.emplace(send.total);
    send_base = send_buf->data();
    for (int p = 0; p < P; ++p) {
      if (p == me) continue;
      copy_sub_box(exec, src.block(), my_src, buffer_block(send_buf->data() + send.displs[p], send_boxes[p]),
                   send_boxes[p], send_boxes[p], itemsize);
    }
  }
  if (!recv.direct) {
    recv_buf.emplace(recv.total);
    recv_base = recv_buf->data();
  }
  copy_sub_box(exec, src.block(), my_src, dst, my_dst, send_boxes[me], itemsize);
  exec.fence();
  comm.alltoallv_bytes(send_base, send.counts, send.displs, recv_base, recv.counts, recv.displs,
                       global_max);
  if (!recv.direct) {
    for (int q = 0; q < P; ++q) {
      if (q == me) continue;
      copy_sub_box(exec, buffer_block(recv_base + recv.displs[q], recv_boxes[q]), recv_boxes[q], dst,
                   my_dst, recv_boxes[q], itemsize);
    }
  }
  exec.fence();
  return DistView<M>::from_parts(target, src.dtype(), comm, std::move(dst));
}

void check_device(const at::Tensor& t, Impl::DeviceSpec want, const char* what) {
  const Impl::DeviceSpec have = Impl::device_spec_of(t);
  KVMAP_CHECK(want.kind == have.kind && (want.kind == Impl::DeviceKind::CPU || want.index == have.index),
              TypeError,
              "kvmap::DistView::" << what << ": the tensor is on " << t.device()
                                  << " but this DistView's memory space maps to "
                                  << Impl::torch_device(want));
}

std::string split_str(std::optional<int> split) {
  return split ? std::to_string(*split) : std::string("None");
}

}  // namespace

template <class M>
DistView<M> DistView<M>::redistribute(const Layout& target) const {
  std::exception_ptr error;
  try {
    Impl::fault_point("DistView::redistribute", comm_.rank());
    KVMAP_CHECK(target.nranks() == comm_.size(), ValueError,
                "kvmap::DistView::redistribute: the target " << target << " is for "
                                                             << target.nranks()
                                                             << " ranks but the communicator has "
                                                             << comm_.size());
    KVMAP_CHECK(target.gshape() == gshape(), ValueError,
                "kvmap::DistView::redistribute: the target " << target << " has global shape "
                                                             << to_string(target.gshape())
                                                             << ", the array " << to_string(gshape()));
  } catch (...) {
    error = std::current_exception();
  }
  comm_.agree_arguments(error, "DistView::redistribute", "redistribute(" + target.str() + ")");
  return move_data(*this, target);  // a new DistView with its own memory, also when unchanged
}

namespace {
template <class M>
DistView<M> to_balanced(const DistView<M>& v, std::optional<int> split, const char* site) {
  std::exception_ptr error;
  std::optional<Layout> target;
  try {
    Impl::fault_point(site, v.comm().rank());
    target = Layout::balanced(v.gshape(), split, v.comm().size());
  } catch (...) {
    error = std::current_exception();
  }
  v.comm().agree_arguments(error, site, std::string(site) + "(split=" + split_str(split) + ")");
  return move_data(v, *target);  // a new DistView with its own memory, also when unchanged
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

template <class M>
at::Tensor DistView<M>::gather(int root) const {
  std::exception_ptr error;
  std::optional<Layout> target;
  try {
    Impl::fault_point("DistView::gather", comm_.rank());
    KVMAP_CHECK(root >= 0 && root < comm_.size(), ValueError,
                "kvmap::DistView::gather: root " << root << " out of range for " << comm_.size()
                                                 << " ranks");
    if (split()) {
      std::vector<std::int64_t> counts(comm_.size(), 0);
      counts[root] = gshape()[*split()];
      target = Layout::from_counts(gshape(), *split(), std::move(counts));
    }
  } catch (...) {
    error = std::current_exception();
  }
  comm_.agree_arguments(error, "DistView::gather", "gather(root=" + std::to_string(root) + ")");
  if (!target) {
    // Replicated: root's own copy, never an alias of the DistView's storage.
    if (comm_.rank() != root) return at::Tensor();
    at::Tensor copy = local().clone();
    Impl::count_bytes_copied(static_cast<std::uint64_t>(copy.numel()) * copy.element_size());
    return copy;
  }
  DistView on_root = move_data(*this, *target);
  return comm_.rank() == root ? on_root.local() : at::Tensor();
}

template <class M>
at::Tensor DistView<M>::allgather() const {
  std::exception_ptr error;
  try {
    Impl::fault_point("DistView::allgather", comm_.rank());
  } catch (...) {
    error = std::current_exception();
  }
  comm_.agree_arguments(error, "DistView::allgather", "allgather()");
  if (!split()) {
    // Replicated: a copy, like every other gather, never an alias of the storage.
    at::Tensor copy = local().clone();
    Impl::count_bytes_copied(static_cast<std::uint64_t>(copy.numel()) * copy.element_size());
    return copy;
  }
  return move_data(*this, Layout::replicated(gshape(), comm_.size())).local();
}

template <class M>
DistView<M> DistView<M>::from_global(const at::Tensor& full, std::optional<int> split, Comm comm) {
  std::exception_ptr error;
  Impl::LocalBlock block;
  DType dtype = DType::Float32;
  std::optional<Layout> target;
  std::ostringstream sig;
  try {
    Impl::fault_point("DistView::from_global", comm.rank());
    block = Impl::block_from_tensor(full);
    dtype = from_torch(full.scalar_type());
    check_device(full, Impl::device_of<M>(), "from_global");
    target = Layout::balanced(block.extents, split, comm.size());
    sig << "from_global(shape=" << to_string(block.extents) << ", dtype=" << name(dtype);
  } catch (...) {
    error = std::current_exception();
  }
  sig << ", split=" << split_str(split) << ")";
  comm.agree_arguments(error, "DistView::from_global", sig.str());
  Layout whole = Layout::replicated(block.extents, comm.size());
  DistView everything(std::move(whole), dtype, comm, std::move(block));
  if (!split) return everything;
  return move_data(everything, *target);
}

template <class M>
DistView<M> DistView<M>::scatter(const at::Tensor& full_on_root, std::optional<int> split,
                                 Comm comm, int root) {
  struct Meta {
    std::int32_t ndim;
    std::int32_t dtype;
    std::int64_t extents[Impl::kMaxRank];
  };
  std::exception_ptr error;
  Impl::LocalBlock block;
  Meta meta;
  std::memset(&meta, 0, sizeof meta);
  try {
    Impl::fault_point("DistView::scatter", comm.rank());
    KVMAP_CHECK(root >= 0 && root < comm.size(), ValueError,
                "kvmap::DistView::scatter: root " << root << " out of range for " << comm.size()
                                                  << " ranks");
    if (comm.rank() == root) {
      block = Impl::block_from_tensor(full_on_root);
      check_device(full_on_root, Impl::device_of<M>(), "scatter");
      meta.ndim = static_cast<std::int32_t>(block.extents.size());
      meta.dtype = static_cast<std::int32_t>(from_torch(full_on_root.scalar_type()));
      for (int d = 0; d < meta.ndim; ++d) meta.extents[d] = block.extents[d];
      Layout::balanced(block.extents, split, comm.size());  // validates split for this shape
    }
  } catch (...) {
    error = std::current_exception();
  }
  comm.agree_arguments(error, "DistView::scatter",
                       "scatter(split=" + split_str(split) + ", root=" + std::to_string(root) + ")");
  comm.bcast_bytes(&meta, sizeof meta, root);
  const Shape gshape(meta.extents, meta.extents + meta.ndim);
  const DType dtype = static_cast<DType>(meta.dtype);
  const Layout target = Layout::balanced(gshape, split, comm.size());
  if (meta.ndim == 0) {
    // A scalar: broadcast its one element.
    Impl::LocalBlock dst = Impl::allocate_block<M>(gshape, size_of(dtype));
    if (comm.rank() == root) {
      const auto g = Impl::make_box_geometry({}, {}, {});
      Impl::box_copy(execution_space(), block.data, dst.data, g, size_of(dtype));
      execution_space().fence();
    }
    comm.bcast_bytes(dst.data, size_of(dtype), root);
    return DistView(target, dtype, std::move(comm), std::move(dst));
  }
  // Root holds every row of axis s; everyone else an empty piece.
  const int s = Impl::normalize_axis(split.value_or(0), meta.ndim, "split axis");
  std::vector<std::int64_t> counts(comm.size(), 0);
  counts[root] = gshape[s];
  Layout on_root = Layout::from_counts(gshape, s, std::move(counts));
  if (comm.rank() != root) {
    block.extents = on_root.lshape(comm.rank());
    block.strides = Impl::row_major_strides(block.extents);
    block.data = nullptr;
  }
  DistView source(std::move(on_root), dtype, comm, std::move(block));
  return move_data(source, target);
}

#define KVMAP_INSTANTIATE_REDISTRIBUTE(Space)                                                  \
  template DistView<Space> DistView<Space>::redistribute(const Layout&) const;                 \
  template DistView<Space> DistView<Space>::resplit(std::optional<int>) const;                 \
  template DistView<Space> DistView<Space>::balance() const;                                   \
  template at::Tensor DistView<Space>::gather(int) const;                                      \
  template at::Tensor DistView<Space>::allgather() const;                                      \
  template DistView<Space> DistView<Space>::from_global(const at::Tensor&, std::optional<int>, \
                                                        Comm);                                 \
  template DistView<Space> DistView<Space>::scatter(const at::Tensor&, std::optional<int>, Comm, int);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_REDISTRIBUTE)

}  // namespace kvmap
