#include "kvmap/dist_view.hpp"

#include <ATen/ATen.h>

#include <limits>
#include <sstream>

#include "kvmap/error.hpp"
#include "kvmap/stats.hpp"
#include "kvmap/tensor_bridge.hpp"

#include "agreement.hpp"
#include "dist_view_access.hpp"
#include "local_block.hpp"
#include "tensor_blocks.hpp"
#include "hash.hpp"

namespace kvmap {

namespace Impl {

void check_local_view(DType have, DType want, const LocalBlock& block, int rank,
                      const std::int64_t* static_extents, ViewLayoutKind kind) {
  const int ndim = static_cast<int>(block.extents.size());
  KVMAP_CHECK(have == want, TypeError,
              "kvmap::DistView::local_view: the array holds "
                  << name(have) << " but the view asks for " << name(want));
  KVMAP_CHECK(rank == ndim, TypeError,
              "kvmap::DistView::local_view: the array has " << ndim << " dimensions but the view "
                                                            << "has rank " << rank);
  for (int d = 0; d < rank; ++d) {
    KVMAP_CHECK(static_extents[d] < 0 || static_extents[d] == block.extents[d], TypeError,
                "kvmap::DistView::local_view: static extent "
                    << static_extents[d] << " of axis " << d << " differs from the local "
                    << "shape " << to_string(block.extents));
  }
  if (kind == ViewLayoutKind::Stride) return;
  // Only axes of extent > 1 constrain the strides of a contiguous layout.
  std::int64_t expect = 1;
  auto check_axis = [&](int d) {
    if (block.extents[d] > 1) {
      KVMAP_CHECK(block.strides[d] == expect, TypeError,
                  "kvmap::DistView::local_view: the local shard (shape "
                      << to_string(block.extents) << ", strides " << to_string(block.strides)
                      << ") is not "
                      << (kind == ViewLayoutKind::Right ? "LayoutRight" : "LayoutLeft")
                      << "-contiguous; ask for Kokkos::LayoutStride");
    }
    expect *= block.extents[d] > 0 ? block.extents[d] : 1;
  };
  if (kind == ViewLayoutKind::Right) {
    for (int d = ndim - 1; d >= 0; --d) check_axis(d);
  } else {
    for (int d = 0; d < ndim; ++d) check_axis(d);
  }
}

}  // namespace Impl

template <class M>
DistView<M> DistView<M>::create(const char* site, Shape gshape, DType dtype,
                                std::optional<int> split, Comm comm, Fill fill, double value) {
  return Detail::new_balanced<M>(
      site, gshape, dtype, split, comm,
      [&](Detail::Signature& sig) {
        if (fill == Fill::Value) sig.arg("value", value);
      },
      [&](DistView& view) {
        if (fill == Fill::Nothing) return;
        at::Tensor t = view.local();
        if (fill == Fill::Zeros) t.zero_();
        if (fill == Fill::Value) t.fill_(value);
        if (fill == Fill::GlobalIndex) {
          const std::int64_t off = view.split() ? view.layout().offset(comm.rank()) : 0;
          at::arange_out(t, off, off + t.numel(), 1);
        }
      });
}

template <class M>
DistView<M> DistView<M>::empty(Shape gshape, DType dtype, std::optional<int> split, Comm comm) {
  return create("DistView::empty", std::move(gshape), dtype, split, std::move(comm), Fill::Nothing,
                0.0);
}

template <class M>
DistView<M> DistView<M>::zeros(Shape gshape, DType dtype, std::optional<int> split, Comm comm) {
  return create("DistView::zeros", std::move(gshape), dtype, split, std::move(comm), Fill::Zeros,
                0.0);
}

template <class M>
DistView<M> DistView<M>::full(Shape gshape, double value, DType dtype, std::optional<int> split,
                              Comm comm) {
  return create("DistView::full", std::move(gshape), dtype, split, std::move(comm), Fill::Value,
                value);
}

template <class M>
DistView<M> DistView<M>::arange(std::int64_t n, DType dtype, std::optional<int> split, Comm comm) {
  return create("DistView::arange", Shape{n}, dtype, split, std::move(comm), Fill::GlobalIndex,
                0.0);
}

namespace {
// What each rank knows of its piece in from_local.
struct LocalMeta {
  std::int32_t split_given;
  std::int32_t split;
  std::int32_t ndim;
  std::int32_t dtype;
  std::int64_t extents[Impl::kMaxRank];

