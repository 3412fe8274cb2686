#!/usr/bin/env python3
"""Heat's vmap against kvmap's, interleaved in one mpirun, on the same memory.

    export OMP_NUM_THREADS=1   # one thread per rank: the figures compare the vmaps, not BLAS threading
    PYTHONPATH=build/torch2/python mpirun -np 1 ~/.cache/kvmap/torch2-venv/bin/python \\
        perf/heat_vs_kvmap.py --json hk-1rank.json
    PYTHONPATH=build/torch2/python mpirun -np 2 ~/.cache/kvmap/torch2-venv/bin/python \\
        perf/heat_vs_kvmap.py --json hk-2ranks.json
    /usr/bin/python3 perf/plot.py hk-1rank.json hk-2ranks.json --out figures/   # heat_vs_kvmap.png

Options: --sizes 16,1024,100000 (samples per rank), --chunk-size 256, --function tanh|pointwise,
--quick (few repetitions: a smoke test), --target-s, --min-reps, --max-reps, --no-compile.

Each rank draws its local batch of float32 samples, makes a Heat DNDarray of it (split 0) and a
kvmap DistView sharing that very memory (``kvmap.from_heat``). The function, written for one
sample, is ``f(x) = tanh(x @ W).sum()`` on 64 features with W 64x64 (the same seed on every
rank), or with --function pointwise ``(sigmoid(1.5 sin x + 0.25) cos x).sum()`` on 256 features
(six elementwise operations: what a fused kernel reads once). Contenders, unchunked and, where
the batch exceeds it, with ``chunk_size``: ``heat.vmap``, ``kvmap.vmap`` on the DistView and on
the DNDarray itself (the drop-in), raw functorch driven from Python (functorch's entry points,
the floor of any vmap there) and ``torch.vmap`` on the local tensor, and the direct batched call
(f written for the batch on ``x.larray``); where torch has ``torch.compile`` (unless
--no-compile): ``kvmap.vmap(f, compile=True)`` (torch.compile; chunked, the shorter last chunk
makes the batch dimension dynamic), the same padded to the chunk size (``kvmap.map_batches`` of
``torch.func.vmap(f)`` with ``pad_to_chunk=True, compile=True``: one static shape),
``kvmap.vmap(f, compile="trace")`` (traced once, Inductor's program called without Dynamo's
guards; chunks padded) and ``torch.compile`` of the direct call, their first call (the
compilation, every rank, the slowest rank's time) reported apart as first_call_s and never timed
with the calls. Before anything is timed every contender's local result is checked against
float64 within the function's rounding bound; a mismatch on any rank ends the run on every rank
with exit status 1.

Timing: warm-up calls give a per-call estimate; the repetitions (the same on every rank)
are enough for about --target-s per contender, within [--min-reps, --max-reps]. In each
repetition the contenders run once each, in an order rotated by one every repetition, each
call after a barrier and timed with time.perf_counter; a sample is the slowest rank's time
for that call. Median and min over the repetitions are reported. OMP_NUM_THREADS is taken
from the environment (use 1) and recorded.

Output: a table on rank 0's stdout with Heat/kvmap per case, and with --json FILE one JSON
line per (ranks, batch, chunk size, contender) with "scenario": "heat_vs_kvmap".

--case overlap (the default runs both cases, --case vmap or --case overlap one) times halos
along the split axis: a 1-D 5-point stencil (depth 2) and a 2-D 3x3 filter (depth 1, zero
columns beyond the edges) on a row-split float32 grid, zero rows beyond the global ends, with
--overlap-elements per rank (default 1048576; 67108864 for the large case). Contenders, each
computing the same torch operations on the same extended block: Heat (``get_halo`` +
``array_with_halos``, the zero rows added on the edge ranks by hand), ``kvmap.map_overlap``
on the DistView and on the DNDarray (``boundary=0.0, trim=False``), a hand-written mpi4py
``Sendrecv`` with both neighbours into a preallocated block, and the copy ceiling (the local
rows copied into the block, no exchange). Every contender's result must equal the
hand-written one exactly (the same operations on the same rows); JSON lines carry
"scenario": "heat_vs_kvmap_overlap".
"""
import argparse
import collections
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

