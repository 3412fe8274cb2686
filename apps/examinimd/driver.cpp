// examinimd-kvmap: ExaMiniMD (its input files and command line) with checks and measurements
// of a force type on the configuration the input makes. One of:
//   --kvmap-compare <model> <cutoff> [options]  after the input's run, the input's force against
//                              pair_style kvmap with these arguments, on the same atoms and
//                              neighbour list: per-atom forces (after the reverse
//                              communication) and the total energy
//   --kvmap-fd <h> <atoms>     after the input's run, the input's forces against central
//                              differences of its total energy (step h) on <atoms> atoms
//   --kvmap-run                the input's run, with the energies at full precision before and
//                              after and, for pair_style kvmap, the time of each phase per step
//   --kvmap-dump <prefix> <every>  the input's run in segments of <every> steps; after each, the
//                              kvmap force's environments and results, per rank (training data)
//   --kvmap-forces <file>      after the input's run, the input's forces (after the reverse
//                              communication) of every atom and the total energy, written by
//                              rank 0 to <file>: "sx sy sz fx fy fz" lines at full precision,
//                              sorted by the atom's starting site (its position after the
//                              input's setup, in thousandths: ExaMiniMD's atom ids depend on the
//                              decomposition, the sites do not)
//   --kvmap-halo <calls>       after the input's run, ExaMiniMD's halo exchange of the positions
//                              (update_halo) and reverse communication of the forces
//                              (update_force) against kvmap::GhostExchange's forward (in place,
//                              as update_halo, and out of place) and reverse of the same rows and
//                              bytes over ExaMiniMD's ghosts, and forward of
//                              16 float32 features (a message-passing layer), <calls> calls each:
//                              ms per call, the slowest rank's
//   --kvmap-jiggle <a>         before any of the above, every atom moved by a pseudo-random
//                              displacement of up to a per axis that depends on its starting site
//                              only (the same configuration at every rank count; a below half
//                              the skin over sqrt(3) keeps the neighbour lists valid)
//   --kvmap-tolerance <r>      compare and fd pass when max|dF| <= r max|F| (and compare when
//                              |dE| <= max(r, atoms x width x 2^-53) |E|)
// Every other argument goes to ExaMiniMD. Exit status 0 when the check passes.
#include <examinimd.h>
#include <property_kine.h>
#include <property_pote.h>

#include <ATen/ATen.h>
#include <kvmap/kvmap.hpp>
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Options {
  std::string mode;
  std::vector<std::string> pair;  // compare: pair_style kvmap's arguments
  double h = 1e-4;
  int atoms = 4;
  std::string prefix;
  int every = 0;
  int calls = 0;
  double jiggle = 0;
  std::string forces_file;
  double tolerance = 1e-12;
  std::vector<char*> examinimd_argv;
};

Options parse(int argc, char** argv) {
  Options o;
  o.examinimd_argv.push_back(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--kvmap-compare") {
      o.mode = "compare";
      while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) o.pair.push_back(argv[++i]);
    } else if (a == "--kvmap-fd" && i + 2 < argc) {
      o.mode = "fd";
      o.h = std::atof(argv[++i]);
      o.atoms = std::atoi(argv[++i]);
    } else if (a == "--kvmap-run") {
      o.mode = "run";
    } else if (a == "--kvmap-dump" && i + 2 < argc) {
      o.mode = "dump";
      o.prefix = argv[++i];
      o.every = std::atoi(argv[++i]);
    } else if (a == "--kvmap-forces" && i + 1 < argc) {
      o.mode = "forces";
      o.forces_file = argv[++i];
    } else if (a == "--kvmap-halo" && i + 1 < argc) {
      o.mode = "halo";
      o.calls = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--kvmap-jiggle" && i + 1 < argc) {
      o.jiggle = std::atof(argv[++i]);
    } else if (a == "--kvmap-tolerance" && i + 1 < argc) {
      o.tolerance = std::atof(argv[++i]);
    } else {
      o.examinimd_argv.push_back(argv[i]);
    }
  }
  o.examinimd_argv.push_back(nullptr);
  return o;
}

