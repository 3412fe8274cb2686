"""kvmap's Python API under mpirun: Heat's vmap cases, zero copy, randomness, errors."""
import os
import runpy

import pytest
import torch
from mpi4py import MPI

import kvmap
from conftest import F, F_ROUNDINGS, Fi, G, G_ROUNDINGS, close, gathered, loop_reference

P = MPI.COMM_WORLD.size
ME = MPI.COMM_WORLD.rank
DTYPES = [torch.float32, torch.float64]


def randn(*shape, dtype, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 4])
@pytest.mark.parametrize("out_dims", [(0, 0), 0])  # Heat's first case: an int applies to both
def test_heat_two_split_inputs(dtype, chunk_size, out_dims):
    a_full, b_full = randn(5 * P, 10, 10, dtype=dtype, seed=1), randn(10, 5 * P, dtype=dtype, seed=2)
    x0, x1 = kvmap.array(a_full, split=0), kvmap.array(b_full, split=1)
    y0, y1 = kvmap.vmap(F, out_dims, chunk_size=chunk_size)(x0, x1, k=2, scale=2.2)
    r0, r1 = loop_reference(F, [gathered(x0), gathered(x1)], [0, 1], out_dims, k=2, scale=2.2)
    assert y0.split == 0 and y1.split == 0
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert close(gathered(y1), r1, F_ROUNDINGS[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_heat_chunked_replicated_input(dtype):
    # Heat's second case: F with out_dims (0, 1), chunk_size=1, k=5, the second input whole.
    a_full, b_full = randn(5 * P, 10, 10, dtype=dtype, seed=23), randn(10, 5 * P, dtype=dtype, seed=24)
    x0, x1 = kvmap.array(a_full, split=0), kvmap.array(b_full)
    y0, y1 = kvmap.vmap(F, out_dims=(0, 1), chunk_size=1)(x0, x1, k=5, scale=2.2)
    r0, r1 = loop_reference(F, [gathered(x0), b_full], [0, None], (0, 1), k=5, scale=2.2)
    assert y0.split == 0 and y1.split == 1
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert close(gathered(y1), r1, F_ROUNDINGS[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 4])
def test_heat_replicated_input_int_output(dtype, chunk_size):
    a_full, b_full = randn(5 * P, 10, 10, dtype=dtype, seed=3), randn(10, 5 * P, dtype=dtype, seed=4)
    x0, x1 = kvmap.array(a_full, split=0), kvmap.array(b_full)
    assert x1.split is None
    y0, y1 = kvmap.vmap(Fi, (0, 1), chunk_size=chunk_size)(x0, x1, k=5, scale=2.2)
    r0, r1 = loop_reference(Fi, [gathered(x0), b_full], [0, None], (0, 1), k=5, scale=2.2)
    assert y1.split == 1 and y1.dtype == torch.int32
    assert close(gathered(y0), r0, F_ROUNDINGS[0])
    assert (gathered(y1).long() - r1.long()).abs().max() <= 1  # truncation of near-integers


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3, 4])
def test_heat_one_output(dtype, chunk_size):
    x0 = kvmap.array(randn(5 * P, 10, 10, dtype=dtype, seed=5), split=0)
    (y0,) = kvmap.vmap(G, out_dims=(0,), chunk_size=chunk_size)(x0, m=2, scale=3)
    (r0,) = loop_reference(G, [gathered(x0)], [0], (0,), m=2, scale=3)
    assert close(gathered(y0), r0, G_ROUNDINGS)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_same_result_as_heat(chunk_size):
    # Heat itself, where it is installed (the torch2 configuration): its vmap on the same
    # arrays, ranks and arguments gives kvmap's values, split and shape.
    ht = pytest.importorskip("heat")
    a_full, b_full = randn(5 * P, 10, 10, dtype=torch.float64, seed=31), randn(10, 5 * P, dtype=torch.float64, seed=32)
    h0, h1 = ht.vmap(F, out_dims=(0, 1), chunk_size=chunk_size)(
        ht.array(a_full, split=0), ht.array(b_full, split=1), k=3, scale=0.5)
    y0, y1 = kvmap.vmap(F, out_dims=(0, 1), chunk_size=chunk_size)(
        kvmap.array(a_full, split=0), kvmap.array(b_full, split=1), k=3, scale=0.5)
    for h, y, roundings in ((h0, y0, F_ROUNDINGS[0]), (h1, y1, F_ROUNDINGS[1])):
        assert tuple(h.gshape) == tuple(y.gshape) and h.split == y.split
        assert close(y.larray, h.larray, roundings)
        assert close(gathered(y), h.resplit(None).larray, roundings)


