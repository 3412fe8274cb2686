#!/usr/bin/env python3
"""Heat's vmap against kvmap's, interleaved in one mpirun, on the same memory.

    export OMP_NUM_THREADS=1   # one thread per rank: the figures compare the vmaps, not BLAS threading
    PYTHONPATH=build/torch2/python mpirun -np 1 ~/.cache/kvmap/torch2-venv/bin/python \\
        perf/heat_vs_kvmap.py --json hk-1rank.json
    PYTHONPATH=build/torch2/python mpirun -np 2 ~/.cache/kvmap/torch2-venv/bin/python \\
        perf/heat_vs_kvmap.py --json hk-2ranks.json
    /usr/bin/python3 perf/plot.py hk-1rank.json hk-2ranks.json --out figures/   # heat_vs_kvmap.png

Options: --sizes 16,1024,100000 (samples per rank), --chunk-size 256, --quick (few
repetitions: a smoke test), --target-s, --min-reps, --max-reps.

Each rank draws its local batch of 64-feature float32 samples, makes a Heat DNDarray of it
(split 0) and a kvmap DistView sharing that very memory (``kvmap.from_heat``). The function,
written for one sample, is ``f(x) = tanh(x @ W).sum()`` with W 64x64 (the same seed on every
rank). Contenders, unchunked and, where the batch exceeds it, with ``chunk_size``:
``heat.vmap``, ``kvmap.vmap`` on the DistView and on the DNDarray itself (the drop-in), raw
functorch driven from Python (functorch's entry points, the floor of any vmap there) and
``torch.vmap`` on the local tensor, and the direct batched
call ``torch.tanh(x.larray @ W).sum(-1)``. Before anything is timed every contender's local
result is checked against the direct call (allclose); a mismatch on any rank ends the run
on every rank with exit status 1.

Timing: warm-up calls give a per-call estimate; the repetitions (the same on every rank)
are enough for about --target-s per contender, within [--min-reps, --max-reps]. In each
repetition the contenders run once each, in an order rotated by one every repetition, each
call after a barrier and timed with time.perf_counter; a sample is the slowest rank's time
for that call. Median and min over the repetitions are reported. OMP_NUM_THREADS is taken
from the environment (use 1) and recorded.

Output: a table on rank 0's stdout with Heat/kvmap per case, and with --json FILE one JSON
line per (ranks, batch, chunk size, contender) with "scenario": "heat_vs_kvmap".
"""
import argparse
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

import heat as ht
import kvmap

FEATURES = 64
CONTENDERS = ("heat.vmap", "kvmap.vmap", "kvmap.vmap (DNDarray)", "raw functorch (local)",
              "torch.vmap (local)", "direct batched")


def f(xi, W=None):
    """One sample: xi has shape (64,)."""
    return torch.tanh(xi @ W).sum()


def raw_functorch(func, chunk_size):
    """The floor of any vmap driven from Python: functorch's own C++ entry points on the local
    tensor (one vmap level, the batch added at 0 and removed at 0), per chunk, no checks."""
    from torch._C._functorch import (_add_batch_dim, _remove_batch_dim, _vmap_decrement_nesting,
                                     _vmap_increment_nesting)

    def one(local, **kwargs):
        n = local.shape[0]
        level = _vmap_increment_nesting(n, "error")
        try:
            return _remove_batch_dim(func(_add_batch_dim(local, 0, level), **kwargs), level, n, 0)
        finally:
            _vmap_decrement_nesting()

    def mapped(local, **kwargs):
        if chunk_size is None or local.shape[0] <= chunk_size:
            return one(local, **kwargs)
        return torch.cat([one(c, **kwargs) for c in local.split(chunk_size)])

    return mapped


