"""kvmap.vmap with Heat's signature and argument checks, running kvmap's C++ scheduler."""
from . import _comms, _kvmap

_RANDOMNESS = ("error", "same", "different")


def vmap(func, out_dims=0, randomness="error", *, chunk_size=None):
    """Vectorizes ``func``, written for one sample, over the split axis of DistViews.

    The result takes DistViews positionally (anything else positional: TypeError), passes
    keyword arguments to ``func`` unmapped, and returns a tuple of DistViews, one per
    output, output k split along ``out_dims[k]``. ``chunk_size`` bounds the samples
    processed at once on each rank.
    """
    if not callable(func):
        raise TypeError("kvmap.vmap: func must be callable, got %s" % type(func).__name__)
    if not isinstance(randomness, str) or randomness not in _RANDOMNESS:
        raise ValueError("kvmap.vmap: randomness must be one of %s, got %r" % (_RANDOMNESS, randomness))
    if chunk_size is not None:
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool):
            raise TypeError("kvmap.vmap: chunk_size must be an int or None, got %s" % type(chunk_size).__name__)
        if chunk_size < 1:
            raise ValueError("kvmap.vmap: chunk_size must be >= 1, got %d" % chunk_size)
    # An int applies to every output; a tuple names one dim per output (as in torch.vmap).
    per_output = not isinstance(out_dims, int)
    if isinstance(out_dims, int) and not isinstance(out_dims, bool):
        dims = [out_dims]
    elif isinstance(out_dims, (tuple, list)) and out_dims and all(
            isinstance(d, int) and not isinstance(d, bool) for d in out_dims):
        dims = list(out_dims)
    else:
        raise TypeError("kvmap.vmap: out_dims must be an int or a non-empty tuple of ints, got %r" % (out_dims,))

    def vmapped(*args, **kwargs):
        # The C++ side checks that every positional argument is a DistView (TypeError).
        outputs = _kvmap._vmap_call(func, dims, randomness, chunk_size, *args, **kwargs)
        # The number of outputs is agreed across ranks, so every rank raises alike.
        if per_output and len(dims) != len(outputs):
            raise ValueError("kvmap.vmap: out_dims %r has %d entries but the function returned %d "
                             "outputs" % (tuple(out_dims), len(dims), len(outputs)))
        return _comms.inherit(outputs, args)

    vmapped.__wrapped__ = func
    vmapped.__doc__ = func.__doc__
    return vmapped
