"""One HDF5 file from every rank, in global numbering, without parallel HDF5.

The writers of :mod:`meshchain.io` (checkpoints, OP2 HDF5 meshes, ParaView output) share
this scheme: every object is stored in its *global* numbering and split into the standard
block distribution of global ids (:func:`~meshchain.comm.blocks.block_offsets`); rank ``r``
holds block ``r``. A dat's owned rows travel to the rank that holds their block
(:func:`dat_block`); a map's declared rows already sit in blocks (:func:`map_block`). Rank 0
creates the file with empty datasets (:func:`create_on_root`), then the ranks write their
blocks one after another, each a contiguous hyperslab, passing a token in rank order
(:func:`write_in_turn`); the last rank flushes the file to disk. Readers take their own
block of rows (:func:`read_block`). No rank ever holds a whole dat or map.

Every step raises the same :class:`~meshchain.MeshchainError` on every rank when one rank
fails (:func:`~meshchain.comm.agree.raise_together`).

Examples
--------
On one process the block is the whole array:

>>> import numpy as np, meshchain as mc
>>> from meshchain.io.ranked import context, dat_block
>>> cells = mc.Set(3, "cells")
>>> q = mc.Dat(cells, 1, np.array([[1.0], [2.0], [3.0]]), "q")
>>> engine, comm = context()
>>> dat_block(engine, comm, q).ravel().tolist()
[1.0, 2.0, 3.0]
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ..api import engine_surface
from ..comm.agree import raise_together
from ..comm.blocks import block_offsets, block_owner
from ..comm.collectives import alltoallv
from ..core.errors import MeshchainError

__all__ = ["context", "agreed", "block_range", "dat_block", "scatter_block", "map_block", "create_on_root",
           "write_in_turn", "read_block", "replace_on_root"]

TOKEN_TAG = 32611


def context():
    """The engine and its communicator (``COMM_SELF`` on one process)."""
    engine = engine_surface()
    comm = engine.comm
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_SELF
    return engine, comm


def agreed(comm, check, error_type):
    """``check()``'s result; when it raises ``error_type`` on some rank, the same error on
    every rank (a bad argument on one rank must not leave the others waiting in a collective)."""
    result, error = None, None
    try:
        result = check()
    except error_type as exc:
        error = exc
    raise_together(comm, error)
    return result


def block_range(n: int, comm) -> tuple[int, int]:
    """This rank's block ``[lo, hi)`` of ``n`` global rows."""
    offsets = block_offsets(n, comm.size)
    return int(offsets[comm.rank]), int(offsets[comm.rank + 1])


def owned_ids(engine, d, error) -> np.ndarray:
    """Global ids of this rank's owned rows of dat ``d`` (``error``: the exception class to
    raise when the mesh is not laid out)."""
    layout = engine.layout_of(d.dataset)
    if layout is None:
        raise error(f"Dat {d.name!r}: writing or reading files on several ranks needs a partitioned mesh; call "
                    f"mc.partition(...) first.")
    return layout.global_ids[: layout.n_owned]


def dat_block(engine, comm, d, error=None) -> np.ndarray:
    """This rank's block (by global id) of ``d``'s rows (collective)."""
    ids, rows = owned_ids(engine, d, error or MeshchainError), d.data_ro
    if comm.size == 1:
        block = np.empty_like(rows)
        block[ids] = rows
        return block
    offsets = block_offsets(d.dataset.size, comm.size)
    owners = block_owner(offsets, ids)
    got_ids, _ = alltoallv(comm, ids.astype(np.int64), owners)
    got_rows, _ = alltoallv(comm, np.ascontiguousarray(rows), owners)
    block = np.empty((offsets[comm.rank + 1] - offsets[comm.rank], d.dim), dtype=d.dtype)
    block[got_ids - offsets[comm.rank]] = got_rows
    return block


