"""A structured tetrahedral mesh of a box: GeoFEM's "cube" benchmark geometry, unstructured.

Each of the ``nx * ny * nz`` hexahedra is cut into six tetrahedra along its main diagonal
(Kuhn's subdivision), so neighbouring hexahedra share their face diagonals and the mesh is
conforming.

Examples
--------
>>> from meshchain.meshes import structured_tets
>>> m = structured_tets(2, 1, 1)
>>> m.nnode, m.ncell, m.nbfacet
(12, 12, 20)
"""

from __future__ import annotations

import itertools

import numpy as np

from .generators import UnstructuredMesh, _check_counts, _check_lengths

__all__ = ["structured_tets"]

# Kuhn's six tetrahedra of the unit cube: the paths 0 -> e_a -> e_a + e_b -> (1, 1, 1) over the
# orderings (a, b, c) of the axes; a corner (i, j, k) is local vertex i + 2j + 4k
_KUHN = np.array([[0, 1 << a, (1 << a) | (1 << b), 7] for a, b, _ in itertools.permutations(range(3))])


def structured_tets(nx: int, ny: int, nz: int, *, lx: float = 1.0, ly: float = 1.0,
                    lz: float = 1.0) -> UnstructuredMesh:
    """An ``nx`` by ``ny`` by ``nz`` box of hexahedra on ``[0, lx] x [0, ly] x [0, lz]``, each
    cut into six positively oriented tetrahedra.

    Node ``i + (nx + 1) * (j + (ny + 1) * k)`` sits at ``(lx i / nx, ly j / ny, lz k / nz)``.

    Parameters
    ----------
    nx, ny, nz : int
        Number of hexahedra along each axis.
    lx, ly, lz : float, keyword-only
        Box size.

    Returns
    -------
    UnstructuredMesh
        ``(nx+1)(ny+1)(nz+1)`` nodes and ``6 nx ny nz`` tetrahedra.

    Examples
    --------
    >>> m = structured_tets(1, 1, 1)
    >>> m.nnode, m.ncell, m.nfacet, m.nbfacet
    (8, 6, 6, 12)
    """
    _check_counts(nx=nx, ny=ny, nz=nz)
    _check_lengths(lx=lx, ly=ly, lz=lz)
    nx, ny, nz = int(nx), int(ny), int(nz)
    axes = [np.linspace(0.0, length, n + 1) for length, n in ((lx, nx), (ly, ny), (lz, nz))]
    z, y, x = np.meshgrid(axes[2], axes[1], axes[0], indexing="ij")  # node index runs fastest in x
    coords = np.column_stack((x.ravel(), y.ravel(), z.ravel()))
    k, j, i = np.meshgrid(np.arange(nz), np.arange(ny), np.arange(nx), indexing="ij")
    origin = (i + (nx + 1) * (j + (ny + 1) * k)).ravel()
    corner = np.array([di + (nx + 1) * (dj + (ny + 1) * dk) for dk in (0, 1) for dj in (0, 1) for di in (0, 1)])
    cells = (origin[:, None, None] + corner[_KUHN][None, :, :]).reshape(-1, 4)
    return UnstructuredMesh.from_cells(coords, cells, "tetra", orient=True)
