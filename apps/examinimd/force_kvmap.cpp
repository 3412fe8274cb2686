// ExaMiniMD's force type backed by kvmap (see force_kvmap.h).
#include <force_kvmap.h>
#include <shell_neighbors.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/script.h>

#include <kvmap/kvmap.hpp>

#include <Kokkos_ScatterView.hpp>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using MemSpace = Kokkos::DefaultExecutionSpace::memory_space;
using Exec = Kokkos::DefaultExecutionSpace;
using Env = Kokkos::View<double***, Kokkos::LayoutRight, MemSpace>;
using Mask = Kokkos::View<bool**, Kokkos::LayoutRight, MemSpace>;
using Neighbors = Kokkos::View<std::int64_t**, Kokkos::LayoutRight, MemSpace>;
using Gradients = Kokkos::View<const double***, Kokkos::LayoutRight, MemSpace,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using View = kvmap::DistView<MemSpace>;
using Clock = std::chrono::steady_clock;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Every rank knows the failure (its condition, or the message, was agreed): each one prints
// it, then the job ends (ExaMiniMD has no error path to return through).
[[noreturn]] void fail(const std::string& message) {
  const kvmap::Comm world = kvmap::Comm::world();
  world.barrier();  // every rank reaches here: each writes its message before the job ends
  kvmap::abort_job(
      world, "ExaMiniMD pair_style kvmap (rank " + std::to_string(world.rank()) + "): " + message);
}

