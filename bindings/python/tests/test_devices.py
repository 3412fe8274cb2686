"""DistViews in every memory space the build has: host memory always, the GPU's in a CUDA or
HIP build (scripts/gpu-check.sh runs these there). References are computed by torch on the
host in float64, independently of kvmap."""
import pytest
import torch

import kvmap

from conftest import close


def _gpu_built():
    try:
        kvmap._kvmap._torch_device("gpu")
        return True
    except ValueError:
        return False


GPU = _gpu_built()
needs_gpu = pytest.mark.skipif(not GPU, reason="kvmap built without a GPU backend")


def test_device_names():
    x = kvmap.zeros(5, 3, split=0)
    assert x.device == "cpu" and x.larray.device.type == "cpu"
    assert x.to("cpu") is x
    assert kvmap.ones(4, device=torch.device("cpu")).device == "cpu"
    assert "device=cpu" in repr(x)
    with pytest.raises(ValueError, match="device must be"):
        kvmap.zeros(4, device="tpu")
    with pytest.raises(ValueError, match="device must be"):
        kvmap.zeros(4, device=3)


@pytest.mark.skipif(GPU, reason="kvmap built with a GPU backend")
def test_gpu_asked_of_a_host_only_build_is_a_clear_error():
    for make in (lambda: kvmap.zeros(4, 2, split=0, device="gpu"),
                 lambda: kvmap.arange(6, split=0, device="cuda"),
                 lambda: kvmap.random.randn(4, split=0, seed=1, device="gpu"),
                 lambda: kvmap.zeros(4, split=0).to("gpu")):
        with pytest.raises(ValueError, match="built for host memory only"):
            make()


@needs_gpu
def test_factories_on_the_gpu_equal_the_host_ones(comm):
    for device in ("gpu", "cuda", torch.device(kvmap._kvmap._torch_device("gpu"))):
        g = kvmap.random.randn(37, 5, split=0, seed=3, device=device)
        h = kvmap.random.randn(37, 5, split=0, seed=3)
        assert g.device == "gpu" and g.larray.is_cuda and g.lshape_map.tolist() == h.lshape_map.tolist()
        # The same Philox streams: equal up to the device's rounding of the transform.
        assert close(g.allgather().cpu(), h.allgather(), roundings=8)
    a = kvmap.arange(11, split=0, device="gpu")
    assert torch.equal(a.allgather().cpu(), torch.arange(11))


@needs_gpu
def test_vmap_on_gpu_dist_views(comm):
    x = kvmap.random.randn(203, 64, split=0, seed=1, device="gpu")
    W = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))
    Wg = W.to(kvmap._kvmap._torch_device("gpu"))

    def energy(xi, W=None):
        return torch.tanh(xi @ W).sum()

    kvmap.reset_stats()
    (e,) = kvmap.vmap(energy, chunk_size=50)(x, W=Wg)
    assert e.device == "gpu" and e.larray.is_cuda and e.split == 0
    assert kvmap.stats()["bytes_copied"] == 0
    expect = torch.tanh(x.larray.cpu().double() @ W.double()).sum(-1)
    assert close(e.larray.cpu(), expect.float(), roundings=64 + 4 + 16)
    (b,) = kvmap.map_batches(lambda xs, W=None: torch.tanh(xs @ W).sum(-1))(x, W=Wg)
    assert b.device == "gpu" and close(b.larray.cpu(), expect.float(), roundings=64 + 4 + 16)


@needs_gpu
def test_spaces_do_not_mix_and_move_with_to(comm):
    g = kvmap.random.rand(20, 3, split=0, seed=5, device="gpu")
    h = kvmap.random.rand(20, 3, split=0, seed=5)
    with pytest.raises(TypeError, match="one memory space"):
        kvmap.vmap(lambda a, b: a + b)(g, h)
    with pytest.raises(TypeError, match="one memory space"):
        kvmap.dot(g, h)
    back = g.to("cpu")
    assert back.device == "cpu" and back.lshape_map.tolist() == g.lshape_map.tolist()
    assert torch.equal(back.larray, g.larray.cpu())
    there = back.to("gpu")
    assert there.device == "gpu" and torch.equal(there.larray.cpu(), back.larray)
    # array() of a GPU tensor lives on the GPU, zero copy for is_split.
    t = torch.ones(4, 2, device=kvmap._kvmap._torch_device("gpu"))
    a = kvmap.array(t, is_split=0)
    assert a.device == "gpu" and a._local_address() == t.data_ptr()


@needs_gpu
def test_heat_dndarray_on_the_gpu_is_mapped_there(comm):
    heat = pytest.importorskip("heat")
    if not hasattr(heat, "gpu"):
        pytest.skip("Heat without GPU support")
    x = heat.random.randn(40, 8, split=0, device="gpu")
    view = kvmap.from_heat(x)
    assert view.device == "gpu" and view._local_address() == x.larray.data_ptr()
    (y,) = kvmap.vmap(lambda r: (r * r).sum())(x)
    assert isinstance(y, heat.DNDarray) and y.larray.is_cuda
    expect = (x.larray.cpu().double() ** 2).sum(-1)
    assert close(y.larray.cpu(), expect.float(), roundings=8 + 1)
