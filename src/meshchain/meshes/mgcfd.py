"""MG-CFD's input: a 3D channel with a bump, its median-dual edges, and nested coarser levels.

MG-CFD (Warwick's multigrid finite-volume Euler mini-app; its OP2 version reads HDF5) is
vertex-centred: the unknowns live on the nodes of a tetrahedral mesh, each node owning its
*median-dual* cell, and the fluxes run over the mesh's edges. Its input is one HDF5 file
per multigrid level, in OP2's layout (0-based maps here; a set's size is the first extent
of its first dataset, as OP2's ``op_decl_set_hdf5_infer_size`` reads it):

=====================  ========================  ======================================
dataset                shape, type               what
=====================  ========================  ======================================
``node_coordinates``   (nodes, 3) double         the node positions
``edge-->node``        (edges, 2) int            an edge's two nodes ``a``, ``b``
``edge_weights``       (edges, 3) double         the dual face between ``a`` and ``b``:
                                                 its area vector, pointing from ``a`` to
                                                 ``b``
``bnd_node-->node``    (bnd_nodes, 1) int        a boundary node (one per node and group)
``bnd_node-->group``   (bnd_nodes, 1) int        its boundary group: ``<= 2`` a wall
                                                 (only pressure acts), ``3..7`` far field
``bnd_node_weights``   (bnd_nodes, 3) double     the node's dual boundary face in that
                                                 group: its area vector, pointing *into*
                                                 the domain
``node-->mg_node``     (nodes, 1) int            the node of the next coarser level it
                                                 restricts to (every level but the last)
=====================  ========================  ======================================

and a text file, ``input.dat``, naming the levels' files (MG-CFD's ``-i`` argument)::

    size=<nodes of level 0>
    num_levels=<L>
    mesh_name=m6wing
    base_array_index=0
    [levels]
    0=<file of level 0>
    ...

:func:`channel_bump` generates such a mesh: the box ``[0, length] x [0, height] x [0,
width]`` with a smooth bump of height ``bump`` on its floor (``1 <= x <= 2``, peaking at
mid-width), ``3 n`` by ``n`` by ``n`` hexahedra (stretched in ``y`` over the bump), each cut
into six tetrahedra (Kuhn's subdivision, conforming); ``(3 n + 1)(n + 1)²`` nodes, about
``7`` edges per node. Level ``l`` is the same channel with ``n / 2^l``: its nodes are every
other node of level ``l - 1`` in each direction (nested), and a node restricts to the
coarse node at half its indices, rounded down. Boundary groups: floor 0, ceiling 1, the
side walls 2, the inlet 4 and the outlet 5 (far field). Edges are numbered by their first
node, then their second; ``shuffle=True`` numbers nodes and edges at random (seeded) instead.

The edge weights are exact median-dual face vectors: in each tetrahedron, the piece of
the dual face of edge ``(a, b)`` is the two triangles from the edge's midpoint to the
centroids of the two faces holding the edge and of the tetrahedron; the boundary weight of
a node is a third of each boundary triangle's area vector around it. Every dual cell is
closed: at each node the outward edge weights and the outward boundary weights sum to zero.

Examples
--------
>>> from meshchain.meshes import channel_bump
>>> mesh = channel_bump(2, levels=2)
>>> [lv.nodes for lv in mesh.levels], [lv.edges.shape[0] for lv in mesh.levels]
([63, 16], [262, 47])
>>> mesh.closure_error() < 1e-14
True
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..core.errors import DeclarationError, MeshFileError, MeshFileNotFoundError
from ..io.ranked import block_range
from .op2_hdf5 import _attributes, _dataset, _rows

__all__ = ["MGCFDLevel", "MGCFDMesh", "channel_bump", "read_input_dat", "read_level", "level_blocks", "GROUPS"]

GROUPS = {"floor": 0, "ceiling": 1, "sides": 2, "inlet": 4, "outlet": 5}
"""The boundary group of each side of :func:`channel_bump`'s channel (MG-CFD treats groups
``<= 2`` as walls, where only the pressure acts, and ``3..7`` as far field)."""

# Kuhn's six tetrahedra of the unit cube: the paths 0 -> e_a -> e_a + e_b -> (1, 1, 1); a path's
# vertices increase in every coordinate, so each of a tetrahedron's six edges points along one of
# seven families of offsets with components 0 or 1
_CORNERS = np.array([[di, dj, dk] for dk in (0, 1) for dj in (0, 1) for di in (0, 1)])
_PATHS = [[0, 1 << a, (1 << a) | (1 << b), 7] for a, b, _ in itertools.permutations(range(3))]
_FAMILIES = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1)]
_PAIRS = [(s, t) for s in range(4) for t in range(s + 1, 4)]


@dataclass
class MGCFDLevel:
    """One multigrid level of MG-CFD's input (see the module docstring for each array)."""

    coords: np.ndarray
    edges: np.ndarray
    edge_weights: np.ndarray
    bnd_nodes: np.ndarray
    bnd_groups: np.ndarray
    bnd_weights: np.ndarray
    to_coarse: np.ndarray | None = None

    @property
    def nodes(self) -> int:
        return len(self.coords)

    def datasets(self) -> dict:
        """The level's HDF5 datasets by name (OP2's layout, 0-based)."""
        out = {"node_coordinates": self.coords, "edge-->node": self.edges, "edge_weights": self.edge_weights,
               "bnd_node-->node": self.bnd_nodes.reshape(-1, 1), "bnd_node-->group": self.bnd_groups.reshape(-1, 1),
               "bnd_node_weights": self.bnd_weights}
        if self.to_coarse is not None:
            out["node-->mg_node"] = self.to_coarse.reshape(-1, 1)
        return out

    def closure_error(self) -> float:
        """The largest ``|Σ outward weights|`` over the dual cells, relative to the largest
        weight (0 for a closed dual mesh)."""
        total = np.zeros_like(self.coords)
        for c in range(3):
            total[:, c] += np.bincount(self.edges[:, 0], self.edge_weights[:, c], self.nodes)
            total[:, c] -= np.bincount(self.edges[:, 1], self.edge_weights[:, c], self.nodes)
            total[:, c] -= np.bincount(self.bnd_nodes, self.bnd_weights[:, c], self.nodes)  # inward -> outward
        return float(np.abs(total).max() / np.abs(self.edge_weights).max())


