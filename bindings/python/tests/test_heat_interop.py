"""kvmap.from_heat and DistView.to_heat under mpirun: shared memory, layouts, communicators."""
import pytest
import torch
from mpi4py import MPI

import kvmap
from conftest import F, F_ROUNDINGS, Fi, G, G_ROUNDINGS, close, loop_reference

ht = pytest.importorskip("heat")

P = MPI.COMM_WORLD.size
ME = MPI.COMM_WORLD.rank
# Uneven counts along the split axis: rank 1 holds nothing (from 2 ranks on).
COUNTS = [(3 * r + 2) % 5 for r in range(P)]


def everywhere(ok):
    """True on every rank if ``ok`` holds on every rank: a rank-local check that fails on one
    rank fails the test on all of them, instead of leaving the others in a collective."""
    return MPI.COMM_WORLD.allreduce(bool(ok), op=MPI.LAND)


def full_tensor(n, m=5, dtype=torch.float32, seed=0):
    """The same global tensor on every rank."""
    return torch.randn(n, m, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def uneven_heat(m=5, dtype=torch.float32, seed=0):
    """A DNDarray split along 0 with COUNTS rows per rank, and its global tensor."""
    full = full_tensor(sum(COUNTS), m, dtype, seed)
    start = sum(COUNTS[:ME])
    return ht.array(full[start:start + COUNTS[ME]].clone(), is_split=0), full


def heat_global(x):
    """The global array of a DNDarray on every rank (Heat's own redistribution)."""
    return ht.resplit(x, None).larray


def test_from_heat_shares_memory_and_copies_nothing():
    x = ht.array(full_tensor(4 * P + 1), split=0)
    before = kvmap.stats()
    d = kvmap.from_heat(x)
    assert everywhere(kvmap.stats()["bytes_copied"] == before["bytes_copied"])
    assert everywhere(d.larray.data_ptr() == x.larray.data_ptr())
    assert everywhere(d._local_address() == x.larray.data_ptr())
    d.larray.fill_(7.0 + ME)  # written through kvmap, seen by Heat
    assert everywhere(bool((x.larray == 7.0 + ME).all()))
    x.larray[:] = -1.0  # and the other way round
    assert everywhere(bool((d.larray == -1.0).all()))


def test_to_heat_shares_memory_and_copies_nothing():
    d = kvmap.random.randn(3 * P + 2, 4, split=0, seed=5)
    before = kvmap.stats()
    h = d.to_heat()
    after = kvmap.stats()
    assert everywhere(after["bytes_copied"] == before["bytes_copied"])
    assert everywhere(after["collectives"] == before["collectives"])  # kvmap communicates nothing
    assert everywhere(isinstance(h, ht.DNDarray))
    assert everywhere(h.larray.data_ptr() == d.larray.data_ptr())
    h.larray.mul_(0).add_(ME + 1)
    assert everywhere(bool((d.larray == ME + 1).all()))
    assert everywhere(torch.equal(heat_global(h), d.allgather()))


@pytest.mark.parametrize("split", [0, 1])
def test_split_gshape_and_lshape_carry_over(split):
    full = full_tensor(2 * P + 1, 3 * P + 2, seed=11)
    x = ht.array(full, split=split)
    d = kvmap.from_heat(x)
    assert d.split == split and tuple(d.gshape) == tuple(x.gshape)
    assert everywhere(tuple(d.lshape) == tuple(x.lshape))
    assert everywhere(torch.equal(d.lshape_map, x.lshape_map))
    assert everywhere(torch.equal(d.allgather(), full))
    h = d.to_heat()
    assert h.split == split and tuple(h.gshape) == tuple(x.gshape)
    assert everywhere(tuple(h.lshape) == tuple(x.lshape))
    assert everywhere(torch.equal(h.lshape_map, x.lshape_map))
    assert everywhere(h.balanced is True)
    assert everywhere(h.is_balanced(force_check=True))
    assert everywhere(torch.equal(heat_global(h), full))


def test_unbalanced_and_empty_shards():
    x, full = uneven_heat(seed=12)
    expected_map = [[c, 5] for c in COUNTS]
    d = kvmap.from_heat(x)
    assert everywhere(d.lshape_map.tolist() == expected_map)
    assert everywhere(tuple(d.lshape) == (COUNTS[ME], 5) and tuple(d.gshape) == (sum(COUNTS), 5))
    assert everywhere(d.is_balanced() == x.is_balanced(force_check=True))
    assert everywhere(torch.equal(d.allgather(), full))
    h = d.to_heat()
    assert everywhere(h.lshape_map.tolist() == expected_map)  # kvmap's counts, not Heat's even chunks
    assert everywhere(h.balanced == x.is_balanced(force_check=True))
    assert everywhere(h.larray.data_ptr() == x.larray.data_ptr() or COUNTS[ME] == 0)
    assert everywhere(torch.equal(heat_global(h), full))
    h.balance_()  # Heat redistributes from the counts it was given
    assert everywhere(torch.equal(heat_global(h), full))
    assert everywhere(h.is_balanced(force_check=True))


def test_replicated():
    full = full_tensor(6, seed=13)
    x = ht.array(full)  # split None: every rank holds the whole array
    d = kvmap.from_heat(x)
    assert everywhere(d.split is None and tuple(d.lshape) == tuple(d.gshape) == (6, 5))
    assert everywhere(d.larray.data_ptr() == x.larray.data_ptr())
    h = d.to_heat()
    assert everywhere(h.split is None and tuple(h.lshape) == (6, 5))
    assert everywhere(h.larray.data_ptr() == x.larray.data_ptr())
    assert everywhere(torch.equal(h.lshape_map, x.lshape_map))
    h2 = kvmap.array(full).to_heat()  # a DistView replicated by kvmap
    assert everywhere(h2.split is None and torch.equal(h2.larray, full))


def test_round_trips_share_memory():
    x, _ = uneven_heat(seed=14)
    h = kvmap.from_heat(x).to_heat()
    assert everywhere(h.larray.data_ptr() == x.larray.data_ptr() or COUNTS[ME] == 0)
    assert everywhere(h.comm is x.comm and h.split == x.split and tuple(h.gshape) == tuple(x.gshape))
    d = kvmap.random.rand(4 * P, 2, split=1, seed=3)
    back = kvmap.from_heat(d.to_heat())
    assert everywhere(back.larray.data_ptr() == d.larray.data_ptr())
    assert everywhere(back.split == 1 and torch.equal(back.lshape_map, d.lshape_map))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool, torch.complex64])
