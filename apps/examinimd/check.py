"""kvmap's ExaMiniMD tests: pair_style kvmap against ExaMiniMD's own lj/cut, a trained model's
energy conservation and finite differences, and the errors every rank must report.

    check.py models <dir> --exe-dir D --launcher L --python P
        lj.pt, bad.pt, training data from an ExaMiniMD Lennard-Jones run, nn.pt / nn64.pt
    check.py lj|nn|mp|mp_ghosts|mp_md|errors --np N --exe-dir D --launcher L --models <dir>

Each prints its figures and ends with "check: OK" (ctest's pass expression).
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile

# float32 against float64 forward and gradient of the radial model: the descriptor (a 3-term
# square, a root, a cosine, exponentials, a sum over up to 100 neighbours) and the MLP (16-,
# 48- and 48-term dot products, two tanh), about 250 roundings each way: 500 of float32's
# unit roundoff 2^-24, norm-wise.
NN_FLOAT32_TOLERANCE = 500 * 2.0 ** -24


def input_file(path, cells, pair, steps, newton="on", thermo=10):
    coeff = "pair_coeff 1 1 1.0 1.0 2.5"
    with open(path, "w") as f:
        f.write("""# 3-D Lennard-Jones melt (ExaMiniMD's in.lj, {cells}^3 cells)
units lj
atom_style atomic
newton {newton}
lattice fcc 0.8442
region box block 0 {cells} 0 {cells} 0 {cells}
create_box 1 box
create_atoms 1 box
mass 1 2.0
velocity all create 1.4 87287 loop geom
pair_style {pair}
{coeff}
neighbor 0.3 bin
neigh_modify delay 0 every 20 check no
fix 1 all nve
thermo {thermo}
run {steps}
""".format(cells=cells, newton=newton, pair=pair, coeff=coeff, steps=steps, thermo=thermo))
    return path


def run(args, cmd, expect_ok=True, np=None):
    full = [args.launcher, "-n", str(np or args.np)] + cmd
    print("check: $ " + " ".join(full), flush=True)
    p = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1200)
    if expect_ok and p.returncode != 0:
        sys.exit("check: FAILED (exit %d)\n%s\n%s" % (p.returncode, p.stdout[-4000:], p.stderr[-4000:]))
    return p


def thermo(stdout):
    """ExaMiniMD's thermo lines: step, temperature, PE, ETot as printed (6 decimals)."""
    lines = []
    for line in stdout.splitlines():
        f = line.split()
        if len(f) == 6 and re.fullmatch(r"\d+", f[0]) and re.fullmatch(r"-?\d+\.\d{6}", f[2]):
            lines.append(tuple(f[:4]))
    return lines


def energies(stdout):
    """kvmap-energy lines of examinimd-kvmap --kvmap-run: {when: (PE, KE, ETot)} per atom."""
    out = {}
    for m in re.finditer(r"kvmap-energy: (\w+) PE (\S+) KE (\S+) ETot (\S+)", stdout):
        out[m.group(1)] = tuple(float(m.group(i)) for i in (2, 3, 4))
    return out


def exe(args, name):
    return os.path.join(args.exe_dir, name)


