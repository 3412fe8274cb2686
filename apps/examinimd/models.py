"""The TorchScript models `pair_style kvmap` runs in kvmap's ExaMiniMD tests and benchmarks.

    python3 models.py lj <out.pt> [--epsilon E] [--sigma S] [--cutoff C]
        Lennard-Jones as a model: per-atom energy 1/2 sum_j (phi(r_ij) - phi(cutoff)) over the
        full neighbour list, phi = 4 eps ((sigma/r)^12 - (sigma/r)^6), for r < cutoff (shifted
        to zero at the cutoff, as ExaMiniMD's lj/cut energy), in float64. Reproduces lj/cut up
        to rounding.
    python3 models.py mp <out prefix> [--cutoff C] [--seed S]
        A message-passing potential across ranks: Lennard-Jones plus two message-passing
        layers with fixed random weights (a radial descriptor of each atom's own environment,
        then messages from its neighbours' features of that layer, whose ghost rows come
        through torch.ops.kvmap.ghost_exchange). Writes <out prefix>.pt (float32) and
        <out prefix>64.pt (float64); for the error tests <out prefix>-noplan.pt, a per-atom
        model that calls the operator with a handle of no plan, and <out prefix>-nostage.pt,
        the model without its `stage` method (which pair_style kvmap's chunks need). Needs
        kvmap's Python package (its import registers the operator).
    python3 models.py bad <out.pt>
        A model whose output is per neighbour pair, not per atom (for the error tests).
    python3 models.py train <data prefix> <out prefix> [--cutoff C] [--steps N] [--seed S]
        A neural-network potential (a radial descriptor and a small MLP, a few thousand
        parameters) trained on the environments, per-atom energies and energy gradients that
        examinimd-kvmap --kvmap-dump wrote from ExaMiniMD's own Lennard-Jones runs (files
        <data prefix>.<rank>.<k>.pt). Writes <out prefix>.pt (float32, the model that runs),
        <out prefix>64.pt (the same parameters in float64, for finite-difference checks) and,
        where torch.export can trace it (torch >= 2.6), <out prefix>.pt2, an AOTInductor
        package of a forward returning energies and forces.

Every model maps (d: [atoms, width, 3] displacements to the neighbours, mask: [atoms, width]
bool) to [atoms] energies; padded neighbours have mask False. A message-passing model (one
with a `message_passing` attribute) also takes (neighbors: [atoms, width] int64, each
neighbour's row among the rank's atoms then its ghosts; ghosts: int, the ghost rows; plan: int,
the handle of the kvmap.GhostExchange over those rows); to run in chunks it has a `layers`
attribute and a method stage(k, d, mask, neighbors, rows, index) computing layer k + 1 on a
chunk of atoms from layer k's features of every row (docs/models.md).
"""
import argparse
import glob
import math
import os
import sys
import time

import torch


class LennardJones(torch.nn.Module):
    def __init__(self, epsilon=1.0, sigma=1.0, cutoff=2.5):
        super().__init__()
        f64 = dict(dtype=torch.float64)
        self.register_buffer("epsilon", torch.tensor(epsilon, **f64))
        self.register_buffer("sigma", torch.tensor(sigma, **f64))
        self.register_buffer("cutoff", torch.tensor(cutoff, **f64))

    def phi(self, rsq):
        r2inv = 1.0 / rsq
        s6 = self.sigma ** 6 * r2inv * r2inv * r2inv
        return 4.0 * self.epsilon * (s6 * s6 - s6)

    def forward(self, d, mask):
        rsq = (d * d).sum(-1)
        cutsq = self.cutoff * self.cutoff
        inside = mask & (rsq < cutsq)
        phi = self.phi(torch.where(inside, rsq, torch.ones_like(rsq))) - self.phi(cutsq)
        return 0.5 * torch.where(inside, phi, torch.zeros_like(phi)).sum(-1)


