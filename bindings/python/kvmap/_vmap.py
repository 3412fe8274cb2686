"""kvmap.vmap with Heat's signature and argument checks, kvmap.map_batches for functions
that are already batch-aware, and kvmap.map_overlap (Dask's) for functions of a block and its
neighbours' rows; all run kvmap's C++ core."""
import numbers

from . import _compile, _kvmap


def _out_dims(who, out_dims):
    """An int applies to every output; a tuple names one dim per output (as in torch.vmap)."""
    if isinstance(out_dims, int) and not isinstance(out_dims, bool):
        return [out_dims], False
    if isinstance(out_dims, (tuple, list)) and out_dims and all(
            isinstance(d, int) and not isinstance(d, bool) for d in out_dims):
        return list(out_dims), True
    raise TypeError("%s: out_dims must be an int or a non-empty tuple of ints, got %r" % (who, out_dims))


def _int_or_none(value):
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _mapped(who, func, out_dims, randomness, chunk_size, memory_budget, pad_to_chunk, batches):
    if not callable(func):
        raise TypeError("%s: func must be callable, got %s" % (who, type(func).__name__))
    # Types are checked here, values by the C++ side (VmapOptions: chunk_size >= 1, the
    # randomness modes, memory_budget >= 1, where pad_to_chunk applies).
    if chunk_size != "auto" and not _int_or_none(chunk_size):
        raise TypeError("%s: chunk_size must be an int, 'auto' or None, got %r" % (who, chunk_size))
    if not _int_or_none(memory_budget):
        raise TypeError("%s: memory_budget must be an int (bytes) or None, got %s"
                        % (who, type(memory_budget).__name__))
    if not isinstance(pad_to_chunk, bool):
        raise TypeError("%s: pad_to_chunk must be a bool, got %s" % (who, type(pad_to_chunk).__name__))
    dims, per_output = _out_dims(who, out_dims)
    # A callable implemented in C++: a call goes from the interpreter to kvmap's scheduler
    # without a Python frame (the outputs carry their inputs' communicator).
    mapped = _kvmap._mapped(func, dims, per_output, randomness, chunk_size, memory_budget, pad_to_chunk,
                            batches)
    mapped.__doc__ = func.__doc__
    return mapped




def vmap(func, out_dims=0, randomness="error", *, chunk_size=None, memory_budget=None, compile=False):
    """Vectorizes ``func``, written for one sample, over the split axis of DistViews.

    The result takes DistViews positionally (anything else positional: TypeError), passes
    keyword arguments to ``func`` unmapped, and returns a tuple of DistViews, one per
    output, output k split along ``out_dims[k]``. ``chunk_size`` bounds the samples
    processed at once on each rank; ``"auto"`` picks it from what one sample of ``func``
    allocates (measured on a first chunk of at most 16) and ``memory_budget`` (bytes per
    rank; None: half the host's available memory shared by the node's ranks, or 80% of the
    GPU's free memory). A chunk whose ``func`` runs out of memory (``MemoryError``,
    ``torch.OutOfMemoryError``) runs again as two halves. ``func`` may be a TorchScript
    module (``torch.jit.script``).

    ``compile=True`` (or a dict of ``torch.compile`` options) runs each chunk as
    ``torch.compile(torch.func.vmap(func))``, compiled at the first call and reused by every
    chunk and call (torch's guards, checked at each chunk, compile again for a new shape or
    dtype; a shorter last chunk makes the batch dimension dynamic once). ``compile="trace"``
    is ``jax.jit``'s contract: ``torch.func.vmap(func)`` traced once per signature (shapes,
    strides, dtypes, devices, keyword arguments' values) and compiled by Inductor, called
    without guards; tensors ``func`` reads from outside its arguments are those of the first
    call (pass the ones that change as arguments); chunks are padded to ``chunk_size``. Not
    with ``randomness`` "same" or "different". Where torch cannot compile ``func``, it runs
    eagerly after one warning. ``kvmap.stats()`` counts ``compilations``,
    ``compile_seconds`` and ``compile_fallbacks``.
    """
    if not isinstance(randomness, str):
        raise ValueError("kvmap.vmap: randomness must be 'error', 'same' or 'different', got %r" % (randomness,))
    compile_options = _compile.options("kvmap.vmap", compile)
    if compile_options is not None and randomness != "error":
        raise ValueError("kvmap.vmap: compile=... is for randomness='error' only, got randomness=%r: "
                         "kvmap's per-sample random values (the same for any ranks and chunk size) "
                         "are not drawn inside a compiled function" % (randomness,))
    if compile_options is None or _compile.available() is not None:
        mapped = _mapped("kvmap.vmap", func, out_dims, randomness, chunk_size, memory_budget, False, False)
        if compile_options is not None:
            _compile.warn_unavailable("kvmap.vmap")
        return mapped
    _mapped("kvmap.vmap", func, out_dims, randomness, chunk_size, memory_budget, False, True)  # checks
    # A traced program is made for one shape: chunks padded to the chunk size compile once (the
    # padding's samples, copies of the last one, are computed and dropped).
    pad = compile_options == _compile.TRACE and chunk_size is not None
    return _compile.CompiledVmap(
        func, lambda local: _mapped("kvmap.vmap", local, out_dims, randomness, chunk_size, memory_budget,
                                    pad, True), compile_options)


