"""chunk_size="auto" under a memory budget, chunks run again in halves when func runs out of
memory (MemoryError, torch.OutOfMemoryError), and pad_to_chunk for programs made for one
batch size. References: torch on the gathered inputs."""
import pytest
import torch
from mpi4py import MPI

import kvmap
from conftest import close

P = MPI.COMM_WORLD.size
ME = MPI.COMM_WORLD.rank


def _full(n, d, seed):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_auto_chunk_under_a_budget():
    full = _full(300 * P, 32, 1)
    x = kvmap.array(full, split=0)

    def f(xi):  # 2 x 64 KiB per sample
        return (xi.unsqueeze(-1).expand(32, 512).contiguous() * 2.0).sum()

    kvmap.reset_stats()
    (y,) = kvmap.vmap(f, chunk_size="auto", memory_budget=4 << 20)(x)
    s = kvmap.stats()
    assert 1 <= s["auto_chunk_size"] < 300
    assert s["auto_chunk_size"] * s["auto_bytes_per_sample"] <= 4 << 20
    assert s["auto_bytes_per_sample"] >= 2 * 32 * 512 * 4
    ref = (full.double().sum(1) * 1024.0).float()
    assert close(y.allgather(), ref, roundings=32 * 512 + 2)
    # The default budget (from the host's available memory) runs too.
    (z,) = kvmap.vmap(f, chunk_size="auto")(x)
    assert close(z.allgather(), ref, roundings=32 * 512 + 2)


@pytest.mark.parametrize("error", [MemoryError, torch.OutOfMemoryError if hasattr(torch, "OutOfMemoryError")
                                   else torch.cuda.OutOfMemoryError])
def test_out_of_memory_on_one_rank_halves_the_chunk(error):
    victim = P - 1
    full = _full(23 * P, 4, 2)
    x = kvmap.array(full, split=0)

    def f(xs):
        if ME == victim and kvmap.chunk_rows() > 3:
            raise error("injected: %d rows" % kvmap.chunk_rows())
        return xs * 3.0 + 1.0

    kvmap.reset_stats()
    (y,) = kvmap.map_batches(f, chunk_size=16)(x)
    assert torch.equal(y.allgather(), full * 3.0 + 1.0)
    retries = kvmap.stats()["chunk_retries"]
    assert retries >= 2 if ME == victim else retries == 0


def test_one_sample_too_large_is_an_error_everywhere():
    x = kvmap.array(_full(5 * P, 2, 3), split=0)

    def f(xi):
        if ME == P - 1:
            raise MemoryError("injected: no sample fits")
        return xi

    with pytest.raises(MemoryError if ME == P - 1 else kvmap.RemoteError, match="no sample fits"):
        kvmap.vmap(f, chunk_size=4)(x)


def test_pad_to_chunk_gives_every_chunk_the_same_rows():
    seen = set()

    def f(xs):
        seen.add(xs.shape[0])
        real = kvmap.chunk_rows()
        if real < xs.shape[0]:
            assert torch.equal(xs[real:], xs[real - 1:real].expand(xs.shape[0] - real, -1))
        return torch.tanh(xs) + xs.sum(1, keepdim=True)

    for n in (1, 7, 8, 9, 30):
        full = _full(n, 3, 10 + n)
        x = kvmap.array(full, split=0)
        (y,) = kvmap.map_batches(f, chunk_size=8, pad_to_chunk=True)(x)
        assert close(y.allgather(), torch.tanh(full) + full.sum(1, keepdim=True), roundings=4 + 3 + 1)
    assert seen <= {8}
    with pytest.raises(TypeError, match="pad_to_chunk must be a bool"):
        kvmap.map_batches(f, chunk_size=8, pad_to_chunk=1)
    with pytest.raises(TypeError, match="chunk_size must be an int, 'auto' or None"):
        kvmap.vmap(f, chunk_size="big")
    with pytest.raises(ValueError, match="pad_to_chunk needs a chunk size"):
        kvmap.map_batches(f, pad_to_chunk=True)(kvmap.array(_full(4, 3, 1), split=0))


def test_host_allocator_keeps_and_reuses_blocks():
    """kvmap's caching allocator in torch's CPU slot: a freed 8 MiB tensor's block serves the
    next tensor of its size; torch's results are unchanged (the same kernels on other memory);
    torch's allocator is back afterwards."""
    assert not kvmap.host_allocator_usage()["installed"]
    full = _full(64 * P, 256, 3)
    x = kvmap.array(full, split=0)

    def f(xs):  # 64 KiB per sample of temporaries: an 8 MiB block per chunk of 128 rows
        return torch.tanh(xs.unsqueeze(-1).expand(xs.shape[0], 256, 64).contiguous()).sum((1, 2))

    (plain,) = kvmap.map_batches(f)(x)
    kvmap.install_host_allocator(cache_bytes=64 << 20)
    try:
        assert kvmap.host_allocator_usage()["installed"]
        a = torch.empty(8 << 20, dtype=torch.uint8)
        where = a.data_ptr()
        del a
        b = torch.ones(2 << 20, dtype=torch.float32)  # the same 8 MiB
        assert b.data_ptr() == where
        assert float(b.sum()) == float(2 << 20)
        del b
        for _ in range(3):
            (cached,) = kvmap.map_batches(f)(x)
            assert torch.equal(cached.allgather(), plain.allgather())
        u = kvmap.host_allocator_usage()
        assert u["reused"] >= 3 and u["bytes_kept"] <= 64 << 20 and u["bytes_kept_peak"] > 0
    finally:
        kvmap.uninstall_host_allocator()
    assert not kvmap.host_allocator_usage()["installed"]
    assert kvmap.host_allocator_usage()["bytes_kept"] == 0