def test_heat_argument_errors():
    with pytest.raises(TypeError):
        kvmap.vmap(1)
    with pytest.raises(ValueError):
        kvmap.vmap(lambda x: x, randomness="random")
    with pytest.raises(TypeError):
        kvmap.vmap(lambda x: x, chunk_size="1")
    with pytest.raises(ValueError):
        kvmap.vmap(lambda x: x, chunk_size=0)
    with pytest.raises(TypeError):
        kvmap.vmap(lambda x: x, out_dims=0)(kvmap.ones(10, split=0), 2)
    with pytest.raises(ValueError, match="out_dims"):
        kvmap.vmap(lambda x: x, out_dims=(0, 1))(kvmap.ones(10, split=0))
    with pytest.raises(ValueError):  # Heat's spelling: nothing mapped is an error as well
        kvmap.vmap(lambda x: x, out_dims=(0, 1))(kvmap.ones(10))


def test_wrong_number_of_out_dims_for_two_outputs():
    x0 = kvmap.array(randn(5 * P, 10, 10, dtype=torch.float32, seed=6), split=0)
    x1 = kvmap.array(randn(10, 5 * P, dtype=torch.float32, seed=7))
    with pytest.raises(ValueError, match="3 entries but the function returned 2"):
        kvmap.vmap(F, (0, 1, 2))(x0, x1, k=2, scale=2.2)
    # A one-entry tuple names one output, as in torch.vmap: two outputs are an error on every
    # rank, while the int 0 applies to both.
    with pytest.raises(ValueError, match="1 entries but the function returned 2"):
        kvmap.vmap(F, (0,))(x0, x1, k=2, scale=2.2)
    assert len(kvmap.vmap(F, 0)(x0, x1, k=2, scale=2.2)) == 2
    for bad in ((0, "1"), (), 1.5, True):
        with pytest.raises(TypeError, match="out_dims"):
            kvmap.vmap(F, bad)


def test_wrong_number_of_out_dims_with_a_rank_without_samples():
    # One sample, on the last rank: the other ranks never call func and learn the number of
    # outputs from the scheduler. Every rank must raise (none may hang), and the next call works.
    full = randn(1, 10, 10, dtype=torch.float64, seed=8)
    x0 = kvmap.array(full if ME == P - 1 else full[:0], is_split=0)
    x1 = kvmap.array(randn(10, 1, dtype=torch.float64, seed=9))
    # The number of outputs is agreed, so out_dims that do not fit it are a ValueError on every
    # rank, also where func did not run.
    with pytest.raises(ValueError, match="1 entries but the function returned 2"):
        kvmap.vmap(F, (0,))(x0, x1, k=2, scale=2.2)
    with pytest.raises(ValueError, match="3 entries but the function returned 2"):
        kvmap.vmap(F, [0, 1, 0])(x0, x1, k=2, scale=2.2)
    y0, y1 = kvmap.vmap(F, 0)(x0, x1, k=2, scale=2.2)
    r0, r1 = loop_reference(F, [full, gathered(x1)], [0, None], 0, k=2, scale=2.2)
    assert y0.lshape_map[:, 0].tolist() == [1 if r == P - 1 else 0 for r in range(P)]
    assert close(gathered(y0), r0, F_ROUNDINGS[0]) and close(gathered(y1), r1, F_ROUNDINGS[1])


@pytest.mark.parametrize("args", [(7,), (3 * P + 1,), (2, 11), (-3, 3 * P, 2), (20, 1, -3), (5, 5)])
@pytest.mark.parametrize("split", [0, None])
def test_arange_matches_torch(args, split):
    d = kvmap.arange(*args, split=split)
    expected = torch.arange(*args)
    assert d.dtype == torch.int64 and d.split == split
    assert torch.equal(gathered(d), expected)
    assert d.is_balanced()


