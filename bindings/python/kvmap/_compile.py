"""kvmap.vmap / kvmap.map_batches with ``compile=``: the local (chunk) function compiled with
``torch.compile`` once per callable, reused by every chunk and call; kvmap's collective steps
stay outside it. Torch's guards decide when a new signature (shapes, dtypes, devices, the
keyword arguments it guards on) compiles again; a batch length seen before in another size
makes the batch dimension dynamic, so a shorter last chunk compiles once, not every call.
Where torch cannot compile (no ``torch.compile``, a backend failure, no C++ compiler for
Inductor), the eager function runs instead after one warning: never a wrong result."""
import itertools
import time
import types
import warnings

import torch

# Counters since start (kvmap.stats() merges them; kvmap.reset_stats() clears them).
_COUNTERS = {"compilations": 0, "compile_seconds": 0.0, "compile_fallbacks": 0}


def counters():
    return dict(_COUNTERS)


def reset_counters():
    _COUNTERS.update(compilations=0, compile_seconds=0.0, compile_fallbacks=0)


def options(who, compile):
    """None for compile=False; else the keyword arguments of torch.compile (True: defaults)."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return {}
    if isinstance(compile, dict):
        return dict(compile)
    raise TypeError("%s: compile must be a bool or a dict of torch.compile options, got %r" % (who, compile))


def _counting(backend):
    """The backend, counting the graphs it compiles and the seconds it takes."""
    from torch._dynamo import lookup_backend

    inner = lookup_backend(backend) if isinstance(backend, str) else backend

    def compile_graph(gm, example_inputs):
        start = time.perf_counter()
        try:
            return inner(gm, example_inputs)
        finally:
            _COUNTERS["compilations"] += 1
            _COUNTERS["compile_seconds"] += time.perf_counter() - start

    return compile_graph


_SERIAL = itertools.count(1)


def _own_code(fn):
    """fn behind a function whose code object is its own. Dynamo keeps its compiled graphs and
    its recompilation limit per code object: every torch.func.vmap wrapper shares one, so
    without this kvmap's compiled callables would share the limit (8 by default) and the ones
    after it would silently run eagerly."""
    def chunk(*args, **kwargs):
        return fn(*args, **kwargs)

    code = chunk.__code__.replace(co_name="kvmap_chunk_%d" % next(_SERIAL))
    return types.FunctionType(code, chunk.__globals__, code.co_name, chunk.__defaults__, chunk.__closure__)


class Compiled:
    """``eager`` compiled on first use; on a failure that the eager function does not share,
    the eager function from then on (one warning). A failure both share is the caller's: it
    is raised as the eager function raises it, as without compile."""

    def __init__(self, who, eager, compile_options):
        self.who = who
        self.eager = eager
        self.options = dict(compile_options)
        self.compiled = None
        self.failed = False
        self.warned = False

    def _fall_back(self, why):
        self.failed = True
        _COUNTERS["compile_fallbacks"] += 1
        if not self.warned:
            self.warned = True
            warnings.warn("%s(compile=...): torch cannot compile this function (%s); running it "
                          "eagerly" % (self.who, why), RuntimeWarning, stacklevel=3)

    def __call__(self, *args, **kwargs):
        if not self.failed:
            if self.compiled is None:
                opts = dict(self.options)
                opts["backend"] = _counting(opts.get("backend", "inductor"))
                self.compiled = torch.compile(_own_code(self.eager), **opts)
            try:
                return self.compiled(*args, **kwargs)
            except Exception as compiled_error:  # noqa: BLE001 (decided by the eager run below)
                result = self.eager(*args, **kwargs)  # a failure of func itself raises here
                self._fall_back("%s: %s" % (type(compiled_error).__name__,
                                            str(compiled_error).strip().splitlines()[0][:300]
                                            if str(compiled_error).strip() else ""))
                return result
        return self.eager(*args, **kwargs)


def _split(array):
    """Whether an argument is mapped: a DistView or DNDarray with a split axis."""
    return getattr(array, "split", None) is not None


def available():
    """Why torch cannot compile here, or None where it can (torch.compile and torch.func)."""
    if not hasattr(torch, "compile") or not hasattr(torch, "func"):
        return "this torch (%s) has no torch.compile" % torch.__version__
    return None


def warn_unavailable(who):
    _COUNTERS["compile_fallbacks"] += 1
    warnings.warn("%s(compile=...): %s; running eagerly" % (who, available()), RuntimeWarning, stacklevel=3)


class CompiledVmap:
    """kvmap.vmap(func, compile=...): each chunk runs torch.compile(torch.func.vmap(func)) through
    kvmap.map_batches' scheduler (the chunk's mapped inputs batch-first, replicated ones whole),
    one compiled function per pattern of mapped arguments, kept on this callable."""

    def __init__(self, func, make_mapped, compile_options):
        self.__wrapped__ = func
        self.__doc__ = func.__doc__
        self.make_mapped = make_mapped  # local function -> kvmap.map_batches' callable
        self.options = compile_options
        self.by_pattern = {}

    def __call__(self, *arrays, **kwargs):
        pattern = tuple(0 if _split(a) else None for a in arrays)
        mapped = self.by_pattern.get(pattern)
        if mapped is None:
            local = torch.func.vmap(self.__wrapped__, in_dims=pattern, out_dims=0)
            mapped = self.make_mapped(Compiled("kvmap.vmap", local, self.options))
            self.by_pattern[pattern] = mapped
        return mapped(*arrays, **kwargs)
