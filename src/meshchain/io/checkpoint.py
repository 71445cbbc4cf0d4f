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

import numpy as np

from ..comm.blocks import block_offsets
from ..comm.agree import raise_together
from ..core.errors import CheckpointError
from ..types.mixed import MixedDat
from .ranked import agreed, context, create_on_root, dat_block, map_block, read_block, replace_on_root, scatter_block, \
    write_in_turn

__all__ = ["checkpoint", "restore", "FORMAT"]

FORMAT = "meshchain-checkpoint-1"


def _failure(message: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {message}")


def checkpoint(path, objects) -> None:
    """Save dats and globals to ``path`` (collective; atomic). ``objects``: a list of them
    (matched by name on restore; names must be unique)."""
    engine, comm = context()
    dats, globs = agreed(comm, lambda: _split(objects, path), CheckpointError)
    mesh = _mesh_signature(engine, comm)
    blocks = [dat_block(engine, comm, d, CheckpointError) for d in dats]
    temporary = create_on_root(comm, path, lambda f: _fill(f, mesh, dats, globs), _failure)
    lows = [int(block_offsets(d.dataset.size, comm.size)[comm.rank]) for d in dats]
    write_in_turn(comm, temporary, path, [(f"dats/{d.name}", lo, b) for d, lo, b in zip(dats, lows, blocks)],
                  _failure)
    replace_on_root(comm, temporary, path, _failure, before=lambda name: _before_rename(name))


def _before_rename(temporary: str) -> str:
    """The last step before the rename (tests inject a crash here)."""
    return temporary


def restore(path, objects) -> None:
    """Load dats and globals saved by :func:`checkpoint` (collective; any rank count)."""
    import h5py

    engine, comm = context()
    dats, globs = agreed(comm, lambda: _split(objects, path), CheckpointError)
    name = os.fspath(path)
    error, handle = None, None
    try:
        handle = h5py.File(name, "r")
        _check(handle, name, _mesh_signature(engine, comm), dats, globs)
    except CheckpointError as exc:
        error = exc
    except (OSError, KeyError, ValueError) as exc:
        error = CheckpointError(f"checkpoint {name!r} cannot be read ({type(exc).__name__}: {exc}); it is missing, "
                                f"truncated or not a meshchain checkpoint.")
    if error is not None and handle is not None:
        handle.close()
    raise_together(comm, error)
    with handle:
        blocks = [read_block(handle["dats"][d.name], comm) for d in dats]
        values = [np.asarray(handle["globals"][g.name]) for g in globs]
    for d, block in zip(dats, blocks):
        scatter_block(engine, comm, d, block, CheckpointError)
    for g, value in zip(globs, values):
        g.value = value


# --- what is saved -------------------------------------------------------------------------------


def _split(objects, path) -> tuple[list, list]:
    objects = [part for o in objects for part in (o.split if isinstance(o, MixedDat) else (o,))]
    names = [getattr(o, "name", None) for o in objects]
    repeated = sorted({n for n in names if names.count(n) > 1})
    kinds = [o for o in objects if not hasattr(o, "is_global")]
    if kinds or repeated:
        raise CheckpointError(f"checkpoint {os.fspath(path)!r}: pass Dats and Globals with distinct names"
                              + (f"; {repeated} repeat" if repeated else f"; got {type(kinds[0]).__name__}"))
    return [o for o in objects if not o.is_global], [o for o in objects if o.is_global]


def _mesh_signature(engine, comm) -> dict:
    """Set sizes and map hashes (the same on every rank and for every rank count)."""
    sets, maps, _ = engine.declared(agreed=True)
    signature = {f"set {s.name}": s.size for s in sets}
    local = []
    for m in maps:
        rows = map_block(engine, m).astype(np.uint64)
        start = 0 if not engine.distributed else int(block_offsets(m.source.size, comm.size)[comm.rank])
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


# --- the file -------------------------------------------------------------------------------------


def _fill(f, mesh: dict, dats, globs) -> None:
    """Rank 0: the metadata, empty datasets and the globals."""
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
