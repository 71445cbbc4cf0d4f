"""Tests of meshchain.meshes.op2 (OP2 ASCII mesh I/O) and meshchain.meshes.naca
(NACA0012 mesh with the structure of OP2's generator). Independent of the DSL."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from meshchain.core.errors import DataShapeError, DeclarationError, MapError, MeshchainError
from meshchain.meshes.naca import naca0012, naca0012_thickness
from meshchain.meshes.op2 import AirfoilMesh, read_op2_ascii, write_op2_ascii

REPO = Path(__file__).resolve().parents[1]
X0 = 0.0077  # OP2's square-root-transform origin: the airfoil is shifted by -x0

SIZES = [(2, 2), (3, 5), (4, 6), (20, 30), (7, 3)]


def counts(I, J):
    """OP2's naca0012.m counts."""
    return ((3 * I + 1) * (J + 1), 3 * I * J, (3 * I - 1) * J + 3 * I * (J - 1) + I, I + 3 * I + 2 * J)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint64)


def one_cell_text():
    return "4 1 0 4\n0 0\n1 0\n1 1\n0 1\n0 1 2 3\n1 0 0 1\n2 1 0 2\n3 2 0 2\n0 3 0 2\n"


def cell_geometry(m):
    c = m.x[m.cell]  # (ncell, 4, 2)
    xx, yy = c[..., 0], c[..., 1]
    area = 0.5 * ((xx[:, 0] - xx[:, 2]) * (yy[:, 1] - yy[:, 3]) - (xx[:, 1] - xx[:, 3]) * (yy[:, 0] - yy[:, 2]))
    return area, c.mean(axis=1)


# --------------------------------------------------------------------------- I/O


@pytest.mark.parametrize("decimals", [None, 6])
def test_round_trip_naca_bit_identical(tmp_path, decimals):
    m = naca0012(20, 30, decimals=decimals)
    path = tmp_path / "new_grid.dat"
    write_op2_ascii(m, path)
    back = read_op2_ascii(path)
    assert back == m
    assert np.array_equal(bits(back.x), bits(m.x))  # bit for bit, signed zeros included
    for name in ("cell", "edge", "ecell", "bedge", "becell", "bound"):
        got = getattr(back, name)
        assert got.dtype == np.int32 and np.array_equal(got, getattr(m, name)), name
    assert back.x.dtype == np.float64


def test_round_trip_awkward_doubles(tmp_path):
    rng = np.random.default_rng(1)
    base = naca0012(3, 5, decimals=None)
    x = rng.standard_normal(base.x.shape) * 10.0 ** rng.integers(-300, 300, base.x.shape)
    x.reshape(-1)[:8] = [0.0, -0.0, 5e-324, -5e-324, np.finfo(float).max, np.finfo(float).tiny, 0.1, 1 / 3]
    m = AirfoilMesh(x, base.cell, base.edge, base.ecell, base.bedge, base.becell, base.bound)
    write_op2_ascii(m, tmp_path / "g.dat")
    back = read_op2_ascii(tmp_path / "g.dat")
    assert np.array_equal(bits(back.x), bits(x))
    assert back == m


def test_reader_accepts_op2_whitespace(tmp_path):
    # OP2 reads with fscanf: records may be split or joined across lines, extra blanks
    text = " 4 1 0 4 \n 0.0 0.0 \n1 0 1 1\n0\n1\n\n0 1 2 3 1 0 0 1\n2 1 0 2\n3 2 0 2\n0 3 0 2"
    (tmp_path / "g.dat").write_text(text)
    m = read_op2_ascii(str(tmp_path / "g.dat"))
    assert (m.nnode, m.ncell, m.nedge, m.nbedge) == (4, 1, 0, 4)
    assert m.x.tolist() == [[0, 0], [1, 0], [1, 1], [0, 1]]
    assert m.bound.tolist() == [1, 2, 2, 2]
    assert m.becell.shape == (4,) and m.ecell.shape == (0, 2)


