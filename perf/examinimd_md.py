"""What kvmap costs inside an MD time step: ExaMiniMD's LJ melt with
  (i)   native lj/cut (ExaMiniMD's own Kokkos kernel),
  (ii)  pair_style kvmap: a TorchScript model through kvmap::map_batches,
  (iii) the same module called directly on one tensor over the whole environment array (the
        force module's `mode direct`, as LAMMPS' pair_nequip does),
for the Lennard-Jones model and the trained radial network, at several sizes and rank counts;
and (iv) the message-passing model (models.py mp: two layers, the second taking its neighbours'
features of the first through kvmap's ghost exchange, plus Lennard-Jones), which runs on all of
a rank's atoms at once, and (v) the same model in ghosts mode (`ghosts 2`: a ghost shell two
cutoffs deep, layer 1 recomputed on the ghosts, no exchange), and (vi) the exchange-mode MP model
in chunks (`chunk 4096`: layer by layer through its `stage` method, the exchange between the
layers run by the pair style; memory bounded by the chunk). The NN and exchange-mode MP models
run once more with kvmap's caching host allocator (KVMAP_HOST_ALLOCATOR_MIB: torch's temporaries
reuse kept blocks instead of mapping fresh memory every step). Peak resident memory (the largest
rank's), user and system CPU seconds (all ranks) are reported for every run, and the ghost
exchange's time per step apart from the model.
Both model contenders share the environment and scatter kernels: (ii)/(iii) is kvmap's cost.
Contenders run interleaved, `--reps` times each; the median steps/s is reported.

    perf/examinimd_md.py --build build/default --models <dir with lj.pt, nn.pt>
        [--np 1,2] [--cells 10,20,40] [--reps 3] [--chunk-nn 65536] [--chunk-mp 4096] [--only REGEX]
        [--json out.json]

Needs the ExaMiniMD build of scripts/build-examinimd.sh (<build>/examinimd/bin) and the models
of apps/examinimd/check.py models (the ctest fixtures make both).
"""
import argparse
import datetime
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "apps", "examinimd"))
import check  # noqa: E402  (the input files of the tests)

STEPS = {10: 100, 20: 20, 40: 5}  # cells -> steps: 4,000 / 32,000 / 256,000 atoms


def contenders(models, cells, chunk_nn, chunk_mp):
    lj, nn = os.path.join(models, "lj.pt"), os.path.join(models, "nn.pt")
    # The network's intermediates at 256,000 atoms (a [atoms, width, 16] basis and its
    # gradient, several GB) do not fit one call: both contenders take the same chunks there.
    nn_chunk = " chunk %d" % chunk_nn if cells >= 40 else ""
    cached = {"KVMAP_HOST_ALLOCATOR_MIB": "4096"}
    return [
        ("native lj/cut", "lj/cut 2.5"),
        ("LJ model, kvmap", "kvmap %s 2.5" % lj),
        ("LJ model, direct", "kvmap %s 2.5 mode direct" % lj),
        ("NN model, kvmap", "kvmap %s 2.5%s" % (nn, nn_chunk)),
        ("NN model, kvmap, host alloc.", "kvmap %s 2.5%s" % (nn, nn_chunk), cached),
        ("NN model, direct", "kvmap %s 2.5 mode direct%s" % (nn, nn_chunk)),
        ("MP model, exchange", "kvmap %s 2.5" % os.path.join(models, "mp.pt")),
        ("MP model, exchange, host alloc.", "kvmap %s 2.5" % os.path.join(models, "mp.pt"), cached),
        ("MP model, exchange, chunks", "kvmap %s 2.5 chunk %d" % (os.path.join(models, "mp.pt"), chunk_mp)),
        ("MP model, ghosts", "kvmap %s 2.5 ghosts 2" % os.path.join(models, "mp.pt")),
    ]


