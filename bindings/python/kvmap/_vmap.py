"""kvmap.vmap with Heat's signature and argument checks, and kvmap.map_batches for functions
that are already batch-aware; both run kvmap's one C++ scheduler."""
from . import _kvmap


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




def vmap(func, out_dims=0, randomness="error", *, chunk_size=None, memory_budget=None):
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
    """
    if not isinstance(randomness, str):
        raise ValueError("kvmap.vmap: randomness must be 'error', 'same' or 'different', got %r" % (randomness,))
    return _mapped("kvmap.vmap", func, out_dims, randomness, chunk_size, memory_budget, False, False)


def map_batches(func, out_dims=0, *, chunk_size=None, memory_budget=None, pad_to_chunk=False):
    """Runs ``func``, already batch-aware, on each chunk of the split axis of DistViews.

    As ``vmap``, but ``func`` receives each chunk's tensors as plain tensors with the batch
    axis first (no functorch: AOTInductor-compiled models, TorchScript modules written for
    batches, any batched code) and returns tensors whose first axis is the chunk length;
    output k's batch axis then moves to ``out_dims[k]``. Torch's random functions inside
    ``func`` behave as in any batched call (there is no ``randomness`` argument).
    ``pad_to_chunk=True`` (with a ``chunk_size``) gives ``func`` exactly ``chunk_size`` rows
    every time, for programs compiled for one shape: the last chunk is padded with copies of
    its last row, ``kvmap.chunk_rows()`` says how many rows are real, the padding's outputs
    are dropped.
    """
    return _mapped("kvmap.map_batches", func, out_dims, "error", chunk_size, memory_budget, pad_to_chunk,
                   True)
