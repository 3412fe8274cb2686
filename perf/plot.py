#!/usr/bin/env python3
"""Turns kvmap-perf's (and perf/heat_vs_kvmap.py's) JSON lines into PNG figures.

    /usr/bin/python3 perf/plot.py results.json [more.json ...] [--out DIR]

Writes overhead.png (time per call vs batch size), chunks.png (time and peak memory vs
chunk size), scaling.png (efficiency vs ranks) and scale.png (per-call local work, bytes
allocated and projected communication vs emulated ranks) into DIR (default: next to the first
JSON), and heat_vs_kvmap.png (Heat's vmap vs kvmap's: time per call and their ratio vs
batch size) for records of perf/heat_vs_kvmap.py. Several files are plotted together
(e.g. runs at 1 and 2 ranks): overhead.png then has one line per contender and rank count,
and chunks.png and scaling.png come from the file with the most ranks that has them.
"""
import argparse
import collections
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def ranks_of(r):
    return int(r["machine"]["ranks"]) if "machine" in r else int(r.get("ranks", 0))


def from_one_file(rows):
    """The rows of the file with the most ranks (files are numbered in "_file" by main)."""
    if not rows:
        return rows
    best = max(rows, key=lambda r: (ranks_of(r), -r["_file"]))["_file"]
    return [r for r in rows if r["_file"] == best]


def machine_line(records):
    m = records[0]["machine"]
    ranks = sorted({ranks_of(r) for r in records})
    m = dict(m, ranks=",".join(str(n) for n in ranks))
    return "{date}, {host}: {cores} cores, {ranks} ranks, Kokkos {kokkos_backend}, LibTorch {libtorch}".format(**m)