class RadialPotential(torch.nn.Module):
    """E_i = scale * MLP(G_i) + shift, G_ik = sum_j exp(-eta (r_ij - mu_k)^2) fc(r_ij), with a
    cosine cutoff fc that takes energies and forces smoothly to zero at the cutoff."""

    def __init__(self, cutoff=2.5, basis=16, hidden=48):
        super().__init__()
        self.register_buffer("cutoff", torch.tensor(cutoff))
        self.register_buffer("centers", torch.linspace(0.8, cutoff, basis))
        self.register_buffer("eta", torch.tensor((basis / (cutoff - 0.8)) ** 2))
        self.register_buffer("scale", torch.tensor(1.0))
        self.register_buffer("shift", torch.tensor(0.0))
        self.mlp = torch.nn.Sequential(torch.nn.Linear(basis, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 1))

    def descriptor(self, d, mask):
        rsq = (d * d).sum(-1)
        inside = mask & (rsq < self.cutoff * self.cutoff)
        r = torch.sqrt(torch.where(inside, rsq, self.cutoff * self.cutoff))
        fc = torch.where(inside, 0.5 * (torch.cos(math.pi * r / self.cutoff) + 1.0), torch.zeros_like(r))
        basis = torch.exp(-self.eta * (r.unsqueeze(-1) - self.centers) ** 2) * fc.unsqueeze(-1)
        return basis.sum(-2)

    def forward(self, d, mask):
        return self.mlp(self.descriptor(d, mask)).squeeze(-1) * self.scale + self.shift


class MessagePassing(torch.nn.Module):
    """E_i = LJ_i + scale * out([h_i, m_i]): h_i = tanh(W1 G_i) from atom i's own radial
    descriptor G_i (layer 1), m_i = sum_j (W2 b_ij) * h_j over its neighbours j (layer 2: the
    features of layer 1 of atoms that may live on other ranks, brought by the ghost exchange;
    b_ij the radial basis of r_ij, zero at and beyond the cutoff and for padding, so messages
    fade smoothly). The Lennard-Jones part keeps atoms apart in molecular dynamics; the
    message-passing part, fixed random weights scaled to about a tenth of the Lennard-Jones
    energy per atom, is what needs the neighbours' features.

    Called with a plan (exchange mode), the rows are the rank's atoms and the ghosts' layer-1
    features come from their owners. Called with plan -1 (pair_style kvmap's `ghosts 2`), the
    rows are the atoms then the ghosts of a shell two cutoffs deep: layer 1 is computed on
    every row, layer 2 on the atoms, and the same energies come out without an exchange."""

    message_passing: bool
    layers: int  # the receptive field, in cutoffs: ghosts mode needs `ghosts 2` or more

    def __init__(self, cutoff=2.5, basis=8, features=16, hidden=32):
        super().__init__()
        self.message_passing = True
        self.layers = 2
        self.lj = LennardJones(cutoff=cutoff)
        self.register_buffer("cutoff", torch.tensor(cutoff, dtype=torch.float64))
        self.register_buffer("centers", torch.linspace(0.8, cutoff, basis))
        self.register_buffer("eta", torch.tensor((basis / (cutoff - 0.8)) ** 2))
        self.register_buffer("scale", torch.tensor(0.5))
        self.embed = torch.nn.Linear(basis, features)
        self.filter = torch.nn.Linear(basis, features, bias=False)
        self.out = torch.nn.Sequential(torch.nn.Linear(2 * features, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 1))

    def basis(self, d, mask):
        rsq = (d * d).sum(-1)
        cutsq = self.cutoff * self.cutoff
        inside = mask & (rsq < cutsq)
        r = torch.sqrt(torch.where(inside, rsq, cutsq.to(rsq.dtype)))
        fc = torch.where(inside, 0.5 * (torch.cos(math.pi * r / self.cutoff.to(r.dtype)) + 1.0),
                         torch.zeros_like(r))
        return torch.exp(-self.eta * (r.unsqueeze(-1) - self.centers) ** 2) * fc.unsqueeze(-1)

    def layer1(self, b):
        return torch.tanh(self.embed(b.sum(1)))                  # [rows, features]

    def layer2(self, d, mask, b, h, rows, neighbors):
        m = (self.filter(b) * rows[neighbors]).sum(1)            # messages from the neighbours
        e = self.out(torch.cat([h, m], -1)).squeeze(-1)
        return self.lj(d, mask).to(e.dtype) + self.scale * e

    def forward(self, d, mask, neighbors, ghosts: int, plan: int):
        b = self.basis(d, mask)                                  # [rows, width, basis]
        h = self.layer1(b)                                       # layer 1
        if plan >= 0:
            rows = torch.cat([h, h.new_zeros([ghosts, h.shape[1]])])  # the ghost rows to fill
            rows = torch.ops.kvmap.ghost_exchange(rows, plan)         # ... from their owners
        else:  # ghosts mode: layer 1 was computed on the ghosts too; layer 2 on the atoms
            rows = h
            atoms = d.shape[0] - ghosts
            d, mask, neighbors = d[:atoms], mask[:atoms], neighbors[:atoms]
            b, h = b[:atoms], h[:atoms]
        return self.layer2(d, mask, b, h, rows, neighbors)      # layer 2

    @torch.jit.export
    def stage(self, k: int, d, mask, neighbors, rows, index):
        """Layer k + 1 on a chunk of the rank's atoms (pair_style kvmap with `chunk` or
        `concurrency`): d, mask, neighbors are the chunk's, index its atoms' rows; rows holds
        layer k's features of every row (the rank's atoms, then its ghosts, filled by the
        exchange), empty for k = 0. Returns the chunk's features (k = 0) or energies (k = 1)."""
        b = self.basis(d, mask)
        if k == 0:
            return self.layer1(b)
        return self.layer2(d, mask, b, rows.index_select(0, index), rows, neighbors)


