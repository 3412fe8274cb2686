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

// Raw MPI_Alltoallv of pre-packed buffers with the byte counts a layout change implies
// (rank p receives from q the rows/columns it will own): the same bytes kvmap moves.
struct RawExchange {
  std::vector<int> sc, sd, rc, rd;
  std::vector<char> send, recv;
};

std::int64_t overlap(std::int64_t a0, std::int64_t a1, std::int64_t b0, std::int64_t b1) {
  return std::max<std::int64_t>(0, std::min(a1, b1) - std::max(a0, b0));
}

// Elements rank q of `from` holds that rank p of `to` owns (2-d, splits 0 or 1).
std::int64_t shared_elems(const Layout& from, int q, const Layout& to, int p) {
  const auto& g = from.gshape();
  std::int64_t r0 = 0, r1 = g[0], c0 = 0, c1 = g[1], s0 = 0, s1 = g[0], t0 = 0, t1 = g[1];
  if (*from.split() == 0) {
    r0 = from.offset(q), r1 = r0 + from.count(q);
  } else {
    c0 = from.offset(q), c1 = c0 + from.count(q);
  }
  if (*to.split() == 0) {
    s0 = to.offset(p), s1 = s0 + to.count(p);
  } else {
    t0 = to.offset(p), t1 = t0 + to.count(p);
  }
  return overlap(r0, r1, s0, s1) * overlap(c0, c1, t0, t1);
}

RawExchange raw_exchange(const Layout& from, const Layout& to, int me, int P,
                         std::size_t itemsize) {
  RawExchange x;
  x.sc.resize(P), x.sd.resize(P), x.rc.resize(P), x.rd.resize(P);
  std::int64_t s = 0, r = 0;
  for (int p = 0; p < P; ++p) {
    x.sc[p] = static_cast<int>(shared_elems(from, me, to, p) * itemsize);
    x.rc[p] = static_cast<int>(shared_elems(from, p, to, me) * itemsize);
    x.sd[p] = static_cast<int>(s);
    x.rd[p] = static_cast<int>(r);
    s += x.sc[p];
    r += x.rc[p];
  }
  x.send.resize(static_cast<std::size_t>(s));
  x.recv.resize(static_cast<std::size_t>(r));
  // Each block carries (source, destination) so a wrong exchange is detected.
  for (int p = 0; p < P; ++p) std::memset(x.send.data() + x.sd[p], (me * 16 + p) & 0x7f, x.sc[p]);
  return x;
}

bool raw_exchange_ok(const RawExchange& x, int me, int P) {
  for (int q = 0; q < P; ++q) {
    for (int i = 0; i < x.rc[q]; ++i) {
      if (x.recv[x.rd[q] + i] != static_cast<char>((q * 16 + me) & 0x7f)) return false;
    }
  }
  return true;
}

void run_alltoallv(const kvmap::Comm& comm, RawExchange& x) {
  MPI_Alltoallv(x.send.data(), x.sc.data(), x.sd.data(), MPI_BYTE, x.recv.data(), x.rc.data(),
                x.rd.data(), MPI_BYTE, comm.raw());
}

}  // namespace