def make_calls(x, d, W, chunk_size):
    heat_f = ht.vmap(f, chunk_size=chunk_size)
    kvmap_f = kvmap.vmap(f, chunk_size=chunk_size)
    torch_f = torch.vmap(f, chunk_size=chunk_size)
    raw_f = raw_functorch(f, chunk_size)
    local = x.larray
    return {
        "heat.vmap": lambda: heat_f(x, W=W)[0].larray,
        "kvmap.vmap": lambda: kvmap_f(d, W=W)[0].larray,
        "kvmap.vmap (DNDarray)": lambda: kvmap_f(x, W=W)[0].larray,
        "raw functorch (local)": lambda: raw_f(local, W=W),
        "torch.vmap (local)": lambda: torch_f(local, W=W),
        "direct batched": lambda: torch.tanh(local @ W).sum(-1),
    }


def check_or_exit(comm, calls, x, W, what):
    """Every contender's local result against float64, within the rounding bound of the
    function (kvmap.check_close: tanh(x @ W) is a K-term dot product per unit, whose error
    tanh passes on scaled by 1 - t^2 and rounds (4), then an N-term sum), agreed over ranks."""
    x64, w64 = x.larray.double(), W.double()
    t = torch.tanh(x64 @ w64)
    exact = t.sum(-1)
    magnitudes = ((1 - t * t) * (x64.abs() @ w64.abs())).sum(-1) + t.abs().sum(-1)
    roundings = W.shape[0] + W.shape[1] + 4
    bad = []
    for name, call in calls.items():
        verdict = kvmap.check_close(call(), exact, roundings=roundings, magnitudes=magnitudes)
        if not verdict:
            bad.append("%s (%s)" % (name, verdict.describe()))
    everyone = comm.allgather(bad)
    if any(everyone):
        if comm.rank == 0:
            for r, names in enumerate(everyone):
                for name in names:
                    print("heat_vs_kvmap: %s: rank %d: %s computes something else than the reference; "
                          "no timing is reported" % (what, r, name), file=sys.stderr, flush=True)
        sys.exit(1)


def measure(comm, calls, args):
    """{contender: (median_s, min_s, reps)}: interleaved, rotated, slowest rank per sample."""
    names = list(calls)
    warm = {}
    for name in names:  # warm-up; the second call's time estimates a call
        calls[name]()
        comm.Barrier()
        t0 = time.perf_counter()
        calls[name]()
        warm[name] = time.perf_counter() - t0
    estimate = comm.allreduce(max(warm.values()), op=MPI.MAX)
    reps = max(args.min_reps, min(args.max_reps, math.ceil(args.target_s / max(estimate, 1e-9))))
    samples = np.zeros((len(names), reps))
    for i in range(reps):
        for k in range(len(names)):
            j = (k + i) % len(names)
            comm.Barrier()
            t0 = time.perf_counter()
            calls[names[j]]()
            samples[j, i] = time.perf_counter() - t0
    slowest = np.empty_like(samples)
    comm.Allreduce(samples, slowest, op=MPI.MAX)
    return {n: (statistics.median(slowest[j]), float(slowest[j].min()), reps) for j, n in enumerate(names)}