def scatter_block(engine, comm, d, block: np.ndarray, error=None) -> None:
    """Write this rank's owned rows of ``d`` from the ranks' blocks (collective)."""
    ids = owned_ids(engine, d, error or MeshchainError)
    if comm.size == 1:
        d.data[:] = block[ids]
        return
    offsets = block_offsets(d.dataset.size, comm.size)
    holders = block_owner(offsets, ids)
    asked, askers = alltoallv(comm, ids.astype(np.int64), holders)
    answers, _ = alltoallv(comm, block[asked - offsets[comm.rank]], askers)
    order = np.argsort(holders, kind="stable")  # answers come grouped by holder, in asking order
    rows = np.empty((len(ids), d.dim), dtype=d.dtype)
    rows[order] = answers.reshape(-1, d.dim)
    d.data[:] = rows


def map_block(engine, m) -> np.ndarray:
    """This rank's block (by global id) of map ``m``'s values, in global numbering."""
    return np.asarray(engine.map_rows(m)).reshape(-1, m.arity)


def create_on_root(comm, path, fill, error) -> str:
    """Rank 0 creates a temporary HDF5 file beside ``path`` and calls ``fill(h5file)`` on it;
    every rank gets its name (collective). A failure raises ``error(message)`` everywhere."""
    import h5py

    temporary, failure = None, None
    if comm.rank == 0:
        directory = os.path.dirname(os.path.abspath(os.fspath(path)))
        try:
            handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(os.fspath(path))}.", suffix=".tmp",
                                                 dir=directory)
            os.close(handle)
            with h5py.File(temporary, "w") as f:
                fill(f)
        except (OSError, ValueError, TypeError) as exc:
            failure = error(f"{os.fspath(path)!r}: cannot write beside it ({exc}); nothing was changed.")
            if temporary is not None and os.path.exists(temporary):
                os.remove(temporary)
    raise_together(comm, failure)
    return comm.bcast(temporary, root=0)


def write_in_turn(comm, temporary: str, path, blocks, error) -> None:
    """Each rank writes its ``blocks`` (``(dataset path, first row, rows)``) into the temporary
    file, in rank order; the last rank syncs it to disk (collective)."""
    import h5py

    if comm.rank > 0:
        comm.recv(source=comm.rank - 1, tag=TOKEN_TAG)
    failure = None
    try:
        with h5py.File(temporary, "r+") as f:
            for name, lo, rows in blocks:
                if len(rows):
                    f[name][lo : lo + len(rows)] = rows
            f.flush()
        if comm.rank == comm.size - 1:
            with open(temporary, "rb+") as raw:
                os.fsync(raw.fileno())
    except (OSError, ValueError, TypeError) as exc:
        failure = error(f"{os.fspath(path)!r}: rank {comm.rank} could not write ({exc}); the previous file is "
                        f"unchanged.")
    if comm.rank < comm.size - 1:
        comm.send(None, dest=comm.rank + 1, tag=TOKEN_TAG)
    try:
        raise_together(comm, failure)
    except Exception:
        if comm.rank == 0 and os.path.exists(temporary):
            os.remove(temporary)
        raise


def replace_on_root(comm, temporary: str, path, error, before=None) -> None:
    """Rank 0 renames the finished temporary file to ``path`` (atomic; ``before``: a hook
    called with the temporary name first); on failure the temporary file is removed and
    ``error`` raised on every rank (collective)."""
    failure = None
    if comm.rank == 0:
        try:
            os.replace(temporary if before is None else before(temporary), os.fspath(path))
        except OSError as exc:
            failure = error(f"{os.fspath(path)!r}: the finished file could not be renamed into place ({exc}); the "
                            f"previous file is unchanged.")
        finally:
            if failure is not None and os.path.exists(temporary):
                os.remove(temporary)
    raise_together(comm, failure)


def read_block(dataset, comm) -> np.ndarray:
    """This rank's block of the rows of an h5py dataset."""
    lo, hi = block_range(dataset.shape[0], comm)
    return np.asarray(dataset[lo:hi])
