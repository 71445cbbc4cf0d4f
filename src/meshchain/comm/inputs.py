"""Declarations on several ranks: every input becomes this rank's block of rows.

A dat or map may be declared with the global array on every rank, on rank 0 only
(``None`` elsewhere), or as each rank's own consecutive rows wrapped in
:class:`Block` (a mesh read in parallel never sits whole on one rank). In every case
the rows end up in the standard block distribution (:func:`~meshchain.comm.blocks.block_offsets`).
The decision is collective: all ranks learn what the others passed, so a mistake
raises the same error everywhere.

Examples
--------
On one rank holds the whole array, so its block is all of it:

>>> import numpy as np
>>> from mpi4py import MPI
>>> from meshchain.comm.inputs import to_block_rows
>>> to_block_rows(MPI.COMM_SELF, np.arange(4), 4, "values").tolist()
[0, 1, 2, 3]
"""

from __future__ import annotations

import numpy as np

from ..core.errors import DataShapeError
from ..types.block import Block
from .blocks import block_offsets, block_owner
from .collectives import alltoallv, mpi_datatype
from .digest import digest

__all__ = ["to_block_rows", "block_rows_or_whole", "describe"]


def describe(data) -> tuple:
    """What a rank passed, for comparing with the others' (small, with a deterministic
    ``repr``): ``("none", ...)``, ``("block", shape, dtype, None)`` or ``("full", shape,
    dtype, :func:`~meshchain.comm.digest.digest` of the values)``.

    >>> describe(None)[0], describe(np.zeros(2))[:3]
    ('none', ('full', (2,), '<f8'))
    """
    if data is None:
        return ("none", None, None, None)
    if isinstance(data, Block):
        return ("block", data.rows.shape, data.rows.dtype.str, None)
    array = np.asarray(data)
    return ("full", array.shape, array.dtype.str, digest(array))


def to_block_rows(comm, data, n_global: int, what: str):
    """This rank's block of the global array ``data`` (or None when no rank passed data).

    Raises the same :class:`DataShapeError` on every rank when the ranks disagree.
    """
    return block_rows_or_whole(comm, data, n_global, what)[0]


def block_rows_or_whole(comm, data, n_global: int, what: str, *, described: tuple | None = None):
    """``(block, whole)``: :func:`to_block_rows`'s block, and ``data`` itself where every rank
    passed the same global array (then any rank can take any of its rows without messages),
    else None. ``described``: :func:`describe` of ``data`` when the caller has it."""
    info = comm.allgather(describe(data) if described is None else described)
    kinds = {i[0] for i in info}
    offsets = block_offsets(n_global, comm.size)
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    if kinds == {"none"}:
        return None, None
    if kinds == {"full"}:
        if len({(i[1], i[2], i[3]) for i in info}) != 1:
            differing = [r for r, i in enumerate(info) if i[1:] != info[0][1:]]
            raise DataShapeError(
                f"{what}: the global array differs between ranks (ranks {differing} differ from rank 0 in shape, "
                f"dtype or contents); pass the same array on every rank, pass it on rank 0 only (None elsewhere), "
                f"or pass each rank's rows wrapped in mc.Block."
            )
        return np.asarray(data)[lo:hi], data
    if kinds == {"full", "none"} and info[0][0] == "full" and all(i[0] == "none" for i in info[1:]):
        return _scatter_from_root(comm, data, offsets), None
    if kinds == {"block"}:
        counts = [i[1][0] if len(i[1]) else 0 for i in info]
        if sum(counts) != n_global or len({i[1][1:] for i in info}) != 1 or len({i[2] for i in info}) != 1:
            raise DataShapeError(
                f"{what}: the mc.Block rows of the ranks have {counts} rows (total {sum(counts)}, expected "
                f"{n_global}) and row shapes {[i[1][1:] for i in info]}; each rank must pass consecutive rows "
                f"of one global array."
            )
        return _rebalance(comm, data.rows, counts, offsets), None
    raise DataShapeError(
        f"{what}: ranks passed inconsistent inputs ({[i[0] for i in info]}); pass the global array on every rank, "
        f"on rank 0 only with None elsewhere, or mc.Block(rows) on every rank."
    )


def _scatter_from_root(comm, data, offsets):
    header = comm.bcast((np.asarray(data).shape[1:], np.asarray(data).dtype.str) if comm.rank == 0 else None)
    shape, dtype = header
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    rows = np.empty((hi - lo,) + tuple(shape), dtype=np.dtype(dtype))
    row = int(np.prod(shape, dtype=np.int64))
    if comm.rank == 0:
        array = np.ascontiguousarray(data)
        counts = (np.diff(offsets) * row).tolist()
        comm.Scatterv([array, counts, (offsets[:-1] * row).tolist(), mpi_datatype(array.dtype)], rows)
    else:
        comm.Scatterv(None, rows)
    return rows


def _rebalance(comm, rows, counts, offsets):
    start = int(np.sum(counts[: comm.rank]))
    ids = np.arange(start, start + len(rows), dtype=np.int64)
    received, _ = alltoallv(comm, np.ascontiguousarray(rows), block_owner(offsets, ids))
    return received
