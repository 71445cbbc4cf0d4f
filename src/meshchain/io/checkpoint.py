"""Checkpoint and restart: dats and globals in global numbering, on any number of ranks.

``mc.checkpoint(path, objects)`` writes one HDF5 file (h5py, no parallel HDF5 needed):

- every dat as a dataset ``dats/<name>`` of shape ``(set size, dim)`` in *global* numbering,
  so that a run restarts on any number of ranks; each rank sends its owned rows to the
  rank that holds their block of global ids, and the ranks then append their blocks to
  the file one after another (rank order, a token passed along), each one contiguous
  hyperslab; no rank ever holds a whole dat;
- every global as ``globals/<name>``;
- what a restart checks the mesh against: the size of every declared set and a hash of
  every declared map's values (the same whatever the rank count: a sum over rows of a
  mixed function of the row, column and value).

Writing is atomic: everything goes to a temporary file beside ``path``, which rank 0 renames
to ``path`` (``os.replace``) only when every rank has written and the file is flushed to
disk. A crash before that leaves the previous checkpoint as it was.

``mc.restore(path, objects)`` reads each rank's block of every dat (a contiguous hyperslab
of the file), sends rows to the ranks that own them now, and writes them into the owned
rows (halos are refreshed by the next exchange that needs them); globals get their saved
values. The objects are matched by name. A missing or unreadable file, a checkpoint of
another mesh (a set's size or a map's hash differ), an object missing from the file or of
another shape or dtype: the same :class:`~meshchain.MeshchainError` on every rank, naming
the file and the object, and nothing is changed.

Examples
--------
>>> import os, tempfile, numpy as np, meshchain as mc
>>> cells = mc.Set(4, "cells")
>>> q = mc.Dat(cells, 2, np.arange(8.0).reshape(4, 2), "q")
>>> t = mc.Global(1, 0.5, "time")
>>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
>>> mc.checkpoint(path, [q, t])
>>> q.data[:] = 0.0; t.value = 0.0
>>> mc.restore(path, [q, t])
>>> q.data_ro[3].tolist(), float(t.value[0])
([6.0, 7.0], 0.5)
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from ..api import get_runtime
from ..comm.agree import raise_together
from ..comm.blocks import block_offsets, block_owner
from ..comm.collectives import alltoallv
from ..core.errors import CheckpointError

__all__ = ["checkpoint", "restore", "FORMAT"]

FORMAT = "meshchain-checkpoint-1"
TOKEN_TAG = 32611


def checkpoint(path, objects) -> None:
    """Save dats and globals to ``path`` (collective; atomic). ``objects``: a list of them
    (matched by name on restore; names must be unique)."""
    session, comm = _context()
    dats, globs = _split(objects, path)
    mesh = _mesh_signature(session, comm)
    blocks = [_to_blocks(session, comm, d) for d in dats]
    temporary, error = None, None
    if comm.rank == 0:
        try:
            temporary = _create(path, mesh, dats, globs)
        except (OSError, ValueError) as exc:
            error = CheckpointError(f"checkpoint {os.fspath(path)!r}: cannot write beside it ({exc}); nothing was "
                                    f"changed.")
    raise_together(comm, error)
    temporary = comm.bcast(temporary, root=0)
    _append_in_turn(comm, temporary, path, dats, blocks)
    error = None
    if comm.rank == 0:
        try:
            os.replace(_before_rename(temporary), os.fspath(path))
        except OSError as exc:
            error = CheckpointError(f"checkpoint {os.fspath(path)!r}: the finished file could not be renamed into "
                                    f"place ({exc}); the previous checkpoint is unchanged.")
        finally:
            if error is not None and os.path.exists(temporary):
                os.remove(temporary)
    raise_together(comm, error)


def _before_rename(temporary: str) -> str:
    """The last step before the rename (tests inject a crash here)."""
    return temporary


def restore(path, objects) -> None:
    """Load dats and globals saved by :func:`checkpoint` (collective; any rank count)."""
    import h5py

    session, comm = _context()
    dats, globs = _split(objects, path)
    name = os.fspath(path)
    error, handle = None, None
    try:
        handle = h5py.File(name, "r")
        _check(handle, name, _mesh_signature(session, comm), dats, globs)
    except CheckpointError as exc:
        error = exc
    except (OSError, KeyError, ValueError) as exc:
        error = CheckpointError(f"checkpoint {name!r} cannot be read ({type(exc).__name__}: {exc}); it is missing, "
                                f"truncated or not a meshchain checkpoint.")
    if error is not None and handle is not None:
        handle.close()
    raise_together(comm, error)
    with handle:
        blocks = [_read_block(handle, d, comm) for d in dats]
        values = [np.asarray(handle["globals"][g.name]) for g in globs]
    for d, block in zip(dats, blocks):
        _from_blocks(session, comm, d, block)
    for g, value in zip(globs, values):
        g.value = value


# --- what is saved -------------------------------------------------------------------------------


def _context():
    session = get_runtime()
    comm = session.comm
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_SELF
    return session, comm


def _split(objects, path) -> tuple[list, list]:
    objects = list(objects)
    names = [getattr(o, "name", None) for o in objects]
    repeated = sorted({n for n in names if names.count(n) > 1})
    kinds = [o for o in objects if not hasattr(o, "is_global")]
    if kinds or repeated:
        raise CheckpointError(f"checkpoint {os.fspath(path)!r}: pass Dats and Globals with distinct names"
                              + (f"; {repeated} repeat" if repeated else f"; got {type(kinds[0]).__name__}"))
    return [o for o in objects if not o.is_global], [o for o in objects if o.is_global]


def _mesh_signature(session, comm) -> dict:
    """Set sizes and map hashes (the same on every rank and for every rank count)."""
    sets, maps, _ = session.declarations.declared(agreed=True)
    signature = {f"set {s.name}": s.size for s in sets}
    local = []
    for m in maps:
        rows = np.asarray(session.declarations.map_rows[m.uid], dtype=np.uint64).reshape(-1, m.arity)
        start = 0 if not session.distributed else int(block_offsets(m.source.size, comm.size)[comm.rank])
        local.append(_map_hash(rows, start))
    totals = comm.allreduce(np.array(local, dtype=np.uint64)) if local else []
    signature.update({f"map {m.name}": int(h) for m, h in zip(maps, totals)})
    return signature


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _map_hash(rows: np.ndarray, start: int) -> np.uint64:
    """Sum over the entries of ``mix(position) ^ mix(value)``: order-free across ranks."""
    if not rows.size:
        return np.uint64(0)
    position = np.arange(start * rows.shape[1], (start + rows.shape[0]) * rows.shape[1], dtype=np.uint64)
    with np.errstate(over="ignore"):
        return np.add.reduce(_mix(position + np.uint64(1)) ^ _mix(rows.ravel() + np.uint64(0x9E3779B97F4A7C15)),
                             dtype=np.uint64)


# --- moving rows between owners and blocks of global ids -----------------------------------------


def _owned(session, d) -> np.ndarray:
    """Global ids of this rank's owned rows of ``d``."""
    layout = session.layout_of(d.dataset)
    if layout is None:
        raise CheckpointError(f"Dat {d.name!r}: checkpoints on several ranks need a partitioned mesh; call "
                              f"mc.partition(...) first.")
    return layout.global_ids[: layout.n_owned]


