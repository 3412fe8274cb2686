"""Process-count-invariant random DistViews: values depend only on (seed, global index)."""
from . import _comms, _device, _kvmap


def _shape(args):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return [int(a) for a in args[0]]
    return [int(a) for a in args]


def rand(*shape, dtype=None, split=None, seed=None, comm=None, device=None):
    """Uniform in [0, 1)."""
    return _comms.remember(_kvmap._random("uniform", _shape(shape), dtype, split, seed, comm,
                                          _device(device)), comm)


def randn(*shape, dtype=None, split=None, seed=None, comm=None, device=None):
    """Standard normal."""
    return _comms.remember(_kvmap._random("normal", _shape(shape), dtype, split, seed, comm,
                                          _device(device)), comm)