// ExaMiniMD's input words for `pair_style kvmap <args...>`: 32 words of 256 bytes.
std::vector<std::vector<char>> pair_words(const std::vector<std::string>& args) {
  std::vector<std::vector<char>> words(32, std::vector<char>(256, '\0'));
  std::vector<std::string> all{"pair_style", "kvmap"};
  all.insert(all.end(), args.begin(), args.end());
  for (std::size_t w = 0; w < all.size() && w < words.size(); ++w)
    std::strncpy(words[w].data(), all[w].c_str(), 255);
  return words;
}

// This rank's atoms' forces, on the host.
Kokkos::View<double* [3], Kokkos::HostSpace> local_forces(const System& s) {
  Kokkos::View<double* [3], Kokkos::HostSpace> out("forces", s.N_local);
  auto all = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.f);
  for (T_INT i = 0; i < s.N_local; ++i)
    for (int d = 0; d < 3; ++d) out(i, d) = all(i, d);
  return out;
}

double total_energy(ExaMiniMD& md, Force* force) {
  PotE pote(md.comm);
  return pote.compute(md.system, md.binning, md.neighbor, force);
}

double max_all(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int compare(ExaMiniMD& md, const Options& o) {
  System& s = *md.system;
  const auto reference = local_forces(s);
  const double e_reference = total_energy(md, md.force);
  auto words = pair_words(o.pair);
  std::vector<char*> args;
  for (auto& w : words) args.push_back(w.data());
  ForceKvmap kvmap_force(args.data(), &s, false);
  kvmap_force.comm_newton = md.input->comm_newton;
  Kokkos::deep_copy(s.f, 0.0);
  kvmap_force.compute(&s, md.binning, md.neighbor);
  if (md.input->comm_newton) md.comm->update_force();
  const auto forces = local_forces(s);
  const double e_kvmap = total_energy(md, &kvmap_force);
  double diff = 0, scale = 0;
  for (T_INT i = 0; i < s.N_local; ++i)
    for (int d = 0; d < 3; ++d) {
      diff = std::max(diff, std::abs(forces(i, d) - reference(i, d)));
      scale = std::max(scale, std::abs(reference(i, d)));
    }
  diff = max_all(diff);
  scale = max_all(scale);
  const double force_ratio = diff / scale;
  const double energy_ratio = std::abs(e_kvmap - e_reference) / std::abs(e_reference);
  // The energies are sums of up to atoms x width pair terms, each side in its own order (lj/cut
  // accumulates them one by one into one float64): their rounding alone is bounded by that
  // many unit roundoffs (2^-53) of the terms' magnitudes, here taken as |E|. The forces sum at
  // most `width` terms per atom: the tolerance applies to them as given.
  const double energy_bound =
      std::max(o.tolerance, static_cast<double>(s.N) * kvmap_force.width() * std::ldexp(1.0, -53));
  const bool ok = force_ratio <= o.tolerance && energy_ratio <= energy_bound;
  if (rank() == 0) {
    std::printf(
        "kvmap-compare: %s against %s: %d atoms, width %d: max|dF| / max|F| = %.3e (max|F| "
        "%.6g; tolerance %.1e), energy %.17g against %.17g: |dE| / |E| = %.3e (bound %.1e): %s\n",
        kvmap_force.name(), md.force->name(), s.N, kvmap_force.width(), force_ratio, scale,
        o.tolerance, e_kvmap, e_reference, energy_ratio, energy_bound, ok ? "PASS" : "FAIL");
  }
  return ok ? 0 : 1;
}

// Moves atom `local` (or nothing, on the other ranks) by delta along axis d, then refreshes
// the ghosts' positions (collective).
void displace(ExaMiniMD& md, T_INT local, int d, double delta) {
  if (local >= 0) {
    auto one = Kokkos::subview(md.system->x, local, d);
    auto value = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), one);
    value() += delta;
    Kokkos::deep_copy(one, value);
  }
  md.comm->update_halo();
}

