"""OP2's HDF5 mesh files (``new_grid.h5``): read by blocks of rows, written from every rank.

The layout is the one OP2-Common's ``op_decl_set_hdf5``, ``op_decl_map_hdf5``,
``op_decl_dat_hdf5`` read and ``op_dump_to_hdf5`` / ``op_fetch_data_hdf5_file`` write:
one dataset per object, at the root, named after it:

- a set: an int32 dataset of shape ``(1,)`` holding its size (``nodes``, ``edges``, ...);
- a map: an int32 dataset of shape ``(source size, arity)`` of 0-based target ids, with the
  attributes ``size``, ``dim`` and ``type`` (``"int"``) (``pedge``, ``pcell``, ...);
- a dat: a dataset of shape ``(set size, dim)`` of its type, with the attributes ``size``,
  ``dim`` and ``type`` (``"double"``, ``"float"``, ``"int"``, ``"long long"``) (``p_x``, ...);
- a global (OP2's ``op_write_const_hdf5``): a dataset of shape ``(dim,)`` with ``dim``
  and ``type``.

:func:`read_op2_hdf5` reads Airfoil's sets, maps and dats (other datasets in the file,
such as OP2's ``p_q`` or constants, are ignored). On one process it returns the whole
:class:`~meshchain.meshes.op2.AirfoilMesh`; on several ranks each rank reads only its
block of rows of every map and dat (a contiguous hyperslab) and gets an
:class:`AirfoilBlocks`, whose :meth:`~AirfoilBlocks.declare` passes those rows as
``mc.Block``: no rank ever holds the whole mesh.

:func:`write_op2_hdf5` writes an :class:`~meshchain.meshes.op2.AirfoilMesh` (on the calling
process), or declared meshchain objects from every rank without gathering them: each
rank's block of rows in global numbering, appended in rank order to a temporary file that
rank 0 renames into place when it is complete (see :mod:`meshchain.io.ranked`).

Examples
--------
>>> import os, tempfile
>>> from meshchain.meshes import naca0012, read_op2_hdf5, write_op2_hdf5
>>> path = os.path.join(tempfile.mkdtemp(), "new_grid.h5")
>>> mesh = naca0012(4, 6)
>>> write_op2_hdf5(mesh, path)
>>> read_op2_hdf5(path) == mesh
True
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from ..comm.agree import raise_together
from ..core.errors import DeclarationError, MeshchainError, MeshFileError, MeshFileNotFoundError
from ..io.ranked import (agreed, block_range, context, create_on_root, dat_block, map_block, replace_on_root,
                         write_in_turn)
from ..types import Block, Dat, Global, Map, Set
from .op2 import AirfoilArrays, AirfoilMesh, check_range, declare_airfoil

__all__ = ["AirfoilBlocks", "read_op2_hdf5", "write_op2_hdf5", "declare_op2_hdf5"]

SETS = ("nodes", "edges", "bedges", "cells")
# dataset -> (source set, arity, AirfoilMesh field, target set)
MAPS = {
    "pedge": ("edges", 2, "edge", "nodes"),
    "pecell": ("edges", 2, "ecell", "cells"),
    "pbedge": ("bedges", 2, "bedge", "nodes"),
    "pbecell": ("bedges", 1, "becell", "cells"),
    "pcell": ("cells", 4, "cell", "nodes"),
}
# dataset -> (set, dim, AirfoilMesh field, numpy kind)
DATS = {"p_x": ("nodes", 2, "x", "f"), "p_bound": ("bedges", 1, "bound", "iu")}
OP2_TYPES = {"float64": "double", "float32": "float", "int32": "int", "int64": "long long"}


@dataclass(frozen=True, eq=False)
class AirfoilBlocks(AirfoilArrays):
    """This rank's rows of an Airfoil mesh read on several ranks (:func:`read_op2_hdf5`).

    ``nnode, ncell, nedge, nbedge`` are the global sizes; ``x, cell, edge, ecell, bedge,
    becell, bound`` hold this rank's block of rows (global ids), as in
    :class:`~meshchain.meshes.op2.AirfoilMesh`.
    """

    nnode: int
    ncell: int
    nedge: int
    nbedge: int

    def declare(self, prefix: str = ""):
        """Declare the mesh as :meth:`AirfoilMesh.declare` does, from each rank's rows."""
        return declare_airfoil((self.nnode, self.nedge, self.nbedge, self.ncell), self, prefix, Block)

    def per_cell(self, row):
        """``row`` repeated for this rank's cells, as ``mc.Block`` (initial values of a cell dat)."""
        return Block(np.tile(np.asarray(row, dtype=np.float64), (len(self.cell), 1)))

    def __repr__(self) -> str:
        return (f"AirfoilBlocks(nnode={self.nnode}, ncell={self.ncell}, nedge={self.nedge}, "
                f"nbedge={self.nbedge}, rows here: {len(self.cell)} cells)")


