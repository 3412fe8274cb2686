#include "exchange_plan.hpp"

#include <algorithm>
#include <climits>
#include <mutex>
#include <tuple>

#include "kvmap/error.hpp"

#include "comm_registry.hpp"
#include "local_block.hpp"
#include "stats_counters.hpp"

namespace kvmap::Detail {

namespace {

// Packs a side into scratch unless every piece can travel in place; in place pieces use a
// contiguous run or a datatype placed relative to the block's base.
void plan_side(Side& side, bool send, const std::vector<std::int64_t>& strides, const Box& whole,
               std::size_t itemsize, bool datatypes_allowed, bool staged, Detail::Messages& x) {
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
  std::vector<Detail::MpiDatatype> types(side.pieces.size());
  for (std::size_t i = 0; i < side.pieces.size() && !side.packed; ++i) {
    const Piece& p = side.pieces[i];
    if (contiguous_in(strides, p.box)) continue;
    if (!datatypes_allowed) {
      side.packed = true;
      break;
    }
    try {
      types[i] = Detail::box_type(p.box.extents(), byte_strides, itemsize,
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
    return extent > 0 ? checked_numel(L.gshape()) / extent : 0;
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
  Detail::PeerTypes send(P), recv(P);
  auto add = [&](Detail::PeerTypes& side, int peer, const Box& box, const Box& whole,
                 const std::vector<std::int64_t>& strides,
                 const std::vector<std::int64_t>& byte_strides) {
    side.set(peer, Detail::box_type(box.extents(), byte_strides, itemsize,
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

// A replicated target: every holder's block to every rank, in one MPI_Allgatherv where the
// counts fit, in point-to-point pieces otherwise.
void plan_allgather(ExchangePlan& x, const PlanKey& key, int P) {
  const Layout& S = key.source;
  const std::size_t itemsize = key.itemsize;
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
  if (fits) return;
  // In pieces, point to point; its own block too goes through MPI (a message to itself).
  const std::size_t mine = x.send.packed_bytes;
  const std::size_t send_at =
      in_place_send ? offset_bytes(key.source_strides, x.my_src, x.my_src, itemsize) : 0;
  for (int r = 0; r < P; ++r) {
    const auto bytes = static_cast<std::size_t>(x.blocks[r].volume()) * itemsize;
    if (bytes > 0) x.messages.recv(r, displs[r], bytes);
    if (mine > 0) x.messages.send(r, send_at, mine);
  }
}

// Everything else: pieces with the peers whose rows meet this rank's, each side in place,
// as datatypes, or packed; one MPI_Alltoallw for a change of split axis on host memory.
void plan_point_to_point(ExchangePlan& x, const PlanKey& key, int me, int P,
                         bool datatypes_allowed) {
  const Layout& S = key.source;
  const Layout& T = key.target;
  x.kind = ExchangeKind::PointToPoint;
  const std::vector<std::int64_t> dst_strides = row_major_strides(T.lshape(me));
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
    return;
  }
  plan_side(x.recv, false, dst_strides, x.my_dst, key.itemsize, datatypes_allowed, key.staged,
            x.messages);
  plan_side(x.send, true, key.source_strides, x.my_src, key.itemsize, datatypes_allowed, key.staged,
            x.messages);
}

ExchangePlan build_plan(const PlanKey& key, int me, int P, bool host_accessible) {
  ExchangePlan x;
  x.itemsize = key.itemsize;
  x.staged = key.staged;
  x.my_src = held(key.source, me);
  x.my_dst = held(key.target, me);
  if (key.source.is_replicated() || key.target == key.source) {
    x.kind = ExchangeKind::Local;  // every rank already holds its part
    x.local = x.my_dst;
  } else if (key.target.is_replicated()) {
    plan_allgather(x, key, P);
  } else {
    plan_point_to_point(x, key, me, P, host_accessible && !key.staged);
  }
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
      on_release([] { PlanCache::instance().clear(); });
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

}  // namespace

std::shared_ptr<ExchangePlan> find_or_build_plan(PlanKey key, int me, int P, bool host_accessible) {
  std::shared_ptr<ExchangePlan> plan = PlanCache::instance().find(key);
  if (!plan) {
    plan = std::make_shared<ExchangePlan>(build_plan(key, me, P, host_accessible));
    count_plan_built();
    PlanCache::instance().put(std::move(key), plan);
  }
  return plan;
}

}  // namespace kvmap::Detail
