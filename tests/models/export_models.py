"""Writes the trained-model fixtures kvmap's model tests load in C++ (test_models.cpp):

  potential.pt       a per-particle MLP potential (float32) saved with torch.jit.save;
  potential.pt2      the same model exported with a dynamic batch axis and compiled with
                     AOTInductor (torch.export + aoti_compile_and_package), where this torch
                     has them;
  potential_b64.pt2  the same, exported with a static batch of 64 (a program made for one
                     shape: kvmap's map_batches runs it with pad_to_chunk);
  reference.pt       positions (float64, [37, 3]) and the eager model's energies on them, and
                     200 more positions with theirs, as buffers of a scripted module (C++
                     reads them with torch::jit::load).

Usage: export_models.py OUTDIR
"""
import os
import sys
import time

import torch


class Potential(torch.nn.Module):
    """Energy of one particle from its 3 coordinates; written so that it also takes a batch."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(3, 16)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x))).sum(-1)


class Reference(torch.nn.Module):
    def __init__(self, positions, energies, positions200, energies200):
        super().__init__()
        self.register_buffer("positions", positions)
        self.register_buffer("energies", energies)
        self.register_buffer("positions200", positions200)
        self.register_buffer("energies200", energies200)

    def forward(self):
        return self.energies


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(2026)
    model = Potential().eval()
    positions = torch.randn(37, 3, dtype=torch.float64)
    positions200 = torch.randn(200, 3, dtype=torch.float64)
    with torch.no_grad():
        energies = model(positions.float())
        energies200 = model(positions200.float())
    torch.jit.save(torch.jit.script(model), os.path.join(outdir, "potential.pt"))
    torch.jit.save(torch.jit.script(Reference(positions, energies, positions200, energies200)),
                   os.path.join(outdir, "reference.pt"))

    aoti = getattr(getattr(torch, "_inductor", None), "aoti_compile_and_package", None)
    if aoti is None or not hasattr(torch, "export"):
        print("export_models: torch %s has no AOTInductor packaging; potential.pt2 not written"
              % torch.__version__)
    else:
        start = time.time()
        batch = torch.export.Dim("batch", min=1, max=1 << 24)
        exported = torch.export.export(model, (positions[:8].float(),), dynamic_shapes={"x": {0: batch}})
        aoti(exported, package_path=os.path.join(outdir, "potential.pt2"))
        print("export_models: potential.pt2 compiled in %.1f s" % (time.time() - start))
        start = time.time()
        exported = torch.export.export(model, (positions200[:64].float(),))  # a static batch of 64
        aoti(exported, package_path=os.path.join(outdir, "potential_b64.pt2"))
        print("export_models: potential_b64.pt2 compiled in %.1f s" % (time.time() - start))
    print("export_models: OK (%s)" % outdir)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
