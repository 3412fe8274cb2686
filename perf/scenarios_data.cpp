// Scenarios on data movement and native kernels: redistribution vs raw MPI collectives,
// vmap'd small GEMMs vs KokkosBatched, kvmap::linalg vs raw KokkosBlas + MPI_Allreduce.
#include <ATen/ATen.h>
#include <KokkosBatched_Gemm_Decl.hpp>
#include <KokkosBatched_Gemm_Serial_Impl.hpp>
#include <KokkosBlas1_dot.hpp>
#include <KokkosBlas1_nrm2.hpp>
#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <cmath>
#include <cstring>

#include "harness.hpp"
#include "kvmap/kvmap.hpp"

namespace kvmap_perf {

namespace {

using View = kvmap::DistView<>;
using Layout = kvmap::Layout;

// A 2-d box [r0, r0 + nr) x [c0, c0 + nc) of global indices.
struct Box2 {
  std::int64_t r0 = 0, nr = 0, c0 = 0, nc = 0;
  std::int64_t volume() const { return nr * nc; }
};

Box2 held(const Layout& l, int r) {
  const auto& g = l.gshape();
  Box2 b{0, g[0], 0, g[1]};
  if (*l.split() == 0) {
    b.r0 = l.offset(r), b.nr = l.count(r);
  } else {
    b.c0 = l.offset(r), b.nc = l.count(r);
  }
  return b;
}

Box2 intersect(const Box2& a, const Box2& b) {
  Box2 c;
  c.r0 = std::max(a.r0, b.r0);
  c.nr = std::max<std::int64_t>(0, std::min(a.r0 + a.nr, b.r0 + b.nr) - c.r0);
  c.c0 = std::max(a.c0, b.c0);
  c.nc = std::max<std::int64_t>(0, std::min(a.c0 + a.nc, b.c0 + b.nc) - c.c0);
  return c;
}

using Host = Kokkos::DefaultHostExecutionSpace;
using Flat = Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using Grid = Kokkos::View<double**, Kokkos::LayoutRight, Kokkos::HostSpace,
                          Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// A layout change of a 2-d float64 array (splits 0 or 1) written by hand, the two ways a user
// of MPI would: pack kernels (Kokkos, on the host execution space) + MPI_Alltoallv + unpack
// kernels, or MPI_Alltoallw with subarray datatypes (MPI packs). Planned once: the timed calls
// run kernels and MPI only, from the source shard into a preallocated destination.
class HandExchange {
 public:
  HandExchange(const kvmap::Comm& comm, const Layout& from, const Layout& to, double* src,
               double* dst)
      : comm_(comm), P_(comm.size()) {
    const int me = comm.rank();
    const Box2 mine_src = held(from, me), mine_dst = held(to, me);
    src_ = Grid(src, mine_src.nr, mine_src.nc);
    dst_ = Grid(dst, mine_dst.nr, mine_dst.nc);
    sc_.resize(P_), sd_.resize(P_), rc_.resize(P_), rd_.resize(P_);
    send_.resize(P_), recv_.resize(P_);
    int s = 0, r = 0;
    for (int p = 0; p < P_; ++p) {
      // Boxes in the local coordinates of the source and destination shards.
      Box2 out = intersect(mine_src, held(to, p)), in = intersect(held(from, p), mine_dst);
      out.r0 -= mine_src.r0, out.c0 -= mine_src.c0;
      in.r0 -= mine_dst.r0, in.c0 -= mine_dst.c0;
      send_[p] = out, recv_[p] = in;
      sc_[p] = static_cast<int>(out.volume()), sd_[p] = s, s += sc_[p];
      rc_[p] = static_cast<int>(in.volume()), rd_[p] = r, r += rc_[p];
    }
    send_buf_ = Kokkos::View<double*, Kokkos::HostSpace>("send", s);
    recv_buf_ = Kokkos::View<double*, Kokkos::HostSpace>("recv", r);
    // Alltoallw: one subarray type per peer (MPI_DOUBLE with count 0 for empty boxes).
    auto subarray = [](const Grid& g, const Box2& b) {
      MPI_Datatype t = MPI_DOUBLE;
      if (b.volume() == 0) return t;
      const int sizes[2] = {static_cast<int>(g.extent(0)), static_cast<int>(g.extent(1))};
      const int sub[2] = {static_cast<int>(b.nr), static_cast<int>(b.nc)};
      const int starts[2] = {static_cast<int>(b.r0), static_cast<int>(b.c0)};
      MPI_Type_create_subarray(2, sizes, sub, starts, MPI_ORDER_C, MPI_DOUBLE, &t);
      MPI_Type_commit(&t);
      return t;
    };
    for (int p = 0; p < P_; ++p) {
      wsc_.push_back(send_[p].volume() ? 1 : 0), wrc_.push_back(recv_[p].volume() ? 1 : 0);
      wst_.push_back(subarray(src_, send_[p])), wrt_.push_back(subarray(dst_, recv_[p]));
    }
    wd_.assign(P_, 0);
  }
  ~HandExchange() {
    for (MPI_Datatype& t : wst_)
      if (t != MPI_DOUBLE) MPI_Type_free(&t);
    for (MPI_Datatype& t : wrt_)
      if (t != MPI_DOUBLE) MPI_Type_free(&t);
  }
  HandExchange(const HandExchange&) = delete;
  HandExchange& operator=(const HandExchange&) = delete;