# --- reading ----------------------------------------------------------------------------------------


def read_op2_hdf5(path):
    """Read OP2's Airfoil mesh from an HDF5 file in OP2's layout (collective on several ranks).

    Parameters
    ----------
    path : str or os.PathLike
        The file (OP2's ``new_grid.h5``, or one written by :func:`write_op2_hdf5`).

    Returns
    -------
    AirfoilMesh or AirfoilBlocks
        The whole mesh on one process; each rank's block of rows on several.

    Raises
    ------
    MeshFileNotFoundError
        The file does not exist.
    MeshFileError
        It is not an HDF5 file, is truncated, or a set, map or dat is missing or has the
        wrong shape or type; the message names the file and the dataset.
    MapError
        A map refers to an element outside its target set (file, map and row named).

    All of them are raised on every rank.
    """
    session, comm = context()
    name = os.fspath(path)
    result, error = None, None
    try:
        result = _read(name, comm)
    except MeshchainError as exc:
        error = exc
    raise_together(comm, error)
    if not session.distributed:
        result = AirfoilMesh(**{f.name: getattr(result, f.name) for f in dataclasses.fields(AirfoilMesh)})
        result.validate()
    return result


def _read(name: str, comm) -> AirfoilBlocks:
    shapes = {d: (arity, "iu") for d, (_, arity, _, _) in MAPS.items()}
    shapes.update({d: (dim, kind) for d, (_, dim, _, kind) in DATS.items()})
    sizes, found = _read_objects(name, comm, SETS, {d: (source, target) for d, (source, _, _, target) in MAPS.items()},
                                 {d: owner for d, (owner, _, _, _) in DATS.items()}, shapes)
    rows = {field: found[d] for d, (_, _, field, _) in (*MAPS.items(), *DATS.items())}
    for dataset, (source, _, field, target) in MAPS.items():
        lo, _ = block_range(sizes[source], comm)
        check_range(rows[field], f"{name}: map {dataset}", target[:-1], sizes[target], first=lo)
    rows["becell"], rows["bound"] = rows["becell"].reshape(-1), rows["bound"].reshape(-1)
    rows["x"] = rows["x"].astype(np.float64)
    for field in ("cell", "edge", "ecell", "bedge", "becell", "bound"):
        rows[field] = rows[field].astype(np.int32)
    return AirfoilBlocks(nnode=sizes["nodes"], ncell=sizes["cells"], nedge=sizes["edges"], nbedge=sizes["bedges"],
                         **rows)


def _dataset(f, name: str, dataset: str, what: str):
    found = f.get(dataset)
    if found is None or not hasattr(found, "shape"):
        raise MeshFileError(f"mesh file {name!r}: dataset {dataset!r} ({what}) is missing; the file holds "
                            f"{sorted(f)[:20]}.")
    return found


def _set_size(f, name: str, dataset: str) -> int:
    found = _dataset(f, name, dataset, "a set: its size as one integer")
    value = np.asarray(found[()]).reshape(-1)
    if value.size != 1 or value.dtype.kind not in "iu" or value[0] < 0:
        raise MeshFileError(f"mesh file {name!r}: set {dataset!r} holds {value.tolist()[:4]} ({value.dtype}); a "
                            f"set's dataset holds its size, one non-negative integer.")
    return int(value[0])


def _rows(f, name: str, dataset: str, size: int, dim, kinds: str, comm) -> np.ndarray:
    """This rank's block of a map's or dat's rows, checked against its set's size and ``dim``
    (None: the file's)."""
    found = _dataset(f, name, dataset, f"{size} rows of {dim or 'any'}")
    shape = tuple(found.shape) + ((1,) if len(found.shape) == 1 else ())
    dim = shape[1] if dim is None and len(shape) == 2 else dim
    if shape != (size, dim) or found.dtype.kind not in kinds:
        raise MeshFileError(f"mesh file {name!r}: dataset {dataset!r} has shape {tuple(found.shape)} and type "
                            f"{found.dtype}; expected ({size}, {dim}) of {'integers' if 'i' in kinds else 'reals'} "
                            f"(its set has {size} elements).")
    lo, hi = block_range(size, comm)
    return np.asarray(found[lo:hi]).reshape(hi - lo, dim)