def _to_blocks(session, comm, d) -> np.ndarray:
    """This rank's block (by global id) of ``d``'s rows."""
    ids, rows = _owned(session, d), d.data_ro
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


def _from_blocks(session, comm, d, block: np.ndarray) -> None:
    """Write this rank's owned rows of ``d`` from the ranks' blocks."""
    ids = _owned(session, d)
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


# --- the file -------------------------------------------------------------------------------------


def _create(path, mesh: dict, dats, globs) -> str:
    """Rank 0: the temporary file with its metadata, empty datasets and the globals."""
    import h5py

    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(os.fspath(path))}.", suffix=".tmp",
                                         dir=directory)
    os.close(handle)
    try:
        with h5py.File(temporary, "w") as f:
            f.attrs["format"] = FORMAT
            for key, value in mesh.items():
                f.attrs[key] = np.uint64(value) if key.startswith("map ") else value
            group = f.create_group("dats")
            for d in dats:
                group.create_dataset(d.name, shape=(d.dataset.size, d.dim), dtype=d.dtype)
                group[d.name].attrs["set"] = d.dataset.name
            values = f.create_group("globals")
            for g in globs:
                values.create_dataset(g.name, data=g.value)
    except BaseException:
        os.remove(temporary)
        raise
    return temporary


def _append_in_turn(comm, temporary: str, path, dats, blocks) -> None:
    """Each rank writes its blocks into the temporary file, in rank order."""
    import h5py

    if comm.rank > 0:
        comm.recv(source=comm.rank - 1, tag=TOKEN_TAG)
    error = None
    try:
        with h5py.File(temporary, "r+") as f:
            for d, block in zip(dats, blocks):
                lo = int(block_offsets(d.dataset.size, comm.size)[comm.rank])
                f["dats"][d.name][lo : lo + len(block)] = block
            f.flush()
        if comm.rank == comm.size - 1:
            with open(temporary, "rb+") as raw:
                os.fsync(raw.fileno())
    except OSError as exc:
        error = CheckpointError(f"checkpoint {os.fspath(path)!r}: rank {comm.rank} could not write ({exc}); the "
                                f"previous checkpoint is unchanged.")
    if comm.rank < comm.size - 1:
        comm.send(None, dest=comm.rank + 1, tag=TOKEN_TAG)
    raise_together(comm, error)


def _check(f, name: str, mesh: dict, dats, globs) -> None:
    if f.attrs.get("format") != FORMAT:
        raise CheckpointError(f"{name!r} is not a meshchain checkpoint (format {f.attrs.get('format')!r}).")
    for key, value in mesh.items():
        if key not in f.attrs or int(f.attrs[key]) != int(value):
            saved = f.attrs.get(key)
            raise CheckpointError(f"checkpoint {name!r} was written for another mesh: {key} is "
                                  f"{'absent' if saved is None else int(saved)} there, {int(value)} here.")
    for d in dats:
        saved = f["dats"].get(d.name)
        if saved is None or saved.shape != (d.dataset.size, d.dim) or saved.dtype != d.dtype:
            what = "is not in it" if saved is None else f"has shape {saved.shape} and dtype {saved.dtype} there"
            raise CheckpointError(f"checkpoint {name!r}: Dat {d.name!r} ({d.dataset.size} x {d.dim}, {d.dtype}) "
                                  f"{what}.")
    for g in globs:
        saved = f["globals"].get(g.name)
        if saved is None or saved.shape != (g.dim,):
            raise CheckpointError(f"checkpoint {name!r}: Global {g.name!r} is not in it (or has another size).")


def _read_block(f, d, comm) -> np.ndarray:
    offsets = block_offsets(d.dataset.size, comm.size)
    return np.asarray(f["dats"][d.name][offsets[comm.rank] : offsets[comm.rank + 1]])