def fmt(s):
    return "%.1f us" % (s * 1e6) if s < 1e-3 else ("%.2f ms" % (s * 1e3) if s < 1 else "%.3f s" % s)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16,1024,100000", help="local batch sizes (samples per rank)")
    ap.add_argument("--chunk-size", type=int, default=256)
    ap.add_argument("--json", default=None, help="write JSON lines to this file (rank 0; replaced)")
    ap.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a result")
    ap.add_argument("--target-s", type=float, default=None, help="time per contender and case (default 0.2)")
    ap.add_argument("--min-reps", type=int, default=None, help="default 7 (--quick: 3)")
    ap.add_argument("--max-reps", type=int, default=None, help="default 1000 (--quick: 20)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.target_s = args.target_s if args.target_s is not None else (0.02 if args.quick else 0.2)
    args.min_reps = args.min_reps if args.min_reps is not None else (3 if args.quick else 7)
    args.max_reps = args.max_reps if args.max_reps is not None else (20 if args.quick else 1000)
    if args.chunk_size < 1 or not sizes or min(sizes) < 1 or args.min_reps < 1 or args.max_reps < args.min_reps:
        ap.error("sizes and chunk size must be >= 1, and 1 <= --min-reps <= --max-reps")

    comm = MPI.COMM_WORLD
    rank, ranks = comm.rank, comm.size
    W = torch.randn(FEATURES, FEATURES, generator=torch.Generator().manual_seed(0))
    meta = {
        "scenario": "heat_vs_kvmap", "function": "tanh(x @ W).sum()", "features": FEATURES,
        "dtype": "float32", "ranks": ranks, "torch": torch.__version__, "heat": ht.__version__,
        "kvmap": kvmap.__version__, "hostname": socket.gethostname(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "torch_threads": torch.get_num_threads(), "cores": os.cpu_count(), "quick": args.quick,
    }
    if rank == 0:
        print("heat_vs_kvmap: %d rank(s), OMP_NUM_THREADS=%s, torch %s, heat %s, kvmap %s, %s%s"
              % (ranks, meta["omp_num_threads"], meta["torch"], meta["heat"], meta["kvmap"],
                 meta["hostname"], " (--quick: smoke test)" if args.quick else ""), flush=True)
        print("%10s %7s  %-20s %11s %11s %6s" % ("batch/rank", "chunk", "contender", "median", "min", "reps"))
    records, summary = [], []
    for batch in sizes:
        local = torch.randn(batch, FEATURES, generator=torch.Generator().manual_seed(1000 + rank))
        x = ht.array(local, is_split=0)
        d = kvmap.from_heat(x)
        if not comm.allreduce(d.larray.data_ptr() == x.larray.data_ptr(), op=MPI.LAND):
            if rank == 0:
                print("heat_vs_kvmap: kvmap.from_heat copied the data", file=sys.stderr)
            sys.exit(1)
        for chunk_size in [None] + ([args.chunk_size] if batch > args.chunk_size else []):
            calls = make_calls(x, d, W, chunk_size)
            check_or_exit(comm, calls, x, W, "batch %d, chunk_size %s" % (batch, chunk_size))
            result = measure(comm, calls, args)
            for name in CONTENDERS:
                med, lo, reps = result[name]
                records.append(dict(meta, contender=name, batch=batch, global_batch=batch * ranks,
                                    chunked=chunk_size is not None, chunk_size=chunk_size,
                                    median_s=med, min_s=lo, reps=reps))
                if rank == 0:
                    print("%10d %7s  %-20s %11s %11s %6d"
                          % (batch, chunk_size or "-", name, fmt(med), fmt(lo), reps), flush=True)
            kv, raw = result["kvmap.vmap"], result["raw functorch (local)"]
            summary.append((batch, chunk_size, result["heat.vmap"][0] / kv[0],
                            result["heat.vmap"][1] / kv[1], kv[0] - raw[0], kv[1] - raw[1]))
            records.append(dict(meta, contender="kvmap.vmap - raw functorch", batch=batch,
                                global_batch=batch * ranks, chunked=chunk_size is not None,
                                chunk_size=chunk_size, extra_median_s=kv[0] - raw[0],
                                extra_min_s=kv[1] - raw[1]))
    if rank == 0:
        print("\nHeat / kvmap (time per call; > 1: kvmap faster) and kvmap's time over raw "
              "functorch from Python, %d rank(s)" % ranks)
        print("%10s %7s %10s %10s %14s %14s" % ("batch/rank", "chunk", "median", "min", "extra median",
                                                "extra min"))
        for batch, chunk_size, med, lo, extra_med, extra_lo in summary:
            print("%10d %7s %9.2fx %9.2fx %14s %14s" % (batch, chunk_size or "-", med, lo, fmt(extra_med),
                                                         fmt(extra_lo)))
        if args.json:
            with open(args.json, "w") as out:
                for r in records:
                    out.write(json.dumps(r) + "\n")
            print("wrote %d records to %s" % (len(records), args.json))


if __name__ == "__main__":
    main()