// A failure that only some ranks saw (a model file one rank cannot read): kvmap's agreement
// gives every rank the first failing rank's message, and each then fails with it. Collective.
void agree(const std::string& local_error) {
  std::exception_ptr error;
  if (!local_error.empty()) error = std::make_exception_ptr(kvmap::Error(local_error));
  try {
    kvmap::agree(kvmap::Comm::world(), error, "pair_style kvmap");
  } catch (const kvmap::RemoteError& e) {
    fail(e.what());
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The dtype of the model's first floating parameter or buffer (float64 if it has none).
at::ScalarType model_dtype(const torch::jit::Module& model) {
  for (const at::Tensor& p : model.parameters())
    if (p.is_floating_point()) return p.scalar_type();
  for (const at::Tensor& b : model.buffers())
    if (b.is_floating_point()) return b.scalar_type();
  return at::kDouble;
}

void check_per_atom(const at::Tensor& energies, std::int64_t atoms) {
  if (energies.dim() != 1 || energies.size(0) != atoms) {
    std::string shape = "[";
    for (std::int64_t d = 0; d < energies.dim(); ++d)
      shape += (d ? ", " : "") + std::to_string(energies.size(d));
    throw kvmap::ValueError("the model must return one energy per atom, shape [" +
                            std::to_string(atoms) + "], but returned " + shape + "]");
  }
}

// Adds seconds to a total that several chunks' threads may update at once.
void add(std::atomic<double>& total, double seconds) {
  double old = total.load();
  while (!total.compare_exchange_weak(old, old + seconds)) {
  }
}

}  // namespace

struct ForceKvmap::State {
  std::string model_path;
  double cutoff = 0;
  std::optional<std::int64_t> chunk;
  int concurrency = 1;
  int max_neighbors = 0;  // 0: no cap
  bool direct = false;
  // A message-passing model (its `message_passing` attribute): it also takes each neighbour's
  // row among the rank's atoms and ghosts, the ghost count and the ghost exchange's handle.
  bool message_passing = false;
  // Ghosts mode (`ghosts L`, message passing): no exchange; ExaMiniMD's ghost shell is L x
  // cutoff (+ skin) deep and the model computes its layers on the ghosts as well, from
  // neighbour lists over atoms and ghosts. 0: exchange mode.
  int ghost_layers = 0;
  // A message-passing model in chunks (`chunk` or `concurrency` given): run layer by layer
  // through its `stage` method, split at the exchanges (run_stages); `layers` of them.
  bool staged = false;
  int layers = 0;
  ShellNeighbors shell;
  torch::jit::Module model;
  at::ScalarType dtype = at::kDouble;
  kvmap::Comm comm = kvmap::Comm::world();
  // The padded environments, in ExaMiniMD's memory space, and the DistViews over them
  // (remade only when the width or a rank's atom count changes): one row per atom, then (ghosts
  // mode) one per ghost.
  int width = -1;
  T_INT atoms = -1;  // rows of the environments
  T_INT owned = 0;   // the rank's atoms (energies)
  Env env;
  Mask mask;
  Neighbors neighbors;  // the row of each neighbour among atoms then ghosts (message passing)
  Kokkos::View<std::int64_t*, MemSpace> index;  // 0, 1, ..., atoms - 1 (staged)
  std::optional<View> env_view, mask_view, neighbors_view, index_view;
  // The ghost exchange over ExaMiniMD's ghosts (message passing), remade when any rank's ids
  // of atoms and ghosts change (a neighbour-list rebuild): their count and fingerprint.
  std::optional<kvmap::GhostExchange> ghost_exchange;
  T_INT ghosts = -1;
  std::uint64_t ids_fingerprint = 0;
  // What the last call returned (kept alive until the scatter has read it).
  at::Tensor energies, gradients;
  std::atomic<double> model_seconds{0}, gradient_seconds{0};
  Timings timings;
};

namespace {

// Calls body(list) with the neighbour list of whichever ExaMiniMD neighbour type is in use.
template <class Body>
void with_neighbor_list(Neighbor* neighbor, Body&& body) {
  if (auto* n = dynamic_cast<Neighbor2D<t_neigh_mem_space>*>(neighbor)) {
    body(n->get_neigh_list());
  } else if (auto* n = dynamic_cast<NeighborCSR<t_neigh_mem_space>*>(neighbor)) {
    body(n->get_neigh_list());
  } else if (auto* n = dynamic_cast<NeighborCSRMapConstr<t_neigh_mem_space>*>(neighbor)) {
    body(n->get_neigh_list());
  } else {
    fail("needs a neighbour list (--neigh-type 2D, CSR or CSRMapConstr)");
  }
}

// The ghost shell ghosts mode needs (layers x cutoff + skin) must fit in one neighbouring
// rank's subdomain: ExaMiniMD's halo exchange takes ghosts from the adjacent ranks only.
// Every rank has the same subdomain extents; the failure is agreed all the same.
void check_shell(const ForceKvmap::State& s, const System& system, double neighbor_cutoff) {
  const double shell = s.ghost_layers * s.cutoff + (neighbor_cutoff - s.cutoff);
  const double narrowest =
      std::min({system.sub_domain_x, system.sub_domain_y, system.sub_domain_z});
  std::string error;
  if (shell > narrowest) {
    error = "ghosts " + std::to_string(s.ghost_layers) + ": the ghost shell (" +
            std::to_string(s.ghost_layers) + " x cutoff + skin = " + std::to_string(shell) +
            ") is deeper than a rank's subdomain (" + std::to_string(narrowest) +
            "), and ExaMiniMD takes ghosts from adjacent ranks only: use fewer ranks, a larger "
            "system, or the exchange mode";
  }
  agree(error);
}

// Calls body(list) with the neighbour lists of the environments' rows: ExaMiniMD's (its atoms)
// or, in ghosts mode, lists over atoms and ghosts within ExaMiniMD's neighbour cutoff (the
// force cutoff plus the skin), remade when an atom moved more than half the skin or the rows
// changed.
template <class Body>
void with_rows(ForceKvmap::State& s, System* system, Neighbor* neighbor, double neighbor_cutoff,
               Body&& body) {
  with_neighbor_list(neighbor, [&](const auto& list) {
    if (!s.ghost_layers) return body(list);
    if (s.width < 0) check_shell(s, *system, neighbor_cutoff);
    const T_INT rows = system->N_local + system->N_ghost;
    if (s.shell.stale(system->x, rows, (neighbor_cutoff - s.cutoff) / 2)) {
      const auto t = Clock::now();
      s.shell.build(system->x, rows, neighbor_cutoff);
      s.timings.shell_lists += seconds_since(t);
      ++s.timings.shell_builds;
    }
    body(s.shell);
  });
}

// A fingerprint of the ids of a rank's atoms then ghosts, in their order.
std::uint64_t fingerprint(const t_id& id, T_INT n) {
  std::uint64_t sum = 0;
  Kokkos::parallel_reduce(
      "kvmap::examinimd::ids", Kokkos::RangePolicy<Exec>(0, n),
      KOKKOS_LAMBDA(const T_INT k, std::uint64_t& total) {
        std::uint64_t z = (static_cast<std::uint64_t>(k) << 32) ^
                          static_cast<std::uint64_t>(static_cast<std::uint32_t>(id(k)));
        z += 0x9e3779b97f4a7c15ULL;  // splitmix64's finalizer
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        total += z ^ (z >> 31);
      },
      sum);
  return sum ^ static_cast<std::uint64_t>(n);
}

// The width every rank pads to (the largest neighbour count of any row on any rank), whether
// any rank's row count changed and (exchange mode) whether any rank's atoms or ghosts
// changed: one MPI_Allreduce per step. On a change, the environment arrays are reallocated and
// adopted by new DistViews (from_local gathers the ranks' counts: the data that changed).
// Returns whether the ghost exchange must be remade.
template <class List>
bool agree_width(ForceKvmap::State& s, const List& list, const System& system) {
  const T_INT atoms = s.ghost_layers ? system.N_local + system.N_ghost : system.N_local;
  s.owned = system.N_local;
  bool ghosts_changed = false;
  if (s.message_passing && !s.ghost_layers) {
    const std::uint64_t ids = fingerprint(system.id, system.N_local + system.N_ghost);
    ghosts_changed = !s.ghost_exchange || system.N_ghost != s.ghosts || ids != s.ids_fingerprint;
    s.ids_fingerprint = ids;
  }
  s.ghosts = system.N_ghost;
  int local_max = 0;
  Kokkos::parallel_reduce(
      "kvmap::examinimd::width", Kokkos::RangePolicy<Exec>(0, atoms),
      KOKKOS_LAMBDA(const T_INT i, int& m) {
        const int count = list.get_neighs(i).get_num_neighs();
        if (count > m) m = count;
      },
      Kokkos::Max<int>(local_max));
  int mine[3] = {local_max, atoms != s.atoms ? 1 : 0, ghosts_changed ? 1 : 0};
  int all[3] = {0, 0, 0};
  MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (s.max_neighbors > 0 && all[0] > s.max_neighbors) {
    int where[2] = {local_max, world_rank()}, worst[2] = {0, 0};
    MPI_Allreduce(where, worst, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD);
    fail("an atom on rank " + std::to_string(worst[1]) + " has " + std::to_string(all[0]) +
         " neighbours within the cutoff and skin, more than max_neighbors " +
         std::to_string(s.max_neighbors) +
         " (raise the cap, or leave it out: the width is then "
         "the largest count on any rank)");
  }
  if (all[0] == s.width && all[1] == 0) return all[2] != 0;
  s.width = all[0];
  s.atoms = atoms;
  s.env = Env(Kokkos::view_alloc("kvmap::examinimd::environments", Kokkos::WithoutInitializing),
              atoms, s.width, 3);
  s.mask = Mask(Kokkos::view_alloc("kvmap::examinimd::mask", Kokkos::WithoutInitializing), atoms,
                s.width);
  if (s.message_passing) {
    s.neighbors =
        Neighbors(Kokkos::view_alloc("kvmap::examinimd::neighbors", Kokkos::WithoutInitializing),
                  atoms, s.width);
  }
  s.env_view = View::from_local(s.env, 0, s.comm);
  s.mask_view = View::from_local(s.mask, 0, s.comm);
  if (s.staged) {
    s.index = Kokkos::View<std::int64_t*, MemSpace>(
        Kokkos::view_alloc("kvmap::examinimd::index", Kokkos::WithoutInitializing), atoms);
    const auto index = s.index;
    Kokkos::parallel_for(
        "kvmap::examinimd::index", Kokkos::RangePolicy<Exec>(0, atoms),
        KOKKOS_LAMBDA(const T_INT i) { index(i) = i; });
    Exec().fence();
    s.neighbors_view = View::from_local(s.neighbors, 0, s.comm);
    s.index_view = View::from_local(s.index, 0, s.comm);
  }
  s.model.to(s.env_view->local().device());
  return all[2] != 0;
}

// The ghost exchange over this rank's ghosts: ExaMiniMD keeps atoms then ghosts in one
// array, each ghost carrying its owner's id (periodic images on the owner's rank included).
// Collective; a failure (an id nobody owns) is raised on every rank.
void remake_ghost_exchange(ForceKvmap::State& s, const System& system) {
  auto ids = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), system.id);
  std::vector<std::int64_t> owned(ids.data(), ids.data() + system.N_local);
  std::vector<std::int64_t> ghosts(ids.data() + system.N_local,
                                   ids.data() + system.N_local + system.N_ghost);
  s.ghost_exchange.reset();
  try {
    s.ghost_exchange.emplace(owned, ghosts, s.comm);
  } catch (const std::exception& e) {
    fail(std::string("the ghost exchange over ExaMiniMD's ghosts: ") + e.what());
  }
}