class Unstaged(torch.nn.Module):
    """A message-passing model without a `stage` method (for the error tests): it runs whole,
    not in chunks."""

    message_passing: bool
    layers: int

    def __init__(self, model):
        super().__init__()
        self.message_passing = True
        self.layers = model.layers
        self.model = model

    def forward(self, d, mask, neighbors, ghosts: int, plan: int):
        return self.model(d, mask, neighbors, ghosts, plan)


class NoPlan(torch.nn.Module):
    """A per-atom model that calls the ghost exchange with a handle of no plan (for the error
    tests): pair_style kvmap gives a plan only to message-passing models."""

    def forward(self, d, mask):
        rows = torch.ops.kvmap.ghost_exchange((d * d).sum(-1), 987654321)
        return rows.sum(-1)


class PairEnergies(torch.nn.Module):
    """A model with the wrong output for pair_style kvmap: one value per neighbour pair."""

    def forward(self, d, mask):
        return (d * d).sum(-1) * mask.to(d.dtype)


class EnergyAndForces(torch.nn.Module):
    """For AOTInductor: energies and their gradients with respect to the displacements."""

    def __init__(self, potential):
        super().__init__()
        self.potential = potential

    def forward(self, d, mask):
        d = d.detach().requires_grad_(True)
        with torch.enable_grad():
            e = self.potential(d, mask)
            (g,) = torch.autograd.grad(e.sum(), d)
        return e.detach(), g


def write_lj(args):
    model = torch.jit.script(LennardJones(args.epsilon, args.sigma, args.cutoff))
    model.save(args.out)
    print("models: wrote %s (Lennard-Jones, eps %g, sigma %g, cutoff %g, float64)"
          % (args.out, args.epsilon, args.sigma, args.cutoff))


def write_bad(args):
    torch.jit.script(PairEnergies()).save(args.out)
    print("models: wrote %s (per-pair output, [atoms, width]: not a per-atom model)" % args.out)


def write_mp(args):
    import kvmap  # noqa: F401  (registers torch.ops.kvmap.ghost_exchange for scripting)

    torch.manual_seed(args.seed)
    model = MessagePassing(args.cutoff).eval()
    torch.jit.script(model).save(args.out + ".pt")
    double = MessagePassing(args.cutoff).double()
    double.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    torch.jit.script(double.eval()).save(args.out + "64.pt")
    torch.jit.script(NoPlan()).save(args.out + "-noplan.pt")
    torch.jit.script(Unstaged(model)).save(args.out + "-nostage.pt")
    parameters = sum(p.numel() for p in model.parameters())
    print("models: wrote %s.pt (float32) and %s64.pt (float64): Lennard-Jones plus two "
          "message-passing layers, %d fixed random parameters (seed %d)"
          % (args.out, args.out, parameters, args.seed))


def load_dumps(prefix):
    files = sorted(glob.glob(prefix + ".*.pt"))
    if not files:
        sys.exit("models: no training data %s.*.pt (examinimd-kvmap --kvmap-dump writes it)" % prefix)
    parts = [torch.jit.load(f) for f in files]
    width = max(p.env.shape[1] for p in parts)

    def pad(t, value):
        extra = width - t.shape[1]
        if extra == 0:
            return t
        shape = list(t.shape)
        shape[1] = extra
        return torch.cat([t, torch.full(shape, value, dtype=t.dtype)], 1)

    env = torch.cat([pad(p.env, 0.0) for p in parts])
    mask = torch.cat([pad(p.mask, False) for p in parts])
    energies = torch.cat([p.energies for p in parts])
    gradients = torch.cat([pad(p.gradients, 0.0) for p in parts])
    return files, env, mask, energies, gradients


