// DistView's collective redistributions (redistribute, resplit, balance, gather,
// allgather, from_global, scatter): each checks its arguments, plans an exchange
// (distributed/exchange_plan.hpp) and allocates before the agreement, and runs it
// (distributed/run_exchange.hpp) after.
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "kvmap/dist_view.hpp"
#include "kvmap/error.hpp"
#include "kvmap/tensor_bridge.hpp"

#include "agreement.hpp"
#include "dist_view_access.hpp"
#include "local_block.hpp"
#include "stats_counters.hpp"
#include "tensor_blocks.hpp"
#include "run_exchange.hpp"
#include "allocation.hpp"

namespace kvmap {

namespace {

using Detail::plan_exchange;
using Detail::PlannedExchange;
using Detail::run_exchange;

// The arguments of a redistribution that every rank must pass alike: the array's layout and
// dtype (so ranks passing different arrays are told, not left in mismatched exchanges).
template <class M>
void describe_source(Detail::Signature& sig, const DistView<M>& v) {
  sig.arg("layout", v.layout()).arg("dtype", v.dtype());
}

}  // namespace

template <class M>
DistView<M> DistView<M>::redistribute(const Layout& target) const {
  return Detail::collective(
      "DistView::redistribute", comm_,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
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
      [](PlannedExchange<M>& x, const Detail::NoPayload&) { return run_exchange(x); });
}

namespace {
template <class M>
DistView<M> to_balanced(const DistView<M>& v, std::optional<int> split, const char* site) {
  return Detail::collective(
      site, v.comm(),
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        describe_source(sig, v);
        sig.arg("split", split);
        return plan_exchange(v, Layout::balanced(v.gshape(), split, v.comm().size()));
      },
      [](PlannedExchange<M>& x, const Detail::NoPayload&) { return run_exchange(x); });
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
  std::optional<PlannedExchange<M>> exchange;
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
      Detail::count_bytes_copied(static_cast<std::uint64_t>(plan.copy.numel()) *
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
  return Detail::collective(
      "DistView::gather", comm_,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        describe_source(sig, *this);
        sig.arg("root", root);
        KVMAP_CHECK(root >= 0 && root < comm_.size(), ValueError,
                    "kvmap::DistView::gather: root " << root << " out of range for " << comm_.size()
                                                     << " ranks");
        return plan_gather(*this, root);
      },
      [&](GatherPlan<M>& plan, const Detail::NoPayload&) {
        return run_gather(plan, root, comm_.rank());
      });
}

template <class M>
at::Tensor DistView<M>::allgather() const {
  return Detail::collective(
      "DistView::allgather", comm_,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        describe_source(sig, *this);
        return plan_gather(*this, -1);
      },
      [&](GatherPlan<M>& plan, const Detail::NoPayload&) {
        return run_gather(plan, -1, comm_.rank());
      });
}

template <class M>
DistView<M> DistView<M>::from_global(const at::Tensor& full, std::optional<int> split, Comm comm) {
  struct Plan {
    std::optional<DistView<M>> whole;         // replicated: the tensor adopted as it is
    std::optional<PlannedExchange<M>> slice;  // split: a copy of this rank's slice
  };
  return Detail::collective(
      "DistView::from_global", comm,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        sig.arg("split", split);
        Impl::LocalBlock block = Detail::block_from_tensor(full);
        const DType dtype = from_torch(full.scalar_type());
        sig.arg("shape", block.extents).arg("dtype", dtype);
        Detail::check_same_device(full, Impl::device_of<M>(),
                                  "kvmap::DistView::from_global: the tensor");
        const Layout target = Layout::balanced(block.extents, split, comm.size());
        Layout whole = Layout::replicated(block.extents, comm.size());
        Plan plan;
        plan.whole.emplace(
            Detail::DistViewAccess::make<M>(std::move(whole), dtype, comm, std::move(block)));
        if (split) plan.slice.emplace(plan_exchange(*plan.whole, target));
        return plan;
      },
      [](Plan& plan, const Detail::NoPayload&) {
        return plan.slice ? run_exchange(*plan.slice) : std::move(*plan.whole);
      });
}

namespace {
// What root tells every rank about the tensor it scatters, reduced by maximum (zeros from the
// other ranks): the number of dimensions and the dtype in word 0, then the extents.
using ScatterMeta = Detail::HeldWords<1 + Impl::kMaxRank>;
}  // namespace

