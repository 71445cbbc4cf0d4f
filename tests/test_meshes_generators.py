"""Tests of meshchain.meshes.generators and meshchain.meshes.meshio_reader."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshio
from meshchain.core.errors import DataShapeError, DeclarationError, MapError, MeshchainError
from meshchain.meshes.generators import (
    UnstructuredMesh,
    jittered_delaunay,
    signed_measures,
    structured_quads,
    structured_tris,
)
from meshchain.meshes.meshio_reader import MeshFileError, MeshFileNotFoundError, read_meshio

FAST = settings(max_examples=25, deadline=None)
LOCAL_FACETS = {
    "triangle": [[0, 1], [1, 2], [2, 0]],
    "quad": [[0, 1], [1, 2], [2, 3], [3, 0]],
    "tetra": [[1, 2, 3], [0, 3, 2], [0, 1, 3], [0, 2, 1]],
}


def random_tets(npts: int = 60, seed: int = 0) -> UnstructuredMesh:
    from scipy.spatial import Delaunay

    pts = np.random.default_rng(seed).random((npts, 3))
    return UnstructuredMesh.from_cells(pts, Delaunay(pts).simplices, "tetra")


# --------------------------------------------------------------------------- #
# Generic invariants
# --------------------------------------------------------------------------- #
def check_invariants(m: UnstructuredMesh) -> None:
    """Properties every mesh must have, checked independently of validate()."""
    m.validate()
    lf = np.array(LOCAL_FACETS[m.cell_type])
    nlf = len(lf)
    assert m.coords.dtype == np.float64 and m.coords.shape == (m.nnode, m.gdim)
    for a in (m.cells, m.facets, m.facet_cells, m.boundary_facets, m.boundary_facet_cells):
        assert a.dtype == np.int32 and a.flags.c_contiguous
    # every cell facet appears exactly once in facets U boundary_facets
    cell_f = {tuple(sorted(f)) for f in m.cells[:, lf].reshape(-1, lf.shape[1]).tolist()}
    all_f = [tuple(sorted(f)) for f in np.concatenate((m.facets, m.boundary_facets)).tolist()]
    assert len(all_f) == len(set(all_f)) == len(cell_f)
    assert set(all_f) == cell_f
    assert nlf * m.ncell == 2 * m.nfacet + m.nbfacet
    # facet_cells consistent with cells: facet nodes belong to both cells
    for fc, fn in ((m.facet_cells[:, 0], m.facets), (m.facet_cells[:, 1], m.facets),
                   (m.boundary_facet_cells, m.boundary_facets)):
        inside = (m.cells[fc][:, :, None] == fn[:, None, :]).any(axis=1).all(axis=1)
        assert inside.all()
    assert np.all(m.facet_cells[:, 0] < m.facet_cells[:, 1])
    assert np.all(m.signed_measures() > 0)
    if m.gdim == 2:
        check_2d_facet_orientation(m, lf)


def check_2d_facet_orientation(m: UnstructuredMesh, lf: np.ndarray) -> None:
    """Edge (a, b) is a CCW edge of facet_cells[:, 0] and reversed in [:, 1]."""
    def has_edge(cells, edges):
        e = m.cells[cells][:, lf]  # (n, nlf, 2)
        return (e == edges[:, None, :]).all(axis=2).any(axis=1)

    assert has_edge(m.facet_cells[:, 0], m.facets).all()
    assert has_edge(m.facet_cells[:, 1], m.facets[:, ::-1]).all()
    assert has_edge(m.boundary_facet_cells, m.boundary_facets).all()


def euler_characteristic(m: UnstructuredMesh) -> int:
    used = np.unique(m.cells).size
    return used - (m.nfacet + m.nbfacet) + m.ncell


# --------------------------------------------------------------------------- #
# Generators
# --------------------------------------------------------------------------- #
@FAST
@given(nx=st.integers(1, 12), ny=st.integers(1, 12))
def test_structured_quads_counts(nx, ny):
    m = structured_quads(nx, ny, lx=2.0, ly=0.5)
    assert m.cell_type == "quad" and m.gdim == 2
    assert m.nnode == (nx + 1) * (ny + 1)
    assert m.ncell == nx * ny
    assert m.nfacet == nx * (ny - 1) + ny * (nx - 1)
    assert m.nbfacet == 2 * (nx + ny)
    assert euler_characteristic(m) == 1
    assert np.allclose(m.signed_measures(), 1.0 / (nx * ny))
    check_invariants(m)


@FAST
@given(nx=st.integers(1, 12), ny=st.integers(1, 12))
def test_structured_tris_counts(nx, ny):
    m = structured_tris(nx, ny)
    assert m.cell_type == "triangle"
    assert m.nnode == (nx + 1) * (ny + 1)
    assert m.ncell == 2 * nx * ny
    assert m.nfacet == nx * (ny - 1) + ny * (nx - 1) + nx * ny
    assert m.nbfacet == 2 * (nx + ny)
    assert euler_characteristic(m) == 1
    assert np.isclose(m.signed_measures().sum(), 1.0)
    check_invariants(m)


def test_structured_quads_layout():
    m = structured_quads(3, 2, lx=3.0, ly=4.0)
    assert m.cells[0].tolist() == [0, 1, 5, 4]
    assert m.cells[4].tolist() == [5, 6, 10, 9]  # cell i + nx*j with i=1, j=1
    assert np.allclose(m.coords[6], [2.0, 2.0])  # node i + (nx+1)*j with i=2, j=1
    assert np.allclose(m.coords.max(axis=0), [3.0, 4.0])


@FAST
@given(n=st.integers(4, 300), seed=st.integers(0, 2**32 - 1), jitter=st.floats(0.0, 0.49))
def test_jittered_delaunay_is_a_valid_disk(n, seed, jitter):
    m = jittered_delaunay(n, seed=seed, jitter=jitter)
    k = max(2, round(np.sqrt(n)))
    assert m.nnode == k * k and m.cell_type == "triangle"
    assert np.unique(m.cells).size == m.nnode  # every point is used
    assert euler_characteristic(m) == 1
    assert np.isclose(m.signed_measures().sum(), 1.0)  # the unit square
    assert m.nbfacet == 4 * (k - 1)
    check_invariants(m)


def test_jittered_delaunay_is_deterministic():
    a, b = jittered_delaunay(400, seed=7), jittered_delaunay(400, seed=7)
    names = ("coords", "cells", "facets", "facet_cells", "boundary_facets", "boundary_facet_cells")
    for name in names:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    c = jittered_delaunay(400, seed=8)
    assert not np.array_equal(a.coords, c.coords)


def test_tetra_mesh_invariants():
    m = random_tets()
    assert m.gdim == 3 and m.cell_type == "tetra"
    check_invariants(m)
    # V - E + F - T = 1 for a 3D ball; count edges from the cells
    e = m.cells[:, [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]].reshape(-1, 2)
    nedge = np.unique(np.sort(e, axis=1), axis=0).shape[0]
    assert m.nnode - nedge + (m.nfacet + m.nbfacet) - m.ncell == 1


def test_large_structured_mesh_builds():
    m = structured_quads(300, 300)
    assert m.ncell == 90_000 and m.nfacet == 2 * 300 * 299


# --------------------------------------------------------------------------- #
# from_cells
# --------------------------------------------------------------------------- #
@FAST
@given(nx=st.integers(1, 6), ny=st.integers(1, 6), seed=st.integers(0, 1000))
def test_from_cells_orients_and_is_deterministic(nx, ny, seed):
    ref = structured_tris(nx, ny)
    rng = np.random.default_rng(seed)
    cells = ref.cells.copy()
    flip = rng.random(len(cells)) < 0.5
    cells[flip] = cells[flip][:, ::-1]  # clockwise
    m = UnstructuredMesh.from_cells(ref.coords, cells, "triangle")
    assert np.array_equal(m.cells[~flip], ref.cells[~flip])
    assert np.all(m.signed_measures() > 0)
    check_invariants(m)
    again = UnstructuredMesh.from_cells(m.coords, m.cells, "triangle")
    assert np.array_equal(again.facets, m.facets)
    assert np.array_equal(again.facet_cells, m.facet_cells)


def test_from_cells_orient_false_keeps_cells():
    xy = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    m = UnstructuredMesh.from_cells(xy, [[0, 2, 1]], "triangle", orient=False)
    assert m.cells.tolist() == [[0, 2, 1]]
    with pytest.raises(DataShapeError, match="signed measure"):
        m.validate()


def test_from_cells_non_manifold():
    xy = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, 1.0], [0.5, -1.0], [2.0, 0.5]])
    cells = [[0, 1, 2], [0, 3, 1], [0, 1, 4]]
    with pytest.raises(MapError, match="non-manifold"):
        UnstructuredMesh.from_cells(xy, cells, "triangle")


@pytest.mark.parametrize(
    "coords, cells, cell_type, err",
    [
        (np.zeros((3, 2)), [[0, 1, 3]], "triangle", MapError),  # out of range
        (np.zeros((3, 2)), [[0, 1, 1]], "triangle", MapError),  # repeated node
        (np.zeros((3, 2)), [[0, 1]], "triangle", MapError),  # wrong arity
        (np.zeros((3, 3)), [[0, 1, 2]], "triangle", DataShapeError),  # wrong gdim
        (np.zeros((3, 2)), [[0, 1, 2]], "triangle", DataShapeError),  # zero area
        (np.zeros((3, 2)), [[0, 1, 2]], "hexahedron", DeclarationError),
    ],
)
def test_from_cells_rejects_bad_input(coords, cells, cell_type, err):
    with pytest.raises(err):
        UnstructuredMesh.from_cells(coords, cells, cell_type)


def test_validate_detects_broken_adjacency():
    m = structured_quads(2, 2)
    bad = UnstructuredMesh(
        coords=m.coords, cells=m.cells, facets=m.facets, facet_cells=m.facet_cells[:, ::-1] % 3,
        boundary_facets=m.boundary_facets, boundary_facet_cells=m.boundary_facet_cells,
        cell_type="quad",
    )
    with pytest.raises(MapError):
        bad.validate()
    with pytest.raises(DataShapeError):
        UnstructuredMesh(m.coords, m.cells, m.facets, m.facet_cells[:1], m.boundary_facets,
                         m.boundary_facet_cells, "quad")


@pytest.mark.parametrize(
    "call",
    [
        lambda: structured_quads(0, 3),
        lambda: structured_tris(2, 2.5),
        lambda: structured_quads(2, 2, lx=-1.0),
        lambda: jittered_delaunay(3),
        lambda: jittered_delaunay(100, jitter=0.5),
    ],
)
def test_generators_reject_bad_arguments(call):
    with pytest.raises(DeclarationError):
        call()


def test_signed_measures_tetra():
    xyz = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert np.allclose(signed_measures(xyz, np.array([[0, 1, 2, 3], [0, 1, 3, 2]]), "tetra"),
                       [1 / 6, -1 / 6])


# --------------------------------------------------------------------------- #
# meshio round trips and errors
# --------------------------------------------------------------------------- #
FORMATS = [("m22.msh", "gmsh22"), ("m41.msh", "gmsh"), ("m.vtk", "vtk"), ("m.vtu", "vtu")]


def write(path, m: UnstructuredMesh, fmt: str) -> None:
    pts = np.column_stack((m.coords, np.zeros(m.nnode))) if m.gdim == 2 else m.coords
    cell_data = None
    if fmt.startswith("gmsh"):
        tag = np.ones(m.ncell, dtype=np.int32)
        cell_data = {"gmsh:physical": [tag], "gmsh:geometrical": [tag]}
    mesh = meshio.Mesh(pts, [(m.cell_type, m.cells)], cell_data=cell_data)
    kw = {"binary": False} if fmt != "vtu" else {}
    meshio.write(path, mesh, file_format=fmt, **kw)


@pytest.mark.parametrize("fname, fmt", FORMATS)
@pytest.mark.parametrize(
    "make", [lambda: structured_quads(4, 3), lambda: jittered_delaunay(60, seed=2), random_tets],
    ids=["quads", "delaunay", "tets"],
)
def test_meshio_round_trip(tmp_path, fname, fmt, make):
    m = make()
    write(tmp_path / fname, m, fmt)
    back = read_meshio(tmp_path / fname)
    assert back.cell_type == m.cell_type and back.gdim == m.gdim
    assert np.array_equal(back.cells, m.cells)
    assert np.allclose(back.coords, m.coords, rtol=0, atol=1e-12)
    assert np.array_equal(back.facets, m.facets)
    assert np.array_equal(back.boundary_facet_cells, m.boundary_facet_cells)


def mixed_mesh():
    """Two quads and two triangles sharing edges, plus boundary lines and a vertex."""
    pts = np.array([[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1], [3, 0.5]], dtype=float)
    pts = np.column_stack((pts, np.zeros(len(pts))))
    cells = [
        ("quad", np.array([[0, 1, 4, 3], [1, 2, 5, 4]])),
        ("triangle", np.array([[2, 6, 5]])),
        ("line", np.array([[0, 1], [1, 2]])),
        ("vertex", np.array([[0]])),
    ]
    return meshio.Mesh(pts, cells)


def test_mixed_cell_types_need_cell_type(tmp_path):
    path = tmp_path / "mixed.vtu"
    meshio.write(path, mixed_mesh())
    with pytest.raises(DataShapeError, match=r"mixed\.vtu.*\['quad', 'triangle'\].*cell_type="):
        read_meshio(path)
    q = read_meshio(path, cell_type="quad")
    assert q.ncell == 2 and q.nnode == 7 and q.nfacet == 1  # unused nodes are kept
    t = read_meshio(path, cell_type="triangle")
    assert t.cells.tolist() == [[2, 6, 5]] and t.nbfacet == 3
    with pytest.raises(DataShapeError, match="no 'tetra' cells"):
        read_meshio(path, cell_type="tetra")
    with pytest.raises(DataShapeError, match="not supported"):
        read_meshio(path, cell_type="line")


def test_lower_dimensional_blocks_are_ignored(tmp_path):
    m = structured_tris(2, 2)
    pts = np.column_stack((m.coords, np.zeros(m.nnode)))
    path = tmp_path / "with_lines.vtu"
    meshio.write(path, meshio.Mesh(pts, [("line", m.boundary_facets), ("triangle", m.cells[:4]),
                                         ("triangle", m.cells[4:])]))
    back = read_meshio(path)
    assert np.array_equal(back.cells, m.cells)


def test_unsupported_or_missing_cells(tmp_path):
    pts = np.random.default_rng(0).random((8, 3))
    path = tmp_path / "hex.vtu"
    meshio.write(path, meshio.Mesh(pts, [("hexahedron", np.arange(8)[None])]))
    with pytest.raises(DataShapeError, match="hexahedron"):
        read_meshio(path)
    path = tmp_path / "lines.vtu"
    meshio.write(path, meshio.Mesh(pts, [("line", np.array([[0, 1]]))]))
    with pytest.raises(DataShapeError, match="no 2D or 3D cells"):
        read_meshio(path)


def test_non_planar_2d_cells(tmp_path):
    pts = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 1]])
    path = tmp_path / "surface.vtu"
    meshio.write(path, meshio.Mesh(pts, [("triangle", np.array([[0, 1, 2]]))]))
    with pytest.raises(DataShapeError, match="z coordinate"):
        read_meshio(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.msh"
    with pytest.raises(MeshFileNotFoundError, match="nope.msh") as info:
        read_meshio(path)
    assert isinstance(info.value, MeshchainError) and isinstance(info.value, FileNotFoundError)
    with pytest.raises(MeshFileError, match="not a regular file"):
        read_meshio(tmp_path)


@pytest.mark.parametrize(
    "fname, content",
    [
        ("garbage.msh", b"$MeshFormat\nthis is not a mesh\n"),
        ("garbage.vtk", b"\x00\x01\x02 not vtk at all"),
        ("garbage.vtu", b"<VTKFile><broken"),
        ("garbage.xyz123", b"1 2 3"),
        ("empty.msh", b""),
    ],
)
def test_garbage_file(tmp_path, fname, content):
    path = tmp_path / fname
    path.write_bytes(content)
    with pytest.raises(MeshFileError, match=fname.replace(".", r"\.")) as info:
        read_meshio(path)
    assert isinstance(info.value, MeshchainError)


# --------------------------------------------------------------------------- #
# declare()
# --------------------------------------------------------------------------- #
def test_declare():
    mc = pytest.importorskip("meshchain")
    if not hasattr(mc, "Set"):
        pytest.skip("meshchain core API (Set/Map/Dat) not available yet")
    m = structured_quads(3, 2)
    d = m.declare(prefix="q_")
    assert d.cell2node.arity == 4 and d.facet2cell.arity == 2 and d.bfacet2cell.arity == 1
    assert d.coords.dim == 2
    assert d.nodes.size == m.nnode and d.cells.size == m.ncell
    assert d.facets.size == m.nfacet and d.bfacets.size == m.nbfacet
    assert d.cells.name == "q_cells"