@dataclass
class MGCFDMesh:
    """MG-CFD's input: its levels, finest first."""

    levels: list

    def closure_error(self) -> float:
        return max(level.closure_error() for level in self.levels)

    def write(self, directory, *, prefix: str = "channel") -> Path:
        """Write one HDF5 file per level (``<prefix>.L<l>.h5``) and ``input.dat`` into
        ``directory`` (created if needed); returns the path of ``input.dat``."""
        import h5py

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        names = []
        for index, level in enumerate(self.levels):
            name = f"{prefix}.L{index}.h5"
            with h5py.File(directory / name, "w") as f:
                for dataset, values in level.datasets().items():
                    _write_dataset(f, dataset, values)
            names.append(name)
        lines = [f"size={self.levels[0].nodes}", f"num_levels={len(self.levels)}", "mesh_name=m6wing",
                 "base_array_index=0", "[levels]", *[f"{i}={n}" for i, n in enumerate(names)]]
        path = directory / "input.dat"
        path.write_text("\n".join(lines) + "\n")
        return path


def _write_dataset(f, name: str, values: np.ndarray) -> None:
    """One dataset in OP2's layout (with OP2's ``size``, ``dim`` and ``type`` attributes)."""
    dataset = f.create_dataset(name, data=np.ascontiguousarray(values))
    for key, value in _attributes(values.shape[0], values.shape[1], values.dtype).items():
        dataset.attrs[key] = value


def read_input_dat(path) -> list[Path]:
    """The level files an MG-CFD ``input.dat`` names, finest first (paths relative to its
    folder); maps must be 0-based (``base_array_index=0``).

    Raises
    ------
    MeshFileNotFoundError, MeshFileError
        The file is missing, or lacks ``num_levels`` or a level's file name.
    """
    path = Path(os.fspath(path))
    if not path.exists():
        raise MeshFileNotFoundError(f"MG-CFD input file {str(path)!r} does not exist; check the path.")
    settings, files, section = {}, {}, None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        if section == "[levels]":
            files[int(key)] = value
        elif section is None:
            settings[key] = value
    if "num_levels" not in settings:
        raise MeshFileError(f"MG-CFD input file {str(path)!r} has no 'num_levels=' line.")
    if settings.get("base_array_index", "0") != "0":
        raise MeshFileError(f"MG-CFD input file {str(path)!r}: base_array_index={settings['base_array_index']}; "
                            f"meshchain reads 0-based maps only (base_array_index=0).")
    levels = int(settings["num_levels"])
    missing = [i for i in range(levels) if i not in files]
    if missing:
        raise MeshFileError(f"MG-CFD input file {str(path)!r} names no file for levels {missing} under [levels].")
    return [path.parent / files[i] for i in range(levels)]