int finite_differences(ExaMiniMD& md, const Options& o) {
  System& s = *md.system;
  const auto forces = local_forces(s);
  auto ids = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.id);
  double diff = 0, scale = 0;
  for (int a = 0; a < o.atoms; ++a) {
    const T_INT id = static_cast<T_INT>((static_cast<long>(a) * s.N) / o.atoms);
    T_INT local = -1;
    for (T_INT i = 0; i < s.N_local; ++i)
      if (ids(i) == id) local = i;
    for (int d = 0; d < 3; ++d) {
      displace(md, local, d, o.h);
      const double up = total_energy(md, md.force);
      displace(md, local, d, -2 * o.h);
      const double down = total_energy(md, md.force);
      displace(md, local, d, o.h);
      if (local >= 0) {
        const double fd = -(up - down) / (2 * o.h);
        diff = std::max(diff, std::abs(fd - forces(local, d)));
        scale = std::max(scale, std::abs(forces(local, d)));
      }
    }
  }
  diff = max_all(diff);
  scale = max_all(scale);
  const bool ok = diff <= o.tolerance * scale;
  if (rank() == 0) {
    std::printf(
        "kvmap-fd: %s: %d atoms x 3 axes, h = %g: max|F - F_fd| / max|F| = %.3e (max|F| %.6g); "
        "tolerance %.1e: %s\n",
        md.force->name(), o.atoms, o.h, diff / scale, scale, o.tolerance, ok ? "PASS" : "FAIL");
  }
  return ok ? 0 : 1;
}

// Each local atom's starting site: its position in thousandths (the atoms stay on their rank
// and at their index until the run's first exchange).
using Site = std::array<long, 3>;
std::vector<Site> starting_sites(const System& s) {
  auto x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.x);
  std::vector<Site> sites(s.N_local);
  for (T_INT i = 0; i < s.N_local; ++i)
    for (int d = 0; d < 3; ++d) sites[i][d] = std::lround(x(i, d) * 1000);
  return sites;
}

// A number in [-1, 1) from a site and an axis only.
double unit_noise(const Site& site, int axis) {
  std::uint64_t z = static_cast<std::uint64_t>(axis);
  for (long c : site) {
    z = z * 0x100000001b3ULL + static_cast<std::uint64_t>(c) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return static_cast<double>(z >> 11) * std::ldexp(1.0, -52) - 1.0;
}

// Moves every atom by up to a per axis (a function of its starting site), then refreshes the
// ghosts' positions (collective). The neighbour lists stay valid while every move is under
// half the skin.
void jiggle(ExaMiniMD& md, const std::vector<Site>& sites, double a) {
  System& s = *md.system;
  auto x = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.x);
  for (T_INT i = 0; i < s.N_local; ++i)
    for (int d = 0; d < 3; ++d) x(i, d) += a * unit_noise(sites[i], d);
  Kokkos::deep_copy(s.x, x);
  md.comm->update_halo();
}

