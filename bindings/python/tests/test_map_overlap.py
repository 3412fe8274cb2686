"""kvmap.map_overlap and DistView.halo / get_halo under mpirun, against the gathered array
padded with numpy.pad and the function applied to each rank's window of it."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import kvmap

P = MPI.COMM_WORLD.size
ME = MPI.COMM_WORLD.rank

MODES = {"periodic": "wrap", "reflect": "symmetric", "nearest": "edge"}
BOUNDARIES = ["none", "periodic", "reflect", "nearest", 2.5]


def everywhere(ok):
    """True on every rank if ``ok`` holds on every rank."""
    return MPI.COMM_WORLD.allreduce(bool(ok), op=MPI.LAND)


# Per-rank counts along the split axis: balanced, uneven with an empty rank, and shards shorter
# than the depth (1 row each, the last rank 3).
def layouts(n_balanced=11):
    uneven = [(3 * r + 2) % 5 for r in range(P)]  # rank 1 holds nothing (from 2 ranks on)
    short = [1] * (P - 1) + [3]
    return {"balanced": None, "uneven": uneven, "short": short, "n": n_balanced}


def make(counts, split, m=3, dtype=torch.float64, seed=0):
    """A DistView with ``counts`` rows per rank along ``split`` (None: balanced, 11 rows), and
    its global array (on every rank)."""
    n = 11 if counts is None else sum(counts)
    shape = [m, m]
    shape.insert(split if split >= 0 else 2 + split + 1, n)
    full = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    axis = split % full.dim()
    if counts is None:
        return kvmap.array(full, split=axis), full
    start = sum(counts[:ME])
    local = full.narrow(axis, start, counts[ME]).contiguous()
    return kvmap.array(local, is_split=axis), full


def counts_of(counts, n):
    """The per-rank counts: the given ones, or Heat's balanced ones of n rows."""
    if counts is not None:
        return counts
    base, extra = divmod(n, P)
    return [base + (1 if r < extra else 0) for r in range(P)]


def padded_window(full, axis, counts, before, after, boundary):
    """The rank's window: numpy.pad of the gathered array along ``axis`` (nothing added for
    "none"), cut at this rank's rows extended by the depth."""
    n = full.shape[axis]
    counts = counts_of(counts, n)
    start = sum(counts[:ME])
    a = full.numpy()
    width = [(0, 0)] * a.ndim
    if boundary == "none":
        lo, hi = max(0, start - before), min(n, start + counts[ME] + after)
        return torch.from_numpy(np.take(a, range(lo, hi), axis=axis).copy())
    width[axis] = (before, after)
    if isinstance(boundary, str):
        p = np.pad(a, width, mode=MODES[boundary])
    else:
        p = np.pad(a, width, mode="constant", constant_values=boundary)
    return torch.from_numpy(np.take(p, range(start, start + counts[ME] + before + after), axis=axis).copy())


def stencil(x, axis):
    """A function of a block and its neighbours' rows that keeps the block's extent: the
    central difference along ``axis`` (zero at the block's ends) plus a pointwise term."""
    out = torch.zeros_like(x)
    n = x.shape[axis]
    if n > 2:
        out.narrow(axis, 1, n - 2).copy_(x.narrow(axis, 2, n - 2) - x.narrow(axis, 0, n - 2))
    return out + 0.5 * x


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("layout", ["balanced", "uneven", "short"])
@pytest.mark.parametrize("split", [0, -1])
@pytest.mark.parametrize("depth", [(1, 1), (2, 3)])
def test_halo_is_numpy_pad_window(boundary, layout, split, depth):
    counts = layouts()[layout]
    d, full = make(counts, split)
    axis = split % full.dim()
    before, after = depth
    n = full.shape[axis]
    if boundary in ("periodic", "reflect") and max(before, after) > n:
        pytest.skip("depth beyond the array: an error (tested below)")
    ext = d.halo((before, after), boundary=boundary)
    want = padded_window(full, axis, counts, before, after, boundary)
    own = d.lshape[axis]
    if own == 0:
        assert everywhere(ext.numel() == 0)
        return
    assert everywhere(ext.is_contiguous() and ext.shape == want.shape and torch.equal(ext, want))


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("layout", ["balanced", "uneven", "short"])
@pytest.mark.parametrize("split", [0, -1])
def test_map_overlap_against_numpy_pad(boundary, layout, split):
    counts = layouts()[layout]
    d, full = make(counts, split, seed=3)
    axis = split % full.dim()
    calls = []

    def f(x):
        calls.append(tuple(x.shape))
        assert x.is_contiguous()
        return stencil(x, axis)

    (out,) = kvmap.map_overlap(f, d, depth=2, boundary=boundary)
    assert everywhere(out.split == axis and tuple(out.gshape) == tuple(full.shape))
    assert everywhere(out.lshape == d.lshape)
    own = d.lshape[axis]
    assert everywhere(len(calls) == (1 if own > 0 else 0))  # empty ranks call nothing
    if own > 0:
        window = padded_window(full, axis, counts, 2, 2, boundary)
        start = sum(counts_of(counts, full.shape[axis])[:ME])
        before = min(2, start) if boundary == "none" else 2
        want = stencil(window, axis).narrow(axis, before, own)
        assert everywhere(torch.equal(out.larray, want))
    else:
        assert everywhere(True)


