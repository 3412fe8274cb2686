"""kvmap.GhostExchange and torch.ops.kvmap.ghost_exchange under mpirun: forward and reverse
against references every rank computes alone (it knows the whole decomposition), gradcheck of
the global function in float64, a scripted module calling the op, errors on every rank."""
import io

import pytest
import torch
from mpi4py import MPI

import kvmap

COMM = MPI.COMM_WORLD
P = COMM.size
ME = COMM.rank


def decomposition(items):
    """Item k has id 1000 + 3k, owner (5k + 1) % P; each rank owns its ids in descending order
    and ghosts every third item from its rank on (its own included: periodic images), the first
    two again."""
    owned = [[] for _ in range(P)]
    owner = {}
    for k in range(items):
        r = (5 * k + 1) % P
        owned[r].append(1000 + 3 * k)
        owner[1000 + 3 * k] = r
    ghosts = []
    for r in range(P):
        owned[r].sort(reverse=True)
        g = [1000 + 3 * k for k in range(r % 3, items, 3)]
        ghosts.append(g + g[:2])
    return owned, ghosts, owner


def ids(values):
    return torch.tensor(values, dtype=torch.int64)


def value(i, c):
    return float((i * 7 + c * 13) % 41 - 20)


def test_forward_and_reverse_against_the_decomposition():
    owned, ghosts, _ = decomposition(9 * P + 4)
    gx = kvmap.GhostExchange(ids(owned[ME]), ids(ghosts[ME]))
    assert (gx.owned, gx.ghosts) == (len(owned[ME]), len(ghosts[ME]))
    x = torch.full((gx.owned + gx.ghosts, 4), -99.0, dtype=torch.float64)
    for i, k in enumerate(owned[ME]):
        x[i] = torch.tensor([value(k, c) for c in range(4)])
    want = x.clone()
    for j, k in enumerate(ghosts[ME]):
        want[gx.owned + j] = torch.tensor([value(k, c) for c in range(4)])
    for dtype in (torch.float64, torch.float32, torch.int32):
        assert torch.equal(gx.forward(x.to(dtype)), want.to(dtype))
    # In place: the same rows, in x's own storage, the owned rows untouched.
    y = x.clone()
    storage = y.data_ptr()
    assert gx.forward_(y) is y
    assert y.data_ptr() == storage and torch.equal(y, want)
    with pytest.raises(ValueError, match="contiguous"):
        gx.forward_(x.t().contiguous().t())
    calls = gx.usage()  # three dtypes, forward_, and the refused call (it reached the plan)
    assert calls["forward_calls"] == 5 and calls["reverse_calls"] == 0
    assert calls["forward_seconds"] > 0
    # reverse: integer-valued gradients, so every sum is exact.
    def grad(r):
        n = len(owned[r]) + len(ghosts[r])
        return torch.tensor([[(r * 31 + i * 11 + c * 5) % 17 - 8 for c in range(4)] for i in range(n)],
                            dtype=torch.float64)
    expect = grad(ME).clone()
    row = {k: i for i, k in enumerate(owned[ME])}
    for q in range(P):
        gq = grad(q)
        for j, k in enumerate(ghosts[q]):
            if k in row:
                expect[row[k]] += gq[len(owned[q]) + j]
    expect[gx.owned:] = 0
    assert torch.equal(gx.reverse(grad(ME)), expect)
    assert gx.usage()["reverse_calls"] == 1


class Scatter(torch.autograd.Function):
    """X (the same on every rank) -> this rank's rows. Its adjoint is Gather (and Gather's is
    Scatter), so gradients of any order stay global and collective."""

    @staticmethod
    def forward(ctx, X, start, rows):
        ctx.start, ctx.rows = start, rows
        return X[start:start + rows].clone()

    @staticmethod
    def backward(ctx, g):
        return Gather.apply(g, ctx.start), None, None


