"""kvmap.vmap / kvmap.map_batches with compile=...: the results of Heat's vmap cases against a
sample-by-sample loop, chunking (the last chunk shorter), out_dims, keyword arguments, how often
torch compiles, the fallback to eager, and what is refused. Most cases compile with torch's
"aot_eager" backend (Dynamo's graph capture through functorch's vmap and AOT autograd, without
generating C++); one compiles with Inductor, the default. compile="trace" (traced without Dynamo,
compiled by Inductor, called without guards) has its own cases below: padded chunks, a program
per signature, tensors passed by keyword never frozen, no output sharing an input's storage."""
import warnings

import pytest
import torch
from mpi4py import MPI

import kvmap
from conftest import F, F_ROUNDINGS, G, G_ROUNDINGS, Fi, close, gathered, loop_reference
from kvmap import _compile

P = MPI.COMM_WORLD.size

CAN_COMPILE = _compile.available() is None
needs_compile = pytest.mark.skipif(not CAN_COMPILE, reason="this torch has no torch.compile")
AOT = {"backend": "aot_eager"}


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def compilations():
    return kvmap.stats()["compilations"]


@needs_compile
@pytest.mark.parametrize("chunk_size, out_dims", [(None, (0, 0)), (3, (0, 1))])
def test_heat_cases_compiled(chunk_size, out_dims):
    # Heat's F with both inputs split (one along axis 1) and with the second one whole;
    # 5 samples per rank in chunks of 3: the last chunk is shorter.
    a_full, b_full = randn(5 * P, 10, 10, seed=1), randn(10, 5 * P, seed=2)
    x0, x1 = kvmap.array(a_full, split=0), kvmap.array(b_full, split=1)
    y0, y1 = kvmap.vmap(F, out_dims, chunk_size=chunk_size, compile=AOT)(x0, x1, k=2, scale=2.2)
    r0, r1 = loop_reference(F, [gathered(x0), gathered(x1)], [0, 1], out_dims, k=2, scale=2.2)
    assert y0.split == out_dims[0] and y1.split == out_dims[1]
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert close(gathered(y1), r1, F_ROUNDINGS[1])
    whole = kvmap.array(b_full)
    y0, y1 = kvmap.vmap(F, out_dims, chunk_size=chunk_size, compile=AOT)(x0, whole, k=5, scale=1.5)
    r0, r1 = loop_reference(F, [gathered(x0), b_full], [0, None], out_dims, k=5, scale=1.5)
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert close(gathered(y1), r1, F_ROUNDINGS[1])


@needs_compile
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_output_and_map_batches_compiled(dtype):
    x0 = kvmap.array(randn(7 * P, 10, 10, dtype=dtype, seed=5), split=0)
    (y0,) = kvmap.vmap(G, out_dims=(0,), chunk_size=4, compile=AOT)(x0, m=2, scale=3)
    (r0,) = loop_reference(G, [gathered(x0)], [0], (0,), m=2, scale=3)
    assert close(gathered(y0), r0, G_ROUNDINGS)
    # map_batches: func is already batched; compiled as it is.
    (y1,) = kvmap.map_batches(lambda x, m: (x - m).pow(3).sum(-1), chunk_size=4, compile=AOT)(x0, m=2)
    (r1,) = loop_reference(lambda x, m: (x - m).pow(3).sum(-1), [gathered(x0)], [0], (0,), m=2)
    assert close(gathered(y1), r1, G_ROUNDINGS + 10)


@needs_compile
@pytest.mark.parametrize("mode", ["aot_eager", "trace"])
def test_heat_int_output_compiled(mode):
    # Heat's third case: a replicated input, an int output along axis 1, 5 samples per rank in
    # chunks of 2 (trace: padded to 2).
    if mode == "trace" and P > 2:
        pytest.skip("Inductor compiles on every rank alike: at 1 and 2 ranks only (CI time)")
    a_full, b_full = randn(5 * P, 10, 10, seed=41), randn(10, 5 * P, seed=42)
    x0, x1 = kvmap.array(a_full, split=0), kvmap.array(b_full)
    compile = AOT if mode == "aot_eager" else mode
    y0, y1 = kvmap.vmap(Fi, (0, 1), chunk_size=2, compile=compile)(x0, x1, k=5, scale=2.2)
    r0, r1 = loop_reference(Fi, [gathered(x0), b_full], [0, None], (0, 1), k=5, scale=2.2)
    assert y1.split == 1 and y1.dtype == torch.int32
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert (gathered(y1).long() - r1.long()).abs().max() <= 1  # truncation of near-integers