// Displacements x_j - x_i to every neighbour j of each local atom i, padded to the width with
// a displacement beyond the cutoff and a false mask.
template <class List>
void build_environments(ForceKvmap::State& s, const List& list, const t_x& x) {
  const Env env = s.env;
  const Mask mask = s.mask;
  const Neighbors rows = s.neighbors;
  const bool message_passing = s.message_passing;
  const int width = s.width;
  const double far = 2 * s.cutoff + 1;
  Kokkos::parallel_for(
      "kvmap::examinimd::environments", Kokkos::RangePolicy<Exec>(0, s.atoms),
      KOKKOS_LAMBDA(const T_INT i) {
        const auto neighs = list.get_neighs(i);
        const int count = neighs.get_num_neighs();
        for (int k = 0; k < width; ++k) {
          const bool real = k < count;
          const T_INT j = real ? neighs(k) : i;
          env(i, k, 0) = real ? x(j, 0) - x(i, 0) : far;
          env(i, k, 1) = real ? x(j, 1) - x(i, 1) : 0.0;
          env(i, k, 2) = real ? x(j, 2) - x(i, 2) : 0.0;
          mask(i, k) = real;
          if (message_passing) rows(i, k) = j;
        }
      });
  Exec().fence();
}

// A message-passing model on all of this rank's atoms at once: its layers exchange ghost
// features (collective between layers, and again in reverse in the gradient), so every rank
// calls it exactly once per step. A failure before the gradient is agreed first, so no rank
// is left in the reverse exchange. In ghosts mode the rows are the atoms then the ghosts, the
// plan is -1 (no exchange) and the model returns the atoms' energies only.
std::tuple<at::Tensor, at::Tensor> run_message_passing(ForceKvmap::State& s, bool gradients) {
  const auto t0 = Clock::now();
  at::AutoGradMode grad_mode(gradients);
  at::Tensor x = kvmap::to_tensor(s.env).to(s.dtype).detach().requires_grad_(gradients);
  at::Tensor e;
  std::string error;
  try {
    const std::int64_t plan = s.ghost_layers ? -1 : s.ghost_exchange->handle();
    e = s.model
            .forward({x, kvmap::to_tensor(s.mask), kvmap::to_tensor(s.neighbors),
                      static_cast<std::int64_t>(s.ghosts), plan})
            .toTensor();
    check_per_atom(e, s.owned);
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  agree(error);
  if (gradients) add(s.model_seconds, seconds_since(t0));
  if (!gradients) return {e.detach().to(at::kDouble), at::Tensor()};
  const auto t1 = Clock::now();
  at::Tensor g = torch::autograd::grad({e.sum()}, {x})[0];
  add(s.gradient_seconds, seconds_since(t1));
  return {e.detach().to(at::kDouble), g.to(at::kDouble)};
}

// A message-passing model in chunks, split at its exchanges. Layer k of the model (its method
// stage(k, d, mask, neighbors, rows, index)) is mapped over the rank's atoms by
// kvmap::map_batches, chunked and `concurrency` as set; between layers the ghost rows of its
// features come from their owners (GhostExchange::forward_, in place). The gradient runs the
// layers backwards: each chunk's layer k once more, under autograd, seeded with the gradient of
// the energy with respect to its features (from layer k + 1), gives that layer's part of dE/dd
// and the gradient of the rows it read, whose ghost rows are then summed into their owners
// (GhostExchange::reverse) for layer k - 1. Between layers only each layer's features (rows x
// features) are kept, so a chunk's activations bound the memory; a layer's forward runs twice.
// kvmap::map_batches agrees a failure of the model among the ranks before any exchange.
std::tuple<at::Tensor, at::Tensor> run_stages(ForceKvmap::State& s, bool gradients) {
  const kvmap::GhostExchange& exchange = *s.ghost_exchange;
  const int last = s.layers - 1;
  const auto options = kvmap::VmapOptions().chunk_size(s.chunk).concurrency(s.concurrency);
  const at::Tensor none =
      at::empty({0}, at::TensorOptions().dtype(s.dtype).device(s.env_view->local().device()));
  torch::jit::Method stage = s.model.get_method("stage");
  auto call = [&stage](int k, const at::Tensor& d, const at::Tensor& mask,
                       const at::Tensor& neighbors, const at::Tensor& rows,
                       const at::Tensor& index) {
    return stage({static_cast<std::int64_t>(k), d, mask, neighbors, rows, index}).toTensor();
  };
  auto check_features = [&s](const at::Tensor& out, std::int64_t n, int k) {
    if (out.dim() < 1 || out.size(0) != n || out.scalar_type() != s.dtype) {
      throw kvmap::ValueError("the model's stage(" + std::to_string(k) +
                              ", ...) must return one row of features per atom of the chunk, "
                              "in the model's dtype");
    }
  };
  // Forward: the features of each layer before the last (with gradients) or of every layer.
  std::vector<at::Tensor> rows(s.layers);  // rows[k]: layer k's features, atoms then ghosts
  at::Tensor energies;
  for (int k = 0; k <= (gradients ? last - 1 : last); ++k) {
    const at::Tensor previous = k ? rows[k - 1] : none;
    auto layer = [&, k](const at::Tensor& d, const at::Tensor& mask, const at::Tensor& neighbors,
                        const at::Tensor& index) {
      const auto t0 = Clock::now();
      at::NoGradGuard no_grad;
      at::Tensor out = call(k, d.to(s.dtype), mask, neighbors, previous, index);
      if (gradients) add(s.model_seconds, seconds_since(t0));  // timed in compute() only
      if (k == last) {
        check_per_atom(out, d.size(0));
        return out.to(at::kDouble);
      }
      check_features(out, d.size(0), k);
      return out;
    };
    at::Tensor out = kvmap::map_batches(layer, options)(*s.env_view, *s.mask_view,
                                                        *s.neighbors_view, *s.index_view)
                         .local();
    if (k == last) return {out, at::Tensor()};
    std::vector<std::int64_t> shape = out.sizes().vec();
    shape[0] = s.owned + s.ghosts;
    rows[k] = at::empty(shape, out.options());
    rows[k].narrow(0, 0, s.owned).copy_(out);
    exchange.forward_(rows[k]);
  }
  // Backward, layer by layer: dE/dd summed over the layers.
  at::Tensor g_total, seed;  // seed: dE / layer k's features of the rank's atoms
  for (int k = last; k >= 0; --k) {
    const at::Tensor previous = k ? rows[k - 1] : none;
    at::Tensor g_rows = k ? at::zeros_like(previous) : at::Tensor();
    std::mutex g_rows_mutex;  // chunks in flight add to it
    // Layer k of a chunk under autograd: its output and the gradient of <output, seed>.
    auto backward = [&, k](const at::Tensor& d, const at::Tensor& mask, const at::Tensor& neighbors,
                           const at::Tensor& index) {
      const auto t0 = Clock::now();
      at::AutoGradMode grad_mode(true);
      at::Tensor x = d.to(s.dtype).detach().requires_grad_(true);
      at::Tensor r = k ? previous.detach().requires_grad_(true) : none;
      at::Tensor out = call(k, x, mask, neighbors, r, index);
      if (k == last)
        check_per_atom(out, d.size(0));
      else
        check_features(out, d.size(0), k);
      add(s.model_seconds, seconds_since(t0));
      const auto t1 = Clock::now();
      const at::Tensor grad_out = k == last ? at::ones_like(out) : seed.index_select(0, index);
      std::vector<at::Tensor> inputs{x};
      if (k) inputs.push_back(r);
      const auto grads = torch::autograd::grad({out}, inputs, {grad_out}, /*retain_graph=*/false,
                                               /*create_graph=*/false, /*allow_unused=*/true);
      if (k && grads[1].defined()) {
        const std::lock_guard<std::mutex> lock(g_rows_mutex);
        g_rows.add_(grads[1]);
      }
      at::Tensor g = grads[0].defined() ? grads[0].to(at::kDouble)
                                        : at::zeros(x.sizes(), x.options().dtype(at::kDouble));
      add(s.gradient_seconds, seconds_since(t1));
      return std::make_tuple(out.detach().to(at::kDouble), g);
    };
    auto [out, g] = kvmap::map_batches(backward, options)(*s.env_view, *s.mask_view,
                                                          *s.neighbors_view, *s.index_view);
    if (k == last) energies = out.local();
    g_total = g_total.defined() ? g_total.add_(g.local()) : g.local();
    if (k) seed = exchange.reverse(g_rows).narrow(0, 0, s.owned);
  }
  return {energies, g_total};
}

// Runs the model on the environments: kvmap::map_batches over the DistViews, or (mode
// direct) the module called on one tensor over the whole array, chunked the same way; a
// message-passing model on all atoms at once (run_message_passing) or in chunks, layer by
// layer (run_stages).
// Returns per-atom energies [atoms] and, with `gradients`, dE/dd [atoms, width, 3].
std::tuple<at::Tensor, at::Tensor> run_model(ForceKvmap::State& s, bool gradients) {
  if (s.staged) return run_stages(s, gradients);
  if (s.message_passing) return run_message_passing(s, gradients);
  auto call = [&s, gradients](const at::Tensor& d, const at::Tensor& mask) {
    const auto t0 = Clock::now();
    at::AutoGradMode grad_mode(gradients);
    at::Tensor x = d.to(s.dtype).detach().requires_grad_(gradients);
    at::Tensor e = s.model.forward({x, mask}).toTensor();
    check_per_atom(e, x.size(0));
    // Timed in compute() only (compute_energy's forward passes are not part of a step).
    if (gradients) add(s.model_seconds, seconds_since(t0));
    if (!gradients) return std::make_tuple(e.detach().to(at::kDouble), at::Tensor());
    const auto t1 = Clock::now();
    at::Tensor g = torch::autograd::grad({e.sum()}, {x})[0];
    add(s.gradient_seconds, seconds_since(t1));
    return std::make_tuple(e.detach().to(at::kDouble), g.to(at::kDouble));
  };
  const auto options = kvmap::VmapOptions().chunk_size(s.chunk).concurrency(s.concurrency);
  if (!s.direct) {
    if (gradients) {
      auto [e, g] = kvmap::map_batches(call, options)(*s.env_view, *s.mask_view);
      return {e.local(), g.local()};
    }
    auto energy = [&call](const at::Tensor& d, const at::Tensor& mask) {
      return std::get<0>(call(d, mask));
    };
    return {kvmap::map_batches(energy, options)(*s.env_view, *s.mask_view).local(), {}};
  }
  // The reference: one tensor over the whole array (torch::from_blob, as pair_nequip does).
  const at::Tensor d = kvmap::to_tensor(s.env), mask = kvmap::to_tensor(s.mask);
  const std::int64_t n = d.size(0), c = s.chunk ? std::max<std::int64_t>(*s.chunk, 1) : n;
  if (c >= n) return call(d, mask);
  at::Tensor e_all = at::empty({n}, d.options());
  at::Tensor g_all = gradients ? at::empty(d.sizes(), d.options()) : at::Tensor();
  for (std::int64_t a = 0; a < n; a += c) {
    const std::int64_t len = std::min(c, n - a);
    auto [e, g] = call(d.narrow(0, a, len), mask.narrow(0, a, len));
    e_all.narrow(0, a, len).copy_(e);
    if (gradients) g_all.narrow(0, a, len).copy_(g);
  }
  return {e_all, g_all};
}

// F_i += dE/dd_ij and F_j -= dE/dd_ij for every real neighbour (d_ij = x_j - x_i), ghosts
// included; ExaMiniMD's update_force then adds the ghosts' forces to their owners. Through a
// Kokkos ScatterView: per-thread copies on the host (no atomics), atomics on GPUs.
template <class List>
void scatter_forces(const ForceKvmap::State& s, const List& list, t_f f) {
  const Gradients g(s.gradients.data_ptr<double>(), s.atoms, s.width, 3);
  auto forces = Kokkos::Experimental::create_scatter_view(f);
  Kokkos::parallel_for(
      "kvmap::examinimd::scatter", Kokkos::RangePolicy<Exec>(0, s.atoms),
      KOKKOS_LAMBDA(const T_INT i) {
        auto out = forces.access();
        const auto neighs = list.get_neighs(i);
        const int count = neighs.get_num_neighs();
        double fi[3] = {0, 0, 0};
        for (int k = 0; k < count; ++k) {
          const T_INT j = neighs(k);
          for (int d = 0; d < 3; ++d) {
            fi[d] += g(i, k, d);
            out(j, d) -= g(i, k, d);
          }
        }
        for (int d = 0; d < 3; ++d) out(i, d) += fi[d];
      });
  Kokkos::Experimental::contribute(f, forces);
  Exec().fence();
}

}  // namespace