void scenario_redistribution(Report& report) {
  const auto& comm = report.comm();
  if (!on_host()) {
    // The raw MPI references read host memory (a GPU-aware MPI is not assumed).
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
    auto expect_local = [&](const View& v) {
      const Layout& l = v.layout();
      return full.narrow(*l.split(), l.offset(me), l.count(me));
    };
    const int reps = m >= 512 ? 3 : 0;

    // resplit 0 -> 1
    const Layout to1 = Layout::balanced({rows, cols}, 1, P);
    require_same(at::equal(a.resplit(1).local(), expect_local(a.resplit(1))), "redistribution",
                 "resplit");
    RawExchange x01 = raw_exchange(a.layout(), to1, me, P, 8);
    run_alltoallv(comm, x01);
    require_same(raw_exchange_ok(x01, me, P), "redistribution", "MPI_Alltoallv");
    const auto t01 = measure_interleaved(
        comm, report.settings(),
        {[&] { View b = a.resplit(1); }, [&] { run_alltoallv(comm, x01); }}, reps);
    const Timing &t_resplit = t01[0], &t_raw01 = t01[1];
    report.add({"redistribution",
                "resplit 0->1 " + size,
                "kvmap resplit",
                t_resplit,
                {{"bytes_per_s", bytes / t_resplit.median},
                 {"ratio_to_raw", t_raw01.median / t_resplit.median}},
                {}});
    report.add({"redistribution",
                "resplit 0->1 " + size,
                "MPI_Alltoallv",
                t_raw01,
                {{"bytes_per_s", bytes / t_raw01.median}},
                {}});

    // balance of an unbalanced layout (rank r holds a share proportional to r + 1)
    std::vector<std::int64_t> counts(P);
    std::int64_t left = rows;
    for (int r = 0; r < P; ++r) {
      counts[r] = r == P - 1 ? left : rows * (r + 1) / (P * (P + 1) / 2);
      left -= counts[r];
    }
    View u = a.redistribute(Layout::from_counts({rows, cols}, 0, counts));
    require_same(at::equal(u.balance().local(), expect_local(a)), "redistribution", "balance");
    RawExchange xb = raw_exchange(u.layout(), a.layout(), me, P, 8);
    run_alltoallv(comm, xb);
    require_same(raw_exchange_ok(xb, me, P), "redistribution", "MPI_Alltoallv");
    const auto tb = measure_interleaved(
        comm, report.settings(), {[&] { View b = u.balance(); }, [&] { run_alltoallv(comm, xb); }},
        reps);
    const Timing &t_balance = tb[0], &t_rawb = tb[1];
    report.add({"redistribution",
                "balance " + size,
                "kvmap balance",
                t_balance,
                {{"bytes_per_s", bytes / t_balance.median},
                 {"ratio_to_raw", t_rawb.median / t_balance.median}},
                {}});
    report.add({"redistribution",
                "balance " + size,
                "MPI_Alltoallv",
                t_rawb,
                {{"bytes_per_s", bytes / t_rawb.median}},
                {}});

    // allgather
    require_same(at::equal(a.allgather(), full), "redistribution", "allgather");
    std::vector<int> gc(P), gd(P);
    for (int r = 0; r < P; ++r) {
      gc[r] = static_cast<int>(a.layout().count(r) * cols * 8);
      gd[r] = static_cast<int>(a.layout().offset(r) * cols * 8);
    }
    std::vector<char> gathered(static_cast<std::size_t>(bytes));
    const at::Tensor mine = a.local();
    const auto tag =
        measure_interleaved(comm, report.settings(),
                            {[&] { (void)a.allgather(); },
                             [&] {
                               MPI_Allgatherv(mine.data_ptr(), gc[me], MPI_BYTE, gathered.data(),
                                              gc.data(), gd.data(), MPI_BYTE, comm.raw());
                             }},
                            reps);
    const Timing &t_ag = tag[0], &t_rawag = tag[1];
    require_same(std::memcmp(gathered.data(), full.data_ptr(), gathered.size()) == 0,
                 "redistribution", "MPI_Allgatherv");
    report.add(
        {"redistribution",
         "allgather " + size,
         "kvmap allgather",
         t_ag,
         {{"bytes_per_s", bytes / t_ag.median}, {"ratio_to_raw", t_rawag.median / t_ag.median}},
         {}});
    report.add({"redistribution",
                "allgather " + size,
                "MPI_Allgatherv",
                t_rawag,
                {{"bytes_per_s", bytes / t_rawag.median}},
                {}});

    // gather to rank 0
    const at::Tensor g = a.gather(0);
    require_same(me != 0 || at::equal(g, full), "redistribution", "gather");
    const auto tg =
        measure_interleaved(comm, report.settings(),
                            {[&] { (void)a.gather(0); },
                             [&] {
                               MPI_Gatherv(mine.data_ptr(), gc[me], MPI_BYTE, gathered.data(),
                                           gc.data(), gd.data(), MPI_BYTE, 0, comm.raw());
                             }},
                            reps);
    const Timing &t_g = tg[0], &t_rawg = tg[1];
    report.add({"redistribution",
                "gather " + size,
                "kvmap gather",
                t_g,
                {{"bytes_per_s", bytes / t_g.median}, {"ratio_to_raw", t_rawg.median / t_g.median}},
                {}});
    report.add({"redistribution",
                "gather " + size,
                "MPI_Gatherv",
                t_rawg,
                {{"bytes_per_s", bytes / t_rawg.median}},
                {}});
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
  require_same(at::allclose(kvmap::to_tensor(C), reference, 1e-10, 1e-10), "native",
               "KokkosBatched SerialGemm");
  require_same(at::allclose(vmm(a, b).local(), reference, 1e-10, 1e-10), "native",
               "kvmap::vmap(matmul)");
  const auto tm =
      measure_interleaved(comm, report.settings(),
                          {[&] { View c = vmm(a, b); }, kk_gemm, [&] { (void)at::bmm(A, B); }});
  const Timing &t_vmap = tm[0], &t_kk = tm[1], &t_bmm = tm[2];
  const std::string gemm_case = "gemm 8x8 n=" + std::to_string(n);
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
  require_same(std::abs(kvmap::linalg::dot(x, y) - raw_dot()) <= 1e-9 * std::abs(raw_dot()),
               "native", "kvmap::linalg::dot");
  require_same(std::abs(kvmap::linalg::nrm2(x) - raw_nrm2()) <= 1e-9 * raw_nrm2(), "native",
               "kvmap::linalg::nrm2");
  const auto tl =
      measure_interleaved(comm, report.settings(),
                          {[&] { (void)kvmap::linalg::dot(x, y); }, [&] { (void)raw_dot(); },
                           [&] { (void)kvmap::linalg::nrm2(x); }, [&] { (void)raw_nrm2(); }},
                          std::max(9, report.settings().reps));
  const Timing &t_dot = tl[0], &t_rdot = tl[1], &t_nrm = tl[2], &t_rnrm = tl[3];
  const std::string blas_case = "n/rank=" + std::to_string(len);
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
