"""kvmap: per-sample torch functions vectorized over arrays distributed with MPI.

Heat-compatible spelling: ``kvmap.array``, ``kvmap.zeros/ones/arange``,
``kvmap.random.rand/randn``, ``DistView.larray/gshape/lshape/split/...`` and
``kvmap.vmap(func, out_dims=0, randomness="error", *, chunk_size=None)``;
``kvmap.map_batches(func, out_dims=0, *, chunk_size=None)`` for batch-aware functions;
``kvmap.from_heat(x)`` and ``DistView.to_heat()`` share memory with Heat's DNDarrays.

DistViews live in host memory (``device="cpu"``) or, where kvmap is built on a Kokkos with
its CUDA or HIP backend, in the GPU's (``device="gpu"``): one made from a tensor (``array``,
``from_heat``) lives where the tensor does, the other factories take ``device=``.
"""
import atexit as _atexit
import math as _math
import numbers as _numbers
import sys as _sys

import torch as _torch  # noqa: F401  (registers torch's Python types before the extension)
from mpi4py import MPI as _MPI  # noqa: F401  (initializes MPI; kvmap never finalizes it)

from . import _build


def _major_minor(v):
    return tuple(v.split("+")[0].split(".")[:2])


# The extension is compiled against one LibTorch: another torch in the environment would
# fail to load it, or worse, load it.
if _major_minor(_torch.__version__) != _major_minor(_build.TORCH_VERSION):
    raise ImportError("kvmap was built against torch %s, but this environment has torch %s: "
                      "rebuild kvmap against it (pip install --force-reinstall --no-deps kvmap, "
                      "or reconfigure the CMake build)" % (_build.TORCH_VERSION, _torch.__version__))

from . import _comms, _compile, _kvmap  # noqa: E402
from ._kvmap import (Closeness, DistView, Error, GhostExchange, RemoteError, build_info, check_close,  # noqa: E402
                     chunk_rows, from_heat, host_allocator_usage, install_host_allocator,
                     uninstall_host_allocator, version)

# mpi4py and kvmap must use one MPI library: two in one process share no communicator.
if _kvmap._mpi_library_version().strip("\x00 \n") != _MPI.Get_library_version().strip("\x00 \n"):
    raise ImportError("kvmap and mpi4py use different MPI libraries (kvmap: %r; mpi4py: %r): build "
                      "mpi4py for kvmap's MPI (MPICC=<that MPI's mpicc> pip install --no-binary "
                      "mpi4py --force-reinstall mpi4py) or kvmap for mpi4py's (MPI_HOME=<prefix>)"
                      % (_kvmap._mpi_library_version().splitlines()[0],
                         _MPI.Get_library_version().splitlines()[0]))

_kvmap._initialize()


@_atexit.register
def _finalize():
    import gc

    gc.collect()
    _kvmap._finalize()


__all__ = ["DistView", "Error", "RemoteError", "Closeness", "check_close", "array", "zeros", "ones", "full", "arange",
           "vmap", "map_batches", "map_overlap", "GhostExchange", "chunk_rows", "random", "from_heat", "manual_seed", "dot", "nrm2", "stats", "reset_stats",
           "install_host_allocator", "uninstall_host_allocator", "host_allocator_usage", "version", "build_info"]
__version__ = version()


def _device(device):
    """'cpu' or 'gpu' (Heat's names) from None (host memory), 'cpu'/'gpu'/'cuda', a
    torch.device or a Heat device."""
    if device is None:
        return "cpu"
    kind = getattr(device, "device_type", None)  # a Heat device
    if kind is None:
        kind = device.type if isinstance(device, _torch.device) else device
    if isinstance(kind, str):
        kind = kind.split(":")[0].lower()
        if kind == "cpu":
            return "cpu"
        if kind in ("gpu", "cuda", "hip"):
            return "gpu"
    raise ValueError("kvmap: device must be None, 'cpu', 'gpu', a torch.device or a Heat device, "
                     "got %r" % (device,))


def _shape(args):
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return [int(a) for a in args[0]]
    return [int(a) for a in args]


def array(obj, split=None, is_split=None, comm=None, device=None):
    """A DistView from a tensor (or anything torch.as_tensor takes), on the tensor's device
    unless ``device`` names another (the tensor is then copied there first).

    split:    every rank passes the full array and keeps its slice along ``split``.
    is_split: every rank passes its local piece; the pieces are concatenated in rank order
              along ``is_split`` (zero copy: the DistView shares the tensor's memory).
    neither:  every rank passes the full array, which is replicated.
    """
    if split is not None and is_split is not None:
        raise ValueError("kvmap.array: split and is_split are mutually exclusive, got split=%r and "
                         "is_split=%r" % (split, is_split))
    t = obj if isinstance(obj, _torch.Tensor) else _torch.as_tensor(obj)
    if device is not None and _device(device) != ("cpu" if t.device.type == "cpu" else "gpu"):
        t = t.to(_kvmap._torch_device(_device(device)))
    if is_split is not None:
        return _comms.remember(_kvmap._from_local(t, is_split, comm), comm)
    return _comms.remember(_kvmap._from_global(t, split, comm), comm)