def declare_op2_hdf5(path, *, sets, maps=None, dats=None) -> dict:
    """Declare sets, maps and dats from a file in OP2's HDF5 layout, as OP2's
    ``op_decl_set_hdf5``, ``op_decl_map_hdf5`` and ``op_decl_dat_hdf5`` do, for any OP2
    application (collective on several ranks: each rank reads only its block of rows).

    Parameters
    ----------
    path : str or os.PathLike
    sets : sequence of str
        Set names: each a dataset holding the set's size.
    maps : dict, optional
        ``{map name: (source set, target set)}``; the arity is the dataset's second extent.
    dats : dict, optional
        ``{dat name: set}``; dim and dtype are the dataset's.

    Returns
    -------
    dict
        Name -> the declared :class:`~meshchain.Set`, :class:`~meshchain.Map` or
        :class:`~meshchain.Dat`; partition afterwards as usual.

    Raises
    ------
    MeshFileNotFoundError, MeshFileError, MapError, DeclarationError
        On every rank, naming the file and the dataset (or the set a map or dat names).

    Examples
    --------
    >>> import os, tempfile
    >>> from meshchain.meshes import naca0012, write_op2_hdf5
    >>> path = os.path.join(tempfile.mkdtemp(), "new_grid.h5")
    >>> write_op2_hdf5(naca0012(4, 6), path)
    >>> found = declare_op2_hdf5(path, sets=["nodes", "cells"], maps={"pcell": ("cells", "nodes")},
    ...                          dats={"p_x": "nodes"})
    >>> found["pcell"].arity, found["p_x"].dim, found["cells"].size
    (4, 2, 72)
    """
    maps, dats, sets = dict(maps or {}), dict(dats or {}), list(sets)
    session, comm = context()
    agreed(comm, lambda: _check_names(path, sets, maps, dats), DeclarationError)
    name, found, error = os.fspath(path), None, None
    try:
        found = _read_objects(name, comm, list(sets), maps, dats)
    except MeshchainError as exc:
        error = exc
    raise_together(comm, error)
    wrap = Block if session.distributed else (lambda rows: rows)
    sizes, rows = found
    declared = {s: Set(sizes[s], s) for s in sets}
    for m, (source, target) in maps.items():
        declared[m] = Map(declared[source], declared[target], rows[m].shape[1], wrap(rows[m]), m)
    for d, owner in dats.items():
        declared[d] = Dat(declared[owner], rows[d].shape[1], wrap(rows[d]), d, dtype=rows[d].dtype)
    return declared


def _check_names(path, sets, maps, dats) -> None:
    unknown = sorted(({s for pair in maps.values() for s in pair} | set(dats.values())) - set(sets))
    if unknown:
        raise DeclarationError(f"declare_op2_hdf5({os.fspath(path)!r}): maps or dats name the sets {unknown}, which "
                               f"are not among sets={sets}.")


def _read_objects(name: str, comm, sets, maps, dats, shapes=None):
    """Set sizes and this rank's rows of every map and dat (``shapes``: ``{dataset: (dim,
    dtype kinds)}`` the file must have; otherwise any dim, integer maps, numeric dats)."""
    shapes = shapes or {}
    import h5py

    if not os.path.exists(name):
        raise MeshFileNotFoundError(f"mesh file {name!r} does not exist; check the path.")
    try:
        with h5py.File(name, "r") as f:
            sizes = {s: _set_size(f, name, s) for s in sets}
            rows = {m: _rows(f, name, m, sizes[source], *shapes.get(m, (None, "iu")), comm)
                    for m, (source, _) in maps.items()}
            rows.update({d: _rows(f, name, d, sizes[owner], *shapes.get(d, (None, "iuf")), comm)
                         for d, owner in dats.items()})
    except (OSError, KeyError, ValueError) as exc:
        raise MeshFileError(f"mesh file {name!r} cannot be read ({type(exc).__name__}: {exc}); it is not an HDF5 "
                            f"file or it is truncated.") from exc
    return sizes, rows


# --- writing ----------------------------------------------------------------------------------------