def map_batches(func, out_dims=0, *, chunk_size=None, memory_budget=None, pad_to_chunk=False, compile=False):
    """Runs ``func``, already batch-aware, on each chunk of the split axis of DistViews.

    As ``vmap``, but ``func`` receives each chunk's tensors as plain tensors with the batch
    axis first (no functorch: AOTInductor-compiled models, TorchScript modules written for
    batches, any batched code) and returns tensors whose first axis is the chunk length;
    output k's batch axis then moves to ``out_dims[k]``. Torch's random functions inside
    ``func`` behave as in any batched call (there is no ``randomness`` argument).
    ``pad_to_chunk=True`` (with a ``chunk_size``) gives ``func`` exactly ``chunk_size`` rows
    every time, for programs compiled for one shape: the last chunk is padded with copies of
    its last row, ``kvmap.chunk_rows()`` says how many rows are real, the padding's outputs
    are dropped. ``compile=True`` (or a dict of ``torch.compile`` options) runs
    ``torch.compile(func)`` on the chunks, ``compile="trace"`` ``func`` traced and compiled
    once per signature, as in ``vmap`` (with ``pad_to_chunk``: one shape).
    """
    compile_options = _compile.options("kvmap.map_batches", compile)
    if compile_options is not None and callable(func):
        if _compile.available() is not None:
            _compile.warn_unavailable("kvmap.map_batches")
        else:
            func = _compile.runner("kvmap.map_batches", func, compile_options)
    return _mapped("kvmap.map_batches", func, out_dims, "error", chunk_size, memory_budget, pad_to_chunk,
                   True)


_BOUNDARIES = ("none", "periodic", "reflect", "nearest")


def _depth(depth):
    """(before, after) from an int or a pair of ints."""
    def is_int(d):
        return isinstance(d, numbers.Integral) and not isinstance(d, bool)
    if is_int(depth):
        return int(depth), int(depth)
    if isinstance(depth, (tuple, list)) and len(depth) == 2 and all(is_int(d) for d in depth):
        return int(depth[0]), int(depth[1])
    raise TypeError("kvmap.map_overlap: depth must be an int or a (before, after) pair of ints, got %r"
                    % (depth,))


def _boundary(boundary):
    """(name, constant) from a boundary's name or a number (a constant)."""
    if isinstance(boundary, str):
        if boundary not in _BOUNDARIES:
            raise ValueError("kvmap.map_overlap: boundary must be 'none', 'periodic', 'reflect', "
                             "'nearest' or a number, got %r" % (boundary,))
        return boundary, 0.0
    if isinstance(boundary, numbers.Real) and not isinstance(boundary, bool):
        return "constant", float(boundary)
    raise TypeError("kvmap.map_overlap: boundary must be 'none', 'periodic', 'reflect', 'nearest' or "
                    "a number, got %r" % (boundary,))


def map_overlap(func, *arrays, depth, boundary="none", trim=True, **kwargs):
    """Dask's ``map_overlap`` on arrays split along one axis (DistViews or Heat DNDarrays).

    On each rank that holds rows, ``func`` receives its block of every array extended along the
    split axis by ``depth`` rows before and after (an int, or ``(before, after)``), taken from
    the neighbouring ranks (as many as the rows lie on), as contiguous tensors, and the keyword
    arguments unmapped. Beyond the global ends the rows are as ``numpy.pad`` pads the gathered
    array: ``boundary="none"`` adds none (the first and last blocks are shorter), "periodic"
    wraps, "reflect" mirrors (numpy's "symmetric"), "nearest" repeats the edge row, a number is
    a constant. ``func`` returns tensors with as many rows along that axis as it was given
    (``trim=True``: kvmap removes the added rows) or exactly its own rows (``trim=False``).
    Returns a tuple with one array per output, with the inputs' per-rank counts: DistViews, or
    DNDarrays where an input is one. Ranks without rows do not call ``func``.
    """
    if not callable(func):
        raise TypeError("kvmap.map_overlap: func must be callable, got %s" % type(func).__name__)
    if not isinstance(trim, bool):
        raise TypeError("kvmap.map_overlap: trim must be a bool, got %s" % type(trim).__name__)
    before, after = _depth(depth)
    name, constant = _boundary(boundary)
    mapped = _kvmap._mapped_overlap(func, before, after, name, constant, trim)
    return mapped(*arrays, **kwargs)