ForceKvmap::ForceKvmap(char** args, System* system, bool half_neigh)
    : Force(args, system, half_neigh), state_(std::make_unique<State>()) {
  State& s = *state_;
  // pair_style kvmap <model.pt> <cutoff> [chunk C] [concurrency K] [max_neighbors M] [mode m]
  //                  [ghosts L]
  std::string error;
  s.model_path = args[2];
  s.cutoff = std::atof(args[3]);
  if (s.model_path.empty() || s.cutoff <= 0) {
    error =
        "usage: pair_style kvmap <model.pt> <cutoff> [chunk C] [concurrency K] "
        "[max_neighbors M] [mode kvmap|direct] [ghosts L]";
  }
  for (int w = 4; error.empty() && w + 1 < 32 && args[w][0] != '\0'; w += 2) {
    const std::string key = args[w], value = args[w + 1];
    if (key == "chunk") {
      s.chunk = std::atoll(value.c_str());
    } else if (key == "concurrency") {
      s.concurrency = std::atoi(value.c_str());
    } else if (key == "max_neighbors") {
      s.max_neighbors = std::atoi(value.c_str());
    } else if (key == "mode" && (value == "kvmap" || value == "direct")) {
      s.direct = value == "direct";
    } else if (key == "ghosts" && std::atoi(value.c_str()) >= 1) {
      s.ghost_layers = std::atoi(value.c_str());
    } else {
      error = "unknown option '" + key + " " + value +
              "' (chunk C, concurrency K, max_neighbors M, mode kvmap|direct, ghosts L >= 1)";
    }
  }
  if (error.empty()) {
    try {
      s.model = torch::jit::load(s.model_path);  // moved to the environments' device below
      s.model.eval();
      s.dtype = model_dtype(s.model);
      s.message_passing =
          s.model.hasattr("message_passing") && s.model.attr("message_passing").toBool();
      s.staged = s.message_passing && (s.chunk || s.concurrency != 1);
      if (s.message_passing && s.direct) {
        error =
            "`mode direct` applies to per-atom models only (a message-passing model's "
            "layers exchange ghost features, a collective step between layers)";
      } else if (s.staged && s.ghost_layers) {
        error =
            "`chunk` and `concurrency` run a message-passing model in exchange mode only "
            "(ghosts mode calls it once on all atoms and ghosts)";
      } else if (s.staged &&
                 !(s.model.find_method("stage") && s.model.hasattr("layers") &&
                   s.model.attr("layers").isInt() && s.model.attr("layers").toInt() >= 1)) {
        error =
            "`chunk` and `concurrency` run a message-passing model layer by layer, split at "
            "its exchanges: the model needs an int attribute `layers` and a method "
            "stage(k: int, d, mask, neighbors, rows, index) -> Tensor (docs/models.md)";
      } else if (s.staged) {
        s.layers = static_cast<int>(s.model.attr("layers").toInt());
      }
      if (s.ghost_layers && !s.message_passing) {
        error = "`ghosts " + std::to_string(s.ghost_layers) +
                "` is for message-passing models (a `message_passing` attribute that is true)";
      }
      // A model that says how many layers deep its receptive field is (`layers`) needs a ghost
      // shell at least that many cutoffs deep.
      if (s.ghost_layers && s.model.hasattr("layers") &&
          s.model.attr("layers").toInt() > s.ghost_layers) {
        error = "the model has " + std::to_string(s.model.attr("layers").toInt()) +
                " message-passing layers: `ghosts " + std::to_string(s.ghost_layers) +
                "` gives a ghost shell too thin for them (ghosts L needs L >= layers)";
      }
      if (s.model.hasattr("cutoff")) {
        const c10::IValue c = s.model.attr("cutoff");
        const double model_cutoff = c.isTensor() ? c.toTensor().item<double>() : c.toDouble();
        if (model_cutoff > s.cutoff * (1 + 1e-12)) {
          error = "the model's cutoff " + std::to_string(model_cutoff) +
                  " exceeds pair_style kvmap's " + std::to_string(s.cutoff) +
                  ": neighbours beyond it would be missing";
        }
      }
    } catch (const std::exception& e) {
      error = "cannot load the TorchScript model '" + s.model_path + "': " + e.what();
    }
  }
  agree(error);
}

