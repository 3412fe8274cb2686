"""The Python communicator each DistView was made on, where Python knows it.

The C++ DistView keeps its own duplicate of the communicator and does not hand it back to
Python (only ``comm_size``/``comm_rank``), so the Python layer remembers the communicator
it was given (an ``mpi4py.MPI.Comm``, or Heat's communication object for
``kvmap.from_heat``) for ``DistView.to_heat``. Entries die with their DistView.
"""
import weakref

_known = weakref.WeakKeyDictionary()


def remember(view, comm):
    """Records ``comm`` for ``view`` (``None``, kvmap's default COMM_WORLD, is not recorded)."""
    if comm is not None:
        _known[view] = comm
    return view


def lookup(view):
    return _known.get(view)


def inherit(outputs, inputs):
    """vmap's outputs live on their inputs' communicator."""
    for a in inputs:
        comm = _known.get(a)
        if comm is not None:
            for o in outputs:
                _known[o] = comm
            break
    return outputs