def channel_bump(n: int, *, levels: int = 3, length: float = 3.0, height: float = 1.0, width: float = 1.0,
                 bump: float = 0.1, shuffle: bool = False, seed: int = 0) -> MGCFDMesh:
    """MG-CFD input for a channel with a bump on its floor (see the module docstring).

    Parameters
    ----------
    n : int
        Hexahedra across the channel's height and width on the finest level (``3 n`` along
        it); a multiple of ``2^(levels - 1)``. ``n = 144`` gives 9.1 million nodes (4 levels: 47 s and
        6.8 GiB at the peak here).
    levels : int, keyword-only
        Multigrid levels (1 or more).
    length, height, width, bump : float, keyword-only
        The channel's size and the bump's height.
    shuffle, seed : keyword-only
        Number every level's nodes and edges at random (with ``seed``).

    Returns
    -------
    MGCFDMesh

    Examples
    --------
    >>> m = channel_bump(4, levels=3, shuffle=True)
    >>> [lv.nodes for lv in m.levels], m.closure_error() < 1e-14
    ([325, 63, 16], True)
    """
    if not isinstance(levels, int) or levels < 1:
        raise DeclarationError(f"channel_bump: levels must be a positive integer, got {levels!r}.")
    if not isinstance(n, int) or n < 1 or n % (1 << (levels - 1)):
        raise DeclarationError(f"channel_bump: n must be a positive multiple of 2^(levels - 1) = {1 << (levels - 1)}, "
                         f"got {n!r}.")
    if not 0.0 <= bump < height:
        raise DeclarationError(f"channel_bump: the bump's height must be in [0, height), got {bump!r}.")
    shape = (length, height, width, bump)
    grids = [(3 * (n >> l), n >> l, n >> l) for l in range(levels)]
    built = [_level(*grid, shape) for grid in grids]
    for fine, grid, coarse in zip(built, grids, grids[1:]):
        fine.to_coarse = _restriction(grid, coarse)
    rng = np.random.default_rng(seed)
    orders = [rng.permutation(level.nodes) if shuffle else None for level in built]
    out = []
    for index, level in enumerate(built):
        coarse = orders[index + 1] if index + 1 < len(built) else None
        out.append(_renumbered(level, orders[index], coarse, rng if shuffle else None))
    return MGCFDMesh(out)


def _level(nx: int, ny: int, nz: int, shape) -> MGCFDLevel:
    """One level in structured numbering: node ``i + (nx + 1)(j + (ny + 1) k)``."""
    coords = _coordinates(nx, ny, nz, shape)
    grid = coords.reshape(nz + 1, ny + 1, nx + 1, 3)
    starts, weights = [], []
    for offset in _FAMILIES:
        starts.append(_family_starts(nx, ny, nz, offset))
        weights.append(np.zeros((nz + 1 - offset[2], ny + 1 - offset[1], nx + 1 - offset[0], 3)))
    family = {offset: f for f, offset in enumerate(_FAMILIES)}
    for path in _PATHS:
        corners = [_CORNERS[v] for v in path]
        points = [grid[c[2]:c[2] + nz, c[1]:c[1] + ny, c[0]:c[0] + nx] for c in corners]
        centroid = sum(points) / 4.0
        for s, t in _PAIRS:
            u, v = (w for w in range(4) if w not in (s, t))
            piece = _dual_piece(points[s], points[t], points[u], points[v], centroid)
            c = corners[s]
            weights[family[tuple(corners[t] - c)]][c[2]:c[2] + nz, c[1]:c[1] + ny, c[0]:c[0] + nx] += piece
    offsets = np.array(_FAMILIES)
    edges = np.concatenate([np.column_stack((s, s + o[0] + (nx + 1) * (o[1] + (ny + 1) * o[2])))
                            for s, o in zip(starts, offsets)]).astype(np.int32)
    edge_weights = np.concatenate([w.reshape(-1, 3) for w in weights])
    order = np.lexsort((edges[:, 1], edges[:, 0]))  # by first node, as a mesh generator numbers them
    edges, edge_weights = edges[order], edge_weights[order]
    bnd_nodes, bnd_groups, bnd_weights = _boundary(grid, nx, ny, nz)
    return MGCFDLevel(coords, edges, edge_weights, bnd_nodes, bnd_groups, bnd_weights)