ForceKvmap::~ForceKvmap() = default;

void ForceKvmap::init_coeff(int, char**) {
  // The model carries its parameters: `pair_coeff * *` (or any) is accepted and unused.
}

void ForceKvmap::compute(System* system, Binning*, Neighbor* neighbor) {
  State& s = *state_;
  if (!comm_newton) {
    fail(
        "needs `newton on`: the forces on ghost atoms reach their owners through ExaMiniMD's "
        "reverse communication, which it runs only with newton on (in.lj says newton off)");
  }
  with_rows(s, system, neighbor, neighbor_cutoff, [&](const auto& list) {
    auto t = Clock::now();
    const bool remake = agree_width(s, list, *system);
    s.timings.agreement += seconds_since(t);
    if (remake) {
      t = Clock::now();
      remake_ghost_exchange(s, *system);
      s.timings.ghost_plan += seconds_since(t);
      ++s.timings.ghost_plans;
    }
    t = Clock::now();
    build_environments(s, list, system->x);
    s.timings.environments += seconds_since(t);
    t = Clock::now();
    const kvmap::GhostExchange::Usage before =
        s.ghost_exchange ? s.ghost_exchange->usage() : kvmap::GhostExchange::Usage();
    try {
      std::tie(s.energies, s.gradients) = run_model(s, true);
    } catch (const std::exception& e) {
      fail(e.what());  // agreed by kvmap: a ValueError here, a RemoteError on the other ranks
    }
    s.timings.mapping += seconds_since(t);
    if (s.ghost_exchange) {  // the model's exchanges, forward and (in its gradient) reverse
      const kvmap::GhostExchange::Usage after = s.ghost_exchange->usage();
      s.timings.ghost_exchange += after.forward_seconds + after.reverse_seconds -
                                  before.forward_seconds - before.reverse_seconds;
      s.timings.ghost_exchanges +=
          after.forward_calls + after.reverse_calls - before.forward_calls - before.reverse_calls;
    }
    t = Clock::now();
    s.gradients = s.gradients.contiguous();
    scatter_forces(s, list, system->f);
    s.timings.scatter += seconds_since(t);
  });
  s.timings.model = s.model_seconds.load();
  s.timings.gradients = s.gradient_seconds.load();
  ++s.timings.calls;
}

