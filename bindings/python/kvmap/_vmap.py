"""kvmap.vmap with Heat's signature and argument checks, and kvmap.map_batches for functions
that are already batch-aware; both run kvmap's one C++ scheduler."""
from . import _comms, _kvmap

_RANDOMNESS = ("error", "same", "different")


def _out_dims(who, out_dims):
    """An int applies to every output; a tuple names one dim per output (as in torch.vmap)."""
    if isinstance(out_dims, int) and not isinstance(out_dims, bool):
        return [out_dims], False
    if isinstance(out_dims, (tuple, list)) and out_dims and all(
            isinstance(d, int) and not isinstance(d, bool) for d in out_dims):
        return list(out_dims), True
    raise TypeError("%s: out_dims must be an int or a non-empty tuple of ints, got %r" % (who, out_dims))


def _mapped(who, func, out_dims, randomness, chunk_size, batches):
    if not callable(func):
        raise TypeError("%s: func must be callable, got %s" % (who, type(func).__name__))
    if chunk_size is not None:
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool):
            raise TypeError("%s: chunk_size must be an int or None, got %s" % (who, type(chunk_size).__name__))
        if chunk_size < 1:
            raise ValueError("%s: chunk_size must be >= 1, got %d" % (who, chunk_size))
    dims, per_output = _out_dims(who, out_dims)
    call = _kvmap._vmap_call

    def mapped(*args, **kwargs):
        # The C++ side checks that every positional argument is a DistView (TypeError).
        outputs = call(func, dims, randomness, chunk_size, batches, *args, **kwargs)
        # The number of outputs is agreed across ranks, so every rank raises alike.
        if per_output and len(dims) != len(outputs):
            raise ValueError("%s: out_dims %r has %d entries but the function returned %d "
                             "outputs" % (who, tuple(out_dims), len(dims), len(outputs)))
        return _comms.inherit(outputs, args)

    mapped.__wrapped__ = func
    mapped.__doc__ = func.__doc__
    return mapped


def vmap(func, out_dims=0, randomness="error", *, chunk_size=None):
    """Vectorizes ``func``, written for one sample, over the split axis of DistViews.

    The result takes DistViews positionally (anything else positional: TypeError), passes
    keyword arguments to ``func`` unmapped, and returns a tuple of DistViews, one per
    output, output k split along ``out_dims[k]``. ``chunk_size`` bounds the samples
    processed at once on each rank. ``func`` may be a TorchScript module
    (``torch.jit.script``).
    """
    if not isinstance(randomness, str) or randomness not in _RANDOMNESS:
        raise ValueError("kvmap.vmap: randomness must be one of %s, got %r" % (_RANDOMNESS, randomness))
    return _mapped("kvmap.vmap", func, out_dims, randomness, chunk_size, False)


def map_batches(func, out_dims=0, *, chunk_size=None):
    """Runs ``func``, already batch-aware, on each chunk of the split axis of DistViews.

    As ``vmap``, but ``func`` receives each chunk's tensors as plain tensors with the batch
    axis first (no functorch: AOTInductor-compiled models, TorchScript modules written for
    batches, any batched code) and returns tensors whose first axis is the chunk length;
    output k's batch axis then moves to ``out_dims[k]``. Torch's random functions inside
    ``func`` behave as in any batched call (there is no ``randomness`` argument).
    """
    return _mapped("kvmap.map_batches", func, out_dims, "error", chunk_size, True)