// The input's force on the current configuration, every atom's by starting site, and the
// total energy: gathered to rank 0 and written sorted by site (no exchange may have run).
int write_forces(ExaMiniMD& md, const std::vector<Site>& sites, const Options& o) {
  System& s = *md.system;
  Kokkos::deep_copy(s.f, 0.0);
  md.force->compute(&s, md.binning, md.neighbor);
  if (md.input->comm_newton) md.comm->update_force();
  const auto forces = local_forces(s);
  const double energy = total_energy(md, md.force);
  std::vector<double> mine;
  for (T_INT i = 0; i < s.N_local; ++i) {
    for (int d = 0; d < 3; ++d) mine.push_back(static_cast<double>(sites[i][d]));
    for (int d = 0; d < 3; ++d) mine.push_back(forces(i, d));
  }
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(size), offsets(size);
  MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < size; ++r) offsets[r] = std::exchange(total, total + counts[r]);
  std::vector<double> all(rank() == 0 ? total : 0);
  MPI_Gatherv(mine.data(), count, MPI_DOUBLE, all.data(), counts.data(), offsets.data(), MPI_DOUBLE,
              0, MPI_COMM_WORLD);
  if (rank() != 0) return 0;
  std::vector<std::array<double, 6>> rows(all.size() / 6);
  for (std::size_t k = 0; k < rows.size(); ++k)
    for (int c = 0; c < 6; ++c) rows[k][c] = all[6 * k + c];
  std::sort(rows.begin(), rows.end());
  std::FILE* out = std::fopen(o.forces_file.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "examinimd-kvmap: cannot write %s\n", o.forces_file.c_str());
    return 2;
  }
  std::fprintf(out, "# %s: %d atoms on %d ranks, total energy %.17g\n", md.force->name(), s.N, size,
               energy);
  for (const auto& r : rows)
    std::fprintf(out, "%ld %ld %ld %.17g %.17g %.17g\n", static_cast<long>(r[0]),
                 static_cast<long>(r[1]), static_cast<long>(r[2]), r[3], r[4], r[5]);
  std::fclose(out);
  std::printf("kvmap-forces: %s: %zu atoms, total energy %.17g, written to %s\n", md.force->name(),
              rows.size(), energy, o.forces_file.c_str());
  return 0;
}

void print_energies(ExaMiniMD& md, const char* when) {
  PotE pote(md.comm);
  KinE kine(md.comm);
  const double n = md.system->N;
  const double pe = pote.compute(md.system, md.binning, md.neighbor, md.force) / n;
  const double ke = kine.compute(md.system) / n;
  if (rank() == 0)
    std::printf("kvmap-energy: %s PE %.17g KE %.17g ETot %.17g (per atom)\n", when, pe, ke,
                pe + ke);
}

// The largest of a value over the ranks.
double max_over_ranks(double v) {
  double out = v;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

void print_timings(ExaMiniMD& md) {
  // Peak resident memory of each process (getrusage: kilobytes on Linux): the largest.
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double peak_mb = max_over_ranks(static_cast<double>(usage.ru_maxrss) / 1024.0);
  const double ghosts = max_over_ranks(static_cast<double>(md.system->N_ghost));
  if (rank() == 0)
    std::printf("kvmap-memory: peak RSS %.1f MB (the largest rank's), ghosts %.0f (the most)\n",
                peak_mb, ghosts);
  auto* force = dynamic_cast<ForceKvmap*>(md.force);
  if (force == nullptr || rank() != 0) return;
  const ForceKvmap::Timings& t = force->timings();
  const double per = 1e3 / std::max(1L, t.calls);
  std::printf(
      "kvmap-timings: %ld calls, width %d, ms per step (rank 0): environments %.3f, agreement "
      "%.3f, model %.3f, gradients %.3f, mapping %.3f (model + gradients + kvmap), scatter %.3f, "
      "ghost exchange %.3f (%.1f calls), ghost plans %.3f, shell lists %.3f\n",
      t.calls, force->width(), t.environments * per, t.agreement * per, t.model * per,
      t.gradients * per, t.mapping * per, t.scatter * per, t.ghost_exchange * per,
      static_cast<double>(t.ghost_exchanges) / std::max(1L, t.calls), t.ghost_plan * per,
      t.shell_lists * per);
}

// ms per call of f, `calls` calls after one untimed, the slowest rank's.
template <class F>
double ms_per_call(int calls, F&& f) {
  f();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < calls; ++k) f();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return max_over_ranks(ms / calls);
}