template <class M>
DistView<M> DistView<M>::scatter(const at::Tensor& full_on_root, std::optional<int> split,
                                 Comm comm, int root) {
  // Two agreements: the other ranks learn root's shape and dtype from the first, and
  // allocate their part before the second.
  const int me = comm.rank();
  Detail::Collective<ScatterMeta> arguments("DistView::scatter", comm);
  std::optional<Impl::LocalBlock> root_block =
      arguments.plan([&](Detail::Signature& sig, ScatterMeta& meta) {
        sig.arg("split", split).arg("root", root);
        KVMAP_CHECK(root >= 0 && root < comm.size(), ValueError,
                    "kvmap::DistView::scatter: root " << root << " out of range for " << comm.size()
                                                      << " ranks");
        Impl::LocalBlock block;
        if (me == root) {
          block = Detail::block_from_tensor(full_on_root);
          Detail::check_same_device(full_on_root, Impl::device_of<M>(),
                                    "kvmap::DistView::scatter: the tensor");
          meta.words[0] = block.extents.size() << 32 |
                          static_cast<std::uint64_t>(from_torch(full_on_root.scalar_type()));
          for (std::size_t d = 0; d < block.extents.size(); ++d)
            meta.words[1 + d] = static_cast<std::uint64_t>(block.extents[d]);
          Layout::balanced(block.extents, split, comm.size());  // validates split for this shape
        }
        return block;
      });
  const ScatterMeta& meta = arguments.agree();
  const int ndim = static_cast<int>(meta.words[0] >> 32);
  Shape gshape(static_cast<std::size_t>(ndim));
  for (int d = 0; d < ndim; ++d) gshape[d] = static_cast<std::int64_t>(meta.words[1 + d]);
  const DType dtype = static_cast<DType>(meta.words[0] & 0xffffffffu);

  return Detail::collective(
      "DistView::scatter", comm,
      [&](Detail::Signature& sig, Detail::NoPayload&) {
        sig.arg("gshape", gshape).arg("dtype", dtype).arg("split", split).arg("root", root);
        const Layout target = Layout::balanced(gshape, split, comm.size());
        // Root holds the whole array (a scalar: replicated), everyone else an empty piece.
        Impl::LocalBlock block = me == root ? std::move(*root_block) : Impl::LocalBlock{};
        std::optional<Layout> source;
        if (ndim == 0) {
          source = Layout::replicated(gshape, comm.size());
        } else {
          const int s = Impl::normalize_axis(split.value_or(0), ndim, "split axis");
          source = Layout::on_rank(gshape, s, root, comm.size());
        }
        if (me != root) {
          block.extents = source->lshape(me);
          block.strides = Detail::row_major_strides(block.extents);
          if (ndim == 0) block = Detail::allocate_block<M>(gshape, size_of(dtype));
        }
        return plan_exchange(
            Detail::DistViewAccess::make<M>(*source, dtype, comm, std::move(block)), target);
      },
      [&](PlannedExchange<M>& x, const Detail::NoPayload&) {
        if (ndim == 0) {
          // A scalar: root's one element, broadcast into every rank's copy.
          Detail::bcast_element<M>(comm, x.src_block.data, dtype, root);
        }
        return run_exchange(x);
      });
}

#define KVMAP_INSTANTIATE_REDISTRIBUTE(Space)                                                   \
  template KVMAP_EXPORT DistView<Space> DistView<Space>::redistribute(const Layout&) const;     \
  template KVMAP_EXPORT DistView<Space> DistView<Space>::resplit(std::optional<int>) const;     \
  template KVMAP_EXPORT DistView<Space> DistView<Space>::balance() const;                       \
  template KVMAP_EXPORT at::Tensor DistView<Space>::gather(int) const;                          \
  template KVMAP_EXPORT at::Tensor DistView<Space>::allgather() const;                          \
  template KVMAP_EXPORT DistView<Space> DistView<Space>::from_global(const at::Tensor&,         \
                                                                     std::optional<int>, Comm); \
  template KVMAP_EXPORT DistView<Space> DistView<Space>::scatter(const at::Tensor&,             \
                                                                 std::optional<int>, Comm, int);
KVMAP_FOR_EACH_MEMORY_SPACE(KVMAP_INSTANTIATE_REDISTRIBUTE)

}  // namespace kvmap