def run_once(exe, launcher, np, path, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([launcher, "-n", str(np), exe, "-il", path, "--kvmap-run"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600,
                       env=dict(os.environ, **env))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit("examinimd_md: failed:\n" + p.stdout[-3000:])
    perf = re.search(r"^(\d+) (\d+) \| (\S+) (\S+) (\S+) (\S+) (\S+) \| (\S+) (\S+) (\S+) PERFORMANCE",
                     p.stdout, re.M)
    out = {"time_s": float(perf.group(3)), "force_s": float(perf.group(4)),
           "neigh_s": float(perf.group(5)), "comm_s": float(perf.group(6)),
           "other_s": float(perf.group(7)), "steps_per_s": float(perf.group(8)),
           "atoms": int(perf.group(2)), "user_s": after.ru_utime - before.ru_utime,
           "system_s": after.ru_stime - before.ru_stime}
    t = re.search(r"kvmap-timings: (\d+) calls, width (\d+), ms per step \(rank 0\): environments (\S+), "
                  r"agreement (\S+), model (\S+), gradients (\S+), mapping (\S+) .*scatter ([0-9.]+)", p.stdout)
    if t:
        out.update(width=int(t.group(2)), environments_ms=float(t.group(3)), width_agreement_ms=float(t.group(4)),
                   model_ms=float(t.group(5)), autograd_ms=float(t.group(6)), mapping_ms=float(t.group(7)),
                   scatter_ms=float(t.group(8)))
        out["kvmap_ms"] = out["mapping_ms"] - out["model_ms"] - out["autograd_ms"]
    g = re.search(r"ghost exchange (\S+) \((\S+) calls\), ghost plans (\S+), shell lists (\S+)", p.stdout)
    if g:
        out.update(ghost_exchange_ms=float(g.group(1)), ghost_exchange_calls=float(g.group(2)),
                   ghost_plan_ms=float(g.group(3)), shell_lists_ms=float(g.group(4)))
    m = re.search(r"kvmap-memory: peak RSS (\S+) MB .*ghosts (\d+)", p.stdout)
    out.update(peak_rss_mb=float(m.group(1)), ghosts=int(m.group(2)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--np", default="1,2")
    ap.add_argument("--cells", default="10,20,40")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-nn", type=int, default=65536)
    ap.add_argument("--chunk-mp", type=int, default=4096,
                    help="atoms per chunk of the MP model's chunked contender (layer by layer)")
    ap.add_argument("--only", help="the contenders whose names match this regular expression")
    ap.add_argument("--json")
    args = ap.parse_args()
    exe = os.path.join(args.build, "examinimd", "bin", "examinimd-kvmap")
    launcher = os.path.join(args.build, "kvmap-mpiexec")
    records = []
    with tempfile.TemporaryDirectory() as work:
        for np in [int(v) for v in args.np.split(",")]:
            for cells in [int(v) for v in args.cells.split(",")]:
                steps = STEPS.get(cells, 10)
                cases = [c for c in contenders(args.models, cells, args.chunk_nn, args.chunk_mp)
                         if not args.only or re.search(args.only, c[0])]
                samples = {c[0]: [] for c in cases}
                for rep in range(args.reps):
                    for name, pair, *env in cases:
                        path = check.input_file(os.path.join(work, "md.in"), cells, pair, steps, thermo=steps)
                        samples[name].append(run_once(exe, launcher, np, path, env[0] if env else {}))
                        print("examinimd_md: %d ranks, %d cells, %s, rep %d: %.3f steps/s"
                              % (np, cells, name, rep, samples[name][-1]["steps_per_s"]), flush=True)
                for name, pair, *env in cases:
                    runs = sorted(samples[name], key=lambda r: r["steps_per_s"])
                    median = runs[len(runs) // 2]
                    rec = dict(median, ranks=np, cells=cells, steps=steps, contender=name, pair_style=pair,
                               environment=env[0] if env else {},
                               steps_per_s_all=[r["steps_per_s"] for r in samples[name]])
                    rec["us_per_atom_step"] = 1e6 / (median["steps_per_s"] * median["atoms"])
                    records.append(rec)
                for model in ("LJ", "NN"):
                    k = [r for r in records if r["ranks"] == np and r["cells"] == cells
                         and r["contender"] == model + " model, kvmap"]
                    d = [r for r in records if r["ranks"] == np and r["cells"] == cells
                         and r["contender"] == model + " model, direct"]
                    if k and d:
                        k[0]["kvmap_over_direct"] = d[0]["steps_per_s"] / k[0]["steps_per_s"]
    print()
    print("%-5s %-8s %-31s %10s %12s %9s | ms per step (rank 0): env  width  model  autograd  kvmap  scatter | comm"
          " | exchange | peak MB | user s  sys s" % ("ranks", "atoms", "contender", "steps/s", "us/atom-step", "ii/iii"))
    for r in records:
        ratio = "%.3f" % r["kvmap_over_direct"] if "kvmap_over_direct" in r else ""
        breakdown = ""
        if "model_ms" in r:
            breakdown = "%6.2f %6.2f %6.2f %8.2f %6.2f %8.2f" % (
                r["environments_ms"], r["width_agreement_ms"], r["model_ms"], r["autograd_ms"],
                r["kvmap_ms"], r["scatter_ms"])
        exchange = "%.2f" % r["ghost_exchange_ms"] if r.get("ghost_exchange_calls") else ""
        print("%-5d %-8d %-31s %10.3f %12.3f %9s | %s | %.2f | %s | %.0f | %.1f %.1f" % (
            r["ranks"], r["atoms"], r["contender"], r["steps_per_s"], r["us_per_atom_step"], ratio,
            breakdown, 1e3 * r["comm_s"] / r["steps"], exchange, r["peak_rss_mb"], r["user_s"], r["system_s"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                       "host": socket.gethostname(), "cores": os.cpu_count(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