T_F_FLOAT ForceKvmap::compute_energy(System* system, Binning*, Neighbor* neighbor) {
  State& s = *state_;
  double energy = 0;
  with_rows(s, system, neighbor, neighbor_cutoff, [&](const auto& list) {
    if (agree_width(s, list, *system)) remake_ghost_exchange(s, *system);
    build_environments(s, list, system->x);
    try {
      energy = std::get<0>(run_model(s, false)).sum().item<double>();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  });
  return energy;
}

const char* ForceKvmap::name() {
  if (state_->ghost_layers) return "ForceKvmap (message passing, ghosts mode: layers on ghosts)";
  if (state_->staged) {
    return "ForceKvmap (message passing in chunks: layer by layer, kvmap::map_batches and "
           "kvmap::GhostExchange)";
  }
  if (state_->message_passing) return "ForceKvmap (message passing, kvmap::GhostExchange)";
  return state_->direct ? "ForceKvmap (direct model call)" : "ForceKvmap (kvmap::map_batches)";
}

const ForceKvmap::Timings& ForceKvmap::timings() const {
  return state_->timings;
}

int ForceKvmap::width() const {
  return state_->width;
}

void ForceKvmap::save_last(const char* path) const {
  const State& s = *state_;
  torch::jit::Module data("TrainingData");
  data.register_buffer("env", kvmap::to_tensor(s.env).cpu().clone());
  data.register_buffer("mask", kvmap::to_tensor(s.mask).cpu().clone());
  data.register_buffer("energies", s.energies.cpu().clone());
  data.register_buffer("gradients", s.gradients.cpu().clone());
  data.save(path);
}