def full(shape, fill_value, dtype=None, split=None, comm=None, device=None):
    return _comms.remember(_kvmap._full(_shape((shape,)), float(fill_value), dtype, split, comm,
                                        _device(device)), comm)


def zeros(*shape, dtype=None, split=None, comm=None, device=None):
    return _comms.remember(_kvmap._full(_shape(shape), 0.0, dtype, split, comm, _device(device)), comm)


def ones(*shape, dtype=None, split=None, comm=None, device=None):
    return _comms.remember(_kvmap._full(_shape(shape), 1.0, dtype, split, comm, _device(device)), comm)


def _arange_arg(a):
    """An arange argument as a Python int or float (NumPy scalars and 0-d tensors too)."""
    if isinstance(a, _torch.Tensor) and a.dim() == 0 and a.dtype != _torch.bool and not a.is_complex():
        a = a.item()
    if isinstance(a, bool) or not isinstance(a, _numbers.Real):
        raise TypeError("kvmap.arange: arguments must be ints or floats, got %r" % (a,))
    if isinstance(a, _numbers.Integral):
        return int(a)
    a = float(a)
    if not _math.isfinite(a):
        raise ValueError("kvmap.arange: arguments must be finite, got %r" % a)
    return a


def arange(*args, dtype=None, split=None, comm=None, device=None):
    """Like ``torch.arange``: ``arange(end)``, ``arange(start, end)`` or
    ``arange(start, end, step)``, a 1-D DistView of ``start + i * step`` below ``end``.

    The default dtype is int64 when every argument is an int, else torch's default dtype.
    Values are computed in int64 (integer arguments) or float64, then cast: torch's length
    and values (torch's float32 kernel rounds in float32, so its last bits may differ).
    """
    if not 1 <= len(args) <= 3:
        raise TypeError("kvmap.arange: expected arange(end), arange(start, end) or "
                        "arange(start, end, step), got %d arguments" % len(args))
    args = [_arange_arg(a) for a in args]
    start, end, step = (0, args[0], 1) if len(args) == 1 else (tuple(args) + (1,))[:3]
    if step == 0:
        raise ValueError("kvmap.arange: step must be nonzero")
    if (step > 0 and start > end) or (step < 0 and start < end):
        raise ValueError("kvmap.arange: start %r, end %r and step %r are inconsistent (as in "
                         "torch.arange)" % (start, end, step))
    integral = all(isinstance(a, int) for a in (start, end, step))
    if dtype is None:
        dtype = _torch.int64 if integral else _torch.get_default_dtype()
    if integral:
        n = max(0, -((start - end) // step))  # ceil((end - start) / step), exactly
    else:
        n = max(0, int(_math.ceil((end - start) / step)))
    work = _torch.int64 if integral else _torch.float64
    index = _kvmap._arange(n, work, split, comm, _device(device))  # 0 .. n-1 with kvmap's layout
    values = index.larray.mul_(step).add_(start)
    if values.dtype == dtype:
        return _comms.remember(index, comm)
    if split is None:
        return _comms.remember(_kvmap._from_global(values.to(dtype), None, comm), comm)
    return _comms.remember(_kvmap._from_local(values.to(dtype), split, comm), comm)


def manual_seed(seed, comm=None):
    """Seeds kvmap's random streams on every rank (collective)."""
    _kvmap._manual_seed(int(seed), comm)


def dot(x, y):
    """Global dot product of two DistViews with equal layouts (Kokkos Kernels + MPI)."""
    return _kvmap._dot(x, y)


def nrm2(x):
    return _kvmap._nrm2(x)


def stats():
    """Counters since start (or reset_stats()): the C++ runtime's, and compile=...'s
    (compilations, compile_seconds, compile_fallbacks)."""
    s = _kvmap._stats()
    s.update(_compile.counters())
    return s


def reset_stats():
    _kvmap._reset_stats()
    _compile.reset_counters()


def _numpy(self):
    """The global array as a NumPy array on every rank."""
    return self.allgather().cpu().numpy()


def _to(self, device):
    """This DistView on ``device`` ('cpu' or 'gpu'): itself if it is there, else a copy there
    with the same layout and communicator (collective)."""
    device = _device(device)
    if device == self.device:
        return self
    return _comms.remember(self._moved_to(device), _comms.lookup(self))


def _halo(self, depth, boundary="none"):
    """This rank's block extended along the split axis by ``depth`` rows before and after (an
    int, or ``(before, after)``), the rows beyond the global ends as ``boundary`` says
    (``map_overlap``'s meaning): a new contiguous tensor (collective)."""
    from ._vmap import _boundary, _depth
    before, after = _depth(depth)
    name, constant = _boundary(boundary)
    return self._halo(before, after, name, constant)


DistView.numpy = _numpy
DistView.to = _to
DistView.halo = _halo


from . import random  # noqa: E402
from ._vmap import map_batches, map_overlap, vmap  # noqa: E402