@needs_compile
def test_compiles_once_per_signature():
    w = randn(16, 8, seed=7)
    f = lambda x: torch.tanh(x @ w.to(x.dtype)).sum()  # noqa: E731
    mapped = kvmap.vmap(f, chunk_size=4, compile=AOT)
    x = kvmap.array(randn(10 * P, 16, seed=8), split=0)  # chunks of 4, 4 and 2 on each rank
    mapped(x)
    first = compilations()
    assert first >= 1
    for _ in range(100):
        (y,) = mapped(x)
    assert compilations() == first, "calls with the same signature compiled again"
    assert close(gathered(y), torch.tanh(gathered(x) @ w).sum(-1), 16 + 8 + 4)
    (y,) = mapped(kvmap.array(randn(6 * P, 16, dtype=torch.float32, seed=9), split=0))  # another dtype
    assert compilations() > first


@needs_compile
@pytest.mark.skipif(P > 2, reason="Inductor compiles on every rank alike: at 1 and 2 ranks only (CI time)")
def test_inductor():
    # torch.compile's default backend: C++ generated and compiled for the chunk function.
    x = kvmap.array(randn(9 * P, 32, seed=11), split=0)
    before = kvmap.stats()
    (y,) = kvmap.vmap(lambda v: torch.sigmoid(2 * v + 1).sum(), chunk_size=5, compile=True)(x)
    after = kvmap.stats()
    assert close(gathered(y), torch.sigmoid(2 * gathered(x) + 1).sum(-1), 32 + 12)
    assert after["compile_fallbacks"] == before["compile_fallbacks"], "Inductor could not compile here"
    assert after["compilations"] > before["compilations"] and after["compile_seconds"] > before["compile_seconds"]


def broken_backend(gm, example_inputs):
    raise RuntimeError("a backend that cannot compile anything")


@needs_compile
def test_falls_back_to_eager_with_one_warning():
    x = kvmap.array(randn(5 * P, 10, 10, seed=12), split=0)
    before = kvmap.stats()["compile_fallbacks"]
    mapped = kvmap.vmap(G, chunk_size=2, compile={"backend": broken_backend})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (y,) = mapped(x, m=1, scale=2)
        (y,) = mapped(x, m=1, scale=2)
    messages = [str(w.message) for w in caught if "compile" in str(w.message)]
    assert len(messages) == 1 and "cannot compile" in messages[0], messages
    assert kvmap.stats()["compile_fallbacks"] == before + 1
    (r,) = loop_reference(G, [gathered(x)], [0], (0,), m=1, scale=2)
    assert close(gathered(y), r, G_ROUNDINGS)


@needs_compile
def test_errors_of_func_are_raised_as_without_compile():
    x = kvmap.array(randn(3 * P, 4, seed=13), split=0)
    with pytest.raises(Exception, match="mat1 and mat2|size mismatch|shapes cannot be multiplied"):
        kvmap.vmap(lambda v: v @ torch.ones(5, 2, dtype=v.dtype), compile=AOT)(x)


def test_refused_and_checked():
    with pytest.raises(ValueError, match="randomness='error' only"):
        kvmap.vmap(lambda v: v, randomness="same", compile=True)
    with pytest.raises(ValueError, match="randomness='error' only"):
        kvmap.vmap(lambda v: v, randomness="different", compile="trace")
    with pytest.raises(TypeError, match="compile must be a bool, 'trace' or a dict"):
        kvmap.vmap(lambda v: v, compile="yes")
    with pytest.raises(TypeError, match="compile must be a bool, 'trace' or a dict"):
        kvmap.map_batches(lambda v: v, compile=1)


@pytest.mark.skipif(CAN_COMPILE, reason="torch.compile exists here (test_inductor compiles)")
def test_without_torch_compile_runs_eagerly():
    x = kvmap.array(randn(4 * P, 6, seed=14), split=0)
    with pytest.warns(RuntimeWarning, match="no torch.compile"):
        mapped = kvmap.vmap(lambda v: (v * v).sum(), compile=True)
    (y,) = mapped(x)
    assert close(gathered(y), (gathered(x) ** 2).sum(-1), 8)


# compile="trace": Inductor generates C++ on every rank alike; Heat's F at 1 and 2 ranks only.
@needs_compile
@pytest.mark.skipif(P > 2, reason="Inductor compiles on every rank alike: at 1 and 2 ranks only (CI time)")
def test_trace_heat_case_padded_chunks():
    # 5 samples per rank in chunks of 3: the last chunk is padded to 3 rows. Two programs: the
    # first chunk of x1 (split along axis 1) is a strided view, the padded one a contiguous copy.
    a_full, b_full = randn(5 * P, 10, 10, seed=21), randn(10, 5 * P, seed=22)
    x0, x1 = kvmap.array(a_full, split=0), kvmap.array(b_full, split=1)
    before = compilations()
    mapped = kvmap.vmap(F, (0, 1), chunk_size=3, compile="trace")
    mapped(x0, x1, k=2, scale=2.2)
    assert before < compilations() <= before + 2
    first = compilations()
    y0, y1 = mapped(x0, x1, k=2, scale=2.2)
    assert compilations() == first
    r0, r1 = loop_reference(F, [gathered(x0), gathered(x1)], [0, 1], (0, 1), k=2, scale=2.2)
    assert y0.split == 0 and y1.split == 1
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert close(gathered(y1), r1, F_ROUNDINGS[1])