def _coordinates(nx: int, ny: int, nz: int, shape) -> np.ndarray:
    length, height, width, bump = shape
    x = np.linspace(0.0, length, nx + 1)
    z = np.linspace(0.0, width, nz + 1)
    eta = np.linspace(0.0, 1.0, ny + 1)
    Z, E, X = np.meshgrid(z, eta, x, indexing="ij")
    along = np.where((X >= 1.0) & (X <= 2.0), np.sin(np.pi * (X - 1.0)) ** 2, 0.0)
    floor = bump * along * (0.5 + 0.5 * np.sin(np.pi * Z / width) ** 2)
    Y = floor + E * (height - floor)
    return np.column_stack((X.ravel(), Y.ravel(), Z.ravel()))


def _family_starts(nx: int, ny: int, nz: int, offset) -> np.ndarray:
    """The nodes an edge of ``offset`` starts from, in the order of that family's weights."""
    k, j, i = np.meshgrid(np.arange(nz + 1 - offset[2]), np.arange(ny + 1 - offset[1]), np.arange(nx + 1 - offset[0]),
                          indexing="ij")
    return (i + (nx + 1) * (j + (ny + 1) * k)).ravel()


def _dual_piece(a, b, u, v, centroid) -> np.ndarray:
    """The area vector of edge ``(a, b)``'s dual face inside one tetrahedron ``(a, b, u, v)``
    (arrays of points), pointing from ``a`` to ``b``."""
    middle = 0.5 * (a + b)
    to_centre = centroid - middle
    face_u = (a + b + u) / 3.0 - middle
    face_v = (a + b + v) / 3.0 - middle
    piece = 0.5 * (np.cross(face_u, to_centre) + np.cross(to_centre, face_v))
    sign = np.sign(np.einsum("...i,...i->...", piece, b - a))
    return piece * sign[..., None]


def _boundary(grid, nx: int, ny: int, nz: int):
    """``(nodes, groups, inward weights)`` of the six sides, side after side."""
    node_ids = np.arange((nx + 1) * (ny + 1) * (nz + 1)).reshape(nz + 1, ny + 1, nx + 1)
    sides = [("inlet", 2, 0, (1, 0, 0)), ("outlet", 2, nx, (-1, 0, 0)), ("floor", 1, 0, (0, 1, 0)),
             ("ceiling", 1, ny, (0, -1, 0)), ("sides", 0, 0, (0, 0, 1)), ("sides", 0, nz, (0, 0, -1))]
    nodes, groups, weights = [], [], []
    for group, axis, index, into in sides:  # axis of the index array: 0 = k, 1 = j, 2 = i; ``into`` about inward
        face = np.take(grid, index, axis=axis)
        ids = np.take(node_ids, index, axis=axis)
        w = np.zeros(face.shape)
        quads = (face[:-1, :-1], face[:-1, 1:], face[1:, :-1], face[1:, 1:])
        for tri in ((0, 1, 3), (0, 3, 2)):  # the face diagonal of Kuhn's tetrahedra: corner 0 to corner 3
            p = [quads[c] for c in tri]
            area = 0.5 * np.cross(p[1] - p[0], p[2] - p[0])
            inward = np.sign(area @ np.array(into, dtype=float))
            third = area * inward[..., None] / 3.0
            for c in tri:
                rows, cols = (slice(0, -1) if c in (0, 1) else slice(1, None)), (slice(0, -1) if c in (0, 2) else slice(1, None))
                w[rows, cols] += third
        nodes.append(ids.ravel())
        groups.append(np.full(ids.size, GROUPS[group]))
        weights.append(w.reshape(-1, 3))
    return np.concatenate(nodes).astype(np.int32), np.concatenate(groups).astype(np.int32), np.concatenate(weights)