def test_dtypes(dtype):
    x = ht.array((full_tensor(2 * P, 3, seed=15) * 4).to(dtype), split=0)
    d = kvmap.from_heat(x)
    assert everywhere(d.dtype == dtype)
    h = d.to_heat()
    assert everywhere(h.dtype == x.dtype and h.larray.dtype == dtype)
    assert everywhere(h.larray.data_ptr() == x.larray.data_ptr())


def test_end_to_end_vmap():
    # Heat array -> kvmap.vmap -> Heat array, against a per-sample loop on the gathered input.
    x, _ = uneven_heat(m=8, seed=16)
    W = torch.randn(8, 3, generator=torch.Generator().manual_seed(17))

    def f(v, W=None):
        return torch.tanh(v @ W).sum()

    for chunk_size in (None, 2):
        (e,) = kvmap.vmap(f, chunk_size=chunk_size)(kvmap.from_heat(x), W=W)
        h = e.to_heat()
        assert everywhere(h.split == 0 and tuple(h.gshape) == (sum(COUNTS),))
        assert everywhere(h.lshape_map.tolist() == [[c] for c in COUNTS])
        assert everywhere(h.comm is x.comm)
        (ref,) = loop_reference(f, [heat_global(x)], [0], 0, W=W)
        # An 8-term dot product, tanh, a 3-term sum.
        assert everywhere(close(heat_global(h), ref, 8 + 4 + 3))
        assert everywhere(close(h.larray, ht.vmap(f)(x, W=W)[0].larray, 8 + 4 + 3))


def test_communicators():
    # A DistView knows the communicator it was made on; to_heat takes another one of the same
    # ranks, and refuses one of other ranks.
    half = MPI.COMM_WORLD.Split(ME % 2, ME)
    full = full_tensor(3 * half.size, seed=18)
    d = kvmap.array(full, split=0, comm=half)
    h = d.to_heat()  # Heat gets its own duplicate of `half`
    assert everywhere(h.comm.size == half.size and h.comm.rank == half.rank)
    assert everywhere(torch.equal(heat_global(h), full))
    (s,) = kvmap.vmap(lambda v: v.sum())(kvmap.from_heat(h))
    assert everywhere(s.to_heat().comm is h.comm and s.comm_size == half.size)
    assert everywhere(close(heat_global(s.to_heat()), full.sum(1), full.shape[1]))
    d2 = kvmap.array(full, split=0, comm=half)
    half.Free()  # kvmap keeps its own duplicate; d2's Python record is now MPI.COMM_NULL
    with pytest.raises(ValueError, match="freed"):
        d2.to_heat()
    assert everywhere(d2.to_heat(comm=h.comm).larray.data_ptr() == d2.larray.data_ptr())
    assert everywhere(d.to_heat().comm is h.comm)  # d's duplicate for Heat, made once, outlives `half`
    w = kvmap.zeros(2 * P, split=0).to_heat(comm=MPI.COMM_WORLD)
    assert everywhere(w.comm is ht.communication.MPI_WORLD)
    if P > 1:
        with pytest.raises(ValueError, match="rank"):
            kvmap.zeros(2 * P, split=0).to_heat(comm=MPI.COMM_SELF)