// ExaMiniMD's own halo exchange against kvmap's ghost exchange over the same ghosts.
int compare_halo(ExaMiniMD& md, const Options& o) {
  System& s = *md.system;
  auto ids = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.id);
  const std::vector<std::int64_t> owned(ids.data(), ids.data() + s.N_local);
  const std::vector<std::int64_t> ghosts(ids.data() + s.N_local,
                                         ids.data() + s.N_local + s.N_ghost);
  const kvmap::GhostExchange gx(owned, ghosts);
  const std::int64_t rows = s.N_local + s.N_ghost;
  at::Tensor x = at::rand({rows, 3}, at::kDouble);
  const at::Tensor h = at::rand({rows, 16}, at::kFloat);
  const double halo = ms_per_call(o.calls, [&] { md.comm->update_halo(); });
  const double in_place = ms_per_call(o.calls, [&] { gx.forward_(x); });
  const double forward = ms_per_call(o.calls, [&] { gx.forward(x); });
  const double force = ms_per_call(o.calls, [&] { md.comm->update_force(); });
  const double reverse = ms_per_call(o.calls, [&] { gx.reverse(x); });
  const double layer = ms_per_call(o.calls, [&] { gx.forward(h); });
  const double ghost_rows = max_over_ranks(static_cast<double>(s.N_ghost));
  const double sent = max_over_ranks(static_cast<double>(gx.rows_sent()));
  if (rank() == 0)
    std::printf(
        "kvmap-halo: %d atoms, ghosts %.0f, rows sent %.0f (the most on a rank); ms per call: "
        "update_halo %.4f, ghost forward_ (in place) [rows, 3] float64 %.4f (ratio %.3f), "
        "forward %.4f (ratio %.3f); update_force %.4f, ghost reverse [rows, 3] float64 %.4f "
        "(ratio %.3f); ghost forward [rows, 16] float32 %.4f\n",
        static_cast<int>(s.N), ghost_rows, sent, halo, in_place, in_place / halo, forward,
        forward / halo, force, reverse, reverse / force, layer);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  Options o = parse(argc, argv);
  int n = static_cast<int>(o.examinimd_argv.size()) - 1;
  char** args = o.examinimd_argv.data();
  Kokkos::initialize(n, args);
  int status = 0;
  {
    ExaMiniMD md;
    md.init(n, args);
    const std::vector<Site> sites = starting_sites(*md.system);
    if (o.jiggle > 0) jiggle(md, sites, o.jiggle);
    if (o.mode == "forces") {
      if (md.input->nsteps != 0) {
        if (rank() == 0) std::fprintf(stderr, "examinimd-kvmap: --kvmap-forces needs `run 0`\n");
        status = 2;
      } else {
        status = write_forces(md, sites, o);
      }
    } else if (o.mode == "compare") {
      md.run(md.input->nsteps);  // a disordered configuration: a lattice's forces cancel
      status = compare(md, o);
    } else if (o.mode == "halo") {
      md.run(md.input->nsteps);
      status = compare_halo(md, o);
    } else if (o.mode == "fd") {
      md.run(md.input->nsteps);
      status = finite_differences(md, o);
    } else if (o.mode == "dump") {
      auto* force = dynamic_cast<ForceKvmap*>(md.force);
      if (force == nullptr) {
        if (rank() == 0)
          std::fprintf(stderr, "examinimd-kvmap: --kvmap-dump needs pair_style kvmap\n");
        status = 2;
      } else {
        for (int done = 0, k = 0; done < md.input->nsteps; done += o.every, ++k) {
          md.run(std::min(o.every, md.input->nsteps - done));
          const std::string path =
              o.prefix + "." + std::to_string(rank()) + "." + std::to_string(k) + ".pt";
          force->save_last(path.c_str());
        }
      }
    } else {
      print_energies(md, "initial");
      md.run(md.input->nsteps);
      print_energies(md, "final");
      print_timings(md);
    }
    md.shutdown();
  }
  Kokkos::finalize();
  MPI_Finalize();
  return status;
}
