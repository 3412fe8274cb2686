"""Writes the compiled programs of kvmap-perf's "compiled" scenario (the C++ side of
perf/heat_vs_kvmap.py's compiled contenders):

  tanh_sum.pt2       f(x) = tanh(x @ W).sum(-1) on a float32 batch [N, 64] (Heat's vmap
                     comparison, written for the batch), exported with a dynamic batch axis
                     (torch.export) and compiled by AOTInductor (aoti_compile_and_package);
  tanh_sum_b256.pt2  the same for a static batch of 256 (kvmap::map_batches runs it with
                     pad_to_chunk);
  tanh_sum_w.pt      W, a buffer of a scripted module (kvmap-perf reads it with torch::jit::load
                     for its float64 reference and the eager contenders).

Usage: export_compiled.py OUTDIR     then   mpirun -np N kvmap-perf --scenario compiled --compiled OUTDIR
Needs torch >= 2.6 (AOTInductor packages) and a C++ compiler.
"""
import os
import sys
import time

import torch


class TanhSum(torch.nn.Module):
    def __init__(self, W):
        super().__init__()
        self.register_buffer("W", W)

    def forward(self, x):
        return torch.tanh(x @ self.W).sum(-1)


def main(outdir):
    aoti = getattr(getattr(torch, "_inductor", None), "aoti_compile_and_package", None)
    if aoti is None or not hasattr(torch, "export"):
        sys.exit("export_compiled: torch %s has no AOTInductor packaging (torch >= 2.6)" % torch.__version__)
    os.makedirs(outdir, exist_ok=True)
    W = torch.randn(64, 64, generator=torch.Generator().manual_seed(2026))
    model = TanhSum(W).eval()
    torch.jit.save(torch.jit.script(model), os.path.join(outdir, "tanh_sum_w.pt"))
    example = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    for name, dynamic in (("tanh_sum.pt2", {"x": {0: torch.export.Dim("batch", min=1, max=1 << 24)}}),
                          ("tanh_sum_b256.pt2", None)):
        start = time.time()
        exported = torch.export.export(model, (example,), dynamic_shapes=dynamic)
        aoti(exported, package_path=os.path.join(outdir, name))
        print("export_compiled: %s compiled in %.1f s" % (name, time.time() - start), flush=True)
    print("export_compiled: OK (%s)" % outdir)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