@pytest.mark.parametrize("dtype", DTYPES)
def test_arange_floats(dtype):
    d = kvmap.arange(0.5, 3 * P + 0.25, 0.75, dtype=dtype, split=0)
    expected = torch.arange(0.5, 3 * P + 0.25, 0.75, dtype=dtype)
    assert d.dtype == dtype and d.gshape == tuple(expected.shape)
    assert close(gathered(d), expected, 2)  # start + i * step: a product and a sum
    f = kvmap.arange(0.0, 1.0, 0.125)  # float arguments: torch's default dtype
    assert f.dtype == torch.get_default_dtype() and torch.equal(gathered(f), torch.arange(0.0, 1.0, 0.125))
    with pytest.raises(ValueError, match="step"):
        kvmap.arange(0, 5, 0)
    with pytest.raises(ValueError, match="inconsistent"):
        kvmap.arange(9, 2)
    with pytest.raises(ValueError, match="finite"):
        kvmap.arange(0.0, float("inf"))
    with pytest.raises(TypeError):
        kvmap.arange()
    with pytest.raises(TypeError):
        kvmap.arange(1, 2, 3, 4)
    with pytest.raises(TypeError):
        kvmap.arange("5")
    with pytest.raises(TypeError):
        kvmap.arange(True)


@pytest.mark.parametrize("args, kwargs", [
    ((2 * P + 1,), dict(dtype=torch.float64)),        # int arguments, float dtype
    ((-P, 3 * P, 3), dict(dtype=torch.int32)),
    ((1, 2.5 * P), {}),                               # mixed: float
    ((3, -4.5 * P, -0.7), dict(dtype=torch.float64)),  # negative float step
    ((2 ** 62, 2 ** 62 + 4 * P, 3), {}),              # int64 beyond float64's exact integers
])
def test_arange_argument_forms_match_torch(args, kwargs):
    expected = torch.arange(*args, **kwargs)
    for split in (0, None):
        d = kvmap.arange(*args, split=split, **kwargs)
        assert d.dtype == expected.dtype and d.gshape == tuple(expected.shape) and d.split == split
        if expected.is_floating_point():  # torch's vectorized kernel may round differently
            assert close(gathered(d), expected, 2)
        else:
            assert torch.equal(gathered(d), expected)


def test_arange_takes_numpy_scalars_and_0d_tensors():
    np = pytest.importorskip("numpy")
    for args in [(np.int64(3 * P),), (np.int32(1), np.int64(2 * P + 1), np.int16(2)), (torch.tensor(2 * P),),
                 (np.float64(0.5), torch.tensor(P + 0.5, dtype=torch.float64))]:
        expected = torch.arange(*args)
        d = kvmap.arange(*args, split=0)
        assert d.dtype == expected.dtype and torch.equal(gathered(d), expected), args


def test_gil_is_released_while_the_scheduler_waits():
    # Rank 0 enters vmap first and waits in the scheduler's collectives for the other ranks,
    # which arrive 0.5 s later. Meanwhile a second Python thread on rank 0 wakes every
    # millisecond and counts; it needs the GIL for each count. Released by the binding, the
    # GIL is free during the wait: hundreds of counts. Held, the thread could count only at
    # the few points where rank 0 itself runs Python or releases the GIL (func's call and its
    # torch op, the wrapper): a handful. (A busy-looping thread would not tell these apart: it
    # gets a whole 5 ms switch interval, tens of thousands of steps, at each such point.)
    if P < 2:
        pytest.skip("needs a second rank to wait for")
    import threading
    import time

    x = kvmap.ones(2 * P, 3, split=0)
    MPI.COMM_WORLD.Barrier()
    if ME == 0:
        stop, ticks = threading.Event(), [0]

        def tick():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.001)

        t = threading.Thread(target=tick)
        t.start()
        time.sleep(0.05)
        before = ticks[0]
        start = time.monotonic()
        (y,) = kvmap.vmap(lambda v: v * 2)(x)
        waited = time.monotonic() - start
        during = ticks[0] - before
        stop.set()
        t.join()
        assert waited > 0.3
        # ~400 measured, 1-2 with the GIL held; 25 still allows 20 ms per wake-up on a loaded host.
        assert during >= 25, "a Python thread woke %d times during a %.2f s vmap" % (during, waited)
    else:
        time.sleep(0.5)
        (y,) = kvmap.vmap(lambda v: v * 2)(x)
    assert bool((gathered(y) == 2).all())