def check_lj(args, work):
    lj = os.path.join(args.models, "lj.pt")
    kvmap_pair = "kvmap %s 2.5" % lj
    # 1. Per-atom forces and the total energy on one configuration (after 100 steps of native
    #    melting), native lj/cut and the model through kvmap on the same neighbour list.
    native = input_file(os.path.join(work, "native.in"), 10, "lj/cut 2.5", 100)
    p = run(args, [exe(args, "examinimd-kvmap"), "-il", native, "--kvmap-compare", lj, "2.5",
                   "--kvmap-tolerance", "1e-12"])
    line = re.search(r"kvmap-compare: .*", p.stdout).group(0)
    print(line)
    if "PASS" not in line:
        sys.exit("check: FAILED: forces or energy differ from lj/cut")
    # 2. 100 steps both ways (ExaMiniMD's own executable): identical thermo lines.
    kvmap_in = input_file(os.path.join(work, "kvmap.in"), 10, kvmap_pair, 100)
    a = thermo(run(args, [exe(args, "ExaMiniMD"), "-il", native]).stdout)
    b = thermo(run(args, [exe(args, "ExaMiniMD"), "-il", kvmap_in]).stdout)
    print("check: thermo, lj/cut: " + " | ".join(" ".join(t) for t in a))
    print("check: thermo, kvmap:  " + " | ".join(" ".join(t) for t in b))
    if not a or a != b:
        sys.exit("check: FAILED: the thermo lines differ")
    # 3. The total energy at full precision after the 100 steps.
    ea = energies(run(args, [exe(args, "examinimd-kvmap"), "-il", native, "--kvmap-run"]).stdout)
    eb = energies(run(args, [exe(args, "examinimd-kvmap"), "-il", kvmap_in, "--kvmap-run"]).stdout)
    rel = abs(eb["final"][2] - ea["final"][2]) / abs(ea["final"][2])
    print("check: ETot per atom after 100 steps: lj/cut %.17g, kvmap %.17g: relative difference "
          "%.3e (limit 1e-10); initial %.17g" % (ea["final"][2], eb["final"][2], rel, ea["initial"][2]))
    if rel > 1e-10:
        sys.exit("check: FAILED: total energies differ")


def conserves_energy(args, work, model, what):
    """1,000 steps of `model` (864 atoms, dt 0.005): the total energy's drift per atom is
    reported and must stay under 1e-3 (a model whose forces were not its energy's gradient
    would drift)."""
    run_in = input_file(os.path.join(work, "md.in"), 6, "kvmap %s 2.5" % model, 1000, thermo=100)
    p = run(args, [exe(args, "examinimd-kvmap"), "-il", run_in, "--kvmap-run"])
    e = energies(p.stdout)
    drift = e["final"][2] - e["initial"][2]
    lines = thermo(p.stdout)
    spread = max(float(t[3]) for t in lines) - min(float(t[3]) for t in lines)
    print("check: %s, 864 atoms, %d ranks, 1000 steps (dt 0.005): ETot per atom %.9f -> %.9f, "
          "drift %.3e per atom, largest excursion %.3e"
          % (what, args.np, e["initial"][2], e["final"][2], drift, spread))
    print(re.search(r"kvmap-timings: .*", p.stdout).group(0))
    if abs(drift) > 1e-3:
        sys.exit("check: FAILED: the %s does not conserve its energy" % what)


def matches_central_differences(args, work, model64):
    """The forces of `model64` (float64) against central differences of its total energy,
    after 50 steps of a melt, on 6 atoms x 3 axes. Returns the input file. With h = 1e-5 the
    truncation error, h^2/6 times the third derivative, is about 3e-9 of max|F| for these models
    (at h = 1e-4 it was 2.7e-7 for the trained one, a hundred times more), and the rounding of
    the total energy (about 1e-13 over the energies one move changes) adds 1e-13 / (2h) = 5e-9."""
    fd_in = input_file(os.path.join(work, "fd.in"), 6, "kvmap %s 2.5" % model64, 50)
    p = run(args, [exe(args, "examinimd-kvmap"), "-il", fd_in, "--kvmap-fd", "1e-5", "6",
                   "--kvmap-tolerance", "1e-7"])
    line = re.search(r"kvmap-fd: .*", p.stdout).group(0)
    print(line)
    if "PASS" not in line:
        sys.exit("check: FAILED: forces are not the gradient of the energy")
    return fd_in


def check_nn(args, work):
    """The trained model's 1,000 steps conserve its energy, then check_nn_forces."""
    conserves_energy(args, work, os.path.join(args.models, "nn.pt"), "radial model")
    check_nn_forces(args, work)


