"""Single-cell-type unstructured meshes as plain NumPy arrays, and generators.

An :class:`UnstructuredMesh` holds the node coordinates, the cell-to-node
connectivity and the derived facet adjacency (interior and boundary facets) of
a triangle, quadrilateral or tetrahedron mesh. :meth:`UnstructuredMesh.declare`
turns it into meshchain sets, maps and a coordinate dat.

Conventions
-----------
* Node ids are ``int32`` and start at 0; coordinates are ``float64``.
* 2D cells are counter-clockwise; tetrahedra are positively oriented
  (``det[x1 - x0, x2 - x0, x3 - x0] > 0``). :meth:`UnstructuredMesh.from_cells`
  reorders the vertices of cells that are not.
* Local facet ``i`` of a cell: for triangles and quads the edge from vertex
  ``i`` to vertex ``i + 1`` (cyclic); for tetrahedra the face opposite vertex
  ``i``.
* Facet node order is taken from ``facet_cells[:, 0]`` (the lower cell id), so
  the facet is oriented outward from that cell: in 2D the normal
  ``(dy, -dx)`` of edge ``(a, b)`` points from ``facet_cells[:, 0]`` into
  ``facet_cells[:, 1]``; boundary facets point out of the domain.
* Facets are numbered by their first cell, then by local facet index, which
  keeps neighbouring facets close in memory; the numbering depends only on
  the input arrays.

Examples
--------
>>> from meshchain.meshes.generators import structured_quads
>>> mesh = structured_quads(2, 1)
>>> mesh.nnode, mesh.ncell, mesh.nfacet, mesh.nbfacet
(6, 2, 1, 6)
>>> mesh.facets.tolist(), mesh.facet_cells.tolist()
([[1, 4]], [[0, 1]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import DataShapeError, DeclarationError, MapError

if TYPE_CHECKING:  # pragma: no cover
    import meshchain as mc

__all__ = [
    "CELL_TYPES",
    "UnstructuredMesh",
    "DeclaredMesh",
    "structured_quads",
    "structured_tris",
    "jittered_delaunay",
]

#: Local facets of each supported cell type, as local vertex indices. Facet
#: ``i`` of a triangle/quad is edge ``(i, i+1)``; of a tetrahedron the face
#: opposite vertex ``i``, oriented outward for a positively oriented cell.
_LOCAL_FACETS: dict[str, np.ndarray] = {
    "triangle": np.array([[0, 1], [1, 2], [2, 0]], dtype=np.intp),
    "quad": np.array([[0, 1], [1, 2], [2, 3], [3, 0]], dtype=np.intp),
    "tetra": np.array([[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]], dtype=np.intp),
}

#: Vertex permutation that reverses the orientation of a cell.
_FLIP: dict[str, np.ndarray] = {
    "triangle": np.array([0, 2, 1], dtype=np.intp),
    "quad": np.array([0, 3, 2, 1], dtype=np.intp),
    "tetra": np.array([0, 1, 3, 2], dtype=np.intp),
}

#: Supported cell types: name -> (vertices per cell, geometric dimension).
CELL_TYPES: dict[str, tuple[int, int]] = {"triangle": (3, 2), "quad": (4, 2), "tetra": (4, 3)}

_INT32_MAX = np.iinfo(np.int32).max


# --------------------------------------------------------------------------- #
# Small array helpers
# --------------------------------------------------------------------------- #
def _check_cell_type(cell_type: str) -> tuple[int, int]:
    try:
        return CELL_TYPES[cell_type]
    except (KeyError, TypeError):
        raise DeclarationError(
            f"unsupported cell_type {cell_type!r}; use one of {sorted(CELL_TYPES)}"
        ) from None


def signed_measures(coords: np.ndarray, cells: np.ndarray, cell_type: str) -> np.ndarray:
    """Signed area (2D) or volume (tetrahedra) of every cell.

    Positive for counter-clockwise 2D cells and positively oriented tetrahedra.
    Quad areas use the shoelace formula.

    Examples
    --------
    >>> import numpy as np
    >>> xy = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> signed_measures(xy, np.array([[0, 1, 2], [0, 2, 1]]), "triangle").tolist()
    [0.5, -0.5]
    """
    _check_cell_type(cell_type)
    x = np.asarray(coords, dtype=np.float64)[np.asarray(cells)]  # (ncell, nvert, gdim)
    if cell_type == "tetra":
        d = x[:, 1:, :] - x[:, :1, :]
        return np.linalg.det(d) / 6.0 if len(d) else np.zeros(0)
    xs, ys = x[..., 0], x[..., 1]
    return 0.5 * np.sum(xs * np.roll(ys, -1, axis=1) - np.roll(xs, -1, axis=1) * ys, axis=1)


def _sort_rows(a: np.ndarray) -> np.ndarray:
    """Sort each (short) row; a fast path for pairs."""
    if a.shape[1] == 2:
        return np.column_stack((np.minimum(a[:, 0], a[:, 1]), np.maximum(a[:, 0], a[:, 1])))
    return np.sort(a, axis=1)


def _facet_keys(sorted_nodes: np.ndarray, nnode: int) -> np.ndarray | None:
    """One int64 key per row of sorted node ids, or None if it could overflow."""
    nfv = sorted_nodes.shape[1]
    if nnode ** nfv >= 2**62:
        return None
    key = np.zeros(len(sorted_nodes), dtype=np.int64)
    for j in range(nfv):
        key *= nnode
        key += sorted_nodes[:, j]
    return key


def _group_sorted(sorted_nodes: np.ndarray, nnode: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable sort order of the rows and the start of each group of equal rows."""
    key = _facet_keys(sorted_nodes, nnode)
    if key is not None:
        order = np.argsort(key, kind="stable")
        k = key[order]
        new = k[1:] != k[:-1]
    else:  # pragma: no cover - needs > ~1.6M nodes in 3D
        order = np.lexsort(sorted_nodes.T[::-1])
        k = sorted_nodes[order]
        new = np.any(k[1:] != k[:-1], axis=1)
    starts = np.flatnonzero(np.concatenate(([True], new)))
    return order, starts