def test_trim_false_several_arrays_and_keywords():
    d, full = make(layouts()["uneven"], 0, seed=4)
    e, full_e = make(layouts()["uneven"], 0, dtype=torch.float32, seed=5)

    def f(x, y, scale):
        # Its own rows only: the average of each row with its neighbours (a moving average).
        return (x[:-2] + x[1:-1] + x[2:]) * scale + y[1:-1].double(), y[1:-1] * 2

    out, out2 = kvmap.map_overlap(f, d, e, depth=1, boundary="nearest", trim=False, scale=1 / 3)
    pad = torch.from_numpy(np.pad(full.numpy(), [(1, 1), (0, 0), (0, 0)], mode="edge"))
    pad_e = torch.from_numpy(np.pad(full_e.numpy(), [(1, 1), (0, 0), (0, 0)], mode="edge"))
    ref = (pad[:-2] + pad[1:-1] + pad[2:]) * (1 / 3) + pad_e[1:-1].double()
    assert everywhere(torch.equal(out.allgather(), ref))
    assert everywhere(out2.dtype == torch.float32 and torch.equal(out2.allgather(), full_e * 2))


def test_outputs_never_alias_inputs_or_each_other():
    d, full = make(None, 0, seed=6)
    before = kvmap.stats()["bytes_copied"]
    a, b = kvmap.map_overlap(lambda x: (x, x), d, depth=1, boundary="periodic")
    assert everywhere(torch.equal(a.allgather(), full) and torch.equal(b.allgather(), full))
    assert everywhere(a.larray.data_ptr() != d.larray.data_ptr())
    assert everywhere(a.larray.numel() == 0 or a.larray.data_ptr() != b.larray.data_ptr())
    assert everywhere(kvmap.stats()["bytes_copied"] > before)


def test_errors_on_every_rank():
    d, _ = make(None, 0)
    with pytest.raises(ValueError, match="depth must be >= 0"):
        kvmap.map_overlap(lambda x: x, d, depth=-1)
    with pytest.raises(ValueError, match="exceeds the 11 rows"):
        kvmap.map_overlap(lambda x: x, d, depth=12, boundary="periodic")
    with pytest.raises(ValueError, match="boundary must be"):
        kvmap.map_overlap(lambda x: x, d, depth=1, boundary="mirror")
    with pytest.raises(TypeError, match="depth must be"):
        kvmap.map_overlap(lambda x: x, d, depth=1.5)
    e, _ = make(layouts()["short"], 0)
    if P > 1:
        with pytest.raises(ValueError, match="same length and the same per-rank counts"):
            kvmap.map_overlap(lambda x, y: x, d, e, depth=1)
    # An output of the wrong extent: the ranks that ran it raise ValueError.
    with pytest.raises((ValueError, kvmap.RemoteError), match="along the split axis 0 it must have"):
        kvmap.map_overlap(lambda x: x[1:], d, depth=1, boundary="periodic")
    # The communicator carries on.
    (ok,) = kvmap.map_overlap(lambda x: x + 1, d, depth=1)
    assert everywhere(ok.lshape == d.lshape)


def test_function_raising_on_one_rank():
    d, _ = make(None, 0)

    def f(x):
        if ME == P - 1:
            raise KeyError("the model is missing")
        return x

    if P == 1:
        with pytest.raises(KeyError, match="the model is missing"):
            kvmap.map_overlap(f, d, depth=1)
        return
    if ME == P - 1:
        with pytest.raises(KeyError):
            kvmap.map_overlap(f, d, depth=1)
    else:
        with pytest.raises(kvmap.RemoteError, match="the model is missing") as e:
            kvmap.map_overlap(f, d, depth=1)
        assert e.value.failed_ranks == [P - 1]


def test_get_halo_matches_heat_semantics():
    d, full = make(None, 0, seed=7)
    d.get_halo(2)
    n = full.shape[0]
    base, extra = divmod(n, P)
    counts = [base + (1 if r < extra else 0) for r in range(P)]
    start = sum(counts[:ME])
    prev = None if start == 0 else full[max(0, start - 2):start]
    nxt = None if start + counts[ME] == n else full[start + counts[ME]:start + counts[ME] + 2]
    assert everywhere((d.halo_prev is None) == (prev is None) and (d.halo_next is None) == (nxt is None))
    assert everywhere(prev is None or torch.equal(d.halo_prev, prev))
    assert everywhere(nxt is None or torch.equal(d.halo_next, nxt))
    assert everywhere(torch.equal(d.array_with_halos, full[max(0, start - 2):start + counts[ME] + 2]))
    d.get_halo(1, prev=False)
    assert everywhere(d.halo_prev is None)
    with pytest.raises(TypeError):
        d.get_halo(1.0)
    with pytest.raises(ValueError):
        d.get_halo(-1)


def test_heat_dndarrays_in_and_out():
    ht = pytest.importorskip("heat")
    _, full = make(None, 0, seed=8)
    x = ht.array(full, split=0)
    (out,) = kvmap.map_overlap(lambda b: stencil(b, 0), x, depth=1, boundary="reflect")
    assert everywhere(isinstance(out, ht.DNDarray) and out.split == 0)
    pad = torch.from_numpy(np.pad(full.numpy(), [(1, 1), (0, 0), (0, 0)], mode="symmetric"))
    ref = stencil(pad, 0)[1:-1]
    got = ht.resplit(out, None).larray
    # Each block's stencil is zero at its own ends, so compare the interior of each block.
    n = full.shape[0]
    base, extra = divmod(n, P)
    counts = [base + (1 if r < extra else 0) for r in range(P)]
    starts = [sum(counts[:r]) for r in range(P)]
    for r in range(P):
        if counts[r] == 0:
            continue
        s = starts[r]
        win = torch.from_numpy(np.pad(full.numpy(), [(1, 1), (0, 0), (0, 0)], mode="symmetric"))[s:s + counts[r] + 2]
        assert everywhere(torch.equal(got[s:s + counts[r]], stencil(win, 0)[1:-1]))
    assert ref.shape == got.shape
