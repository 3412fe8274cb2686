"""Compares what kvmap's entry points send per call across process counts.

Reads traffic_np<P>.tsv (written by kvmap_test_traffic at each P) from a directory and
checks every row marked "fixed": no MPI call at P = 1, and the same number of calls,
collectives and bytes received per rank at every P > 1; and every row marked "neighbours"
(halo exchanges): the same collectives and bytes at every P > 1, and no more calls at any P
than at the largest (point-to-point messages with a bounded set of neighbours; at P = 2 the
rank before and the rank after are one). Rows marked "data" are printed, not checked.
Prints the table it compared.
"""
import pathlib
import re
import sys


def main(directory):
    runs = {}
    for path in pathlib.Path(directory).glob("traffic_np*.tsv"):
        nprocs = int(re.search(r"np(\d+)", path.name).group(1))
        rows = {}
        for line in path.read_text().splitlines():
            op, kind, calls, collectives, received, *functions = line.split("\t")
            rows[op] = (kind, int(calls), int(collectives), int(received),
                        functions[0] if functions else "")
        runs[nprocs] = rows
    if len(runs) < 2 or not any(p > 1 for p in runs):
        print(f"compare_traffic: need runs at P = 1 and P > 1 in {directory}, found {sorted(runs)}")
        return 1
    ps = sorted(runs)
    ops = list(runs[ps[-1]])
    print("calls / collectives / bytes received per rank per call, at P = " +
          ", ".join(map(str, ps)))
    failures = []
    for op in ops:
        cells = []
        for p in ps:
            row = runs[p].get(op)
            cells.append("-" if row is None else f"{row[1]}/{row[2]}/{row[3]}")
        kind = runs[ps[-1]][op][0]
        print(f"  {op:48s} {kind:10s} " + "  ".join(f"{c:>14s}" for c in cells))
        above = {p: runs[p][op][1:4] for p in ps if p > 1 and op in runs[p]}
        if kind == "neighbours":
            if len({v[1:] for v in above.values()}) > 1:
                failures.append(f"{op}: (collectives, bytes) differ with P: {above}")
            most = above[ps[-1]][0] if ps[-1] in above else 0
            if any(v[0] > most for v in above.values()):
                failures.append(f"{op}: more calls at some P than at P = {ps[-1]}: {above}")
            continue
        if kind != "fixed":
            continue
        if 1 in runs and op in runs[1] and runs[1][op][1] != 0:
            failures.append(f"{op}: {runs[1][op][1]} MPI call(s) at P = 1 ({runs[1][op][4]})")
        if len(set(above.values())) > 1:
            failures.append(f"{op}: (calls, collectives, bytes) differ with P: {above}")
    for f in failures:
        print("FAIL " + f)
    print("compare_traffic: " + ("OK" if not failures else f"{len(failures)} failure(s)"))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
