#!/usr/bin/env python3
"""Turns kvmap-perf's JSON lines into PNG figures.

    /usr/bin/python3 perf/plot.py results.json [--out DIR]

Writes overhead.png (time per call vs batch size), chunks.png (time and peak memory vs
chunk size) and scaling.png (efficiency vs ranks) into DIR (default: next to the JSON).
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


def machine_line(records):
    m = records[0]["machine"]
    return "{date}, {host}: {cores} cores, {ranks} ranks, Kokkos {kokkos_backend}, LibTorch {libtorch}".format(**m)


def plot_overhead(records, out):
    rows = [r for r in records if r["scenario"] == "overhead"]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, fn in zip(axes, sorted({r["case"].split(" n=")[0] for r in rows})):
        series = collections.defaultdict(list)
        for r in rows:
            name, n = r["case"].split(" n=")
            if name == fn:
                series[r["contender"]].append((int(n), r["median_s"]))
        for contender, pts in sorted(series.items()):
            pts.sort()
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], marker="o", label=contender)
        ax.set_title(fn)
        ax.set_xlabel("local batch (samples)")
        ax.set_ylabel("time per call (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("kvmap-perf overhead — " + machine_line(records), fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "overhead.png")
    fig.savefig(path, dpi=110)
    return path


def plot_chunks(records, out):
    # One chunk at a time: the rows with "concurrency" in their name compare chunks in flight.
    rows = [r for r in records if r["scenario"] == "chunks" and "time_over_unchunked" in r]
    if not rows:
        return None

    def size(r):
        c = r["contender"]
        return 100000 if c == "unchunked" else int(c.split("=")[1])

    rows.sort(key=size)
    xs = [size(r) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogx(xs, [r["time_over_unchunked"] for r in rows], marker="o", color="C0")
    ax.set_xlabel("chunk size (samples; 100000 = unchunked)")
    ax.set_ylabel("time / unchunked", color="C0")
    ax2 = ax.twinx()
    ax2.semilogx(xs, [r["peak_extra_mib"] for r in rows], marker="s", color="C1")
    ax2.set_ylabel("peak extra memory (MiB)", color="C1")
    ax.set_title("chunks — " + machine_line(records), fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "chunks.png")
    fig.savefig(path, dpi=110)
    return path


def plot_scaling(records, out):
    rows = [r for r in records if r["scenario"] == "scaling"]
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
    ax.set_title("scaling — " + machine_line(records), fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "scaling.png")
    fig.savefig(path, dpi=110)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = args.out or os.path.dirname(os.path.abspath(args.json))
    os.makedirs(out, exist_ok=True)
    records = load(args.json)
    for path in (plot_overhead(records, out), plot_chunks(records, out), plot_scaling(records, out)):
        if path:
            print(path)


if __name__ == "__main__":
    main()
