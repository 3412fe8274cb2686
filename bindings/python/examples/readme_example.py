# The Python example of docs/python.md (run by the tests under mpirun).
import torch
import kvmap

x = kvmap.random.randn(1000, 64, split=0, seed=1)  # 1000 samples over the ranks
W = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))


def energy(xi, W=None, scale=1.0):  # written for ONE sample: xi has shape (64,)
    return scale * torch.tanh(xi @ W).sum()


(e,) = kvmap.vmap(energy, chunk_size=256)(x, W=W, scale=0.5)
print(e.gshape, e.split, e.lshape_map.tolist())  # (1000,) 0 [[500], [500]] on 2 ranks
# Against the formula in float64, within the rounding bound of float32: a 64-term dot
# product, tanh (4), a 16-term sum and the scale (chunking changes only the rounding).
expect = 0.5 * torch.tanh(x.larray.double() @ W.double()).sum(-1)
assert kvmap.check_close(e.larray, expect, roundings=64 + 4 + 16 + 1)
