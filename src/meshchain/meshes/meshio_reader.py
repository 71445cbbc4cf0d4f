"""Read triangle, quad and tetrahedron meshes from any format ``meshio`` reads.

:func:`read_meshio` reads Gmsh ``.msh`` (2.2 and 4.x), VTK ``.vtk``/``.vtu``,
XDMF, Medit, ... files with :func:`meshio.read` and returns an
:class:`~meshchain.meshes.generators.UnstructuredMesh`.

Examples
--------
>>> import tempfile, pathlib, meshio, numpy as np
>>> from meshchain.meshes.generators import structured_tris
>>> mesh = structured_tris(2, 2)
>>> path = pathlib.Path(tempfile.mkdtemp()) / "square.vtu"
>>> xyz = np.column_stack((mesh.coords, np.zeros(mesh.nnode)))  # VTK wants 3D points
>>> meshio.write_points_cells(path, xyz, [("triangle", mesh.cells)])
>>> back = read_meshio(path)
>>> back.ncell, back.gdim, bool((back.cells == mesh.cells).all())
(8, 2, True)
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import DataShapeError, MeshchainError, MeshFileError, MeshFileNotFoundError
from .generators import CELL_TYPES, UnstructuredMesh

__all__ = ["read_meshio", "MeshFileError", "MeshFileNotFoundError"]

_log = logging.getLogger(__name__)


def _read(path: Path, file_format: str | None) -> Any:
    """``meshio.read`` with every failure turned into a :class:`MeshFileError`."""
    import meshio

    if not path.exists():
        raise MeshFileNotFoundError(f"mesh file {str(path)!r} does not exist; check the path")
    if not path.is_file():
        raise MeshFileError(f"mesh path {str(path)!r} is not a regular file")
    # meshio prints its warnings and errors (and calls sys.exit when no reader
    # accepts the file): capture them, log them, and name them in our error.
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            mesh = meshio.read(path, file_format=file_format)
    except MeshchainError:  # pragma: no cover - defensive
        raise
    except (Exception, SystemExit) as err:  # ReadError, ValueError, IndexError, exit(1), ...
        how = f" as {file_format!r}" if file_format else ""
        said = " ".join(out.getvalue().split())
        exited = isinstance(err, SystemExit)
        cause = "no reader accepted it" if exited else f"{type(err).__name__}: {err}"
        raise MeshFileError(
            f"meshio could not read mesh file {str(path)!r}{how}: {cause}"
            + (f" (meshio said: {said})" if said else "")
            + ". Check that the file is complete and that its extension matches its format "
            "(or pass file_format=...)"
        ) from (None if exited else err)
    if out.getvalue().strip():
        _log.info("meshio, reading %s: %s", path, out.getvalue().strip())
    return mesh


def _select_type(path: Path, blocks: list[Any], cell_type: str | None) -> str:
    """Pick the cell type to read: ``cell_type`` or the single top-dimensional type."""
    found: dict[str, int] = {}
    for b in blocks:
        if len(b.data):
            found[b.type] = max(found.get(b.type, 0), int(b.dim))
    if cell_type is not None:
        if cell_type not in CELL_TYPES:
            raise DataShapeError(
                f"cell_type={cell_type!r} is not supported; use one of {sorted(CELL_TYPES)}"
            )
        if cell_type not in found:
            raise DataShapeError(
                f"mesh file {str(path)!r} has no {cell_type!r} cells; it has {sorted(found)}"
            )
        return cell_type
    top = max(found.values(), default=-1)
    if top < 2:
        raise DataShapeError(
            f"mesh file {str(path)!r} has no 2D or 3D cells (found {sorted(found) or 'no cells'}); "
            f"read_meshio needs one of {sorted(CELL_TYPES)}"
        )
    types = sorted(t for t, d in found.items() if d == top)
    if len(types) > 1:
        raise DataShapeError(
            f"mesh file {str(path)!r} mixes {top}D cell types {types}; meshchain meshes have a "
            f"single cell type: pass cell_type=... "
            f"(one of {[t for t in types if t in CELL_TYPES]}) "
            "to read only those cells"
        )
    if types[0] not in CELL_TYPES:
        raise DataShapeError(
            f"mesh file {str(path)!r} has {types[0]!r} cells, which meshchain does not support; "
            f"convert the mesh to one of {sorted(CELL_TYPES)}"
        )
    return types[0]


def _planar_coords(path: Path, points: np.ndarray, gdim: int) -> np.ndarray:
    """Coordinates with ``gdim`` columns; drop a constant z for 2D cells."""
    if points.ndim != 2 or points.shape[1] < gdim:
        raise DataShapeError(
            f"mesh file {str(path)!r} has points of shape {points.shape}; "
            f"{gdim}D cells need at least {gdim} coordinates per point"
        )
    extra = points[:, gdim:]
    if extra.size and np.ptp(extra, axis=0).max() != 0.0:
        raise DataShapeError(
            f"mesh file {str(path)!r} has 2D cells on points whose z coordinate varies; "
            "only planar meshes (constant z) can be read as triangle or quad meshes"
        )
    return np.ascontiguousarray(points[:, :gdim], dtype=np.float64)


def read_meshio(
    path: str | os.PathLike[str],
    *,
    cell_type: str | None = None,
    file_format: str | None = None,
) -> UnstructuredMesh:
    """Read a triangle, quad or tetrahedron mesh with ``meshio``.

    The cell blocks of the highest topological dimension in the file are
    read (triangles or quads in 2D, tetrahedra in 3D) and concatenated in file
    order; lower-dimensional blocks (boundary lines, points, surface triangles
    of a 3D mesh) are ignored. For 2D cells a constant (normally zero) z
    coordinate is dropped. Cells are then oriented and the facets derived by
    :meth:`UnstructuredMesh.from_cells`.

    All points of the file are kept, in file order, so node ids match the
    file. Points used by no selected cell (for example Gmsh geometry points,
    or the nodes of cells of another type) remain as unused nodes.

    Parameters
    ----------
    path : str or path-like
        The mesh file.
    cell_type : {"triangle", "quad", "tetra"}, optional, keyword-only
        Read only the cells of this type. Required when the file holds several
        cell types of the highest dimension (for example triangles and quads).
    file_format : str, optional, keyword-only
        A meshio format name (``"gmsh"``, ``"vtu"``, ...) when the extension
        does not tell it.

    Returns
    -------
    UnstructuredMesh

    Raises
    ------
    MeshFileNotFoundError
        If ``path`` does not exist (also a :class:`FileNotFoundError`).
    MeshFileError
        If meshio cannot read the file; the original exception is chained.
    DataShapeError
        If the file mixes top-dimensional cell types and ``cell_type`` is not
        given, holds no supported cells, or has non-planar 2D cells.
    MapError
        If the cells form a non-manifold mesh.

    Examples
    --------
    >>> try:
    ...     read_meshio("no/such/file.msh")
    ... except FileNotFoundError as err:  # also a MeshchainError
    ...     print(type(err).__name__)
    MeshFileNotFoundError
    """
    p = Path(path)
    mesh = _read(p, file_format)
    ctype = _select_type(p, list(mesh.cells), cell_type)
    cells = np.concatenate([np.asarray(b.data) for b in mesh.cells if b.type == ctype], axis=0)
    gdim = CELL_TYPES[ctype][1]
    coords = _planar_coords(p, np.asarray(mesh.points), gdim)
    return UnstructuredMesh.from_cells(coords, cells, ctype)