  // What must agree on every rank: split, rank, dtype and every extent but the split axis's.
  std::uint64_t fingerprint() const {
    std::uint64_t h = Detail::combine64(static_cast<std::uint64_t>(split_given),
                                        static_cast<std::uint64_t>(split_given ? split : 0));
    h = Detail::combine64(Detail::combine64(h, static_cast<std::uint64_t>(ndim)),
                          static_cast<std::uint64_t>(dtype));
    for (int d = 0; d < ndim; ++d) {
      if (!split_given || d != split)
        h = Detail::combine64(h, static_cast<std::uint64_t>(extents[d]));
    }
    return h;
  }
};

// What every rank gathers from every rank: its rows and the fingerprint of the rest.
struct LocalRows {
  std::int64_t count;
  std::uint64_t meta;
};

std::string describe(const LocalMeta& m) {
  Shape s(m.extents, m.extents + std::min(m.ndim, Impl::kMaxRank));
  std::ostringstream os;
  os << "shape " << to_string(s) << " and dtype "
     << (m.dtype >= 0 && m.dtype < kNumDTypes ? name(static_cast<DType>(m.dtype)) : "?");
  return os.str();
}

std::string mismatch(int r, const LocalMeta& m, const LocalMeta& ref) {
  std::ostringstream why;
  if (m.split_given != ref.split_given || (m.split_given && m.split != ref.split)) {
    why << "rank " << r << " passed split=" << (m.split_given ? std::to_string(m.split) : "None")
        << " but rank 0 passed split=" << (ref.split_given ? std::to_string(ref.split) : "None");
  } else {
    why << "rank " << r << " has a local shard of " << describe(m) << " but rank 0 has "
        << describe(ref) << "; "
        << (ref.split_given ? "all extents except the split axis " + std::to_string(ref.split)
                            : std::string("a replicated array needs identical shapes"))
        << " and the dtype must agree on every rank";
  }
  return "kvmap::DistView::from_local: " + why.str();
}

// Every rank sees the same gathered fingerprints and reaches the same verdict; only then do
// rank 0's and the first differing rank's pieces travel, for the messages.
void check_local_metas(const Comm& comm, const LocalMeta& mine, const std::vector<LocalRows>& all) {
  std::vector<Detail::RankStatus> statuses;
  for (const LocalRows& rows : all) statuses.push_back(Detail::RankStatus{0, 1, rows.meta});
  const std::vector<int> bad = Detail::ranks_differing(statuses, 0);
  if (!bad.empty()) {
    Detail::raise_differing(comm, 0, bad, Detail::bytes_of(mine),
                            [](int r, const std::string& theirs, const std::string& rank0s) {
                              return mismatch(r, Detail::from_bytes<LocalMeta>(theirs),
                                              Detail::from_bytes<LocalMeta>(rank0s));
                            });
  }
  if (mine.split_given) {
    std::int64_t total = 0;
    for (int r = 0; r < comm.size(); ++r) {
      if (all[r].count > std::numeric_limits<std::int64_t>::max() - total) {
        Detail::raise_detected<ValueError>(
            comm, {r}, {"kvmap::DistView::from_local: the split extents sum beyond int64"});
      }
      total += all[r].count;
    }
  }
}
}  // namespace

template <class M>
DistView<M> DistView<M>::from_local_source(const LocalSource& source, std::optional<int> split,
                                           Comm comm) {
  struct Plan {
    Impl::LocalBlock block;
    DType dtype;
    LocalMeta meta;
    std::vector<std::int64_t> counts;
  };
  // Every rank's count is data that really moves: one gather of 32 bytes per rank.
  Detail::Collective<LocalRows> call("DistView::from_local", comm);
  std::optional<Plan> plan = call.plan([&](Detail::Signature&, LocalRows& rows) {
    DType dtype = DType::Float32;
    Impl::LocalBlock block = source(dtype);
    const int ndim = static_cast<int>(block.extents.size());
    Detail::checked_span_bytes(block.extents, block.strides, size_of(dtype));
    KVMAP_CHECK(!split || ndim > 0, ValueError,
                "kvmap::DistView::from_local: a 0-dimensional array cannot be split (split="
                    << *split << "); pass split=std::nullopt");
    LocalMeta meta{};
    meta.split_given = split ? 1 : 0;
    if (split) meta.split = Impl::normalize_axis(*split, ndim, "split axis");
    meta.ndim = ndim;
    meta.dtype = static_cast<std::int32_t>(dtype);
    for (int d = 0; d < ndim; ++d) meta.extents[d] = block.extents[d];
    rows.count = split ? block.extents[meta.split] : 0;
    rows.meta = meta.fingerprint();
    // The layout's counts, filled from the gather (a replicated array has none).
    std::vector<std::int64_t> counts(split ? static_cast<std::size_t>(comm.size()) : 0);
    return Plan{std::move(block), dtype, meta, std::move(counts)};
  });
  const std::vector<LocalRows> all = call.agree_gather();
  check_local_metas(comm, plan->meta, all);
  const LocalMeta& mine = plan->meta;
  Shape gshape(mine.extents, mine.extents + mine.ndim);
  if (!mine.split_given) {
    return call.execute([&] {
      return DistView(Layout::replicated(gshape, comm.size()), plan->dtype, comm,
                      std::move(plan->block));
    });
  }
  std::int64_t total = 0;
  for (int r = 0; r < comm.size(); ++r) total += plan->counts[r] = all[r].count;
  gshape[mine.split] = total;
  return call.execute([&] {
    Layout layout = Layout::from_counts(std::move(gshape), mine.split, std::move(plan->counts));
    return DistView(std::move(layout), plan->dtype, comm, std::move(plan->block));
  });
}

template <class M>
DistView<M> DistView<M>::from_local(const at::Tensor& local, std::optional<int> split, Comm comm) {
  return from_local_source(
      [&local](DType& dtype) {
        Impl::LocalBlock block = Detail::block_from_tensor(local);
        dtype = from_torch(local.scalar_type());
        Detail::check_same_device(local, Impl::device_of<M>(),
                                  "kvmap::DistView::from_local: the tensor");
        return block;
      },
      split, std::move(comm));
}

namespace Detail {
namespace {
// What this rank checks alone of a tensor adopted under `layout` (from_local(layout) in its
// plan, adopt_without_agreement before the caller's collective): its block and dtype.
template <class M>
std::pair<Impl::LocalBlock, DType> adoptable(const at::Tensor& local, const Layout& layout,
                                             const Comm& comm, const char* who) {
  KVMAP_CHECK(local.defined(), ValueError, who << ": the tensor is undefined");
  const DType dtype = from_torch(local.scalar_type());
  KVMAP_CHECK(layout.nranks() == comm.size(), ValueError,
              who << ": the layout is for " << layout.nranks() << " ranks, the communicator has "
                  << comm.size());
  check_same_device(local, Impl::device_of<M>(), std::string(who) + ": the tensor");
  Impl::LocalBlock block = block_from_tensor(local);
  checked_span_bytes(block.extents, block.strides, size_of(dtype));
  return {std::move(block), dtype};
}
}  // namespace

template <class M>
DistView<M> adopt_without_agreement(const at::Tensor& local, Layout layout, Comm comm) {
  auto [block, dtype] = adoptable<M>(local, layout, comm, "kvmap: adopting a shard");
  return DistViewAccess::make<M>(std::move(layout), dtype, std::move(comm), std::move(block));
}
#define KVMAP_INSTANTIATE_ADOPT(Space) \
  template DistView<Space> adopt_without_agreement<Space>(const at::Tensor&, Layout, Comm);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_ADOPT)
#undef KVMAP_INSTANTIATE_ADOPT
}  // namespace Detail