def test_errors():
    with pytest.raises(TypeError, match="heat.DNDarray"):
        kvmap.from_heat(torch.zeros(3))
    with pytest.raises(TypeError, match="heat.DNDarray"):
        kvmap.from_heat(kvmap.zeros(3))
    with pytest.raises(TypeError, match="comm"):
        kvmap.zeros(3).to_heat(comm="world")
    with pytest.raises(TypeError, match="dtype"):
        kvmap.zeros(2 * P, dtype=torch.bfloat16, split=0).to_heat()


# ---- kvmap.vmap / kvmap.map_batches as drop-ins for heat.vmap on DNDarrays ------------------

def same_dndarray(got, want, roundings):
    """kvmap's output DNDarray against heat.vmap's: type, split, gshape, lshape, dtype,
    device, balance and values within the rounding bound of the function (``roundings``, see
    conftest.close; checked on every rank, agreed)."""
    ok = (isinstance(got, ht.DNDarray) and got.split == want.split
          and tuple(got.gshape) == tuple(want.gshape) and tuple(got.lshape) == tuple(want.lshape)
          and got.dtype == want.dtype and got.device == want.device
          and got.larray.dtype == want.larray.dtype
          and got.is_balanced(force_check=True) == want.is_balanced(force_check=True)
          and bool(close(got.larray, want.larray, roundings)))
    return everywhere(ok)


def same_results(got, want, roundings):
    """``roundings``: one per output."""
    return (everywhere(isinstance(got, tuple) and isinstance(want, tuple) and len(got) == len(want))
            and all(same_dndarray(g, w, r) for g, w, r in zip(got, want, roundings)))


