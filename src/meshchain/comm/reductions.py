"""Sums, maxima, minima, prefix sums, and gathering to one rank: the collectives of set-up code.

Everything here is collective over ``comm`` (every rank calls each function in the same
order) and works for ``comm=None`` or one rank as for several. Arrays are reduced in place
(no pickling); Python ints are returned as Python ints.

Examples
--------
>>> import numpy as np
>>> from meshchain.comm.reductions import sum_everywhere, max_everywhere, count_before
>>> sum_everywhere(None, 3), count_before(None, 3)
(3, 0)
>>> max_everywhere(None, np.array([1.0, 2.0]))
array([1., 2.])
"""

from __future__ import annotations

import numpy as np

from ..core import activity
from .collectives import mpi_datatype

__all__ = ["sum_everywhere", "max_everywhere", "min_everywhere", "count_before", "gather_to_root", "scatter_from_root"]


def _reduce(comm, values, op_name: str):
    if comm is None or comm.size == 1:
        return values
    from mpi4py import MPI

    op = getattr(MPI, op_name)
    with activity.waiting(f"collective {op_name.lower()} over ranks (Allreduce)"):
        if isinstance(values, np.ndarray):
            comm.Allreduce(MPI.IN_PLACE, values, op=op)
            return values
        return comm.allreduce(values, op=op)


def sum_everywhere(comm, values):
    """The sum over ranks of ``values``: an int (or float), or an array summed in place."""
    return _reduce(comm, values, "SUM")


def max_everywhere(comm, values):
    """The maximum over ranks of ``values``: an int (or float), or an array reduced in place."""
    return _reduce(comm, values, "MAX")


def min_everywhere(comm, values):
    """The minimum over ranks of ``values``: an int (or float), or an array reduced in place."""
    return _reduce(comm, values, "MIN")


def count_before(comm, count: int) -> int:
    """The sum of ``count`` over the ranks below this one (0 on rank 0): an exclusive prefix sum."""
    if comm is None or comm.size == 1:
        return 0
    from mpi4py import MPI

    with activity.waiting("collective count_before (Exscan)"):
        before = comm.exscan(int(count), op=MPI.SUM)  # None on rank 0
    return int(before) if comm.rank else 0


def gather_to_root(comm, rows: np.ndarray, counts=None):
    """``(all rows, counts)``: every rank's 1-D ``rows`` concatenated in rank order on rank 0
    (None elsewhere), and on every rank the number each rank gave. ``counts`` (from an
    earlier call with rows of the same lengths, passed on every rank) spares gathering them."""
    rows = np.ascontiguousarray(rows)
    if comm is None or comm.size == 1:
        return rows.copy(), np.array([len(rows)], dtype=np.int64)
    root = comm.rank == 0
    with activity.waiting("collective gather_to_root (Gatherv)"):
        if counts is None:
            counts = np.array(comm.allgather(len(rows)), dtype=np.int64)
        gathered = np.empty(int(counts.sum()) if root else 0, dtype=rows.dtype)
        comm.Gatherv(rows, [gathered, counts, mpi_datatype(rows.dtype)] if root else None, root=0)
    return (gathered if root else None), counts


def scatter_from_root(comm, rows, counts, out: np.ndarray) -> np.ndarray:
    """Fill every rank's 1-D ``out`` with its piece of rank 0's ``rows`` (``counts[r]`` rows
    for rank ``r``, in rank order; ``rows`` and ``counts`` are read on rank 0 only)."""
    if comm is None or comm.size == 1:
        out[...] = rows
        return out
    root = comm.rank == 0
    with activity.waiting("collective scatter_from_root (Scatterv)"):
        comm.Scatterv([np.ascontiguousarray(rows), counts, mpi_datatype(out.dtype)] if root else None, out, root=0)
    return out