CONTENDERS = ("heat.vmap", "kvmap.vmap", "kvmap.vmap (DNDarray)", "raw functorch (local)",
              "torch.vmap (local)", "direct batched")
# Where torch has torch.compile (unless --no-compile): compiled once per case, the compilation
# timed apart on the first call, never inside the timed calls. The padded one only chunked.
COMPILED = ("kvmap.vmap (compile)", "kvmap.vmap (compile, padded)", "kvmap.vmap (trace)",
            "torch.compile (direct batched)")


def f(xi, W=None):
    """One sample: xi has shape (64,)."""
    return torch.tanh(xi @ W).sum()


def tanh_reference(x64, W):
    """tanh(x @ W).sum(-1) in float64 and its rounding bound: a K-term dot product per unit,
    whose error tanh passes on scaled by 1 - t^2 and rounds (4), then an N-term sum."""
    w64 = W.double()
    t = torch.tanh(x64 @ w64)
    magnitudes = ((1 - t * t) * (x64.abs() @ w64.abs())).sum(-1) + t.abs().sum(-1)
    return t.sum(-1), W.shape[0] + W.shape[1] + 4, magnitudes


def f_pointwise(xi):
    """One sample of 256 features: six elementwise operations, then a sum."""
    return (torch.sigmoid(torch.sin(xi) * 1.5 + 0.25) * torch.cos(xi)).sum()


def pointwise_reference(x64, W):
    """The pointwise f in float64 and its bound: each term's six operations err by a few units
    in the last place of quantities at most 1.75 in size, passed on with factors at most 1.5
    (sigmoid's slope is at most 1/4): within 16 unit roundoffs of 1 per term; the N-term sum
    adds gamma_N sum|term|."""
    terms = torch.sigmoid(torch.sin(x64) * 1.5 + 0.25) * torch.cos(x64)
    return terms.sum(-1), x64.shape[-1] + 16, (1 + terms.abs()).sum(-1)


# one: f for one sample; batched: f for the batch; takes_w: whether f takes W; reference: the
# float64 value, roundings and magnitudes for kvmap.check_close.
Function = collections.namedtuple("Function", "label features one batched takes_w reference")
FUNCTIONS = {
    "tanh": Function("tanh(x @ W).sum()", 64, f, lambda local, **kw: torch.tanh(local @ kw["W"]).sum(-1), True,
                     tanh_reference),
    "pointwise": Function("(sigmoid(1.5 sin x + 0.25) cos x).sum()", 256, f_pointwise,
                          lambda local: (torch.sigmoid(torch.sin(local) * 1.5 + 0.25) * torch.cos(local)).sum(-1),
                          False, pointwise_reference),
}


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


def make_compiled_calls(d, fn, kw, chunk_size):
    one, batched = fn.one, fn.batched
    kvmap_c = kvmap.vmap(one, chunk_size=chunk_size, compile=True)
    kvmap_t = kvmap.vmap(one, chunk_size=chunk_size, compile="trace")
    direct_c = torch.compile(batched)
    local = d.larray
    calls = {
        "kvmap.vmap (compile)": lambda: kvmap_c(d, **kw)[0].larray,
        "kvmap.vmap (trace)": lambda: kvmap_t(d, **kw)[0].larray,
        "torch.compile (direct batched)": lambda: direct_c(local, **kw),
    }
    if chunk_size is not None:
        padded = kvmap.map_batches(torch.func.vmap(one, in_dims=0), chunk_size=chunk_size, pad_to_chunk=True,
                                   compile=True)
        calls["kvmap.vmap (compile, padded)"] = lambda: padded(d, **kw)[0].larray
    return calls