def check_nn_forces(args, work):
    """The trained model's forces are its energy's gradient (the float64 copy against central
    differences), and float32 agrees with float64 within float32's rounding: the numerics
    without the 1,000 steps (the forced-kernels runs' check)."""
    nn, nn64 = os.path.join(args.models, "nn.pt"), os.path.join(args.models, "nn64.pt")
    fd_in = matches_central_differences(args, work, nn64)
    # The float32 model against its float64 copy: within float32's rounding.
    p = run(args, [exe(args, "examinimd-kvmap"), "-il", fd_in, "--kvmap-compare", nn, "2.5",
                   "--kvmap-tolerance", repr(NN_FLOAT32_TOLERANCE)])
    line = re.search(r"kvmap-compare: .*", p.stdout).group(0)
    print(line)
    if "PASS" not in line:
        sys.exit("check: FAILED: float32 and float64 differ beyond float32's rounding")


def read_forces(path):
    """examinimd-kvmap --kvmap-forces' file: ({starting site: (fx, fy, fz)}, total energy)."""
    with open(path) as f:
        header = f.readline()
        forces = {tuple(int(v) for v in w[:3]): tuple(float(v) for v in w[3:])
                  for w in (line.split() for line in f)}
    return forces, float(header.rsplit(" ", 1)[1])


# The message-passing model's float64 forces on one configuration at two decompositions
# differ by rounding only: the neighbours of an atom come in another order, the ghost rows'
# gradients reach their owners in another order, and the forces on ghosts are added to their
# owners in another order. Per force component, about 3,000 roundings: the radial basis and
# layer 1 (8 and 16 terms), each of about 80 neighbours' messages (16 features), the output
# MLP (32 and 32 terms), the same again in the backward pass, then the sums over neighbours
# and images: 3,000 unit roundoffs 2^-53 of max|F|. The total energy sums 864 per-atom energies
# in another order on top: 4,000 unit roundoffs of |E|.
MP_FORCE_BOUND = 3000 * 2.0 ** -53
MP_ENERGY_BOUND = 4000 * 2.0 ** -53


def check_mp(args, work):
    mp64 = os.path.join(args.models, "mp64.pt")
    # Decomposition invariance: the same configuration (a jiggled lattice, the same at every
    # rank count) at 1 rank and at N.
    # At N ranks also in chunks (layer by layer through the model's `stage`, split at the
    # exchanges, two chunks in flight): chunks of 50 atoms, several per rank at every N.
    files = {}
    for key, np, options in ((1, 1, ""), (args.np, args.np, ""),
                             ("chunks", args.np, " chunk 50 concurrency 2")):
        cfg = input_file(os.path.join(work, "mp64-%s.in" % key), 6, "kvmap %s 2.5%s" % (mp64, options), 0)
        files[key] = os.path.join(work, "forces-%s.txt" % key)
        p = run(args, [exe(args, "examinimd-kvmap"), "-il", cfg, "--kvmap-jiggle", "0.08",
                       "--kvmap-forces", files[key]], np=np)
        print(re.search(r"kvmap-forces: .*", p.stdout).group(0))
        if key == "chunks" and "message passing in chunks" not in p.stdout:
            sys.exit("check: FAILED: ExaMiniMD did not run the model in chunks\n" + p.stdout[-3000:])
    f1, e1 = read_forces(files[1])
    fn, en = read_forces(files[args.np])
    compare_forces("%d ranks against 1" % args.np, f1, e1, fn, en)
    fc, ec = read_forces(files["chunks"])
    compare_forces("%d ranks in chunks of 50 (2 in flight) against 1 rank" % args.np, f1, e1, fc, ec)
    # Its forces are the gradient of its energy (through both layers and the exchange, in both
    # directions): central differences at N ranks.
    matches_central_differences(args, work, mp64)


