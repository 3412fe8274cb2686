#!/usr/bin/env python3
"""The Python workload of ``perf/instructions.py --python``: ``calls`` calls of one contender
at local batch 16 after 50 warm-up calls (the warm-up and the interpreter's start-up cancel
out between a run with 0 calls and one with ``calls``).

    python perf/python_calls.py {raw functorch,kvmap.vmap,kvmap.vmap (DNDarray),kvmap.map_batches,direct} CALLS

f(x) = tanh(x @ W).sum() per sample of 64 float32 features, as perf/heat_vs_kvmap.py.
"kvmap.vmap (DNDarray)" maps a Heat DNDarray of the same values (where Heat is installed):
the drop-in's path, whose outputs are DNDarrays.
"""
import sys

import torch
from torch._C._functorch import _add_batch_dim, _remove_batch_dim, _vmap_decrement_nesting, _vmap_increment_nesting

import kvmap

torch.set_num_threads(1)
W = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))


def f(xi, W=None):
    return torch.tanh(xi @ W).sum()


def fb(x, W=None):
    return torch.tanh(x @ W).sum(-1)


d = kvmap.random.randn(16, 64, split=0, seed=1)
local = d.larray


def raw():
    n = local.shape[0]
    level = _vmap_increment_nesting(n, "error")
    try:
        return _remove_batch_dim(f(_add_batch_dim(local, 0, level), W=W), level, n, 0)
    finally:
        _vmap_decrement_nesting()


kf, kb = kvmap.vmap(f), kvmap.map_batches(fb)
CALLS = {"raw functorch": raw, "kvmap.vmap": lambda: kf(d, W=W)[0],
         "kvmap.map_batches": lambda: kb(d, W=W)[0], "direct": lambda: fb(local, W=W)}
if sys.argv[1] == "kvmap.vmap (DNDarray)":
    h = d.to_heat()
    CALLS[sys.argv[1]] = lambda: kf(h, W=W)[0]
call = CALLS[sys.argv[1]]
for _ in range(50):
    call()
for _ in range(int(sys.argv[2])):
    call()