def write_op2_hdf5(what, path) -> None:
    """Write a mesh in OP2's HDF5 layout.

    Parameters
    ----------
    what : AirfoilMesh, or declared objects
        An :class:`AirfoilMesh` (written by the calling process), or meshchain sets, maps,
        dats and globals: a list of them or a dataclass holding them (such as
        :class:`~meshchain.meshes.op2.DeclaredAirfoil` or the Airfoil app's problem), written
        in global numbering from every rank (collective; the mesh must be partitioned on
        several ranks).
    path : str or os.PathLike
        The file, replaced atomically when it is complete.

    Raises
    ------
    MeshFileError
        The file cannot be written, or two objects share a name (on every rank).
    """
    if isinstance(what, AirfoilMesh):
        what.validate()
        from mpi4py import MPI

        _write(MPI.COMM_SELF, path, _mesh_records(what))
        return
    session, comm = context()
    objects = _objects(what)
    agreed(comm, lambda: _check_objects(objects, path), MeshFileError)
    _write(comm, path, _object_records(session, comm, objects))


def _failure(message: str) -> MeshFileError:
    return MeshFileError(f"mesh file {message}")


def _check_objects(objects, path) -> None:
    for obj in objects:
        if not isinstance(obj, (Set, Map, Dat, Global)):
            raise MeshFileError(f"write_op2_hdf5: {type(obj).__name__} is not a Set, Map, Dat or Global; pass "
                                f"meshchain objects or an AirfoilMesh.")
    names = [o.name for o in objects]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise MeshFileError(f"mesh file {os.fspath(path)!r}: the objects {repeated} share a name; OP2's HDF5 layout "
                            f"stores each object under its name.")


def _write(comm, path, records) -> None:
    """``records``: (name, global shape, dtype, attributes, first row, this rank's rows)."""

    def fill(f):
        for name, shape, dtype, attrs, _, _ in records:
            dataset = f.create_dataset(name, shape=shape, dtype=dtype)
            for key, value in attrs.items():
                dataset.attrs[key] = value

    temporary = create_on_root(comm, path, fill, _failure)
    write_in_turn(comm, temporary, path, [(r[0], r[4], r[5]) for r in records], _failure)
    replace_on_root(comm, temporary, path, _failure)


def _attributes(size: int, dim: int, dtype) -> dict:
    return {"size": np.array([size], dtype=np.int32), "dim": np.array([dim], dtype=np.int32),
            "type": np.bytes_(OP2_TYPES.get(np.dtype(dtype).name, np.dtype(dtype).name))}


def _record(name, size, dim, dtype, lo, rows):
    return (name, (size, dim), np.dtype(dtype), _attributes(size, dim, dtype), lo, rows)


def _set_record(name, size, *, here: bool = True):
    """A set's size (``here``: this rank writes it; one rank does)."""
    return (name, (1,), np.dtype(np.int32), {}, 0, np.array([size] if here else [], dtype=np.int32))


def _mesh_records(mesh: AirfoilMesh) -> list:
    sizes = {"nodes": mesh.nnode, "edges": mesh.nedge, "bedges": mesh.nbedge, "cells": mesh.ncell}
    records = [_set_record(s, sizes[s]) for s in SETS]
    for dataset, (source, arity, field, _) in MAPS.items():
        records.append(_record(dataset, sizes[source], arity, np.int32, 0, getattr(mesh, field).reshape(-1, arity)))
    for dataset, (source, dim, field, _) in DATS.items():
        values = getattr(mesh, field).reshape(-1, dim)
        records.append(_record(dataset, sizes[source], dim, values.dtype, 0, values))
    return records


def _objects(what) -> list:
    if dataclasses.is_dataclass(what) and not isinstance(what, type):
        return [getattr(what, f.name) for f in dataclasses.fields(what)]
    return list(what)


def _object_records(session, comm, objects) -> list:
    records = []
    for obj in objects:
        if isinstance(obj, Set):
            records.append(_set_record(obj.name, obj.size, here=comm.rank == 0))
        elif isinstance(obj, Map):
            lo, _ = block_range(obj.source.size, comm)
            records.append(_record(obj.name, obj.source.size, obj.arity, np.int32, lo, map_block(session, obj)))
        elif isinstance(obj, Dat):
            lo, _ = block_range(obj.dataset.size, comm)
            records.append(_record(obj.name, obj.dataset.size, obj.dim, obj.dtype, lo,
                                   dat_block(session, comm, obj, MeshFileError)))
        else:  # a Global (checked before)
            rows = np.asarray(obj.value).reshape(-1) if comm.rank == 0 else np.zeros(0, obj.value.dtype)
            records.append((obj.name, (obj.dim,), obj.value.dtype, _attributes(obj.dim, obj.dim, obj.value.dtype)
                            | {"size": np.array([1], np.int32)}, 0, rows))
    return records