def compare_forces(what, f1, e1, fn, en):
    """Two force files of one configuration, equal within the message-passing model's rounding
    bounds (per component, of max|F|; the total energy, of |E|)."""
    if sorted(f1) != sorted(fn):
        sys.exit("check: FAILED: %s: the atoms differ" % what)
    scale = max(abs(v) for f in f1.values() for v in f)
    diff = max(abs(a - b) for i in f1 for a, b in zip(f1[i], fn[i]))
    de = abs(en - e1) / abs(e1)
    print("check: message-passing model (float64), %d atoms, %s: max|dF| / max|F| = %.3e (max|F| %.4g; "
          "bound %.2e, ratio %.3f), |dE| / |E| = %.3e (bound %.2e)"
          % (len(f1), what, diff / scale, scale, MP_FORCE_BOUND, diff / scale / MP_FORCE_BOUND, de,
             MP_ENERGY_BOUND))
    if diff > MP_FORCE_BOUND * scale or de > MP_ENERGY_BOUND:
        sys.exit("check: FAILED: %s: the forces or the energy differ beyond rounding" % what)


def check_mp_ghosts(args, work):
    # The same model and configuration in ghosts mode (a ghost shell of 2 cutoffs + skin, layer 1
    # recomputed on the ghosts, no exchange) and in exchange mode, at N ranks: 10^3 cells (4,000
    # atoms), so that every rank's subdomain at 1-4 ranks is deeper than the 5.3-deep shell.
    mp64 = os.path.join(args.models, "mp64.pt")
    files = {}
    for mode, option in (("exchange", ""), ("ghosts", " ghosts 2")):
        cfg = input_file(os.path.join(work, "mp64-%s.in" % mode), 10, "kvmap %s 2.5%s" % (mp64, option), 0)
        files[mode] = os.path.join(work, "forces-%s.txt" % mode)
        p = run(args, [exe(args, "examinimd-kvmap"), "-il", cfg, "--kvmap-jiggle", "0.08",
                       "--kvmap-forces", files[mode]])
        print(re.search(r"kvmap-forces: .*", p.stdout).group(0))
        if mode == "ghosts" and "ghosts mode" not in p.stdout:
            sys.exit("check: FAILED: ExaMiniMD did not run pair_style kvmap in ghosts mode\n" + p.stdout[-3000:])
    fe, ee = read_forces(files["exchange"])
    fg, eg = read_forces(files["ghosts"])
    compare_forces("ghosts mode against exchange mode at %d ranks" % args.np, fe, ee, fg, eg)


def check_mp_md(args, work):
    # The float32 model, the ghost plan remade at each neighbour-list rebuild.
    conserves_energy(args, work, os.path.join(args.models, "mp.pt"), "message-passing model (float32)")


def check_errors(args, work):
    lj = os.path.join(args.models, "lj.pt")
    cases = [
        ("a missing model file", "kvmap %s 2.5" % os.path.join(work, "missing.pt"), "on",
         "cannot load the TorchScript model"),
        ("a model whose output is not per atom", "kvmap %s 2.5" % os.path.join(args.models, "bad.pt"),
         "on", "one energy per atom"),
        ("more neighbours than a cap", "kvmap %s 2.5 max_neighbors 10" % lj, "on",
         "more than max_neighbors 10"),
        ("newton off", "kvmap %s 2.5" % lj, "off", "needs `newton on`"),
        ("a message-passing model in chunks without a stage method",
         "kvmap %s 2.5 chunk 64" % os.path.join(args.models, "mp-nostage.pt"), "on",
         "the model needs an int attribute `layers` and a method"),
        ("a message-passing model in direct mode", "kvmap %s 2.5 mode direct" % os.path.join(args.models, "mp.pt"),
         "on", "`mode direct` applies to per-atom models only"),
        ("a model calling the ghost exchange without a plan",
         "kvmap %s 2.5" % os.path.join(args.models, "mp-noplan.pt"), "on",
         "no GhostExchange plan has handle 987654321"),
        ("ghosts mode for a per-atom model", "kvmap %s 2.5 ghosts 2" % lj, "on",
         "is for message-passing models"),
        ("a ghost shell thinner than the model's layers",
         "kvmap %s 2.5 ghosts 1" % os.path.join(args.models, "mp.pt"), "on", "ghost shell too thin"),
    ]
    if args.np > 1:  # 4^3 cells, 6.7 wide: split, a subdomain is thinner than a 5.3-deep shell
        cases.append(("a ghost shell deeper than a subdomain",
                      "kvmap %s 2.5 ghosts 2" % os.path.join(args.models, "mp.pt"), "on",
                      "is deeper than a rank's subdomain"))
    for what, pair, newton, text in cases:
        path = input_file(os.path.join(work, "error.in"), 4, pair, 10, newton=newton)
        p = run(args, [exe(args, "ExaMiniMD"), "-il", path], expect_ok=False)
        # Each rank's message, to the next rank's (a TorchScript error spans several lines).
        ranks = sorted(int(r) for r in re.findall(r"pair_style kvmap \(rank (\d+)\): (?:(?!pair_style kvmap \(rank).)*?"
                                                   + re.escape(text), p.stderr, re.DOTALL))
        print("check: %s: exit %d, message on ranks %s" % (what, p.returncode, ranks))
        if p.returncode == 0 or ranks != list(range(args.np)):
            sys.exit("check: FAILED: %s: expected a failure with %r on every rank\n%s" % (what, text, p.stderr[-3000:]))


