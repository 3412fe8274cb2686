"""kvmap.vmap / kvmap.map_batches with ``compile=``: the local (chunk) function compiled once and
reused by every chunk and call; kvmap's collective steps stay outside it. Two runners:

- ``compile=True`` (or a dict of torch.compile options): ``torch.compile``. Torch's guards,
  checked at every chunk call, decide when a new signature (shapes, dtypes, devices, the keyword
  arguments it guards on, globals the function reads) compiles again; a batch length seen before
  in another size makes the batch dimension dynamic, so a shorter last chunk compiles once.
- ``compile="trace"``: as ``jax.jit``. The function is traced once per signature that kvmap
  checks itself (each tensor's shape, strides, dtype and device; the other arguments by value)
  into a graph of aten operations (``make_fx`` with fake tensors) and compiled by Inductor
  (``torch._inductor.compile``); a chunk call is a dictionary lookup and the compiled code, with
  no Dynamo frame or guards. Tensors the function reads from outside its arguments (globals,
  closures, module parameters) are those objects at the first call of a signature (changed in
  place they are seen; rebound they are not). vmap pads chunks to the chunk size (one shape,
  one compilation).

Where torch cannot compile (no ``torch.compile``, a backend failure, data-dependent control flow
under ``"trace"``, no C++ compiler for Inductor), the eager function runs instead after one
warning: never a wrong result."""
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


TRACE = "trace"


def options(who, compile):
    """None for compile=False; "trace"; else the keyword arguments of torch.compile (True: defaults)."""
    if compile is False or compile is None:
        return None
    if compile is True:
        return {}
    if isinstance(compile, str) and compile == TRACE:
        return TRACE
    if isinstance(compile, dict):
        return dict(compile)
    raise TypeError("%s: compile must be a bool, 'trace' or a dict of torch.compile options, got %r"
                    % (who, compile))


def runner(who, eager, compile_options):
    """The chunk function for compile_options (options()' result)."""
    if compile_options == TRACE:
        return Traced(who, eager)
    return Compiled(who, eager, compile_options)


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


def _why(error):
    text = str(error).strip()
    return "%s: %s" % (type(error).__name__, text.splitlines()[0][:300] if text else "")


class _Runner:
    """What both runners share: the eager function, and falling back to it with one warning
    on a failure that the eager function does not share. A failure both share is the
    caller's: it is raised as the eager function raises it, as without compile."""

    def __init__(self, who, eager):
        self.who = who
        self.eager = eager
        self.failed = False
        self.warned = False

    def _eager_after(self, error, args, kwargs, for_good=True):
        result = self.eager(*args, **kwargs)  # a failure of func itself raises here
        self.failed = self.failed or for_good
        _COUNTERS["compile_fallbacks"] += 1
        if not self.warned:
            self.warned = True
            warnings.warn("%s(compile=...): torch cannot compile this function (%s); running it "
                          "eagerly" % (self.who, _why(error)), RuntimeWarning, stacklevel=3)
        return result


class Compiled(_Runner):
    """compile=True: ``torch.compile(eager)``, made at the first call."""

    def __init__(self, who, eager, compile_options):
        super().__init__(who, eager)
        self.options = dict(compile_options)
        self.compiled = None

    def __call__(self, *args, **kwargs):
        if self.failed:
            return self.eager(*args, **kwargs)
        if self.compiled is None:
            opts = dict(self.options)
            opts["backend"] = _counting(opts.get("backend", "inductor"))
            self.compiled = torch.compile(_own_code(self.eager), **opts)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as compiled_error:  # noqa: BLE001 (decided by the eager run)
            return self._eager_after(compiled_error, args, kwargs)


class Traced(_Runner):
    """compile="trace": one Inductor program per signature, traced without Dynamo. At most
    PROGRAMS per callable (as Dynamo's recompile limit): a number passed by keyword that
    changes every call would otherwise compile at every call; the signatures beyond run
    eagerly after the one warning (pass such values as tensors: they are inputs)."""

    PROGRAMS = 32

    def __init__(self, who, eager):
        super().__init__(who, eager)
        self.programs = {}  # signature -> (compiled program, whether func returns one tensor)

    @staticmethod
    def _signature(args, kwargs):
        """The tensors (positional ones, then keyword ones by name) and the signature: where each
        tensor sits, its shape, strides, dtype and device; every other value as it is."""
        tensors, key = [], []
        for where, value in itertools.chain(enumerate(args), sorted(kwargs.items())):
            if isinstance(value, torch.Tensor):
                tensors.append(value)
                key.append((where, tuple(value.shape), value.stride(), value.dtype, value.device))
            else:
                key.append((where, type(value), value))
        return tensors, tuple(key)

    def _trace(self, args, kwargs, tensors):
        from torch.fx.experimental.proxy_tensor import make_fx

        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        names = sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        one_output = []

        def flat(*ts):
            a, kw = list(args), dict(kwargs)
            for i, t in zip(positions, ts):
                a[i] = t
            for name, t in zip(names, ts[len(positions):]):
                kw[name] = t
            out = self.eager(*a, **kw)
            one_output.append(isinstance(out, torch.Tensor))
            return (out,) if one_output[-1] else tuple(out)

        start = time.perf_counter()
        # Fake tensors: a branch on a tensor's values cannot be traced (an error, then eager);
        # it is never frozen into the program.
        graph = make_fx(flat, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)
        compiled = torch._inductor.compile(graph, list(tensors))
        _COUNTERS["compilations"] += 1
        _COUNTERS["compile_seconds"] += time.perf_counter() - start
        return compiled, one_output[-1]

    def __call__(self, *args, **kwargs):
        if self.failed:
            return self.eager(*args, **kwargs)
        tensors, key = self._signature(args, kwargs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self.eager(*args, **kwargs)  # the program computes no gradients
        try:
            program = self.programs.get(key)
        except TypeError as unhashable:  # an argument kvmap cannot compare: this call eager
            return self._eager_after(unhashable, args, kwargs, for_good=False)
        if program is None:
            if len(self.programs) >= self.PROGRAMS:
                return self._eager_after(RuntimeError(
                    "%d signatures compiled already; a value passed by keyword that changes every "
                    "call? pass it as a tensor" % self.PROGRAMS), args, kwargs, for_good=False)
            try:
                program = self._trace(args, kwargs, tensors)
            except Exception as trace_error:  # noqa: BLE001 (decided by the eager run)
                return self._eager_after(trace_error, args, kwargs)
            self.programs[key] = program
        compiled, one_output = program
        out = compiled(*tensors)
        return out[0] if one_output else tuple(out)


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
            mapped = self.make_mapped(runner("kvmap.vmap", local, self.options))
            self.by_pattern[pattern] = mapped
        return mapped(*arrays, **kwargs)