  void alltoallv() {
    for (int p = 0; p < P_; ++p) move_box(send_[p], src_, send_buf_.data() + sd_[p], true);
    Host().fence();
    MPI_Alltoallv(send_buf_.data(), sc_.data(), sd_.data(), MPI_DOUBLE, recv_buf_.data(),
                  rc_.data(), rd_.data(), MPI_DOUBLE, comm_.raw());
    for (int p = 0; p < P_; ++p) move_box(recv_[p], dst_, recv_buf_.data() + rd_[p], false);
    Host().fence();
  }
  void alltoallw() {
    MPI_Alltoallw(src_.data(), wsc_.data(), wd_.data(), wst_.data(), dst_.data(), wrc_.data(),
                  wd_.data(), wrt_.data(), comm_.raw());
  }

 private:
  // Packs box b of g into buf (row-major), or unpacks buf into it.
  static void move_box(const Box2& b, const Grid& g, double* buf, bool pack) {
    if (b.volume() == 0) return;
    const std::int64_t r0 = b.r0, c0 = b.c0, nc = b.nc;
    Kokkos::parallel_for(pack ? "perf::pack" : "perf::unpack",
                         Kokkos::MDRangePolicy<Host, Kokkos::Rank<2>>({0, 0}, {b.nr, b.nc}),
                         [=](const std::int64_t i, const std::int64_t j) {
                           if (pack) {
                             buf[i * nc + j] = g(r0 + i, c0 + j);
                           } else {
                             g(r0 + i, c0 + j) = buf[i * nc + j];
                           }
                         });
  }

  kvmap::Comm comm_;
  int P_;
  Grid src_, dst_;
  std::vector<Box2> send_, recv_;
  std::vector<int> sc_, sd_, rc_, rd_, wsc_, wrc_, wd_;
  std::vector<MPI_Datatype> wst_, wrt_;
  Kokkos::View<double*, Kokkos::HostSpace> send_buf_, recv_buf_;
};

// The machine's copy bandwidth on `bytes` per rank (STREAM copy, a Kokkos kernel on the host
// execution space): the ceiling of any data movement that reads and writes that many bytes.
class CopyKernel {
 public:
  explicit CopyKernel(std::size_t bytes)
      : a_("copy_a", bytes / sizeof(double)), b_("copy_b", bytes / sizeof(double)) {
    Kokkos::deep_copy(a_, 1.0);
    Kokkos::deep_copy(b_, 0.0);
  }
  void operator()() const {
    const auto a = a_;
    const auto b = b_;
    Kokkos::parallel_for(
        "perf::stream_copy", Kokkos::RangePolicy<Host>(0, a.extent(0)),
        KOKKOS_LAMBDA(const std::size_t i) { b(i) = a(i); });
    Host().fence();
  }
  std::size_t bytes() const { return a_.extent(0) * sizeof(double); }