def heat_cases():
    """heat.vmap's own cases (Heat's test_vmap: one and several inputs and outputs, out_dims as
    an int and a tuple, other split axes, chunk sizes, keyword arguments), on balanced and
    unbalanced (one empty shard) DNDarrays, each with its outputs' roundings (conftest.close)."""
    x, _ = uneven_heat(m=6, seed=30)
    y, _ = uneven_heat(m=6, seed=31)
    b = ht.array(full_tensor(2 * P + 3, 4, seed=32), split=0)  # balanced
    cols = ht.array(full_tensor(5, 2 * P + 1, seed=33), split=1)  # batch along axis 1
    W = torch.randn(6, 3, generator=torch.Generator().manual_seed(34))
    # heat.vmap with a chunk_size fails on an empty shard (torch.vmap's chunking of 0 samples):
    # its chunked cases get shards that are never empty.
    bx = ht.array(full_tensor(2 * P + 3, 6, seed=41), split=0)
    by = ht.array(full_tensor(2 * P + 3, 6, seed=42), split=0)

    def one(v):
        return v.sum()

    def two_in_two_out(v, w):
        return v * w, (v - w).norm()

    def with_kwargs(v, W=None, scale=1.0):
        return torch.tanh(v @ W) * scale

    def expand(v):
        return torch.outer(v, v[:2])  # a per-sample matrix

    # Heat's own test_vmap cases: x0 (5P, 10, 10) split 0 with x1 (10, 5P) split 1 (mapped
    # along axis 1) or replicated (passed whole), keyword arguments, an int output.
    x0 = ht.array(full_tensor(5 * P, 100, seed=43).reshape(5 * P, 10, 10), split=0)
    x1_split = ht.array(full_tensor(10, 5 * P, seed=44), split=1)
    x1_whole = ht.array(full_tensor(10, 5 * P, seed=44), split=None)
    x0_64 = ht.array(full_tensor(5 * P, 100, torch.float64, seed=45).reshape(5 * P, 10, 10), split=0)
    x1_64 = ht.array(full_tensor(10, 5 * P, torch.float64, seed=46), split=1)

    # Roundings: a 6-term sum; a product, and a difference, squares, a 6-term sum and a root;
    # a product; a 6-term dot product, tanh and the scale; exp. Fi's int output is exact.
    one_r, two_r, outer_r, tanh_r = (6,), (1, 1 + 1 + 6 + 1), (1,), (6 + 4 + 1,)
    return [
        ("Heat (a): split 0 and split 1 inputs", F, (x0, x1_split), {"out_dims": 0}, {"k": 2, "scale": 2.2},
         F_ROUNDINGS),
        ("Heat (b): a replicated input, out_dims (0, 1)", Fi, (x0, x1_whole), {"out_dims": (0, 1)},
         {"k": 2, "scale": 2.2}, F_ROUNDINGS),
        ("Heat (c): out_dims (0,)", G, (x0,), {"out_dims": (0,)}, {"m": 2, "scale": 3}, (G_ROUNDINGS,)),
        ("Heat chunks: x1 split 1, chunk_size 3", F, (x0, x1_split), {"out_dims": (0, 0), "chunk_size": 3},
         {"k": 2, "scale": -2.2}, F_ROUNDINGS),
        ("Heat chunks: x1 replicated, chunk_size 4", F, (x0, x1_whole), {"out_dims": (0, 0), "chunk_size": 4},
         {"k": 2, "scale": -2.2}, F_ROUNDINGS),
        ("Heat chunks: float64, chunk_size 2", F, (x0_64, x1_64), {"out_dims": (0, 0), "chunk_size": 2},
         {"k": 2, "scale": -2.2}, F_ROUNDINGS),
        ("one input, one output", one, (b,), {}, {}, one_r),
        ("unbalanced, one empty shard", one, (x,), {}, {}, one_r),
        ("two inputs, two outputs", two_in_two_out, (x, y), {}, {}, two_r),
        ("out_dims tuple", two_in_two_out, (x, y), {"out_dims": (1, 0)}, {}, two_r),
        ("out_dims int for every output", expand, (b,), {"out_dims": 2}, {}, outer_r),
        ("split along axis 1", lambda v: v * 2, (cols,), {}, {}, (1,)),
        ("split 1 to out_dims 1", lambda v: v.flip(0), (cols,), {"out_dims": 1}, {}, (1,)),
        ("keyword arguments", with_kwargs, (x,), {}, {"W": W, "scale": 0.5}, tanh_r),
        ("chunk_size 1", with_kwargs, (bx,), {"chunk_size": 1}, {"W": W}, tanh_r),
        ("chunk_size 2", two_in_two_out, (bx, by), {"chunk_size": 2}, {}, two_r),
        ("float64", lambda v: v.double().exp(), (b,), {}, {}, (4,)),
    ]


N_CASES = 17


@pytest.mark.parametrize("case", range(N_CASES))
def test_vmap_on_dndarrays_matches_heat_vmap(case):
    cases = heat_cases()
    assert len(cases) == N_CASES
    name, f, args, options, kwargs, roundings = cases[case]
    want = ht.vmap(f, **options)(*args, **kwargs)
    before = kvmap.stats()["bytes_copied"]
    got = kvmap.vmap(f, **options)(*args, **kwargs)
    assert same_results(got, want, roundings), name
    # Zero copy in and out: the inputs' shards were mapped in place, the outputs adopted.
    if "chunk_size" not in options:
        assert everywhere(kvmap.stats()["bytes_copied"] == before), name
    # Inputs untouched and still Heat's.
    assert everywhere(all(isinstance(a, ht.DNDarray) for a in args))


def test_vmap_on_dndarrays_keeps_local_counts_and_communicator():
    x, full = uneven_heat(m=3, seed=35)
    (s,) = kvmap.vmap(lambda v: v.sum())(x)
    assert everywhere(s.lshape_map.tolist() == [[c] for c in COUNTS])
    assert everywhere(s.comm is x.comm)
    assert everywhere(close(heat_global(s), full.sum(1), full.shape[1]))
    # The output's shard is the memory kvmap wrote: a DNDarray over it, no copy.
    assert everywhere(s.larray.is_contiguous())


def test_map_batches_on_dndarrays():
    x, full = uneven_heat(m=4, seed=36)
    W = torch.randn(4, 2, generator=torch.Generator().manual_seed(37))
    for chunk_size in (None, 2):
        (e,) = kvmap.map_batches(lambda v, W=None: torch.tanh(v @ W), chunk_size=chunk_size)(x, W=W)
        want = ht.vmap(lambda v, W=None: torch.tanh(v @ W))(x, W=W)[0]
        assert same_dndarray(e, want, 4 + 4)  # a 4-term dot product, tanh
        assert everywhere(close(heat_global(e), torch.tanh(full @ W), 4 + 4))