class Gather(torch.autograd.Function):
    """Each rank's rows -> the global Y on every rank (rank order)."""

    @staticmethod
    def forward(ctx, y, start):
        ctx.start, ctx.rows = start, y.shape[0]
        return torch.cat(COMM.allgather(y.detach().contiguous()))

    @staticmethod
    def backward(ctx, g):
        return Scatter.apply(g, ctx.start, ctx.rows), None


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_of_the_global_function(reverse):
    owned, ghosts, _ = decomposition(2 * P + 1)
    gx = kvmap.GhostExchange(ids(owned[ME]), ids(ghosts[ME]))
    counts = [len(owned[r]) + len(ghosts[r]) for r in range(P)]
    start = sum(counts[:ME])
    op = torch.ops.kvmap.ghost_exchange_reverse if reverse else torch.ops.kvmap.ghost_exchange

    def f(X):  # every rank evaluates it with the same X: each call is collective
        return Gather.apply(op(Scatter.apply(X, start, counts[ME]), gx.handle), start)

    X = torch.randn(sum(counts), 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5),
                    requires_grad=True)
    # The op is linear with integer Jacobian entries: central differences are exact but for
    # rounding. An output is a sum of at most k terms (k: an id's rows on all ranks, owner
    # included), each f(X +- eps) is off by k unit roundoffs u of k max|X|, and X +- eps itself
    # by u max|X|: over 2 eps, atol = (k + 2) u (k max|X| + eps) / eps. The second derivatives
    # (gradgradcheck's differences of the first, also linear with integer entries) alike, with
    # its random output gradients in place of X: randn's few dozen values stay under 5 (each
    # exceeds it with probability 6e-7).
    eps, u = 1e-3, 2.0 ** -53
    every = [i for r in range(P) for i in ghosts[r] + owned[r]]
    k = max(every.count(i) for i in set(every))
    atol = (k + 2) * u * (k * max(float(X.abs().max()), 5.0) + eps) / eps
    assert torch.autograd.gradcheck(f, (X,), eps=eps, atol=atol, rtol=0)
    if not reverse:  # the second derivatives are exchanges too: once is enough (O(n^2) calls)
        torch.manual_seed(0)  # gradgradcheck's random output gradients: the same on every rank
        assert torch.autograd.gradgradcheck(f, (X,), eps=eps, atol=atol, rtol=0)


class MessagePassing(torch.nn.Module):
    """Two layers; ghost features are exchanged between them."""

    def __init__(self):
        super().__init__()
        self.lin1 = torch.nn.Linear(3, 3, dtype=torch.float64)
        self.lin2 = torch.nn.Linear(3, 1, dtype=torch.float64)

    def forward(self, x: torch.Tensor, plan: int) -> torch.Tensor:
        h = torch.tanh(self.lin1(x))
        h = torch.ops.kvmap.ghost_exchange(h, plan)
        return self.lin2(h).sum()


def test_a_scripted_model_calls_the_op():
    owned, ghosts, _ = decomposition(5 * P + 1)
    gx = kvmap.GhostExchange(ids(owned[ME]), ids(ghosts[ME]))
    torch.manual_seed(3)
    model = MessagePassing()
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buffer)
    buffer.seek(0)
    scripted = torch.jit.load(buffer)
    x = torch.randn(gx.owned + gx.ghosts, 3, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(ME))
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    ea, eb = scripted(xa, gx.handle), model(xb, gx.handle)
    ea.backward()
    eb.backward()
    # The same operations in the same order on the same values.
    assert torch.equal(ea, eb)
    assert torch.equal(xa.grad, xb.grad)
    # The eager reference without the op: forward, then reverse of the gradient.
    h = torch.tanh(model.lin1(x.clone().requires_grad_(True)))
    assert torch.equal(gx(h.detach()), gx.forward(h.detach()))


def test_errors_on_every_rank():
    owned, ghosts, _ = decomposition(3 * P + 1)
    odd = 1 if P > 1 else 0
    bad = ghosts[ME] + ([7] if ME == odd else [])
    # ValueError on the rank at fault, RemoteError (naming it) on the others.
    with pytest.raises((ValueError, kvmap.RemoteError), match="ghost id 7 .* is owned by no rank"):
        kvmap.GhostExchange(ids(owned[ME]), ids(bad))
    gx = kvmap.GhostExchange(ids(owned[ME]), ids(ghosts[ME]))
    x = torch.zeros(gx.owned + gx.ghosts - (1 if ME == odd else 0), 2)
    with pytest.raises((ValueError, kvmap.RemoteError), match="ghost rows on this rank"):
        gx.forward(x)
    with pytest.raises(RuntimeError, match="no GhostExchange plan has handle 123456789"):
        torch.ops.kvmap.ghost_exchange(torch.zeros(2, 2), 123456789)


@pytest.mark.skipif(P > 1, reason="one rank suffices: the exported program is each rank's own")
@pytest.mark.skipif(not hasattr(torch, "export") or not hasattr(torch._inductor, "aoti_compile_and_package"),
                    reason="torch.export and AOTInductor packages need torch >= 2.6")
def test_export_and_aotinductor_keep_the_op(tmp_path):
    owned, ghosts, _ = decomposition(7)
    gx = kvmap.GhostExchange(ids(owned[ME]), ids(ghosts[ME]))
    torch.manual_seed(4)
    model = MessagePassing()
    x = torch.randn(gx.owned + gx.ghosts, 3, dtype=torch.float64)
    program = torch.export.export(model, (x, gx.handle))
    assert "torch.ops.kvmap.ghost_exchange" in program.graph_module.code
    assert torch.equal(program.module()(x, gx.handle), model(x, gx.handle))
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "m.pt2"))
    compiled = torch._inductor.aoti_load_package(package)
    # Inductor may fuse and reorder the layers' sums: float64 rounding of a 3-term dot
    # product and a sum over the rows, far below this bound.
    want = model(x, gx.handle)
    assert abs(compiled(x, gx.handle).item() - want.item()) <= 1e-12 * (1 + abs(want.item()))
