"""kvmap.map_batches, TorchScript modules as the mapped function, empty batches: against the
direct batched call on the gathered data, the eager module, per-sample loops and torch.vmap."""
import pytest
import torch
from mpi4py import MPI

import kvmap
from conftest import close, gathered, loop_reference

P = MPI.COMM_WORLD.size
ME = MPI.COMM_WORLD.rank
# The potential's roundings (for close): a 3-term dot plus a bias (4), tanh (4), a 16-term dot
# plus a bias (17), the sum over one output (1).
POTENTIAL_ROUNDINGS = 26


def randn(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def potential_class():
    """A new class each call: TorchScript compiles (and its graph executor optimizes) per class,
    so each scripted instance below is independent of the others."""

    class Potential(torch.nn.Module):
        """Energy of one particle from its coordinates; takes a batch as well."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(5)
            self.hidden = torch.nn.Linear(3, 16)
            self.out = torch.nn.Linear(16, 1)

        def forward(self, x):
            return self.out(torch.tanh(self.hidden(x))).sum(-1)

    return Potential


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 1000])
@pytest.mark.parametrize("out_dims", [0, (1, 0)])
def test_map_batches_is_the_direct_batched_call(chunk_size, out_dims):
    full, w = randn(5 * P + 1, 4, seed=1), randn(4, 3, seed=2)
    x = kvmap.array(full, split=0)

    def model(b, w):
        return torch.tanh(b @ w), b.sum(1).float()

    y0, y1 = kvmap.map_batches(model, out_dims=out_dims, chunk_size=chunk_size)(x, w=w)
    r0, r1 = model(full, w)
    d0 = 0 if out_dims == 0 else 1
    assert y0.split == d0 and y1.split == 0
    assert y0.lshape[d0] == x.lshape[0]  # the inputs' per-rank counts
    assert close(gathered(y0), r0.movedim(0, d0), 4 + 4)  # a 4-term dot product, tanh
    assert gathered(y1).dtype == torch.float32 and close(gathered(y1), r1, 4 + 1)  # sum, cast


def test_map_batches_output_must_lead_with_the_chunk():
    odd = 1 if P > 1 else 0
    x = kvmap.ones(2 * P, 3, split=0)

    def f(b):
        return b.sum(0) if ME == odd else b * 2

    if ME == odd:
        with pytest.raises(ValueError, match="first axis must be the chunk length"):
            kvmap.map_batches(f)(x)
    else:
        with pytest.raises(kvmap.RemoteError, match="first axis must be the chunk length") as info:
            kvmap.map_batches(f)(x)
        assert info.value.failed_ranks == [odd]
    with pytest.raises(TypeError, match="kvmap.map_batches: func must be callable"):
        kvmap.map_batches(3)


def test_scripted_module_through_vmap_and_map_batches():
    eager = potential_class()().eval()
    # One scripted module for vmap, one for map_batches: an optimized plan that LibTorch's graph
    # executor builds on direct calls cannot run under functorch (docs/models.md, TorchScript).
    per_sample = torch.jit.script(potential_class()().eval())
    batched = torch.jit.script(potential_class()().eval())
    full = randn(4 * P + 3, 3, seed=3, dtype=torch.float32)
    x = kvmap.array(full, split=0)
    with torch.no_grad():
        expected = eager(full)
        (loop,) = loop_reference(eager, [full], [0], 0)
    for chunk_size in (None, 1, 4, None):
        (e,) = kvmap.vmap(per_sample, chunk_size=chunk_size)(x)
        (b,) = kvmap.map_batches(batched, chunk_size=chunk_size)(x)
        assert close(gathered(e), loop, POTENTIAL_ROUNDINGS)
        assert close(gathered(e), expected, POTENTIAL_ROUNDINGS)
        assert close(gathered(b), expected, POTENTIAL_ROUNDINGS)


def test_one_scripted_module_for_both_with_optimization_off():
    eager = potential_class()().eval()
    scripted = torch.jit.script(eager)
    full = randn(2 * P + 1, 3, seed=4, dtype=torch.float32)
    x = kvmap.array(full, split=0)
    with torch.no_grad():
        expected = eager(full)
    with torch.jit.optimized_execution(False):  # from the module's first call on
        for _ in range(3):
            assert close(scripted(full), expected, POTENTIAL_ROUNDINGS)
            (b,) = kvmap.map_batches(scripted)(x)
            (e,) = kvmap.vmap(scripted, chunk_size=2)(x)
            assert close(gathered(b), expected, POTENTIAL_ROUNDINGS)
            assert close(gathered(e), expected, POTENTIAL_ROUNDINGS)


@pytest.mark.parametrize("mapper", [kvmap.vmap, kvmap.map_batches])
def test_empty_batch_gives_torch_vmaps_shapes(mapper):
    x = kvmap.zeros(0, 4, split=0)
    assert tuple(x.gshape) == (0, 4)
    if mapper is kvmap.vmap:
        affine, total = (lambda v: v * 2 + 1), (lambda v: v.sum())
    else:
        affine, total = (lambda b: b * 2 + 1), (lambda b: b.sum(1))
    (a,) = mapper(affine)(x)
    (s,) = mapper(total)(x)
    # torch.vmap on an empty batch: [0, 4] and [0] (torch >= 2.0; 1.13 has no torch.vmap).
    assert tuple(a.gshape) == (0, 4) and tuple(s.gshape) == (0,)
    if hasattr(torch, "vmap"):
        assert tuple(a.gshape) == tuple(torch.vmap(lambda v: v * 2 + 1)(torch.zeros(0, 4)).shape)
        assert tuple(s.gshape) == tuple(torch.vmap(lambda v: v.sum())(torch.zeros(0, 4)).shape)
    assert a.dtype == torch.float32 and gathered(a).shape == (0, 4)
