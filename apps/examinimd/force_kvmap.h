// ExaMiniMD force type backed by kvmap: `pair_style kvmap <model.pt> <cutoff> [options]`.
//
// Each step the local atoms' neighbour environments (displacements to every neighbour of the
// full list, padded with a mask to a width every rank shares) are built by a Kokkos kernel in
// ExaMiniMD's memory space and adopted by kvmap DistViews without a copy; kvmap::map_batches
// runs a TorchScript model on them chunk by chunk, returning per-atom energies and their
// gradients with respect to the displacements (autograd inside the mapped function), which a
// second kernel scatters as forces to the atoms and their ghosts with atomics. ExaMiniMD's
// reverse communication (`newton on`) then adds the ghosts' forces to their owners.
//
// Options after the cutoff: `chunk C` (atoms per model call; default: all), `concurrency K`
// (chunks in flight), `max_neighbors M` (a cap on the width: more neighbours is an error on
// every rank), `mode kvmap|direct` (direct: the model called on one tensor over the whole
// environment array, as LAMMPS' pair_nequip does: the benchmark's reference).
//
// The model: forward(d: [atoms, width, 3], mask: [atoms, width] bool) -> [atoms] energies,
// in its own dtype (float32 or float64; the float64 displacements are cast per chunk).
// A message-passing model (a `message_passing` attribute that is true) takes as well
// (neighbors: [atoms, width] int64, each neighbour's row among the rank's atoms then its
// ghosts; ghosts: int, the ghost count; plan: int, a kvmap::GhostExchange handle over those
// rows, rebuilt at ExaMiniMD's neighbour-list rebuilds) and calls
// torch.ops.kvmap.ghost_exchange between its layers; it runs on all of a rank's atoms at once,
// or, with `chunk` or `concurrency`, layer by layer in chunks through its method
// stage(k, d, mask, neighbors, rows, index) (layer k + 1 of a chunk from layer k's features of
// every row; `layers` of them), the exchange between layers run by the pair style.
// `ghosts L` runs it instead in ghosts mode, for comparison: ExaMiniMD's ghost shell is L x
// cutoff (+ skin) deep, the rows are the atoms then the ghosts (neighbour lists over both,
// shell_neighbors.h), the plan is -1 and the model, computing its layers on every row, returns
// the energies of the rank's atoms only.
// This header follows ExaMiniMD's module pattern (modules_force.h includes it).
#ifdef FORCE_MODULES_INSTANTIATION
else if (input->force_type == FORCE_KVMAP) {
  force = new ForceKvmap(input->input_data.words[input->force_line], system, false);
}
#endif

#if !defined(MODULES_OPTION_CHECK) && !defined(FORCE_MODULES_INSTANTIATION)
#ifndef FORCE_KVMAP_H
#define FORCE_KVMAP_H
#include <force.h>

#include <memory>

class ForceKvmap : public Force {
 public:
  ForceKvmap(char** args, System* system, bool half_neigh);
  ~ForceKvmap();

  void init_coeff(int nargs, char** args) override;
  void compute(System* system, Binning* binning, Neighbor* neighbor) override;
  T_F_FLOAT compute_energy(System* system, Binning* binning, Neighbor* neighbor) override;
  const char* name() override;

  // Seconds spent in each phase of compute() since the start, summed over calls (the model
  // and its gradients summed over chunks, also when several run at once).
  struct Timings {
    double environments = 0;    // building the padded environments (Kokkos kernel)
    double agreement = 0;       // the width and layout agreement (MPI_Allreduce) and adoption
    double model = 0;           // the model's forward passes
    double gradients = 0;       // autograd of the energies with respect to the displacements
    double mapping = 0;         // the whole kvmap::map_batches (or direct) call
    double scatter = 0;         // forces to atoms and ghosts (Kokkos kernel with atomics)
    double ghost_plan = 0;      // building the ghost exchange's plans (message passing)
    long ghost_plans = 0;       // plans built (at neighbour-list rebuilds)
    double ghost_exchange = 0;  // in the ghost exchange's calls (forward and reverse)
    long ghost_exchanges = 0;   // ... how many
    double shell_lists = 0;     // ghosts mode: building neighbour lists over atoms and ghosts
    long shell_builds = 0;      // ... how many times
    long calls = 0;             // compute() calls
  };
  const Timings& timings() const;
  // The padded neighbour width every rank uses now.
  int width() const;
  // Writes the last compute()'s environments, mask, energies and gradients (this rank's) as
  // the buffers of a TorchScript module (torch.jit.load(path).env etc. in Python): training
  // data for a model.
  void save_last(const char* path) const;

  struct State;  // defined in force_kvmap.cpp (keeps LibTorch out of ExaMiniMD's headers)

 private:
  std::unique_ptr<State> state_;
};

#endif
#endif
