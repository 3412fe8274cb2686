#!/usr/bin/env python3
"""Per-call cost of the ways to run a compiled vmapped function from Python, one process,
no kvmap: what a chunk call of kvmap.vmap(compile=...) can cost at best.

    OMP_NUM_THREADS=1 ~/.cache/kvmap/torch2-venv/bin/python perf/compile_runners.py [--batch 16]

f(x) = tanh(x @ W).sum() on 64 float32 features (perf/heat_vs_kvmap.py's), on one batch.
Runners: the direct batched call and functorch's vmap (eager); torch.compile of the vmapped
function, also with torch.compiler.set_stance(skip_guard_eval_unsafe=True) (Dynamo checks only
the guards that tell its compiled versions apart); the vmapped function traced with make_fx
(fake tensors) and compiled by torch._inductor.compile, called without Dynamo (kvmap's
compile="trace"); torch.export + AOTInductor (aoti_compile_and_package, aoti_load_package).
Each result is checked against float64 within the rounding bound of f before timing; the
compilation time of each is printed apart. Medians of 7 rounds.
"""
import argparse
import tempfile
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    W = torch.randn(64, 64, generator=g)
    x = torch.randn(args.batch, 64, generator=g)

    def f(xi):
        return torch.tanh(xi @ W).sum()

    vf = torch.func.vmap(f)
    x64, w64 = x.double(), W.double()
    t = torch.tanh(x64 @ w64)
    exact = t.sum(-1)
    bound = (64 + 64 + 4) * 2.0 ** -24 * (((1 - t * t) * (x64.abs() @ w64.abs())).sum(-1) + t.abs().sum(-1))

    runners = {"direct batched (eager)": lambda v: torch.tanh(v @ W).sum(-1), "functorch vmap (eager)": vf}

    def compiled(name, make):
        start = time.perf_counter()
        run = make()
        run(x)
        print("%-44s compiles in %.2f s" % (name, time.perf_counter() - start), flush=True)
        runners[name] = run

    compiled("torch.compile(vmap(f))", lambda: torch.compile(vf))
    stance = getattr(torch.compiler, "set_stance", None)
    if stance is not None:
        guarded = runners["torch.compile(vmap(f))"]

        def unsafe(v):
            with stance("default", skip_guard_eval_unsafe=True):
                return guarded(v)
        runners["torch.compile, skip_guard_eval_unsafe"] = unsafe

    def traced():
        from torch.fx.experimental.proxy_tensor import make_fx
        graph = make_fx(vf, tracing_mode="fake", _allow_non_fake_inputs=True)(x)
        return torch._inductor.compile(graph, [x])
    compiled("make_fx + Inductor, no Dynamo (trace)", traced)

    aoti = getattr(torch._inductor, "aoti_compile_and_package", None)
    if aoti is not None:
        class M(torch.nn.Module):
            def forward(self, v):
                return vf(v)

        def package():
            batch = torch.export.Dim("batch", min=1, max=1 << 20)
            ep = torch.export.export(M(), (x,), dynamic_shapes={"v": {0: batch}})
            path = aoti(ep, package_path=tempfile.mkdtemp() + "/f.pt2")
            return torch._inductor.aoti_load_package(path)
        compiled("torch.export + AOTInductor package", package)

    for name, run in runners.items():
        got = run(x)
        got = got[0] if isinstance(got, (list, tuple)) else got
        if not bool(((got.double() - exact).abs() <= bound).all()):
            raise SystemExit("compile_runners: %s computes something else" % name)
    print("%-44s %10s  (batch %d)" % ("runner", "per call", args.batch))
    with torch.no_grad():
        for name, run in runners.items():
            for _ in range(50):
                run(x)
            rounds = []
            for _ in range(7):
                start = time.perf_counter()
                for _ in range(args.calls // 7):
                    run(x)
                rounds.append((time.perf_counter() - start) / (args.calls // 7))
            rounds.sort()
            print("%-44s %8.1f us" % (name, rounds[3] * 1e6), flush=True)


if __name__ == "__main__":
    main()