def write_text(tmp_path, text, name="bad.dat"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    "text, err, words",
    [
        ("", DataShapeError, ["header"]),
        ("4 1 0\n", DataShapeError, ["header"]),
        ("nnode ncell\n", DataShapeError, ["header", "line 1"]),
        ("4 1.5 0 4\n0 0\n", DataShapeError, ["header"]),
        ("4 -1 0 4\n0 0\n", DataShapeError, ["header"]),
        # truncated in the cells and in the boundary-edge sections
        ("4 1 0 4\n0 0\n1 0\n1 1\n0 1\n0 1 2\n", DataShapeError, ["truncated", "cells section"]),
        (one_cell_text()[:-8], DataShapeError, ["truncated", "boundary edges section"]),
        # a token that is not a number, with its line
        (one_cell_text().replace("1 1\n", "1 abc\n"), DataShapeError, ["line 4", "abc", "node coordinates"]),
        # a non-integer id
        (one_cell_text().replace("0 1 2 3", "0 1 2.5 3"), DataShapeError, ["line 6", "cells section"]),
        # more numbers than the header says
        (one_cell_text() + "7 7 7 7\n", DataShapeError, ["extra data", "line 11"]),
        # out-of-range ids, in each section
        (one_cell_text().replace("0 1 2 3", "0 1 4 3"), MapError, ["cells section", "node 4"]),
        (one_cell_text().replace("0 1 2 3", "0 -1 2 3"), MapError, ["cells section", "node -1"]),
        (one_cell_text().replace("2 1 0 2", "2 9 0 2"), MapError, ["boundary edges section", "node 9"]),
        (one_cell_text().replace("2 1 0 2", "2 1 1 2"), MapError, ["boundary edges section", "cell 1"]),
    ],
)
def test_reader_errors(tmp_path, text, err, words):
    path = write_text(tmp_path, text)
    with pytest.raises(err) as info:
        read_op2_ascii(path)
    assert isinstance(info.value, MeshchainError)
    msg = str(info.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, (w, msg)


def test_reader_edge_cell_out_of_range(tmp_path):
    m = naca0012(2, 2)
    path = tmp_path / "g.dat"
    write_op2_ascii(m, path)
    lines = path.read_text().splitlines(keepends=True)
    k = 1 + m.nnode + m.ncell + 3  # 4th interior edge record
    n1, n2, c1, _ = lines[k].split()
    lines[k] = f"{n1} {n2} {c1} {m.ncell}\n"
    path.write_text("".join(lines))
    with pytest.raises(MapError, match=r"edges section.*cell %d" % m.ncell):
        read_op2_ascii(path)


def test_reader_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_op2_ascii(tmp_path / "nope.dat")


def test_validate_errors():
    m = naca0012(2, 2)
    fields = dict(x=m.x, cell=m.cell, edge=m.edge, ecell=m.ecell, bedge=m.bedge, becell=m.becell, bound=m.bound)

    def make(**kw):
        return AirfoilMesh(**{**fields, **kw})

    make().validate()
    with pytest.raises(DataShapeError, match="AirfoilMesh.cell"):
        make(cell=m.cell[:, :3]).validate()
    with pytest.raises(DataShapeError, match="AirfoilMesh.ecell"):
        make(ecell=m.ecell[:-1]).validate()
    with pytest.raises(DataShapeError, match="AirfoilMesh.bound"):
        make(bound=m.bound[:-1]).validate()
    with pytest.raises(DataShapeError, match="AirfoilMesh.x"):
        make(x=np.where(np.arange(m.nnode)[:, None] == 3, np.nan, m.x)).validate()
    with pytest.raises(MapError, match=r"AirfoilMesh.ecell\[0\].*cell"):
        bad = m.ecell.copy()
        bad[0, 1] = m.ncell
        make(ecell=bad).validate()
    with pytest.raises(MapError, match=r"AirfoilMesh.bedge\[1\].*node -3"):
        bad = m.bedge.copy()
        bad[1, 0] = -3
        make(bedge=bad).validate()
    with pytest.raises(DataShapeError, match="AirfoilMesh.cell.*non-integer"):
        make(cell=m.cell + 0.5)
    with pytest.raises(MapError):
        write_op2_ascii(make(becell=m.becell + m.ncell), "/nonexistent/never_written.dat")


# ----------------------------------------------------------------------- naca0012


@pytest.mark.parametrize("I, J", SIZES)
def test_naca_counts_and_dtypes(I, J):
    m = naca0012(I, J)
    assert (m.nnode, m.ncell, m.nedge, m.nbedge) == counts(I, J)
    assert m.x.dtype == np.float64 and m.x.shape == (m.nnode, 2)
    for name in ("cell", "edge", "ecell", "bedge", "becell", "bound"):
        assert getattr(m, name).dtype == np.int32
    assert int((m.bound == 1).sum()) == I  # wall
    assert int((m.bound == 2).sum()) == 3 * I + 2 * J  # far field
    assert set(np.unique(m.bound).tolist()) == {1, 2}


def test_naca_op2_validation_mesh_counts():
    m = naca0012(400, 600)
    assert (m.nnode, m.ncell, m.nedge, m.nbedge) == (721801, 720000, 1438600, 2800)


@pytest.mark.parametrize("I, J", SIZES)
def test_naca_topology(I, J):
    m = naca0012(I, J)
    # every interior edge joins 2 distinct cells, has 2 distinct nodes
    assert np.all(m.ecell[:, 0] != m.ecell[:, 1])
    assert np.all(m.edge[:, 0] != m.edge[:, 1])
    assert np.all(m.bedge[:, 0] != m.bedge[:, 1])
    # every cell has exactly 4 edges, counting boundary edges
    incid = np.bincount(np.concatenate([m.ecell.ravel(), m.becell]), minlength=m.ncell)
    assert np.all(incid == 4)
    # no cell pair is joined twice
    pairs = np.sort(m.ecell, axis=1)
    assert np.unique(pairs, axis=0).shape[0] == m.nedge
    # every node is used by some cell
    assert np.all(np.bincount(m.cell.ravel(), minlength=m.nnode) > 0)
    # the edge's end points coincide (in position) with an edge of each of its cells
    for side in (0, 1):
        cx = m.x[m.cell[m.ecell[:, side]]]  # (nedge, 4, 2)
        for end in (0, 1):
            d = np.abs(cx - m.x[m.edge[:, end]][:, None, :]).max(axis=2).min(axis=1)
            assert d.max() < 1e-12
    bx = m.x[m.cell[m.becell]]
    for end in (0, 1):
        d = np.abs(bx - m.x[m.bedge[:, end]][:, None, :]).max(axis=2).min(axis=1)
        assert d.max() == 0.0


def test_naca_numbering_matches_op2_generator():
    I, J = 2, 3
    m = naca0012(I, J)
    ni, nci = 3 * I + 1, 3 * I

    def node(i, j):
        return i + j * ni

    def cell(i, j):
        return i + j * nci

    assert m.cell[cell(1, 2)].tolist() == [node(1, 2), node(2, 2), node(2, 3), node(1, 3)]
    # edges in OP2's order, written out by hand for (j, i) = (0, 0), (0, 1), (0, 2)
    expected = [
        [node(0, 0), node(1, 0), cell(5, 0), cell(0, 0)],  # wake cut
        [node(0, 1), node(1, 1), cell(0, 0), cell(0, 1)],  # up
        [node(1, 0), node(1, 1), cell(1, 0), cell(0, 0)],  # right
        [node(1, 0), node(2, 0), cell(4, 0), cell(1, 0)],  # wake cut
        [node(1, 1), node(2, 1), cell(1, 0), cell(1, 1)],
        [node(2, 0), node(2, 1), cell(2, 0), cell(1, 0)],
        [node(2, 1), node(3, 1), cell(2, 0), cell(2, 1)],  # i = 2 >= I: no cut edge
    ]
    got = np.concatenate([m.edge, m.ecell], axis=1)[:7].tolist()
    assert got == expected
    # the last edge: up-edge of the last cell of row J-2 ... then row J-1 has only right edges
    assert np.concatenate([m.edge, m.ecell], axis=1)[-1].tolist() == [
        node(nci - 1, J - 1), node(nci - 1, J), cell(nci - 1, J - 1), cell(nci - 2, J - 1)]
    b = np.concatenate([m.bedge, m.becell[:, None], m.bound[:, None]], axis=1).tolist()
    assert b[:I] == [[node(i + 1, 0), node(i, 0), cell(i, 0), 1] for i in range(I, 2 * I)]
    assert b[I:I + J] == [[node(nci, j + 1), node(nci, j), cell(nci - 1, j), 2] for j in range(J)]
    assert b[I + J:I + J + nci] == [[node(i, J), node(i + 1, J), cell(i, J - 1), 2] for i in range(nci - 1, -1, -1)]
    assert b[I + J + nci:] == [[node(0, j), node(0, j + 1), cell(0, j), 2] for j in range(J - 1, -1, -1)]


@pytest.mark.parametrize("I, J", [(4, 6), (20, 30), (400, 600)])
def test_naca_geometry_orientation(I, J):
    m = naca0012(I, J)
    area, centre = cell_geometry(m)
    assert np.all(area > 0)  # counter-clockwise cells, like OP2's
    # OP2 convention: for edge (x1, x2), (dy, -dx) with d = x1 - x2 points out of
    # the first cell (res_calc adds the flux to res1, subtracts it from res2)
    d = m.x[m.edge[:, 0]] - m.x[m.edge[:, 1]]
    normal = np.stack([d[:, 1], -d[:, 0]], axis=1)
    assert np.all(np.einsum("ij,ij->i", normal, centre[m.ecell[:, 1]] - centre[m.ecell[:, 0]]) > 0)
    # ... and out of the domain for boundary edges
    d = m.x[m.bedge[:, 0]] - m.x[m.bedge[:, 1]]
    normal = np.stack([d[:, 1], -d[:, 0]], axis=1)
    mid = 0.5 * (m.x[m.bedge[:, 0]] + m.x[m.bedge[:, 1]])
    assert np.all(np.einsum("ij,ij->i", normal, mid - centre[m.becell]) > 0)


@pytest.mark.parametrize("decimals", [None, 6])
def test_naca_closed_cells_preserve_free_stream(decimals):
    # the edge normals of each cell sum to zero: OP2's Airfoil keeps a uniform flow uniform
    m = naca0012(20, 30, decimals=decimals)
    d = m.x[m.edge[:, 0]] - m.x[m.edge[:, 1]]
    n = np.stack([d[:, 1], -d[:, 0]], axis=1)
    acc = np.zeros((m.ncell, 2))
    np.add.at(acc, m.ecell[:, 0], n)
    np.add.at(acc, m.ecell[:, 1], -n)
    d = m.x[m.bedge[:, 0]] - m.x[m.bedge[:, 1]]
    np.add.at(acc, m.becell, np.stack([d[:, 1], -d[:, 0]], axis=1))
    assert np.abs(acc).max() < 1e-12


@pytest.mark.parametrize("I, J, decimals, tol", [(20, 30, None, 1e-6), (400, 600, None, 1e-6), (400, 600, 6, 2e-5)])
def test_naca_wall_on_airfoil_surface(I, J, decimals, tol):
    m = naca0012(I, J, decimals=decimals)
    wall = np.unique(m.bedge[m.bound == 1])
    assert wall.size == I + 1
    xw = m.x[wall]
    chord = xw[:, 0] + X0  # the generator does not shift the airfoil back by x0
    assert chord.min() >= -1e-6 and abs(chord.min()) < 1e-6  # leading edge
    assert np.isclose(chord.max(), 1.0 + X0)  # last wall node at the w-plane's Re w = +-1
    inside = chord <= 1.0
    y_exact = naca0012_thickness(np.clip(chord[inside], 0.0, 1.0))
    assert np.abs(np.abs(xw[inside, 1]) - y_exact).max() < tol
    assert np.all(np.abs(xw[~inside, 1]) < 1e-6)  # the tail edges run along y = 0
    # both surfaces, symmetric: lower for i < 2I... wall nodes ordered i = I..2I
    ys = m.x[np.arange(I, 2 * I + 1), 1]
    assert np.all(ys[1:I // 2] < 0) and np.all(ys[-I // 2:-1] > 0)
    assert np.allclose(ys, -ys[::-1], atol=1e-6)
    # and the standard NACA0012 formula (open trailing edge) agrees to ~1e-3
    std = 0.6 * (0.2969 * np.sqrt(chord[inside].clip(0, 1)) - 0.1260 * chord[inside] - 0.3516 * chord[inside] ** 2
                 + 0.2843 * chord[inside] ** 3 - 0.1015 * chord[inside] ** 4)
    assert np.abs(np.abs(xw[inside, 1]) - std).max() < 2e-3


def test_naca_far_field_and_wake_cut():
    I, J = 20, 30
    m = naca0012(I, J, decimals=None)
    far = np.unique(m.bedge[m.bound == 2])
    r = np.hypot(m.x[far, 0], m.x[far, 1])
    assert r.min() > 8.9 and r.max() < 18.0 + 1e-9  # image of the w-rectangle: 9 .. 18 chords
    # the two sides of the wake cut are duplicated nodes at the same place, on y = 0, x in [1, 9]
    ni = 3 * I + 1
    lower = m.x[np.arange(0, I + 1)]
    upper = m.x[np.arange(3 * I, 2 * I - 1, -1)]
    assert np.allclose(lower, upper, atol=1e-12, rtol=0)
    assert np.all(np.abs(lower[:, 1]) < 1e-12) and np.isclose(lower[0, 0], 9.0) and np.isclose(lower[-1, 0], 1.0)
    # the top row j = J is the image of Im w = 3
    top = m.x[J * ni: (J + 1) * ni]
    w = np.sqrt(top[:, 0] + 1j * top[:, 1])
    assert np.allclose(np.abs(w.imag), 3.0)


def test_naca_decimals():
    full = naca0012(20, 30, decimals=None)
    r6 = naca0012(20, 30)
    r3 = naca0012(20, 30, decimals=3)
    # default: OP2's "%f" rounding, exactly what printf + strtod give
    assert np.array_equal(r6.x, np.array([float("%f" % v) for v in full.x.ravel()]).reshape(-1, 2))
    assert np.abs(r3.x - full.x).max() <= 5e-4 + 1e-12
    assert r6.nedge == full.nedge and np.array_equal(r6.ecell, full.ecell)


@pytest.mark.parametrize("bad", [dict(I=1, J=5), dict(I=5, J=0), dict(I=2.5, J=4), dict(I=True, J=4),
                                 dict(I=4, J=4, decimals=-1), dict(I=4, J=4, decimals=1.5)])
def test_naca_bad_arguments(bad):
    with pytest.raises(DeclarationError) as info:
        naca0012(**bad)
    assert isinstance(info.value, MeshchainError)


# ------------------------------------------------------------ C reference program


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_reference_runs(tmp_path):
    exe = tmp_path / "airfoil_c"
    subprocess.run(["gcc", "-O1", "-std=c99", "-o", str(exe), str(REPO / "benchmarks" / "airfoil.c"), "-lm"],
                   check=True)
    mesh = tmp_path / "g.dat"
    write_op2_ascii(naca0012(20, 30), mesh)
    out = subprocess.run([str(exe), str(mesh), "200", "2"], check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    assert [ln.split()[0] for ln in lines[:2]] == ["100", "200"]
    rms = [float(ln.split()[1]) for ln in lines[:2]]
    assert all(np.isfinite(rms)) and 0 < rms[1] < rms[0]
    assert lines[2].startswith("TIME ") and float(lines[2].split()[1]) > 0
    assert [ln.split()[1] for ln in lines[3:]] == ["save_soln", "adt_calc", "res_calc", "bres_calc", "update"]
    assert len(lines) == 8
    # a bad mesh file is reported, not crashed on
    bad = tmp_path / "bad.dat"
    bad.write_text("4 1 0 4\n0 0\n")
    res = subprocess.run([str(exe), str(bad), "1"], capture_output=True, text=True)
    assert res.returncode != 0 and "bad.dat" in res.stderr
