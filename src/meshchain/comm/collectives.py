"""Collective helpers for setting up a distributed mesh (all-to-all, fetches, gathers).

Everything here is collective over ``comm``: every rank calls each function in the
same order. Rows are numpy arrays; MPI datatypes come from
:func:`mpi4py.util.dtlib.from_numpy_dtype`.
"""

from __future__ import annotations

import numpy as np

from ..core import activity
from .blocks import block_owner
from .sparse import exchange_rows

__all__ = ["alltoallv", "fetch_rows", "fetch_csr", "gather_rows", "concatenated_ranges", "mpi_datatype"]


def alltoallv(comm, send: np.ndarray, destinations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send row ``i`` of ``send`` to rank ``destinations[i]``.

    Returns ``(received, sources)``: the rows received, grouped by source rank in rank
    order (rows from one source keep their order), and the source rank of each row.
    Moved by the dynamic sparse exchange (:func:`meshchain.comm.sparse.exchange_rows`,
    NBX termination): a rank sends only to the ranks its rows go to and learns who sends
    to it without an all-to-all of counts, so no rank does O(P) work for P ranks.
    """
    with activity.waiting("collective alltoallv (sparse exchange of rows)"):
        return exchange_rows(comm, np.ascontiguousarray(send), np.asarray(destinations, dtype=np.int64))


def mpi_datatype(dtype):
    """The MPI datatype of a numpy dtype (mpi4py's public mapping)."""
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(np.dtype(dtype))


def fetch_rows(comm, offsets: np.ndarray, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rows ``table_global[ids]`` of a table held in block distribution with ``offsets``.

    ``table`` is this rank's block (rows ``offsets[rank]:offsets[rank+1]``).
    """
    ids = np.asarray(ids, dtype=np.int64)
    owners = block_owner(offsets, ids)
    requests, sources = alltoallv(comm, ids, owners)
    answers = table[requests - offsets[comm.rank]]
    replies, _ = alltoallv(comm, answers, sources)
    result = np.empty((len(ids),) + table.shape[1:], dtype=table.dtype)
    result[np.argsort(owners, kind="stable")] = replies
    return result


def fetch_csr(comm, offsets: np.ndarray, pointers: np.ndarray, values: np.ndarray, ids: np.ndarray):
    """Variable-length rows of a block-distributed CSR table: returns ``(pointers, values)``
    of the requested rows, in the order of ``ids``."""
    ids = np.asarray(ids, dtype=np.int64)
    owners = block_owner(offsets, ids)
    requests, sources = alltoallv(comm, ids, owners)
    rows = requests - offsets[comm.rank]
    lengths = (pointers[rows + 1] - pointers[rows]).astype(np.int64)
    reply_values, _ = alltoallv(comm, values[concatenated_ranges(pointers[rows], lengths)], np.repeat(sources, lengths))
    reply_lengths, _ = alltoallv(comm, lengths, sources)
    order = np.argsort(owners, kind="stable")  # reply i answers ids[order[i]]
    lengths_in_order = np.empty(len(ids), dtype=np.int64)
    lengths_in_order[order] = reply_lengths
    reply_starts = np.concatenate(([0], np.cumsum(reply_lengths)[:-1])).astype(np.int64)
    position_in_reply = np.empty(len(ids), dtype=np.int64)
    position_in_reply[order] = np.arange(len(ids))
    out_pointers = np.concatenate(([0], np.cumsum(lengths_in_order))).astype(np.int64)
    out_values = reply_values[concatenated_ranges(reply_starts[position_in_reply], lengths_in_order)]
    return out_pointers, out_values


def concatenated_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each start ``s`` and length ``n``."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shifts = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return shifts + np.arange(total, dtype=np.int64)


def gather_rows(comm, global_ids: np.ndarray, rows: np.ndarray, n_global: int):
    """Rows of all ranks placed at their global ids, on rank 0 (``None`` elsewhere)."""
    with activity.waiting("collective gather_rows (gather to rank 0)"):
        gathered_ids = comm.gather(np.ascontiguousarray(global_ids, dtype=np.int64), root=0)
        gathered_rows = comm.gather(np.ascontiguousarray(rows), root=0)
    if comm.rank != 0:
        return None
    result = np.empty((n_global,) + rows.shape[1:], dtype=rows.dtype)
    for ids, values in zip(gathered_ids, gathered_rows):
        result[ids] = values
    return result