def _restriction(fine: tuple, coarse: tuple) -> np.ndarray:
    """Fine node ``(i, j, k)`` -> coarse node ``(i // 2, j // 2, k // 2)``."""
    nx, ny, nz = fine
    cx, cy, _ = coarse
    k, j, i = np.meshgrid(np.arange(nz + 1), np.arange(ny + 1), np.arange(nx + 1), indexing="ij")
    return ((i // 2) + (cx + 1) * ((j // 2) + (cy + 1) * (k // 2))).ravel().astype(np.int32)


def _renumbered(level, order, coarse_order, rng) -> MGCFDLevel:
    """``level`` with node ``order[i]`` renamed ``i`` (None: unchanged) and its edges in a
    random order (``rng``); the restriction follows the coarse level's ``coarse_order``."""
    to_coarse = level.to_coarse
    if order is None:
        return level
    new_id = np.empty_like(order)
    new_id[order] = np.arange(len(order))
    if to_coarse is not None and coarse_order is not None:
        coarse_new = np.empty_like(coarse_order)
        coarse_new[coarse_order] = np.arange(len(coarse_order))
        to_coarse = coarse_new[to_coarse[order]].astype(np.int32)
    edge_order = rng.permutation(len(level.edges))
    return MGCFDLevel(level.coords[order], new_id[level.edges[edge_order]].astype(np.int32),
                      level.edge_weights[edge_order], new_id[level.bnd_nodes].astype(np.int32), level.bnd_groups,
                      level.bnd_weights, to_coarse)


_DATASETS = {"node_coordinates": ("nodes", 3, "f"), "edge-->node": ("edges", 2, "iu"), "edge_weights": ("edges", 3, "f"),
             "bnd_node-->node": ("bnd_nodes", 1, "iu"), "bnd_node-->group": ("bnd_nodes", 1, "iu"),
             "bnd_node_weights": ("bnd_nodes", 3, "f"), "node-->mg_node": ("nodes", 1, "iu")}
_FIRST = {"nodes": "node_coordinates", "edges": "edge-->node", "bnd_nodes": "bnd_node-->node"}


def read_level(path, comm=None) -> tuple[dict, dict]:
    """``(sizes, rows)`` of one level's HDF5 file: the sizes of its sets (``"nodes"``,
    ``"edges"``, ``"bnd_nodes"``: each its first dataset's first extent, as OP2's
    ``op_decl_set_hdf5_infer_size`` reads them) and this rank's block of rows of each
    dataset (all rows without ``comm``); ``node-->mg_node`` only where the file has it.

    Raises
    ------
    MeshFileNotFoundError, MeshFileError
        The file is missing, unreadable, or a dataset is missing or of the wrong shape or
        type (the message names the file and the dataset).
    """
    import h5py

    name = os.fspath(path)
    if not os.path.exists(name):
        raise MeshFileNotFoundError(f"MG-CFD level file {name!r} does not exist; check input.dat's [levels].")
    comm = comm if comm is not None else MPI.COMM_SELF
    try:
        with h5py.File(name, "r") as f:
            sizes = {s: int(_dataset(f, name, d, f"the {s}").shape[0]) for s, d in _FIRST.items()}
            rows = {d: _rows(f, name, d, sizes[s], dim, kinds, comm) for d, (s, dim, kinds) in _DATASETS.items()
                    if d in f or d != "node-->mg_node"}
    except (OSError, KeyError, ValueError) as exc:
        raise MeshFileError(f"MG-CFD level file {name!r} cannot be read ({type(exc).__name__}: {exc}).") from exc
    return sizes, rows


def level_blocks(level: MGCFDLevel, comm=None) -> tuple[dict, dict]:
    """:func:`read_level`'s ``(sizes, rows)`` of a level held in memory (this rank's block
    of each dataset on ``comm``; all rows without it)."""
    datasets = level.datasets()
    sizes = {s: len(datasets[d]) for s, d in _FIRST.items()}
    rows = {}
    for d, values in datasets.items():
        lo, hi = block_range(len(values), comm if comm is not None else MPI.COMM_SELF)
        rows[d] = values[lo:hi]
    return sizes, rows