def test_array_split_and_is_split():
    full = torch.arange(3 * P * 2, dtype=torch.float64).reshape(3 * P, 2)
    a = kvmap.array(full, split=0)
    assert a.gshape == (3 * P, 2) and a.lshape == (3, 2)
    piece = full[3 * ME: 3 * ME + 3]
    b = kvmap.array(piece, is_split=0)
    assert torch.equal(gathered(b), full)
    assert b.larray.data_ptr() == piece.data_ptr()  # is_split adopts the tensor
    with pytest.raises(ValueError):
        kvmap.array(full, split=0, is_split=0)
    assert a.lshape_map.tolist() == [[3, 2]] * P
    assert a.is_balanced()


def test_larray_is_zero_copy_and_writes_reach_cpp():
    x = kvmap.zeros(4 * P, 3, dtype=torch.float64, split=0)
    assert x.larray.data_ptr() == x._local_address()
    x.larray.fill_(2.0)  # a write through the torch view ...
    ones = kvmap.ones(4 * P, 3, dtype=torch.float64, split=0)
    assert kvmap.dot(x, ones) == pytest.approx(2.0 * 4 * P * 3)  # ... seen by Kokkos Kernels in C++
    kvmap.reset_stats()
    (y,) = kvmap.vmap(lambda v: v * 3)(x)
    assert kvmap.stats()["bytes_copied"] == 0
    assert torch.equal(y.larray, x.larray * 3)


def test_balance_and_resplit_in_place():
    full = torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5)
    counts = [7 if r == P - 1 else 0 for r in range(P)]
    piece = full if ME == P - 1 else full[:0]
    d = kvmap.array(piece, is_split=0)
    assert d.lshape_map[:, 0].tolist() == counts
    assert d.balance_() is d  # in-place methods return the array, as Heat's do
    assert d.is_balanced()
    assert torch.equal(gathered(d), full)
    assert d.resplit_(1) is d
    assert d.split == 1
    assert torch.equal(d.resplit_(None).larray, full)  # Heat's idiom
    d.resplit_(1)
    assert torch.equal(torch.from_numpy(d.numpy()), full)
    g = d.gather()
    assert (g is not None) == (ME == 0)
    if ME == 0:
        assert torch.equal(g, full)


def test_randomness_modes():
    x = kvmap.zeros(3 * P, 2, split=0)
    draw = lambda v: v.sum() + torch.rand(4)  # noqa: E731
    with pytest.raises(RuntimeError, match="randomness"):
        kvmap.vmap(draw)(x)
    torch.manual_seed(1000 + ME)  # different states on purpose: "same" shares rank 0's
    (s,) = kvmap.vmap(draw, randomness="same")(x)
    s = gathered(s)
    assert torch.equal(s, s[0].expand_as(s))
    torch.manual_seed(42)  # identical states on purpose: "different" still differs per rank
    (d,) = kvmap.vmap(draw, randomness="different", chunk_size=2)(x)
    d = gathered(d)
    assert len({tuple(row.tolist()) for row in d}) == 3 * P


def test_random_arrays_do_not_depend_on_ranks():
    r = gathered(kvmap.random.randn(17, 3, split=0, seed=9))
    alone = kvmap.random.randn(17, 3, split=0, seed=9, comm=MPI.COMM_SELF).larray
    assert torch.equal(r, alone)
    u = gathered(kvmap.random.rand(100, split=0, seed=3))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_unseeded_draws_on_a_passed_communicator_continue_one_stream():
    # Every call converts MPI.COMM_WORLD anew; kvmap keeps one duplicate (and one stream
    # counter) per user communicator, so the draws go on instead of repeating.
    first = gathered(kvmap.random.rand(8, split=0, comm=MPI.COMM_WORLD))
    second = gathered(kvmap.random.rand(8, split=0, comm=MPI.COMM_WORLD))
    assert not torch.equal(first, second)
    third = gathered(kvmap.random.rand(8, split=0))  # comm=None: the same world communicator
    assert not torch.equal(third, first) and not torch.equal(third, second)


