"""Communication primitives for setting up a distributed mesh.

Everything here is collective over ``comm``: every rank calls each function in the
same order. Errors found on some ranks are agreed on first (:func:`raise_together`),
so every rank raises the same :class:`~meshchain.core.errors.MeshchainError` and none is
left waiting in a collective.
"""

from __future__ import annotations

import os

import numpy as np

from ..partition.partitioners import block_offsets  # the one definition of the block distribution

__all__ = [
    "world_communicator",
    "raise_together",
    "alltoallv",
    "block_offsets",
    "block_owner",
    "fetch_rows",
    "fetch_csr",
]

_LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_RANK", "HYDI_CONTROL_FD")


def world_communicator():
    """``MPI.COMM_WORLD`` when this process was started by an MPI launcher, else None.

    mpi4py is imported only then, so serial runs never initialise MPI.
    """
    if not any(v in os.environ for v in _LAUNCHER_VARIABLES):
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD


def raise_together(comm, error: Exception | None) -> None:
    """Raise on every rank if ``error`` is not None on some rank (the lowest rank's error)."""
    if comm is None or comm.size == 1:
        if error is not None:
            raise error
        return
    messages = comm.allgather(None if error is None else (type(error), str(error)))
    for rank, found in enumerate(messages):
        if found is not None:
            kind, text = found
            raise kind(text if rank == comm.rank else f"{text} (reported by rank {rank})")


def block_owner(offsets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rank holding each global id in a block distribution with ``offsets``."""
    return (np.searchsorted(offsets, ids, side="right") - 1).astype(np.int64)


def alltoallv(comm, send: np.ndarray, destinations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send row ``i`` of ``send`` to rank ``destinations[i]``.

    Returns ``(received, sources)``: the rows received, grouped by source rank in rank
    order (rows from one source keep their order), and the source rank of each row.
    """
    send = np.ascontiguousarray(send)
    order = np.argsort(destinations, kind="stable")
    ordered = np.ascontiguousarray(send[order])
    counts = np.bincount(destinations, minlength=comm.size).astype(np.int64)
    recv_counts = np.array(comm.alltoall(counts.tolist()), dtype=np.int64)
    row = int(np.prod(send.shape[1:], dtype=np.int64))
    received = np.empty((int(recv_counts.sum()),) + send.shape[1:], dtype=send.dtype)
    mpi_type = _mpi_type(send.dtype)
    send_displ = np.concatenate(([0], np.cumsum(counts)[:-1])) * row
    recv_displ = np.concatenate(([0], np.cumsum(recv_counts)[:-1])) * row
    comm.Alltoallv(
        [ordered, (counts * row).tolist(), send_displ.tolist(), mpi_type],
        [received, (recv_counts * row).tolist(), recv_displ.tolist(), mpi_type],
    )
    sources = np.repeat(np.arange(comm.size), recv_counts)
    return received, sources


def _mpi_type(dtype):
    from mpi4py import MPI

    return MPI._typedict[np.dtype(dtype).char]


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
    reply_values, _ = alltoallv(comm, values[_ranges(pointers[rows], lengths)], np.repeat(sources, lengths))
    reply_lengths, _ = alltoallv(comm, lengths, sources)
    order = np.argsort(owners, kind="stable")  # reply i answers ids[order[i]]
    lengths_in_order = np.empty(len(ids), dtype=np.int64)
    lengths_in_order[order] = reply_lengths
    reply_starts = np.concatenate(([0], np.cumsum(reply_lengths)[:-1])).astype(np.int64)
    position_in_reply = np.empty(len(ids), dtype=np.int64)
    position_in_reply[order] = np.arange(len(ids))
    out_pointers = np.concatenate(([0], np.cumsum(lengths_in_order))).astype(np.int64)
    out_values = reply_values[_ranges(reply_starts[position_in_reply], lengths_in_order)]
    return out_pointers, out_values


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each start ``s`` and length ``n``."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shifts = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return shifts + np.arange(total, dtype=np.int64)