def plot_overhead(records, out):
    rows = [r for r in records if r["scenario"] == "overhead"]
    if not rows:
        return None
    several = len({ranks_of(r) for r in rows}) > 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, fn in zip(axes, sorted({r["case"].split(" n=")[0] for r in rows})):
        series = collections.defaultdict(list)
        for r in rows:
            name, n = r["case"].split(" n=")
            if name == fn:
                label = r["contender"] + (" (%d ranks)" % ranks_of(r) if several else "")
                series[label].append((int(n), r["median_s"]))
        for contender, pts in sorted(series.items()):
            pts.sort()
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], marker="o", label=contender)
        ax.set_title(fn)
        ax.set_xlabel("local batch (samples)")
        ax.set_ylabel("time per call (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("kvmap-perf overhead — " + machine_line(rows), fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "overhead.png")
    fig.savefig(path, dpi=110)
    return path


def plot_chunks(records, out):
    # One chunk at a time: the rows with "concurrency" in their name compare chunks in flight.
    rows = from_one_file([r for r in records if r["scenario"] == "chunks" and "time_over_unchunked" in r])
    if not rows:
        return None

    # The batch ("n=<samples> ...") stands for the unchunked call.
    def batch(r):
        return int(r["case"].split()[0].split("=")[1])

    def size(r):
        c = r["contender"]
        return batch(r) if c == "unchunked" else int(c.split("=")[1])

    rows.sort(key=size)
    xs = [size(r) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogx(xs, [r["time_over_unchunked"] for r in rows], marker="o", color="C0")
    ax.set_xlabel("chunk size (samples; %d = unchunked)" % batch(rows[0]))
    ax.set_ylabel("time / unchunked", color="C0")
    ax2 = ax.twinx()
    ax2.semilogx(xs, [r["peak_extra_mib"] for r in rows], marker="s", color="C1")
    ax2.set_ylabel("peak extra memory (MiB)", color="C1")
    ax.set_title("chunks — " + machine_line(rows), fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "chunks.png")
    fig.savefig(path, dpi=110)
    return path


def plot_scaling(records, out):
    rows = from_one_file([r for r in records if r["scenario"] == "scaling"])
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in ("strong", "weak"):
        pts = sorted((int(r["contender"].split()[0]), r["efficiency"]) for r in rows if r["case"].startswith(kind))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kind)
    ax.set_xlabel("ranks")
    ax.set_ylabel("parallel efficiency")
    ax.set_ylim(0, 1.2)
    ax.legend()
    ax.set_title("scaling — " + machine_line(rows), fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "scaling.png")
    fig.savefig(path, dpi=110)
    return path


def plot_scale(records, out):
    """Scenario "scale": emulated per-call local work and the projected communication vs P."""
    rows = from_one_file([r for r in records if r["scenario"] == "scale"])
    if not rows:
        return None
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    work = collections.defaultdict(list)
    for r in rows:
        if r["contender"].startswith("kvmap (emulated"):
            name, p = r["case"].rsplit(" P=", 1)
            work[name].append((int(p), r["median_s"] * 1e6, r["bytes_allocated_per_call"]))
    for i, (name, pts) in enumerate(sorted(work.items())):
        pts.sort()
        ax.semilogx([p[0] for p in pts], [p[1] for p in pts], marker="o", color="C%d" % i, label=name)
        ax2.semilogx([p[0] for p in pts], [p[2] for p in pts], marker="o", color="C%d" % i, label=name)
    ax.set_xlabel("ranks (emulated)")
    ax.set_ylabel("local work per call (us, median)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax2.set_xlabel("ranks (emulated)")
    ax2.set_ylabel("bytes allocated per call")
    ax2.set_ylim(bottom=0)
    proj = collections.defaultdict(list)
    for r in rows:
        if r["contender"] == "projected" and r["case"].endswith(" 10 GB/s"):
            name, rest = r["case"].split(" P=", 1)
            p = int(rest.split()[0])
            if name == "vmap agreement":
                proj["vmap agreement (allreduce, 120 B)"].append((p, r["agreement_projected_us"]))
                proj["before: allgather of 664 B"].append((p, r["allgather_664B_us"]))
            else:
                proj["balance (agreement + peers with data)"].append((p, r["balance_projected_us"]))
                proj["before: allgather + all-to-all"].append((p, r["alltoallv_us"]))
    for i, (name, pts) in enumerate(sorted(proj.items())):
        pts.sort()
        ax3.loglog([p[0] for p in pts], [p[1] for p in pts], marker="o",
                   linestyle=":" if name.startswith("before") else "-", label=name)
    ax3.axhline(30.0, color="gray", linewidth=0.8, linestyle="--", label="30 us")
    ax3.set_xlabel("ranks")
    ax3.set_ylabel("projected time per call (us), 1.5 us latency, 10 GB/s")
    ax3.legend(fontsize=7)
    ax3.grid(True, which="both", alpha=0.3)
    fig.suptitle("per-call cost vs ranks — " + machine_line(rows), fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "scale.png")
    fig.savefig(path, dpi=110)
    return path


def rank_line(ax, i, ranks, chunk, pts, markers):
    """One line of (batch, value) points for a rank count, chunked dashed (log x)."""
    if pts:
        ax.semilogx([p[0] for p in pts], [p[1] for p in pts], color="C%d" % i,
                    marker=markers[i % len(markers)], linestyle="--" if chunk else "-",
                    label="%d rank%s%s" % (ranks, "s" if ranks > 1 else "", ", chunk %d" % chunk if chunk else ""))


def plot_heat_vs_kvmap(records, out):
    """perf/heat_vs_kvmap.py: time per call and Heat/kvmap vs the local batch."""
    rows = [r for r in records if r["scenario"] == "heat_vs_kvmap" and "median_s" in r]
    extra = [r for r in records if r["scenario"] == "heat_vs_kvmap" and "extra_median_s" in r]
    if not rows:
        return None
    contenders = ["heat.vmap", "kvmap.vmap", "torch.vmap (local)", "direct batched"]
    contenders += sorted({r["contender"] for r in rows} - set(contenders))
    rank_counts = sorted({r["ranks"] for r in rows})
    markers = "osD^v<>"
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.5))
    series = collections.defaultdict(list)
    for r in rows:
        series[(r["contender"], r["ranks"], r["chunk_size"])].append((r["batch"], r["median_s"]))
    for (contender, ranks, chunk), pts in sorted(series.items(), key=lambda kv: (
            contenders.index(kv[0][0]), kv[0][1], kv[0][2] or 0)):
        pts.sort()
        ax.loglog([p[0] for p in pts], [p[1] for p in pts], color="C%d" % contenders.index(contender),
                  marker=markers[rank_counts.index(ranks) % len(markers)], linestyle="--" if chunk else "-",
                  label="%s, %d rank%s%s" % (contender, ranks, "s" if ranks > 1 else "",
                                              ", chunk %d" % chunk if chunk else ""))
    ax.set_xlabel("local batch (samples per rank)")
    ax.set_ylabel("time per call (s, median, slowest rank)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    medians = {(r["contender"], r["ranks"], r["chunk_size"], r["batch"]): r["median_s"] for r in rows}
    for i, ranks in enumerate(rank_counts):
        for chunk in sorted({r["chunk_size"] or 0 for r in rows if r["ranks"] == ranks}):
            chunk = chunk or None
            pts = sorted((b, medians[("heat.vmap", n, c, b)] / medians[("kvmap.vmap", n, c, b)])
                         for (name, n, c, b) in medians
                         if name == "heat.vmap" and n == ranks and c == chunk
                         and ("kvmap.vmap", n, c, b) in medians)
            rank_line(ax2, i, ranks, chunk, pts, markers)
    ax2.axhline(3.0, color="gray", linestyle=":", label="3x")
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("local batch (samples per rank)")
    ax2.set_ylabel("Heat / kvmap (time per call)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7)
    # kvmap's Python call over raw functorch driven from Python (the floor of any vmap there).
    for i, ranks in enumerate(rank_counts):
        for chunk in sorted({r["chunk_size"] or 0 for r in extra if r["ranks"] == ranks}):
            # Small batches only: at 100,000 samples the difference is the run's noise (ms).
            pts = sorted((r["batch"], r["extra_median_s"] * 1e6) for r in extra
                         if r["ranks"] == ranks and (r["chunk_size"] or 0) == chunk
                         and r["batch"] <= 1024)
            rank_line(ax3, i, ranks, chunk, pts, markers)
    ax3.axhline(3.0, color="gray", linestyle=":", label="3 us")
    ax3.axhline(0.0, color="black", linewidth=0.8)
    ax3.set_xlabel("local batch (samples per rank)")
    ax3.set_yscale("symlog", linthresh=1.0)
    ax3.set_ylabel("kvmap.vmap - raw functorch (us per call, median; symlog)")
    ax3.grid(True, which="both", alpha=0.3)
    ax3.legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle("heat.vmap vs kvmap.vmap, f = %s, %d features%s — %s, %s: %s cores, OMP_NUM_THREADS=%s, "
                 "torch %s, Heat %s, kvmap %s" % (
                     r0["function"], r0["features"],
                     " (--quick: smoke test)" if any(r.get("quick") for r in rows) else "",
                     r0["date"], r0["hostname"], r0["cores"], r0["omp_num_threads"], r0["torch"],
                     r0["heat"], r0["kvmap"]), fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "heat_vs_kvmap.png")
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or os.path.dirname(os.path.abspath(args.json[0]))
    os.makedirs(out, exist_ok=True)
    records = []
    for i, path in enumerate(args.json):
        records += [dict(r, _file=i) for r in load(path)]
    for path in (plot_overhead(records, out), plot_chunks(records, out), plot_scaling(records, out),
                 plot_scale(records, out), plot_heat_vs_kvmap(records, out)):
        if path:
            print(path)


if __name__ == "__main__":
    main()
