"""The Python communicator each DistView was made on, where Python knows it.

The C++ DistView keeps its own duplicate of the communicator and does not hand it back to
Python (only ``comm_size``/``comm_rank``), so each DistView object carries the communicator
it was given (an ``mpi4py.MPI.Comm``, or Heat's communication object for
``kvmap.from_heat``) as ``_comm`` for ``DistView.to_heat``; vmap's outputs take their
inputs' (in C++). ``None`` is kvmap's default, COMM_WORLD.
"""


def remember(view, comm):
    """Records ``comm`` for ``view``."""
    if comm is not None:
        view._comm = comm
    return view


def lookup(view):
    return view._comm
