import pytest
import torch
from mpi4py import MPI

import kvmap


@pytest.fixture
def comm():
    return MPI.COMM_WORLD


def gathered(d):
    """The global array of a DistView on every rank (the reference side of every test)."""
    return d.allgather()


def loop_reference(func, mapped, in_dims, out_dims, **kwargs):
    """Independent reference: call func sample by sample on gathered inputs, then stack."""
    n = [a.shape[d] for a, d in zip(mapped, in_dims) if d is not None][0]
    outs = []
    for i in range(n):
        args = [a.select(d, i) if d is not None else a for a, d in zip(mapped, in_dims)]
        r = func(*args, **kwargs)
        outs.append(r if isinstance(r, tuple) else (r,))
    dims = out_dims if isinstance(out_dims, (tuple, list)) else (out_dims,) * len(outs[0])
    return tuple(torch.stack([o[k] for o in outs], dim=dims[k]) for k in range(len(outs[0])))


# The functions of Heat's own vmap tests (heat/core/tests/test_vmap.py).
def F(x0, x1, k=2, scale=1e-2):
    return torch.topk(torch.linalg.svdvals(x0), k)[0] ** 2, scale * x0 @ x1


def Fi(x0, x1, k=2, scale=1e-2):
    return torch.topk(torch.linalg.svdvals(x0), k)[0] ** 2, (scale * x0 @ x1).int()


def G(x0, m=1, scale=2):
    return (x0 - m) ** scale