template <class M>
DistView<M> DistView<M>::from_local(const at::Tensor& local, const Layout& layout, Comm comm) {
  struct Plan {
    Impl::LocalBlock block;
    DType dtype;
  };
  Detail::Collective<> call("DistView::from_local(layout)", comm);
  std::optional<Plan> plan = call.plan([&](Detail::Signature& sig, Detail::NoPayload&) {
    auto [block, dtype] = Detail::adoptable<M>(local, layout, comm, "kvmap::DistView::from_local");
    sig.arg("layout", layout).arg("dtype", dtype);
    const Shape expected = layout.lshape(comm.rank());
    KVMAP_CHECK(block.extents == expected, ValueError,
                "kvmap::DistView::from_local: rank "
                    << comm.rank() << "'s tensor has shape " << to_string(block.extents)
                    << ", but the layout gives it " << to_string(expected));
    return Plan{std::move(block), dtype};
  });
  call.agree();
  return call.execute([&] { return DistView(layout, plan->dtype, comm, std::move(plan->block)); });
}

template <class M>
at::Tensor DistView<M>::local() const {
  return Impl::tensor_from_block(block_, dtype_, Impl::device_of<M>());
}

template <class M>
std::vector<Shape> DistView<M>::lshape_map() const {
  std::vector<Shape> out;
  out.reserve(static_cast<std::size_t>(layout_.nranks()));
  for (int r = 0; r < layout_.nranks(); ++r) out.push_back(layout_.lshape(r));
  return out;
}

#define KVMAP_INSTANTIATE_DIST_VIEW(Space) template class DistView<Space>;
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_DIST_VIEW)

}  // namespace kvmap