 private:
  Kokkos::View<double*, Kokkos::HostSpace> a_, b_;
};

// One case of the scenario: kvmap's operation, its hand-written references and the copy
// kernel, timed interleaved. Figures: bytes per second (the array's bytes over the time),
// kvmap over the faster reference, and each contender as a fraction of the copy ceiling
// (the copy kernel's time for the bytes each rank writes, over the contender's time).
struct Contender {
  std::string name;
  std::function<void()> run;
};

void report_case(Report& report, const std::string& case_name, double array_bytes,
                 const Contender& kvmap_op, const std::vector<Contender>& references,
                 const CopyKernel& copy, int reps) {
  std::vector<std::function<void()>> ops = {kvmap_op.run};
  for (const Contender& c : references) ops.push_back(c.run);
  ops.push_back([&] { copy(); });
  const std::vector<Timing> t = measure_interleaved(report.comm(), report.settings(), ops, reps);
  const double t_copy = t.back().median;
  double best = t[1].median;
  for (std::size_t k = 1; k <= references.size(); ++k) best = std::min(best, t[k].median);
  auto figures = [&](const Timing& x) -> std::map<std::string, double> {
    return {{"bytes_per_s", array_bytes / x.median}, {"of_copy_ceiling", t_copy / x.median}};
  };
  auto mine = figures(t[0]);
  mine["over_best_reference"] = best / t[0].median;
  report.add({"redistribution", case_name, kvmap_op.name, t[0], mine, {}});
  for (std::size_t k = 0; k < references.size(); ++k)
    report.add({"redistribution", case_name, references[k].name, t[k + 1], figures(t[k + 1]), {}});
  report.add({"redistribution",
              case_name,
              "copy kernel (ceiling)",
              t.back(),
              {{"copy_bytes_per_s", 2.0 * static_cast<double>(copy.bytes()) / t_copy}},
              {{"bytes_per_rank", std::to_string(copy.bytes())}}});
}

double* data_of(const View& v) {
  return static_cast<double*>(v.local().data_ptr());
}

}  // namespace

void scenario_redistribution(Report& report) {
  const auto& comm = report.comm();
  if (!on_host()) {
    // The hand-written references read host memory (a GPU-aware MPI is not assumed).
    report.progress("redistribution: skipped, the arrays are in device memory");
    return;
  }
  const int P = comm.size(), me = comm.rank();
  std::vector<std::int64_t> mib = report.settings().quick ? std::vector<std::int64_t>{8, 64}
                                                          : std::vector<std::int64_t>{8, 64, 512};
  const std::int64_t cols = 128;
  for (std::int64_t m : mib) {
    const std::int64_t rows = m * 1024 * 1024 / (8 * cols);
    const std::string size = std::to_string(m) + " MiB";
    const double bytes = static_cast<double>(rows * cols * 8);
    report.progress("redistribution: " + size);
    View a = kvmap::random::uniform({rows, cols}, kvmap::DType::Float64, 0, comm, 9);
    const at::Tensor full =
        kvmap::random::uniform({rows, cols}, kvmap::DType::Float64, 0, kvmap::Comm::self(), 9)
            .local();
    auto expect = [&](const Layout& l) {
      return l.is_replicated() ? full : full.narrow(*l.split(), l.offset(me), l.count(me));
    };
    const int reps = m >= 512 ? 3 : 0;
    // Each rank writes its destination shard: the copy ceiling copies that many bytes.
    const std::size_t shard_bytes = static_cast<std::size_t>(a.local().numel()) * 8;
    const CopyKernel copy_shard(shard_bytes);

    // Layout changes: kvmap against both hand-written exchanges, each checked first.
    std::vector<std::int64_t> counts(P);
    std::int64_t left = rows;
    for (int r = 0; r < P; ++r) {  // rank r holds a share proportional to r + 1
      counts[r] = r == P - 1 ? left : rows * (r + 1) / (P * (P + 1) / 2);
      left -= counts[r];
    }
    const View u = a.redistribute(Layout::from_counts({rows, cols}, 0, counts));
    const View b1 = a.resplit(1);
    struct Change {
      std::string name;
      const View& from;
      Layout to;
      std::function<View()> op;
    };
    const std::vector<Change> changes = {
        {"resplit 0->1", a, Layout::balanced({rows, cols}, 1, P), [&] { return a.resplit(1); }},
        {"resplit 1->0", b1, a.layout(), [&] { return b1.resplit(0); }},
        {"balance", u, a.layout(), [&] { return u.balance(); }},
    };
    for (const Change& c : changes) {
      require_same(at::equal(c.op().local(), expect(c.to)), "redistribution", "kvmap " + c.name);
      at::Tensor dst = at::empty(c.to.lshape(me), at::kDouble);
      HandExchange hand(comm, c.from.layout(), c.to, data_of(c.from),
                        static_cast<double*>(dst.data_ptr()));
      dst.zero_();
      hand.alltoallv();
      require_same(at::equal(dst, expect(c.to)), "redistribution", "pack + MPI_Alltoallv");
      dst.zero_();
      hand.alltoallw();
      require_same(at::equal(dst, expect(c.to)), "redistribution", "MPI_Alltoallw");
      report_case(report, c.name + " " + size, bytes,
                  {"kvmap " + c.name.substr(0, c.name.find(' ')), [&] { View v = c.op(); }},
                  {{"pack + MPI_Alltoallv + unpack", [&] { hand.alltoallv(); }},
                   {"MPI_Alltoallw(subarray)", [&] { hand.alltoallw(); }}},
                  copy_shard, reps);
    }

    // allgather and gather of a split-0 array: each rank's rows are contiguous, so the
    // references are MPI's own collectives on the shard, no packing.
    std::vector<int> gc(P), gd(P);
    for (int r = 0; r < P; ++r) {
      gc[r] = static_cast<int>(a.layout().count(r) * cols);
      gd[r] = static_cast<int>(a.layout().offset(r) * cols);
    }
    at::Tensor gathered = at::empty({rows, cols}, at::kDouble);
    const double* mine = data_of(a);
    auto* out = static_cast<double*>(gathered.data_ptr());
    const CopyKernel copy_full(static_cast<std::size_t>(bytes));
    require_same(at::equal(a.allgather(), full), "redistribution", "allgather");
    MPI_Allgatherv(mine, gc[me], MPI_DOUBLE, out, gc.data(), gd.data(), MPI_DOUBLE, comm.raw());
    require_same(at::equal(gathered, full), "redistribution", "MPI_Allgatherv");
    report_case(report, "allgather " + size, bytes,
                {"kvmap allgather", [&] { (void)a.allgather(); }},
                {{"MPI_Allgatherv",
                  [&] {
                    MPI_Allgatherv(mine, gc[me], MPI_DOUBLE, out, gc.data(), gd.data(), MPI_DOUBLE,
                                   comm.raw());
                  }}},
                copy_full, reps);
    gathered.zero_();
    const at::Tensor g = a.gather(0);
    require_same(me != 0 || at::equal(g, full), "redistribution", "gather");
    MPI_Gatherv(mine, gc[me], MPI_DOUBLE, out, gc.data(), gd.data(), MPI_DOUBLE, 0, comm.raw());
    require_same(me != 0 || at::equal(gathered, full), "redistribution", "MPI_Gatherv");
    report_case(report, "gather " + size, bytes, {"kvmap gather", [&] { (void)a.gather(0); }},
                {{"MPI_Gatherv",
                  [&] {
                    MPI_Gatherv(mine, gc[me], MPI_DOUBLE, out, gc.data(), gd.data(), MPI_DOUBLE, 0,
                                comm.raw());
                  }}},
                copy_full, reps);
  }
}

void scenario_native(Report& report) {
  const auto& comm = report.comm();
  if (!on_host()) {
    report.progress("native: skipped, its KokkosBatched reference runs on the host");
    return;
  }
  using Host = Kokkos::DefaultHostExecutionSpace;
  const std::int64_t n = report.settings().quick ? 20000 : 100000, m = 8;
  report.progress("native: batched " + std::to_string(m) + "x" + std::to_string(m) + " GEMM, " +
                  std::to_string(n) + " per rank");
  const at::Tensor A =
      at::randn({n, m, m}, at::detail::createCPUGenerator(40 + comm.rank()), at::kDouble);
  const at::Tensor B =
      at::randn({n, m, m}, at::detail::createCPUGenerator(50 + comm.rank()), at::kDouble);
  View a = View::from_local(A, 0, comm), b = View::from_local(B, 0, comm);
  auto vmm = kvmap::vmap([](const at::Tensor& x, const at::Tensor& y) { return at::matmul(x, y); });
  const at::Tensor reference = at::bmm(A, B);
  Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace> C("C", n, m, m);
  auto Av = a.local_view<double***, Kokkos::LayoutRight>();
  auto Bv = b.local_view<double***, Kokkos::LayoutRight>();
  auto kk_gemm = [&] {
    Kokkos::parallel_for(
        "kvmap-perf::batched_gemm", Kokkos::RangePolicy<Host>(0, n), [=](const std::int64_t i) {
          auto ai = Kokkos::subview(Av, i, Kokkos::ALL, Kokkos::ALL);
          auto bi = Kokkos::subview(Bv, i, Kokkos::ALL, Kokkos::ALL);
          auto ci = Kokkos::subview(C, i, Kokkos::ALL, Kokkos::ALL);
          KokkosBatched::SerialGemm<KokkosBatched::Trans::NoTranspose,
                                    KokkosBatched::Trans::NoTranspose,
                                    KokkosBatched::Algo::Gemm::Unblocked>::invoke(1.0, ai, bi, 0.0,
                                                                                  ci);
        });
    Host().fence();
  };
  kk_gemm();
  // float64 against float64: each entry is an m-term dot product, error <= gamma_m (|A|@|B|).
  const std::string gemm_case = "gemm 8x8 n=" + std::to_string(n);
  const Expected expected{reference, reference, {m, at::bmm(A.abs(), B.abs())}};
  require_close("native", gemm_case, "KokkosBatched SerialGemm", kvmap::to_tensor(C), expected);
  require_close("native", gemm_case, "kvmap::vmap(matmul)", vmm(a, b).local(), expected);
  const auto tm =
      measure_interleaved(comm, report.settings(),
                          {[&] { View c = vmm(a, b); }, kk_gemm, [&] { (void)at::bmm(A, B); }});
  const Timing &t_vmap = tm[0], &t_kk = tm[1], &t_bmm = tm[2];
  report.add({"native",
              gemm_case,
              "kvmap::vmap(matmul)",
              t_vmap,
              {{"over_kokkos_batched", t_vmap.median / t_kk.median}},
              {}});
  report.add({"native", gemm_case, "KokkosBatched gemm", t_kk, {}, {}});
  report.add({"native", gemm_case, "torch bmm (direct)", t_bmm, {}, {}});

  const std::int64_t len = report.settings().quick ? 1 << 20 : 1 << 23;
  report.progress("native: dot / nrm2 of " + std::to_string(len) + " doubles per rank");
  View x = kvmap::random::uniform({len * comm.size()}, kvmap::DType::Float64, 0, comm, 60);
  View y = kvmap::random::uniform({len * comm.size()}, kvmap::DType::Float64, 0, comm, 61);
  auto xv = x.local_view<double*, Kokkos::LayoutRight>();
  auto yv = y.local_view<double*, Kokkos::LayoutRight>();
  auto raw_dot = [&] {
    double local = KokkosBlas::dot(xv, yv), global = 0;
    MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, comm.raw());
    return global;
  };
  auto raw_nrm2 = [&] {
    double local = KokkosBlas::nrm2(xv), global = 0;
    local *= local;
    MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, comm.raw());
    return std::sqrt(global);
  };
  // Both sides sum len * P non-negative terms (uniform draws) in float64 in their own orders:
  // error <= gamma_(len P) times the result each; nrm2 adds a square root and a squaring.
  const std::string blas_case = "n/rank=" + std::to_string(len);
  const auto scalar = [](double v) { return at::full({}, v, at::kDouble); };
  const std::int64_t terms = len * comm.size();
  const double dot_ref = raw_dot(), nrm2_ref = raw_nrm2();
  require_close("native", "dot " + blas_case, "kvmap::linalg::dot",
                scalar(kvmap::linalg::dot(x, y)),
                {scalar(dot_ref), scalar(dot_ref), {terms, scalar(dot_ref)}});
  require_close("native", "nrm2 " + blas_case, "kvmap::linalg::nrm2",
                scalar(kvmap::linalg::nrm2(x)),
                {scalar(nrm2_ref), scalar(nrm2_ref), {terms + 3, scalar(nrm2_ref)}});
  const auto tl =
      measure_interleaved(comm, report.settings(),
                          {[&] { (void)kvmap::linalg::dot(x, y); }, [&] { (void)raw_dot(); },
                           [&] { (void)kvmap::linalg::nrm2(x); }, [&] { (void)raw_nrm2(); }},
                          std::max(9, report.settings().reps));
  const Timing &t_dot = tl[0], &t_rdot = tl[1], &t_nrm = tl[2], &t_rnrm = tl[3];
  report.add({"native",
              "dot " + blas_case,
              "kvmap::linalg::dot",
              t_dot,
              {{"over_raw", t_dot.median / t_rdot.median}},
              {}});
  report.add({"native", "dot " + blas_case, "KokkosBlas+Allreduce", t_rdot, {}, {}});
  report.add({"native",
              "nrm2 " + blas_case,
              "kvmap::linalg::nrm2",
              t_nrm,
              {{"over_raw", t_nrm.median / t_rnrm.median}},
              {}});
  report.add({"native", "nrm2 " + blas_case, "KokkosBlas+Allreduce", t_rnrm, {}, {}});
}

}  // namespace kvmap_perf