def make_calls(x, d, fn, kw, chunk_size):
    one, batched = fn.one, fn.batched
    heat_f = ht.vmap(one, chunk_size=chunk_size)
    kvmap_f = kvmap.vmap(one, chunk_size=chunk_size)
    torch_f = torch.vmap(one, chunk_size=chunk_size)
    raw_f = raw_functorch(one, chunk_size)
    local = x.larray
    return {
        "heat.vmap": lambda: heat_f(x, **kw)[0].larray,
        "kvmap.vmap": lambda: kvmap_f(d, **kw)[0].larray,
        "kvmap.vmap (DNDarray)": lambda: kvmap_f(x, **kw)[0].larray,
        "raw functorch (local)": lambda: raw_f(local, **kw),
        "torch.vmap (local)": lambda: torch_f(local, **kw),
        "direct batched": lambda: batched(local, **kw),
    }


def check_or_exit(comm, calls, x, fn, W, what):
    """Every contender's local result against float64, within the rounding bound of the
    function (kvmap.check_close, the function's reference and bound), agreed over ranks."""
    exact, roundings, magnitudes = fn.reference(x.larray.double(), W)
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


OVERLAP_CONTENDERS = ("heat get_halo", "kvmap.map_overlap", "kvmap.map_overlap (DNDarray)",
                      "mpi4py Sendrecv", "copy ceiling")


def stencil_1d(e):
    """The 5-point stencil on a block extended by 2 rows each side: the block's own rows."""
    m = e.shape[0] - 4
    return 0.4 * e[2:2 + m] + 0.2 * (e[1:1 + m] + e[3:3 + m]) + 0.1 * (e[0:m] + e[4:4 + m])


def filter_2d(e, w):
    """A 3x3 filter on a row block extended by 1 row each side, zero columns beyond the edges."""
    return torch.nn.functional.conv2d(e[None, None], w, padding=(0, 1))[0, 0]


def make_overlap_calls(comm, x, d, op, depth):
    """The contenders of one overlap case: each returns the rank's own rows of op."""
    rank, ranks = comm.rank, comm.size
    local = x.larray
    n, cols = local.shape
    prev = rank - 1 if rank > 0 else MPI.PROC_NULL
    nxt = rank + 1 if rank < ranks - 1 else MPI.PROC_NULL
    block = torch.zeros(n + 2 * depth, cols)  # the hand-written exchange's preallocated block
    zeros = torch.zeros(depth, cols)

    def by_hand():
        block[depth:depth + n] = local
        # My first rows to the previous rank's tail, my last rows to the next rank's head; the
        # edge ranks' outer rows stay zero (PROC_NULL).
        comm.Sendrecv(local[:depth].numpy(), dest=prev, sendtag=1,
                      recvbuf=block[n + depth:].numpy(), source=nxt, recvtag=1)
        comm.Sendrecv(local[n - depth:].numpy(), dest=nxt, sendtag=2,
                      recvbuf=block[:depth].numpy(), source=prev, recvtag=2)
        return op(block)

    def heat():
        x.get_halo(depth)
        e = x.array_with_halos
        parts = ([zeros] if rank == 0 else []) + [e] + ([zeros] if rank == ranks - 1 else [])
        return op(torch.cat(parts) if len(parts) > 1 else e)

    def ceiling():
        e = torch.empty(n + 2 * depth, cols)
        e[depth:depth + n] = local
        return op(e)

    mapped = dict(depth=depth, boundary=0.0, trim=False)
    return {
        "heat get_halo": heat,
        "kvmap.map_overlap": lambda: kvmap.map_overlap(op, d, **mapped)[0].larray,
        "kvmap.map_overlap (DNDarray)": lambda: kvmap.map_overlap(op, x, **mapped)[0].larray,
        "mpi4py Sendrecv": by_hand,
        "copy ceiling": ceiling,
    }