def _as_coords(coords: Any, gdim: int, cell_type: str) -> np.ndarray:
    c = np.ascontiguousarray(coords, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != gdim:
        raise DataShapeError(
            f"coords for {cell_type!r} cells must have shape (nnode, {gdim}), got {c.shape}"
        )
    if not np.all(np.isfinite(c)):
        raise DataShapeError("coords contain NaN or infinite values; fix the input coordinates")
    return c


def _as_cells(cells: Any, nvert: int, nnode: int, cell_type: str) -> np.ndarray:
    c = np.asarray(cells)
    if c.ndim != 2 or c.shape[1] != nvert:
        raise MapError(
            f"cells of type {cell_type!r} must have shape (ncell, {nvert}), got {c.shape}"
        )
    if c.size and not np.issubdtype(c.dtype, np.integer):
        raise MapError(f"cells must hold integer node ids, got dtype {c.dtype}")
    if nnode > _INT32_MAX or len(c) * nvert > _INT32_MAX:
        raise MapError("mesh too large for int32 node/facet ids")
    if c.size and (c.min() < 0 or c.max() >= nnode):
        bad = int(np.flatnonzero(np.any((c < 0) | (c >= nnode), axis=1))[0])
        raise MapError(
            f"cell {bad} has node ids {c[bad].tolist()} outside [0, {nnode}); "
            "node ids must index rows of coords"
        )
    c = np.ascontiguousarray(c, dtype=np.int32)
    s = np.sort(c, axis=1)
    dup = np.any(s[:, 1:] == s[:, :-1], axis=1)
    if dup.any():
        bad = int(np.flatnonzero(dup)[0])
        raise MapError(f"cell {bad} repeats a node: {c[bad].tolist()}; remove degenerate cells")
    return c


def _orient(coords: np.ndarray, cells: np.ndarray, cell_type: str) -> np.ndarray:
    """Return cells with every cell positively oriented (copy only if needed)."""
    vol = signed_measures(coords, cells, cell_type)
    scale = np.max(np.abs(vol)) if len(vol) else 0.0
    zero = np.abs(vol) <= 1e-14 * scale
    if zero.any() or (len(vol) and scale == 0.0):
        bad = int(np.flatnonzero(zero | (vol == 0.0))[0])
        raise DataShapeError(
            f"cell {bad} ({cells[bad].tolist()}) has zero "
            f"{'volume' if cell_type == 'tetra' else 'area'}; "
            "remove degenerate cells"
        )
    neg = vol < 0
    if neg.any():
        cells = cells.copy()
        cells[neg] = cells[neg][:, _FLIP[cell_type]]
    return cells


def _derive_facets(cells: np.ndarray, nnode: int, cell_type: str) -> dict[str, np.ndarray]:
    """Interior and boundary facets and their cells, vectorised."""
    lf = _LOCAL_FACETS[cell_type]
    nlf, nfv = lf.shape
    allf = cells[:, lf].reshape(-1, nfv)  # local facet r belongs to cell r // nlf
    srt = _sort_rows(allf)
    order, starts = _group_sorted(srt, nnode)
    counts = np.diff(np.concatenate((starts, [len(order)])))
    if counts.size and counts.max() > 2:
        g = int(np.flatnonzero(counts > 2)[0])
        members = order[starts[g] : starts[g] + counts[g]] // nlf
        raise MapError(
            f"non-manifold mesh: facet {srt[order[starts[g]]].tolist()} is shared by "
            f"{counts[g]} cells {sorted(members.tolist())}; "
            "each facet may belong to at most 2 cells"
        )
    first = order[starts]  # lowest local-facet index of each group (stable sort)
    inner = counts == 2
    f0 = first[inner]
    f1 = order[starts[inner] + 1]
    perm = np.argsort(f0)
    f0, f1 = f0[perm], f1[perm]
    b = np.sort(first[~inner])
    return {
        "facets": np.ascontiguousarray(allf[f0], dtype=np.int32),
        "facet_cells": np.stack((f0 // nlf, f1 // nlf), axis=1).astype(np.int32),
        "boundary_facets": np.ascontiguousarray(allf[b], dtype=np.int32),
        "boundary_facet_cells": (b // nlf).astype(np.int32),
    }


# --------------------------------------------------------------------------- #
# The mesh container
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class DeclaredMesh:
    """Meshchain sets, maps and the coordinate dat of an :class:`UnstructuredMesh`.

    Returned by :meth:`UnstructuredMesh.declare`.
    """

    nodes: Any
    cells: Any
    facets: Any
    bfacets: Any
    cell2node: Any
    facet2node: Any
    facet2cell: Any
    bfacet2node: Any
    bfacet2cell: Any
    coords: Any


@dataclass(frozen=True, eq=False, repr=False)
class UnstructuredMesh:
    """A single-cell-type unstructured mesh stored as NumPy arrays.

    Build one with :meth:`from_cells` (which derives the facets) or with a
    generator such as :func:`structured_quads`; the constructor itself only
    converts dtypes and checks shapes (call :meth:`validate` for a full check).

    Parameters
    ----------
    coords : ndarray, shape (nnode, gdim), float64
        Node coordinates. Nodes not used by any cell are allowed.
    cells : ndarray, shape (ncell, nvert), int32
        Node ids of each cell; 2D cells counter-clockwise.
    facets : ndarray, shape (nfacet, nfv), int32
        Interior facets (edges in 2D, triangles in 3D), each shared by exactly
        two cells, oriented outward from ``facet_cells[:, 0]``.
    facet_cells : ndarray, shape (nfacet, 2), int32
        The two cells of each interior facet, lower id first.
    boundary_facets : ndarray, shape (nbfacet, nfv), int32
        Facets belonging to one cell only, oriented outward.
    boundary_facet_cells : ndarray, shape (nbfacet,), int32
        The cell of each boundary facet.
    cell_type : {"triangle", "quad", "tetra"}
        The cell type.

    Examples
    --------
    >>> import numpy as np
    >>> xy = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    >>> mesh = UnstructuredMesh.from_cells(xy, [[0, 1, 2], [0, 2, 3]], "triangle")
    >>> mesh
    UnstructuredMesh(cell_type='triangle', gdim=2, nnode=4, ncell=2, nfacet=1, nbfacet=4)
    >>> mesh.facets.tolist(), mesh.facet_cells.tolist()
    ([[2, 0]], [[0, 1]])
    """

    coords: np.ndarray
    cells: np.ndarray
    facets: np.ndarray
    facet_cells: np.ndarray
    boundary_facets: np.ndarray
    boundary_facet_cells: np.ndarray
    cell_type: str

    def __post_init__(self) -> None:
        nvert, gdim = _check_cell_type(self.cell_type)
        nfv = _LOCAL_FACETS[self.cell_type].shape[1]
        set_ = object.__setattr__
        set_(self, "coords", _as_coords(self.coords, gdim, self.cell_type))
        shapes = {
            "cells": (np.int32, (nvert,)),
            "facets": (np.int32, (nfv,)),
            "facet_cells": (np.int32, (2,)),
            "boundary_facets": (np.int32, (nfv,)),
            "boundary_facet_cells": (np.int32, ()),
        }
        for name, (dtype, tail) in shapes.items():
            a = np.asarray(getattr(self, name))
            if a.size == 0 and a.ndim != 1 + len(tail):
                a = a.reshape((0,) + tail)
            if a.ndim != 1 + len(tail) or a.shape[1:] != tail:
                want = "(n" + "".join(f", {t}" for t in tail) + ")"
                raise DataShapeError(
                    f"UnstructuredMesh.{name} must have shape {want} for {self.cell_type!r} "
                    f"cells, got {a.shape}"
                )
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise MapError(f"UnstructuredMesh.{name} must hold integers, got dtype {a.dtype}")
            set_(self, name, np.ascontiguousarray(a, dtype=dtype))
        if len(self.facets) != len(self.facet_cells):
            raise DataShapeError(
                f"facets ({len(self.facets)}) and facet_cells ({len(self.facet_cells)}) "
                "differ in length"
            )
        if len(self.boundary_facets) != len(self.boundary_facet_cells):
            raise DataShapeError(
                f"boundary_facets ({len(self.boundary_facets)}) and boundary_facet_cells "
                f"({len(self.boundary_facet_cells)}) differ in length"
            )

    # ---------------------------------------------------------------- sizes
    @property
    def nnode(self) -> int:
        """Number of nodes (rows of :attr:`coords`)."""
        return int(self.coords.shape[0])

    @property
    def ncell(self) -> int:
        """Number of cells."""
        return int(self.cells.shape[0])

    @property
    def nfacet(self) -> int:
        """Number of interior facets."""
        return int(self.facets.shape[0])

    @property
    def nbfacet(self) -> int:
        """Number of boundary facets."""
        return int(self.boundary_facets.shape[0])

    @property
    def gdim(self) -> int:
        """Geometric dimension (2 or 3)."""
        return int(self.coords.shape[1])

    def __repr__(self) -> str:
        return (
            f"UnstructuredMesh(cell_type={self.cell_type!r}, gdim={self.gdim}, nnode={self.nnode}, "
            f"ncell={self.ncell}, nfacet={self.nfacet}, nbfacet={self.nbfacet})"
        )

    # ---------------------------------------------------------- construction
    @classmethod
    def from_cells(
        cls, coords: Any, cells: Any, cell_type: str, *, orient: bool = True
    ) -> UnstructuredMesh:
        """Build a mesh from coordinates and cells, deriving the facet adjacency.

        Parameters
        ----------
        coords : array_like, shape (nnode, gdim)
            Node coordinates (``gdim`` 2 for triangles and quads, 3 for tetra).
        cells : array_like of int, shape (ncell, nvert)
            Node ids of each cell.
        cell_type : {"triangle", "quad", "tetra"}
            The cell type.
        orient : bool, keyword-only
            Reorder the vertices of negatively oriented cells (clockwise in 2D)
            so that every cell is positively oriented (default). With
            ``orient=False`` cells are kept as given.

        Returns
        -------
        UnstructuredMesh

        Raises
        ------
        MapError
            If node ids are out of range, a cell repeats a node, or a facet is
            shared by more than two cells (non-manifold mesh).
        DataShapeError
            If the arrays have the wrong shape, or a cell has zero measure.

        Examples
        --------
        >>> import numpy as np
        >>> xy = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
        >>> UnstructuredMesh.from_cells(xy, [[0, 2, 1]], "triangle").cells.tolist()
        [[0, 1, 2]]
        """
        nvert, gdim = _check_cell_type(cell_type)
        xy = _as_coords(coords, gdim, cell_type)
        c = _as_cells(cells, nvert, len(xy), cell_type)
        if orient:
            c = _orient(xy, c, cell_type)
        return cls(coords=xy, cells=c, cell_type=cell_type, **_derive_facets(c, len(xy), cell_type))

    # ------------------------------------------------------------- checking
    def signed_measures(self) -> np.ndarray:
        """Signed area (2D) or volume (3D) of every cell; all positive for a valid mesh.

        Examples
        --------
        >>> structured_quads(2, 2, lx=2.0).signed_measures().tolist()
        [0.5, 0.5, 0.5, 0.5]
        """
        return signed_measures(self.coords, self.cells, self.cell_type)

    def validate(self) -> UnstructuredMesh:
        """Check the whole mesh for consistency; return ``self``.

        Checks node and cell id ranges, that no cell repeats a node, that every
        cell is positively oriented, and that the local facets of all cells are
        exactly the interior facets (twice, once per cell) plus the boundary
        facets (once).

        Raises
        ------
        MapError
            On out-of-range ids or inconsistent facet adjacency.
        DataShapeError
            On non-positively oriented or degenerate cells.

        Examples
        --------
        >>> structured_tris(3, 2).validate().ncell
        12
        """
        _as_cells(self.cells, self.cells.shape[1], self.nnode, self.cell_type)
        for name in ("facet_cells", "boundary_facet_cells"):
            a = getattr(self, name)
            if a.size and (a.min() < 0 or a.max() >= self.ncell):
                raise MapError(f"UnstructuredMesh.{name} has cell ids outside [0, {self.ncell})")
        for name in ("facets", "boundary_facets"):
            a = getattr(self, name)
            if a.size and (a.min() < 0 or a.max() >= self.nnode):
                raise MapError(f"UnstructuredMesh.{name} has node ids outside [0, {self.nnode})")
        vol = self.signed_measures()
        if np.any(vol <= 0):
            bad = int(np.flatnonzero(vol <= 0)[0])
            raise DataShapeError(
                f"cell {bad} ({self.cells[bad].tolist()}) has signed measure {vol[bad]:g} <= 0; "
                "build the mesh with UnstructuredMesh.from_cells to orient cells"
            )
        self._check_facet_incidence()
        return self

    def _check_facet_incidence(self) -> None:
        lf = _LOCAL_FACETS[self.cell_type]
        nlf, nfv = lf.shape
        expected = np.empty((self.ncell * nlf, nfv + 1), dtype=np.int64)
        expected[:, :nfv] = np.sort(self.cells[:, lf].reshape(-1, nfv), axis=1)
        expected[:, nfv] = np.repeat(np.arange(self.ncell), nlf)
        sf = np.sort(self.facets, axis=1)
        got = np.concatenate(
            (
                np.column_stack((sf, self.facet_cells[:, 0])),
                np.column_stack((sf, self.facet_cells[:, 1])),
                np.column_stack((np.sort(self.boundary_facets, axis=1), self.boundary_facet_cells)),
            )
        ).astype(np.int64)
        if got.shape != expected.shape:
            raise MapError(
                f"{self.ncell} cells have {len(expected)} local facets, but 2*nfacet + nbfacet = "
                f"{len(got)}; rebuild the facets with UnstructuredMesh.from_cells"
            )
        e = expected[np.lexsort(expected.T[::-1])]
        g = got[np.lexsort(got.T[::-1])]
        mism = np.any(e != g, axis=1)
        if mism.any():
            i = int(np.flatnonzero(mism)[0])
            raise MapError(
                f"facet adjacency inconsistent with cells: cell {int(e[i, -1])} has facet "
                f"{e[i, :-1].tolist()} but the facet arrays give {g[i, :-1].tolist()} for cell "
                f"{int(g[i, -1])}; rebuild the facets with UnstructuredMesh.from_cells"
            )

    # ----------------------------------------------------------- declaring
    def declare(self, prefix: str = "") -> DeclaredMesh:
        """Declare the mesh as meshchain sets, maps and a coordinate dat.

        Parameters
        ----------
        prefix : str
            Prepended to every name (``nodes``, ``cells``, ``facets``,
            ``bfacets``, ``cell2node``, ...), to tell several meshes apart.

        Returns
        -------
        DeclaredMesh
            Sets ``nodes, cells, facets, bfacets``; maps ``cell2node``,
            ``facet2node``, ``facet2cell`` (arity 2), ``bfacet2node``,
            ``bfacet2cell`` (arity 1); dat ``coords`` (dim ``gdim``, float64).

        Examples
        --------
        >>> m = structured_quads(2, 2).declare(prefix="q_")
        >>> m.cell2node.arity, m.facet2cell.arity, m.coords.dim
        (4, 2, 2)
        """
        import meshchain as mc

        nfv = self.facets.shape[1]
        nodes = mc.Set(self.nnode, f"{prefix}nodes")
        cells = mc.Set(self.ncell, f"{prefix}cells")
        facets = mc.Set(self.nfacet, f"{prefix}facets")
        bfacets = mc.Set(self.nbfacet, f"{prefix}bfacets")
        nvert = self.cells.shape[1]
        return DeclaredMesh(
            nodes=nodes,
            cells=cells,
            facets=facets,
            bfacets=bfacets,
            cell2node=mc.Map(cells, nodes, nvert, self.cells, f"{prefix}cell2node"),
            facet2node=mc.Map(facets, nodes, nfv, self.facets, f"{prefix}facet2node"),
            facet2cell=mc.Map(facets, cells, 2, self.facet_cells, f"{prefix}facet2cell"),
            bfacet2node=mc.Map(bfacets, nodes, nfv, self.boundary_facets, f"{prefix}bfacet2node"),
            bfacet2cell=mc.Map(
                bfacets, cells, 1, self.boundary_facet_cells.reshape(-1, 1), f"{prefix}bfacet2cell"
            ),
            coords=mc.Dat(nodes, self.gdim, self.coords, f"{prefix}coords", dtype=np.float64),
        )


# --------------------------------------------------------------------------- #
# Generators
# --------------------------------------------------------------------------- #
def _check_counts(**counts: Any) -> None:
    for name, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise DeclarationError(f"{name} must be a positive integer, got {n!r}")


def _check_lengths(**lengths: Any) -> None:
    for name, v in lengths.items():
        if not (isinstance(v, (int, float, np.integer, np.floating)) and np.isfinite(v) and v > 0):
            raise DeclarationError(f"{name} must be a positive finite number, got {v!r}")


def _grid(nx: int, ny: int, lx: float, ly: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid coordinates (node ``i + (nx+1)*j``) and the first node of each quad."""
    x = np.linspace(0.0, lx, nx + 1)
    y = np.linspace(0.0, ly, ny + 1)
    xx, yy = np.meshgrid(x, y)  # shape (ny+1, nx+1), row j = y index
    coords = np.column_stack((xx.ravel(), yy.ravel()))
    i, j = np.meshgrid(np.arange(nx, dtype=np.int64), np.arange(ny, dtype=np.int64))
    n0 = (i + (nx + 1) * j).ravel()
    return coords, n0


def structured_quads(nx: int, ny: int, *, lx: float = 1.0, ly: float = 1.0) -> UnstructuredMesh:
    """An ``nx`` by ``ny`` grid of quads on ``[0, lx] x [0, ly]``, stored unstructured.

    Node ``i + (nx + 1) * j`` sits at ``(lx * i / nx, ly * j / ny)``; cell
    ``i + nx * j`` has nodes ``n0, n0 + 1, n0 + nx + 2, n0 + nx + 1`` with
    ``n0 = i + (nx + 1) * j`` (counter-clockwise).

    Parameters
    ----------
    nx, ny : int
        Number of cells in x and y.
    lx, ly : float, keyword-only
        Domain size.

    Returns
    -------
    UnstructuredMesh
        ``(nx+1)(ny+1)`` nodes, ``nx*ny`` cells, ``nx(ny-1) + ny(nx-1)``
        interior and ``2(nx+ny)`` boundary edges.

    Examples
    --------
    >>> m = structured_quads(3, 2)
    >>> m.nnode, m.ncell, m.nfacet, m.nbfacet
    (12, 6, 7, 10)
    >>> m.cells[0].tolist()
    [0, 1, 5, 4]
    """
    _check_counts(nx=nx, ny=ny)
    _check_lengths(lx=lx, ly=ly)
    coords, n0 = _grid(int(nx), int(ny), float(lx), float(ly))
    cells = np.column_stack((n0, n0 + 1, n0 + nx + 2, n0 + nx + 1))
    return UnstructuredMesh.from_cells(coords, cells, "quad", orient=False)


def structured_tris(nx: int, ny: int, *, lx: float = 1.0, ly: float = 1.0) -> UnstructuredMesh:
    """An ``nx`` by ``ny`` grid of quads, each split into two triangles.

    Nodes are numbered as in :func:`structured_quads`; quad ``q`` with nodes
    ``(a, b, c, d)`` becomes triangles ``2q = (a, b, c)`` and ``2q + 1 = (a, c, d)``
    (diagonal from lower-left to upper-right).

    Parameters
    ----------
    nx, ny : int
        Number of quads in x and y.
    lx, ly : float, keyword-only
        Domain size.

    Returns
    -------
    UnstructuredMesh
        ``(nx+1)(ny+1)`` nodes and ``2*nx*ny`` counter-clockwise triangles.

    Examples
    --------
    >>> m = structured_tris(1, 1)
    >>> m.cells.tolist()
    [[0, 1, 3], [0, 3, 2]]
    >>> m.facets.tolist(), m.nbfacet
    ([[3, 0]], 4)
    """
    _check_counts(nx=nx, ny=ny)
    _check_lengths(lx=lx, ly=ly)
    coords, n0 = _grid(int(nx), int(ny), float(lx), float(ly))
    a, b, c, d = n0, n0 + 1, n0 + nx + 2, n0 + nx + 1
    lower, upper = np.column_stack((a, b, c)), np.column_stack((a, c, d))
    cells = np.stack((lower, upper), axis=1).reshape(-1, 3)
    return UnstructuredMesh.from_cells(coords, cells, "triangle", orient=False)


def jittered_delaunay(n: int, *, seed: int = 0, jitter: float = 0.3) -> UnstructuredMesh:
    """Delaunay triangulation of a randomly jittered grid of about ``n`` points.

    The points of an ``m x m`` grid on the unit square (``m = round(sqrt(n))``,
    at least 2, spacing ``h = 1 / (m - 1)``) are moved by up to ``jitter * h``
    in each coordinate using ``numpy.random.default_rng(seed)``; boundary points
    move only along their side and the corners stay fixed, so the domain stays
    the unit square. The points are triangulated with
    :class:`scipy.spatial.Delaunay`. Cells are counter-clockwise, start at their
    lowest node id, and are sorted by centroid row by row; the result depends
    only on ``n``, ``seed`` and ``jitter``.

    Parameters
    ----------
    n : int
        Approximate number of points (at least 4).
    seed : int, keyword-only
        Seed of the random jitter.
    jitter : float, keyword-only
        Maximum displacement as a fraction of the grid spacing, in ``[0, 0.5)``.

    Returns
    -------
    UnstructuredMesh
        A triangle mesh of the unit square with ``m * m`` nodes.

    Examples
    --------
    >>> m = jittered_delaunay(100, seed=1)
    >>> m.nnode, m.cell_type
    (100, 'triangle')
    >>> bool((m.signed_measures() > 0).all()), round(float(m.signed_measures().sum()), 12)
    (True, 1.0)
    """
    from scipy.spatial import Delaunay

    _check_counts(n=n)
    if n < 4:
        raise DeclarationError(f"jittered_delaunay needs n >= 4 points, got {n}")
    if not (isinstance(jitter, (int, float, np.integer, np.floating)) and 0.0 <= jitter < 0.5):
        raise DeclarationError(f"jitter must be a number in [0, 0.5), got {jitter!r}")
    m = max(2, int(round(np.sqrt(n))))
    h = 1.0 / (m - 1)
    coords, _ = _grid(m - 1, m - 1, 1.0, 1.0)
    rng = np.random.default_rng(seed)
    shift = rng.uniform(-jitter * h, jitter * h, size=coords.shape)
    on_x = np.isclose(coords[:, 0], 0.0) | np.isclose(coords[:, 0], 1.0)
    on_y = np.isclose(coords[:, 1], 0.0) | np.isclose(coords[:, 1], 1.0)
    shift[on_x, 0] = 0.0  # boundary points slide along their side only
    shift[on_y, 1] = 0.0
    coords = coords + shift
    tri = np.asarray(Delaunay(coords).simplices, dtype=np.int64)
    tri = _canonical_triangles(coords, tri, h)
    return UnstructuredMesh.from_cells(coords, tri, "triangle")


def _canonical_triangles(coords: np.ndarray, tri: np.ndarray, h: float) -> np.ndarray:
    """Orient CCW, rotate lowest node first, sort cells by centroid row then x."""
    area = signed_measures(coords, tri, "triangle")
    tri = np.where((area < 0)[:, None], tri[:, [0, 2, 1]], tri)
    shift = np.argmin(tri, axis=1)
    idx = (shift[:, None] + np.arange(3)) % 3
    tri = np.take_along_axis(tri, idx, axis=1)
    cen = coords[tri].mean(axis=1)
    row = np.floor(cen[:, 1] / h).astype(np.int64)
    order = np.lexsort((tri[:, 2], tri[:, 1], tri[:, 0], cen[:, 0], row))
    return tri[order]