def test_dndarrays_and_distviews_mix_and_distviews_stay_distviews():
    x, full = uneven_heat(m=3, seed=38)
    d = kvmap.from_heat(ht.array(full_tensor(sum(COUNTS), 3, seed=39)[sum(COUNTS[:ME]):sum(COUNTS[:ME + 1])].clone(),
                                 is_split=0))
    (mixed,) = kvmap.vmap(lambda a, b: a + b)(x, d)
    assert everywhere(isinstance(mixed, ht.DNDarray))
    (plain,) = kvmap.vmap(lambda a, b: a + b)(d, d)
    assert everywhere(isinstance(plain, kvmap.DistView))
    assert everywhere(close(mixed.larray, x.larray + d.larray, 1))


def test_dndarray_errors_match_heat():
    x, _ = uneven_heat(m=3, seed=40)
    for mapped in (kvmap.vmap(lambda v: v), kvmap.map_batches(lambda v: v)):
        with pytest.raises(TypeError, match="positional argument 1 must be a kvmap.DistView or a heat.DNDarray"):
            mapped(x, torch.zeros(3))
    with pytest.raises(ValueError, match="out_dims"):
        kvmap.vmap(lambda v: (v, v), out_dims=(0,))(x)
    with pytest.raises(ValueError, match="out_dims"):
        ht.vmap(lambda v: (v, v), out_dims=(0,))(x)


def test_balanced_dndarray_adoption_follows_its_shard():
    """A balanced DNDarray mapped call after call (adopted without communication, the adoption
    kept while its shard is the same memory): results follow its shard changed in place
    (shared memory) and replaced by a new tensor (adopted again)."""
    full = full_tensor(4 * P + 3, 3, seed=50).mul(8).round()  # small integers: exact sums
    x = ht.array(full.clone(), split=0)  # Heat slices its argument without a copy
    assert x.balanced
    double = kvmap.vmap(lambda v: v * 2)
    for _ in range(2):
        (y,) = double(x)
        assert everywhere(torch.equal(heat_global(y), full * 2))
    x.larray.add_(1)
    (y,) = double(x)
    assert everywhere(torch.equal(heat_global(y), (full + 1) * 2))
    x.larray = x.larray + 1
    (y,) = double(x)
    assert everywhere(torch.equal(heat_global(y), (full + 2) * 2))
    (s,) = kvmap.map_batches(lambda v: v.sum(1))(x)
    assert everywhere(torch.equal(heat_global(s), (full + 2).sum(1)))


def test_dndarray_whose_shard_contradicts_its_layout_is_an_error_on_every_rank():
    """A balanced DNDarray whose shard on one rank no longer has the shape its metadata gives
    (its private storage replaced there, Heat's flags untouched), mapped before and after:
    every rank raises (the original error on that rank, RemoteError elsewhere), none waits."""
    x = ht.array(full_tensor(4 * P, 3, seed=51), split=0)
    double = kvmap.vmap(lambda v: v * 2)
    double(x)
    bad = P - 1
    if ME == bad:
        x._DNDarray__array = torch.zeros(5, 3)
    with pytest.raises(ValueError if ME == bad else kvmap.RemoteError,
                       match="rank %d's (tensor|shard on rank %d) has shape|shard on rank %d has shape"
                       % (bad, bad, bad)):
        double(x)


def test_heat_private_fields():
    """What kvmap's Heat adapter (bindings/python/src/heat_adapter.cpp) relies on of Heat's
    DNDarray: each constructor argument stored under its private name, holding what the
    public property returns, and DNDarray.__new__ being object's (results are then built from
    a copy of a first result's __dict__). A Heat release that changes them fails here, naming
    the field: the adapter still works through the properties, but slower, and must be
    brought up to date."""
    x = ht.array(full_tensor(2 * P + 1), split=0)
    report = kvmap._kvmap._heat_private_fields(x)
    fields = {k: v for k, v in report.items() if k.startswith("_DNDarray__")}
    for field, (prop, present, same) in fields.items():
        assert present, ("Heat %s no longer stores DNDarray.%s under %s: update kvmap's Heat adapter"
                         % (ht.__version__, prop, field))
        assert same, ("Heat %s's DNDarray field %s no longer holds what .%s returns: update kvmap's "
                      "Heat adapter" % (ht.__version__, field, prop))
    assert report["__new__ is object.__new__"], (
        "Heat %s's DNDarray has a __new__ of its own: kvmap's Heat adapter builds results from a "
        "template __dict__ and must be updated" % ht.__version__)
    assert len(fields) == 7