@needs_compile
def test_trace_one_program_per_signature(monkeypatch):
    w = randn(16, 8, seed=23)
    mapped = kvmap.vmap(lambda v, w: torch.tanh(v @ w).sum(), chunk_size=4, compile="trace")
    x = kvmap.array(randn(10 * P, 16, seed=24), split=0)  # chunks of 4, 4 and 2 (padded to 4)
    before = kvmap.stats()
    (y,) = mapped(x, w=w)
    assert kvmap.stats()["compilations"] == before["compilations"] + 1
    for _ in range(100):
        (y,) = mapped(x, w=w)
    assert kvmap.stats()["compilations"] == before["compilations"] + 1, "the same signature compiled again"
    assert close(gathered(y), torch.tanh(gathered(x) @ w).sum(-1), 16 + 8 + 4)
    # A tensor passed by keyword is an input of the program, never a constant of it: another
    # tensor of the same signature gives its own result without compiling.
    w2 = randn(16, 8, seed=25)
    (y2,) = mapped(x, w=w2)
    assert kvmap.stats()["compilations"] == before["compilations"] + 1
    assert close(gathered(y2), torch.tanh(gathered(x) @ w2).sum(-1), 16 + 8 + 4)
    # Another dtype, another trailing shape: a program each.
    (y3,) = mapped(kvmap.array(randn(6 * P, 16, dtype=torch.float32, seed=26), split=0), w=w2.float())
    (y4,) = mapped(kvmap.array(randn(6 * P, 12, seed=27), split=0), w=w2[:12])
    assert kvmap.stats()["compilations"] == before["compilations"] + 3
    assert kvmap.stats()["compile_fallbacks"] == before["compile_fallbacks"]
    # A number by keyword is part of the signature: beyond the limit of programs per callable,
    # new values run eagerly after one warning, with the eager result.
    limit = 2  # (the limit is 32: each program takes Inductor seconds)
    monkeypatch.setattr(_compile.Traced, "PROGRAMS", limit)
    scaled = kvmap.vmap(lambda v, s: (v * s).sum(), compile="trace")
    small = kvmap.array(randn(2 * P, 3, seed=32), split=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(limit + 3):
            (z,) = scaled(small, s=float(k))
    assert len([w for w in caught if "signatures compiled already" in str(w.message)]) == 1
    assert close(gathered(z), (gathered(small) * (limit + 2)).sum(-1), 4)


@needs_compile
def test_trace_reads_outside_tensors_in_place_and_outputs_own_storage():
    w = randn(6, 6, seed=28)
    x = kvmap.array(randn(4 * P, 6, seed=29), split=0)
    mapped = kvmap.vmap(lambda v: v @ w, compile="trace")
    (y,) = mapped(x)
    assert close(gathered(y), gathered(x) @ w, 6)
    w.mul_(-2)  # changed in place: the program reads the same tensor
    (y,) = mapped(x)
    assert close(gathered(y), gathered(x) @ w, 6)
    # The identity: Inductor's program returns its input; kvmap's output is storage of its own.
    (same,) = kvmap.vmap(lambda v: v, compile="trace")(x)
    assert torch.equal(same.larray, x.larray)
    assert same.larray.untyped_storage().data_ptr() != x.larray.untyped_storage().data_ptr()
    # A keyword tensor that requires gradients (a DistView's shard never does): the eager
    # function (the program computes none).
    wg = randn(6, seed=30).requires_grad_()
    before = compilations()
    (yg,) = kvmap.map_batches(lambda v, w: (v * w).sum(-1), compile="trace")(x, w=wg)
    assert compilations() == before
    assert close(gathered(yg), (gathered(x) * wg.detach()).sum(-1), 8)


@needs_compile
def test_trace_falls_back_on_data_dependent_control_flow():
    def branchy(v):  # a branch on the values: not traceable, never frozen into a program
        return v * 2 if bool(v.sum() > 0) else v - 1
    x = kvmap.array(randn(5 * P, 3, seed=31), split=0)
    before = kvmap.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mapped = kvmap.map_batches(branchy, chunk_size=2, compile="trace")
        (y,) = mapped(x)
        (y,) = mapped(x)
    messages = [str(w.message) for w in caught if "compile" in str(w.message)]
    assert len(messages) == 1 and "cannot compile" in messages[0], messages
    assert kvmap.stats()["compile_fallbacks"] == before["compile_fallbacks"] + 1
    # every rank's 5 rows in chunks of 2, 2 and 1, each branching on its own sum
    local = [torch.cat([branchy(c) for c in r.split(2)]) for r in gathered(x).split(5)]
    assert torch.equal(gathered(y), torch.cat(local))
