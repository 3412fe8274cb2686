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


def close(got, ref, roundings, magnitudes=None):
    """``got`` has ``ref``'s dtype and is within the rounding bound of it (kvmap.check_close:
    norm-wise unless magnitudes are given; between two computations in one precision, the sum
    of both bounds). ``roundings``: along the longest chain of the function, k for a k-term
    sum, 1 per arithmetic operation, 4 per elementary function. Truthy; its repr says why."""
    if got.dtype != ref.dtype:
        return DtypesDiffer(got.dtype, ref.dtype)
    return kvmap.check_close(got, ref, roundings=roundings, magnitudes=magnitudes)


class DtypesDiffer:
    """A failed close(): the result has another dtype than the reference."""

    def __init__(self, got, want):
        self.text = "dtypes differ: %s against the reference's %s" % (got, want)

    def __bool__(self):
        return False

    def __repr__(self):
        return self.text


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


# Their roundings (for close): singular values of a 10x10 matrix are within p(n) u sigma_max
# of the exact ones with p(n) <= n^2 (LAPACK), squared twice that; scale * x0 @ x1 is a
# 10-term dot product and a product; (x0 - m) ** 3 a subtraction, a cube and pow's rounding.
F_ROUNDINGS = (2 * 10 * 10 + 1, 10 + 1)
G_ROUNDINGS = 8