def test_a_failed_call_keeps_no_frames_alive():
    # f fails on its first chunk on every rank: no further chunk runs, and once the exception
    # is handled nothing of the failed call (exception, traceback, frames) stays alive.
    import gc
    import weakref

    class Marker:
        pass

    refs = []

    def f(v):
        marker = Marker()
        refs.append(weakref.ref(marker))
        raise KeyError("boom")

    x = kvmap.ones(4 * P, 3, split=0)
    with pytest.raises(KeyError, match="boom"):
        kvmap.vmap(f, chunk_size=1)(x)
    gc.collect()
    assert len(refs) == 1
    assert refs[0]() is None


def test_exception_on_one_rank_only():
    odd = 1 if P > 1 else 0
    x = kvmap.ones(2 * P, 3, split=0)

    def f(v):
        if ME == odd:
            raise KeyError("boom on rank %d" % odd)
        return v

    if ME == odd:
        with pytest.raises(KeyError, match="boom"):  # the Python type survives
            kvmap.vmap(f)(x)
    else:
        with pytest.raises(kvmap.RemoteError, match="boom") as info:
            kvmap.vmap(f)(x)
        assert info.value.failed_ranks == [odd]
    (y,) = kvmap.vmap(lambda v: v + 1)(x)  # and the next call works
    assert bool((gathered(y) == 2).all())


def test_sub_communicator():
    half = MPI.COMM_WORLD.Split(ME % 2, ME)
    full = torch.arange(4 * half.size * 3, dtype=torch.float64).reshape(4 * half.size, 3)
    x = kvmap.array(full, split=0, comm=half)
    assert x.comm_size == half.size
    (y,) = kvmap.vmap(lambda v, c=0.0: v.sum() + c)(x, c=1.0)
    assert torch.equal(gathered(y), full.sum(1) + 1.0)
    half.Free()


def test_readme_example_runs():
    here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(os.path.join(here, "..", "examples", "readme_example.py"), run_name="__main__")


def terms_near_zero(seed):
    """tests/test_tolerance.cpp's case: 64 exact float32 terms in [-2, 2) whose sum is near -0.007."""
    t = []
    for _ in range(63):
        seed = (seed * 6364136223846793005 + 1442695040888963407) % 2 ** 64
        t.append(((seed >> 40) - 2 ** 23) / 2 ** 22)
    t.append(float(torch.tensor(-sum(t) - 0.007, dtype=torch.float64).float()))
    return t


def float32_sum(values):
    s = torch.zeros((), dtype=torch.float32)
    for v in values:
        s = s + torch.as_tensor(v, dtype=torch.float32)
    return s


def test_check_close_two_summation_orders_near_zero():
    t = terms_near_zero(39)
    sign_sorted = float32_sum(sorted(t, key=lambda v: (v < 0, -abs(v))))
    lanes = [float32_sum(t[k::16]) for k in range(16)]  # 16 lanes, then pairwise
    while len(lanes) > 1:
        lanes = [float32_sum([lanes[a], lanes[a + len(lanes) // 2]]) for a in range(len(lanes) // 2)]
    blocked = lanes[0]
    exact = torch.tensor(sum(t), dtype=torch.float64)  # multiples of 2^-22 below 2^7: exact
    magnitudes = sum(abs(v) for v in t)
    # allclose(rtol=1e-4, atol=1e-5) fails between the two orders; the bound holds for both.
    assert not torch.allclose(sign_sorted, blocked, rtol=1e-4, atol=1e-5)
    for got in (sign_sorted, blocked):
        c = kvmap.check_close(got, exact, roundings=64, magnitudes=magnitudes)
        assert c and c.form == "component-wise" and c.ratio < 0.2, c
    assert kvmap.check_close(sign_sorted, blocked, roundings=64, magnitudes=magnitudes)
    wrong = kvmap.check_close(sign_sorted + 1e-3, exact, roundings=64, magnitudes=magnitudes)
    assert not wrong and wrong.ratio > 1 and "OUTSIDE" in repr(wrong)
    # Norm-wise, integers exactly, and the conftest helper's dtype check.
    ref = torch.tensor([10.0, -3.0, 1e-9], dtype=torch.float64)
    assert kvmap.check_close(ref.float(), ref).form == "norm-wise"
    bad = kvmap.check_close(ref + torch.tensor([0.0, 0.0, 1e-12]), ref)
    assert not bad and bad.position == (2,)
    assert not kvmap.check_close(torch.arange(4), torch.arange(4) + 1)
    assert not close(ref.float(), ref, 1)