def run_overlap(comm, args, meta):
    """The overlap cases: records, and (case, kvmap/hand-written, kvmap/Heat) for the summary."""
    rank, ranks = comm.rank, comm.size
    w = torch.full((1, 1, 3, 3), 1.0 / 9)
    records, summary = [], []
    for elements in args.overlap_elements:
        side = int(math.isqrt(elements))
        cases = (("1-D 5-point stencil", (elements, 1), 2, stencil_1d),
                 ("2-D 3x3 filter", (side, elements // side), 1, lambda e: filter_2d(e, w)))
        for name, shape, depth, op in cases:
            local = torch.randn(*shape, generator=torch.Generator().manual_seed(2000 + rank))
            x = ht.array(local, is_split=0)
            d = kvmap.from_heat(x)
            calls = make_overlap_calls(comm, x, d, op, depth)
            reference = calls["mpi4py Sendrecv"]().clone()
            bad = [c for c in OVERLAP_CONTENDERS
                   if c != "copy ceiling" and not torch.equal(calls[c](), reference)]
            everyone = comm.allgather(bad)
            if any(everyone):
                if rank == 0:
                    print("heat_vs_kvmap: %s: %s computes something else than the hand-written "
                          "exchange; no timing is reported" % (name, everyone), file=sys.stderr)
                sys.exit(1)
            result = measure(comm, calls, args)
            label = "%s, %d per rank" % (name, elements)
            for c in OVERLAP_CONTENDERS:
                med, lo, reps = result[c]
                records.append(dict(meta, scenario="heat_vs_kvmap_overlap", function=name, case=name,
                                    elements_per_rank=shape[0] * shape[1], depth=depth, contender=c,
                                    median_s=med, min_s=lo, reps=reps))
                if rank == 0:
                    print("%-36s %-30s %11s %11s %6d" % (label, c, fmt(med), fmt(lo), reps), flush=True)
            kv = result["kvmap.map_overlap"][0]
            summary.append((label, result["mpi4py Sendrecv"][0] / kv, result["heat get_halo"][0] / kv,
                            result["heat get_halo"][0] / result["kvmap.map_overlap (DNDarray)"][0]))
    if rank == 0:
        print("\nmap_overlap throughput over the hand-written exchange's and over Heat's "
              "(> 1: kvmap faster), medians, %d rank(s)" % ranks)
        print("%-36s %14s %10s %18s" % ("case", "hand-written", "Heat", "Heat (DNDarray)"))
        for label, hand, heat, heat_nd in summary:
            print("%-36s %13.2fx %9.2fx %17.2fx" % (label, hand, heat, heat_nd))
    return records


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
    ap.add_argument("--case", default="vmap,overlap", help="vmap, overlap or both (default)")
    ap.add_argument("--function", default="tanh", choices=sorted(FUNCTIONS),
                    help="the vmap case's f: tanh(x @ W).sum() on 64 features (default) or the "
                         "pointwise chain on 256")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave out the torch.compile contenders (compile: %s)" % ", ".join(COMPILED))
    ap.add_argument("--overlap-elements", default="1048576",
                    help="grid elements per rank of the overlap cases (e.g. 1048576,67108864)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    cases = {c.strip() for c in args.case.split(",") if c.strip()}
    args.overlap_elements = [int(s) for s in args.overlap_elements.split(",") if s.strip()]
    if not cases or cases - {"vmap", "overlap"} or min(args.overlap_elements or [0]) < 16:
        ap.error("--case takes vmap and/or overlap; --overlap-elements at least 16 each")
    args.target_s = args.target_s if args.target_s is not None else (0.02 if args.quick else 0.2)
    args.min_reps = args.min_reps if args.min_reps is not None else (3 if args.quick else 7)
    args.max_reps = args.max_reps if args.max_reps is not None else (20 if args.quick else 1000)
    if args.chunk_size < 1 or not sizes or min(sizes) < 1 or args.min_reps < 1 or args.max_reps < args.min_reps:
        ap.error("sizes and chunk size must be >= 1, and 1 <= --min-reps <= --max-reps")

    comm = MPI.COMM_WORLD
    rank, ranks = comm.rank, comm.size
    compiling = not args.no_compile and hasattr(torch, "compile")
    fn = FUNCTIONS[args.function]
    features = fn.features
    W = torch.randn(features, features, generator=torch.Generator().manual_seed(0))
    kw = {"W": W} if fn.takes_w else {}
    meta = {
        "scenario": "heat_vs_kvmap", "function": fn.label, "features": features,
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
    records, summary, over_direct = [], [], []
    for batch in (sizes if "vmap" in cases else []):
        local = torch.randn(batch, features, generator=torch.Generator().manual_seed(1000 + rank))
        x = ht.array(local, is_split=0)
        d = kvmap.from_heat(x)
        if not comm.allreduce(d.larray.data_ptr() == x.larray.data_ptr(), op=MPI.LAND):
            if rank == 0:
                print("heat_vs_kvmap: kvmap.from_heat copied the data", file=sys.stderr)
            sys.exit(1)
        for chunk_size in [None] + ([args.chunk_size] if batch > args.chunk_size else []):
            calls = make_calls(x, d, fn, kw, chunk_size)
            compile_s = {}
            if compiling:
                for name, call in make_compiled_calls(d, fn, kw, chunk_size).items():
                    comm.Barrier()
                    start = time.perf_counter()
                    call()  # compiles (every rank), outside the timed calls
                    compile_s[name] = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                    calls[name] = call
                    records.append(dict(meta, contender=name, batch=batch, global_batch=batch * ranks,
                                        chunked=chunk_size is not None, chunk_size=chunk_size,
                                        first_call_s=compile_s[name]))
                    if rank == 0:
                        print("%10d %7s  %-20s first call (compiles): %s"
                              % (batch, chunk_size or "-", name, fmt(compile_s[name])), flush=True)
            check_or_exit(comm, calls, x, fn, W, "batch %d, chunk_size %s" % (batch, chunk_size))
            result = measure(comm, calls, args)
            for name in CONTENDERS + tuple(c for c in COMPILED if c in calls):
                med, lo, reps = result[name]
                records.append(dict(meta, contender=name, batch=batch, global_batch=batch * ranks,
                                    chunked=chunk_size is not None, chunk_size=chunk_size,
                                    median_s=med, min_s=lo, reps=reps))
                if rank == 0:
                    print("%10d %7s  %-20s %11s %11s %6d"
                          % (batch, chunk_size or "-", name, fmt(med), fmt(lo), reps), flush=True)
            over_direct.append((batch, chunk_size, {n: result[n][0] / result["direct batched"][0]
                                                    for n in ("kvmap.vmap",) + COMPILED if n in result}))
            kv, raw = result["kvmap.vmap"], result["raw functorch (local)"]
            summary.append((batch, chunk_size, result["heat.vmap"][0] / kv[0],
                            result["heat.vmap"][1] / kv[1], kv[0] - raw[0], kv[1] - raw[1]))
            records.append(dict(meta, contender="kvmap.vmap - raw functorch", batch=batch,
                                global_batch=batch * ranks, chunked=chunk_size is not None,
                                chunk_size=chunk_size, extra_median_s=kv[0] - raw[0],
                                extra_min_s=kv[1] - raw[1]))
    if rank == 0 and summary:
        print("\nHeat / kvmap (time per call; > 1: kvmap faster) and kvmap's time over raw "
              "functorch from Python, %d rank(s)" % ranks)
        print("%10s %7s %10s %10s %14s %14s" % ("batch/rank", "chunk", "median", "min", "extra median",
                                                "extra min"))
        for batch, chunk_size, med, lo, extra_med, extra_lo in summary:
            print("%10d %7s %9.2fx %9.2fx %14s %14s" % (batch, chunk_size or "-", med, lo, fmt(extra_med),
                                                         fmt(extra_lo)))
    if rank == 0 and over_direct and compiling:
        names = ("kvmap.vmap",) + COMPILED
        print("\nTime over the direct batched call's (medians; < 1: faster than the eager direct call)")
        print("%10s %7s " % ("batch/rank", "chunk") + " ".join("%16s" % n.replace("kvmap.vmap ", "")
                                                                for n in names))
        for batch, chunk_size, ratios in over_direct:
            print("%10d %7s " % (batch, chunk_size or "-") + " ".join(
                "%15.2fx" % ratios[n] if n in ratios else "%16s" % "-" for n in names))
    if "overlap" in cases:
        records += run_overlap(comm, args, meta)
    if rank == 0:
        if args.json:
            with open(args.json, "w") as out:
                for r in records:
                    out.write(json.dumps(r) + "\n")
            print("wrote %d records to %s" % (len(records), args.json))


if __name__ == "__main__":
    main()