def train(args):
    torch.manual_seed(args.seed)
    files, env, mask, energies, gradients = load_dumps(args.data)
    env[~mask] = torch.tensor([2 * args.cutoff + 1, 0.0, 0.0], dtype=env.dtype)
    n = env.shape[0]
    order = torch.randperm(n)
    held_out, fit = order[: n // 10], order[n // 10:]
    model = RadialPotential(args.cutoff)
    model.shift.fill_(float(energies.mean()))
    model.scale.fill_(float(energies.std()))
    env32, e32, g32 = env.float(), energies.float(), gradients.float()
    g_scale = float(g32[mask].std())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.steps)

    def losses(index, create_graph):
        d = env32[index].requires_grad_(True)
        e = model(d, mask[index])
        (g,) = torch.autograd.grad(e.sum(), d, create_graph=create_graph)
        le = ((e - e32[index]) / model.scale).pow(2).mean()
        lg = ((g - g32[index])[mask[index]] / g_scale).pow(2).mean()
        return le, lg

    start = time.time()
    for step in range(args.steps):
        batch = fit[torch.randint(len(fit), (args.batch,))]
        le, lg = losses(batch, True)
        loss = le + lg
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % max(1, args.steps // 5) == 0 or step == args.steps - 1:
            print("models: step %d: energy loss %.3e, gradient loss %.3e" % (step, float(le), float(lg)))
    le, lg = losses(held_out[:4096], False)
    rms_e = math.sqrt(float(le)) * float(model.scale)
    rms_g = math.sqrt(float(lg)) * g_scale
    parameters = sum(p.numel() for p in model.parameters())
    print("models: trained %d parameters on %d environments from %d files in %.0f s; held out: "
          "energy RMS error %.4f (of std %.4f), gradient RMS error %.4f (of std %.4f)"
          % (parameters, len(fit), len(files), time.time() - start, rms_e, float(energies.std()),
             rms_g, g_scale))
    model.eval()
    torch.jit.script(model).save(args.out + ".pt")
    double = RadialPotential(args.cutoff).double()
    double.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    torch.jit.script(double.eval()).save(args.out + "64.pt")
    print("models: wrote %s.pt (float32) and %s64.pt (float64)" % (args.out, args.out))
    export_aoti(model, env32[:64], mask[:64], args.out + ".pt2")


def export_aoti(model, d, mask, path):
    inductor = getattr(torch, "_inductor", None)
    if not hasattr(torch, "export") or inductor is None or not hasattr(inductor, "aoti_compile_and_package"):
        print("models: no AOTInductor package: torch %s has no torch._inductor.aoti_compile_and_package"
              % torch.__version__)
        return
    try:
        batch = torch.export.Dim("atoms", min=1)
        exported = torch.export.export(EnergyAndForces(model), (d, mask),
                                       dynamic_shapes={"d": {0: batch}, "mask": {0: batch}})
        inductor.aoti_compile_and_package(exported, package_path=path)
        print("models: wrote %s (AOTInductor: energies and forces)" % path)
    except Exception as e:  # reported, not fatal: the TorchScript model is what runs
        print("models: no AOTInductor package: torch.export could not trace the forward with its "
              "gradient: %s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    lj = sub.add_parser("lj")
    lj.add_argument("out")
    lj.add_argument("--epsilon", type=float, default=1.0)
    lj.add_argument("--sigma", type=float, default=1.0)
    lj.add_argument("--cutoff", type=float, default=2.5)
    bad = sub.add_parser("bad")
    bad.add_argument("out")
    nn = sub.add_parser("train")
    nn.add_argument("data")
    nn.add_argument("out")
    nn.add_argument("--cutoff", type=float, default=2.5)
    nn.add_argument("--steps", type=int, default=1500)
    nn.add_argument("--batch", type=int, default=256)
    nn.add_argument("--seed", type=int, default=0)
    mp = sub.add_parser("mp")
    mp.add_argument("out")
    mp.add_argument("--cutoff", type=float, default=2.5)
    mp.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.what == "lj":
        write_lj(args)
    elif args.what == "mp":
        write_mp(args)
    elif args.what == "bad":
        write_bad(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
