#pragma once
// Running a redistribution plan on one memory space: the destination and scratch allocated
// before the agreement (plan_exchange), then only kernels and MPI after it (run_exchange):
// a local copy, an allgather, an all-to-all MPI packs, or point-to-point messages, each in
// place, packed by kernels, or staged through host memory for an MPI that cannot read
// device memory. Used by redistribute.cpp alone.
#include <Kokkos_Core.hpp>

#include <array>
#include <complex>
#include <optional>

#include "detail.hpp"
#include "kvmap/dist_view.hpp"

#include "allocation.hpp"
#include "box_copy.hpp"
#include "comm_registry.hpp"
#include "dist_view_access.hpp"
#include "exchange_plan.hpp"
#include "gpu_aware_mpi.hpp"
#include "stats_counters.hpp"
#include "local_block.hpp"

namespace kvmap::Detail {

// Packing memory comes from allocate_block, whose cache recycles large blocks: fresh
// allocations cost page faults on every call, which dominate the exchange on many machines.
template <class M>
struct Scratch {
  LocalBlock block;
  explicit Scratch(std::size_t bytes)
      : block(allocate_block<M>({static_cast<std::int64_t>(bytes)}, 1)) {}
  unsigned char* data() const { return static_cast<unsigned char*>(block.data); }
};

// MPI and device memory: without a GPU-aware MPI (platform/gpu_aware_mpi.hpp; or when tests
// force it), the packed bytes go through host buffers on their way to and from MPI.
template <class M>
bool staged_through_host() {
  return !mpi_reads_directly(is_host_accessible<M>);
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
  count_bytes_copied(n);
}

// A broadcast of one element (at most 16 bytes: complex128) of M memory from root; staged
// through a buffer on the stack, so nothing is allocated after the agreement.
template <class M>
void bcast_element(const Comm& comm, void* data, DType dtype, int root) {
  const std::size_t n = size_of(dtype);
  if (!staged_through_host<M>()) {
    Detail::transport(comm).bcast_bytes(data, n, root);
    return;
  }
  std::array<unsigned char, 16> host{};
  static_assert(sizeof(std::complex<double>) <= sizeof(host), "an element fits the buffer");
  if (comm.rank() == root) copy_bytes<Kokkos::HostSpace, M>(host.data(), data, n);
  Detail::transport(comm).bcast_bytes(host.data(), n, root);
  if (comm.rank() != root) copy_bytes<M, Kokkos::HostSpace>(data, host.data(), n);
}

// The global box `sub` from a block holding `src_whole` into one holding `dst_whole`: one
// kernel on `exec`, counted.
template <class Exec>
void copy_sub_box(const Exec& exec, DType dtype, const LocalBlock& src, const Box& src_whole,
                  const LocalBlock& dst, const Box& dst_whole, const Box& sub) {
  if (sub.volume() == 0) return;
  const std::size_t itemsize = size_of(dtype);
  const auto g = make_strided_copy(sub.extents(), src.strides, dst.strides);
  box_copy(exec, address(src, src_whole, sub, itemsize),
           const_cast<unsigned char*>(address(dst, dst_whole, sub, itemsize)), g, dtype);
  count_bytes_copied(static_cast<std::uint64_t>(sub.volume()) * itemsize);
}

// One call's redistribution, planned: the destination and every scratch buffer are
// allocated here (before the agreement), so that run_exchange (after it) only runs kernels
// and MPI.
template <class M>
struct PlannedExchange {
  PlannedExchange(DistView<M> source, Layout target_layout)
      : src(std::move(source)), target(std::move(target_layout)) {}
  DistView<M> src;
  Layout target;
  std::shared_ptr<ExchangePlan> plan;
  LocalBlock src_block, dst;
  std::optional<Scratch<M>> send_buf, recv_buf;
  // Staged exchanges: MPI's copies of send_buf and recv_buf in host memory.
  std::optional<Scratch<Kokkos::HostSpace>> send_host, recv_host;
};

template <class M>
PlannedExchange<M> plan_exchange(const DistView<M>& src, const Layout& target) {
  const Comm& comm = src.comm();
  const int me = comm.rank();
  PlannedExchange<M> x(src, target);
  x.src_block = DistViewAccess::block(src);
  PlanKey key{comm.id(),           src.layout(),   target,
              x.src_block.strides, src.itemsize(), staged_through_host<M>(),
              mpi_count_limit()};
  x.plan = find_or_build_plan(std::move(key), me, comm.size(), is_host_accessible<M>);
  const ExchangePlan& p = *x.plan;
  x.dst = allocate_block<M>(target.lshape(me), src.itemsize());
  if (p.send.packed && p.send.packed_bytes > 0) x.send_buf.emplace(p.send.packed_bytes);
  if (p.recv.packed && p.recv.packed_bytes > 0) x.recv_buf.emplace(p.recv.packed_bytes);
  if (p.staged) {
    if (p.send.packed_bytes > 0) x.send_host.emplace(p.send.packed_bytes);
    if (p.recv.packed_bytes > 0) x.recv_host.emplace(p.recv.packed_bytes);
  }
  return x;
}

// The buffers MPI reads and writes: the sides' own, or their host copies when staged (the
// send side copied to host memory here, the receive side back by unstage_recv).
struct MpiBuffers {
  const void* send;
  void* recv;
};

template <class M>
MpiBuffers stage_send(PlannedExchange<M>& x, const void* send_base, void* recv_base) {
  const ExchangePlan& p = *x.plan;
  if (!p.staged) return {send_base, recv_base};
  if (x.send_host)
    copy_bytes<Kokkos::HostSpace, M>(x.send_host->data(), send_base, p.send.packed_bytes);
  return {x.send_host ? x.send_host->data() : nullptr, x.recv_host ? x.recv_host->data() : nullptr};
}

template <class M>
void unstage_recv(PlannedExchange<M>& x, void* recv_base) {
  const ExchangePlan& p = *x.plan;
  if (p.staged && x.recv_host) {
    copy_bytes<M, Kokkos::HostSpace>(recv_base, x.recv_host->data(), p.recv.packed_bytes);
  }
}

// Every rank's block to every rank: packed (or in place for split 0), MPI_Allgatherv or
// point-to-point pieces above the count limit, unpacked into the destination.
template <class M, class Exec>
void run_allgather(const Exec& exec, PlannedExchange<M>& x, DType dtype) {
  const Comm& comm = x.src.comm();
  ExchangePlan& p = *x.plan;  // its messages hold the requests in flight
  const LocalBlock& src = x.src_block;
  unsigned char* send_scratch = x.send_buf ? x.send_buf->data() : nullptr;
  const unsigned char* send_ptr = static_cast<const unsigned char*>(src.data);
  if (p.send.packed) {
    if (send_scratch) {
      copy_sub_box(exec, dtype, src, p.my_src, buffer_block(send_scratch, p.my_src), p.my_src,
                   p.my_src);
    }
    send_ptr = send_scratch;
  }
  unsigned char* recv_scratch = x.recv_buf ? x.recv_buf->data() : nullptr;
  unsigned char* recv_base = p.recv.packed ? recv_scratch : static_cast<unsigned char*>(x.dst.data);
  exec.fence();
  const MpiBuffers mpi = stage_send(x, send_ptr, recv_base);
  if (p.allgatherv) {
    Detail::transport(comm).allgatherv_bytes(mpi.send, p.counts[comm.rank()], mpi.recv, p.counts,
                                             p.displs);
  } else {
    Detail::transport(comm).run(p.messages, mpi.send, mpi.recv);
  }
  unstage_recv(x, recv_base);
  if (p.recv.packed) {
    std::size_t off = 0;
    for (const Box& b : p.blocks) {
      copy_sub_box(exec, dtype, buffer_block(recv_base + off, b), b, x.dst, p.my_dst, b);
      off += static_cast<std::size_t>(b.volume()) * p.itemsize;
    }
  }
}

// Messages with the peers whose rows meet this rank's: the local part by a kernel, packed
// pieces through scratch (staged through host memory when MPI cannot read M), in place
// pieces as contiguous runs or datatypes MPI packs.
template <class M, class Exec>
void run_point_to_point(const Exec& exec, PlannedExchange<M>& x, DType dtype) {
  ExchangePlan& p = *x.plan;  // its messages hold the requests in flight
  const LocalBlock& src = x.src_block;
  unsigned char* send_scratch = x.send_buf ? x.send_buf->data() : nullptr;
  unsigned char* recv_scratch = x.recv_buf ? x.recv_buf->data() : nullptr;
  copy_sub_box(exec, dtype, src, p.my_src, x.dst, p.my_dst, p.local);
  if (p.send.packed) {
    for (const Piece& q : p.send.pieces) {
      copy_sub_box(exec, dtype, src, p.my_src, buffer_block(send_scratch + q.packed_offset, q.box),
                   q.box, q.box);
    }
  }
  exec.fence();  // every kernel's writes before MPI reads them
  const void* send_base = p.send.packed ? send_scratch : src.data;
  void* recv_base = p.recv.packed ? recv_scratch : x.dst.data;
  const MpiBuffers mpi = stage_send(x, send_base, recv_base);
  Detail::transport(x.src.comm()).run(p.messages, mpi.send, mpi.recv);
  unstage_recv(x, recv_base);
  count_bytes_copied(p.send.mpi_packs + p.recv.mpi_packs);
  if (p.recv.packed) {
    for (const Piece& q : p.recv.pieces) {
      copy_sub_box(exec, dtype, buffer_block(recv_scratch + q.packed_offset, q.box), q.box, x.dst,
                   p.my_dst, q.box);
    }
  }
}

// Runs the plan (after the agreement: kernels and MPI only, nothing allocated) and returns
// the new array in the destination block.
template <class M>
DistView<M> run_exchange(PlannedExchange<M>& x) {
  using Exec = typename DistView<M>::execution_space;
  Exec exec;
  const ExchangePlan& p = *x.plan;
  const DType dtype = x.src.dtype();
  switch (p.kind) {
    case ExchangeKind::Local:
      copy_sub_box(exec, dtype, x.src_block, p.my_src, x.dst, p.my_dst, p.local);
      break;
    case ExchangeKind::Allgather: run_allgather(exec, x, dtype); break;
    case ExchangeKind::PointToPoint:
      if (p.send_types) {  // a change of split axis on host memory: one MPI_Alltoallw
        exec.fence();      // every kernel's writes to the source before MPI reads it
        Detail::transport(x.src.comm())
            .alltoallw(x.src_block.data, *p.send_types, x.dst.data, *p.recv_types);
        count_bytes_copied(p.send.mpi_packs + p.recv.mpi_packs);
      } else {
        run_point_to_point(exec, x, dtype);
      }
      break;
  }
  exec.fence();
  x.send_buf.reset();
  x.recv_buf.reset();
  x.send_host.reset();
  x.recv_host.reset();
  return DistViewAccess::make<M>(x.target, dtype, x.src.comm(), std::move(x.dst));
}

}  // namespace kvmap::Detail