def models_key(args, here):
    """What the models are made from: models.py, this script, the ExaMiniMD program that
    writes the training data, and the Python and torch that train them."""
    h = hashlib.sha256()
    for path in (os.path.join(here, "models.py"), os.path.abspath(__file__), exe(args, "examinimd-kvmap")):
        with open(path, "rb") as f:
            h.update(f.read())
    torch = subprocess.run([args.python, "-c", "import sys, torch; print(sys.version, torch.__version__)"],
                           check=True, stdout=subprocess.PIPE, text=True).stdout
    h.update((os.path.realpath(args.python) + torch).encode())
    return h.hexdigest()


def make_models(args):
    os.makedirs(args.dir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    # Made once per build tree: again only when one of their inputs changed.
    key, stamp = models_key(args, here), os.path.join(args.dir, "made-from.sha256")
    if os.path.exists(stamp) and open(stamp).read() == key:
        print("check: the models in %s are up to date (made from the same inputs, %s)" % (args.dir, key[:12]))
        return
    if os.path.exists(stamp):
        os.remove(stamp)
    models = [args.python, os.path.join(here, "models.py")]
    lj = os.path.join(args.dir, "lj.pt")
    subprocess.run(models + ["lj", lj], check=True)
    subprocess.run(models + ["bad", os.path.join(args.dir, "bad.pt")], check=True)
    # Training data: ExaMiniMD's Lennard-Jones melt (the model above through kvmap), 8x8x8
    # cells, the environments of every 40th step of 400, hot enough to sample the repulsion.
    data = os.path.join(args.dir, "lj-melt")
    with tempfile.TemporaryDirectory() as work:
        path = input_file(os.path.join(work, "train.in"), 8, "kvmap %s 2.5" % lj, 400, thermo=100)
        run(args, [exe(args, "examinimd-kvmap"), "-il", path, "--kvmap-dump", data, "40"])
    subprocess.run(models + ["train", data, os.path.join(args.dir, "nn")], check=True)
    subprocess.run(models + ["mp", os.path.join(args.dir, "mp")], check=True)
    with open(stamp, "w") as f:
        f.write(key)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["models", "lj", "nn", "nn_forces", "mp", "mp_ghosts", "mp_md", "errors"])
    parser.add_argument("dir", nargs="?")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--exe-dir", required=True)
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--models")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    if args.what == "models":
        make_models(args)
    else:
        with tempfile.TemporaryDirectory() as work:
            {"lj": check_lj, "nn": check_nn, "nn_forces": check_nn_forces, "mp": check_mp, "mp_ghosts": check_mp_ghosts,
             "mp_md": check_mp_md, "errors": check_errors}[args.what](args, work)
    print("check: OK")


if __name__ == "__main__":
    main()
