"""ParaView output (``mc.Output``, XDMF + HDF5): written on 1-4 ranks without gathering, read
back with meshio equal to ``dat.gather()``; a restarted run continues its series; bad fields,
directories and failing disks raise on every rank and leave the complete steps readable."""

from __future__ import annotations

import os

import meshio
import numpy as np
import pytest

import meshchain as mc
from helpers import failure_on_every_rank
from meshchain.meshes import structured_tris

MESH = structured_tris(6, 5)


@mc.kernel
def advance(a, b, c, u, w):
    u[0] += a[0] + 2 * b[0] - c[0]
    w[0] = 3 * u[0]
    w[1] = w[1] - 1


def declare(comm, *, other_set=False):
    mc.reset_runtime(comm=comm)
    elsewhere = mc.Dat(mc.Set(3, "edges"), 1, None, "elsewhere") if other_set else None
    nodes, cells = mc.Set(MESH.nnode, "nodes"), mc.Set(MESH.ncell, "cells")
    c2n = mc.Map(cells, nodes, 3, MESH.cells, "c2n")
    x = mc.Dat(nodes, 2, MESH.coords, "x")
    h = mc.Dat(nodes, 1, np.arange(MESH.nnode, dtype=np.float64) % 7, "h")
    u = mc.Dat(cells, 1, np.arange(MESH.ncell, dtype=np.float64), "u")
    w = mc.Dat(cells, 2, None, "w", dtype=np.int64)
    mc.partition("block")
    return (c2n, x, h, u, w, elsewhere) if other_set else (c2n, x, h, u, w)


def step(c2n, h, u, w):
    mc.par_loop(advance, c2n.source, h(mc.READ, c2n[0]), h(mc.READ, c2n[1]), h(mc.READ, c2n[2]), u(mc.RW),
                w(mc.RW))


def shared_path(comm, tmp_path, name):
    return comm.bcast(str(tmp_path / name), root=0)


def read_series(index):
    """Points, cell blocks and [(time, point data, cell data)] as meshio reads them."""
    with meshio.xdmf.TimeSeriesReader(index) as reader:
        points, cells = reader.read_points_cells()
        return points, cells, [reader.read_data(k) for k in range(reader.num_steps)]


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=300)
def test_output_read_back_with_meshio_equals_the_gathered_dats(comm, tmp_path):
    directory = shared_path(comm, tmp_path, "out")
    c2n, x, h, u, w = declare(comm)
    out = mc.Output(directory, coords=x, cells=c2n, name="run")
    expected = []
    for t in (0.0, 0.25, 0.5):
        out.write(t, {"h": h, "u": u, "w": w})
        expected.append((t, h.gather(), u.gather(), w.gather()))
        step(c2n, h, u, w)
    if comm.rank == 0:
        points, cells, steps = read_series(os.path.join(directory, "run.xdmf"))
        np.testing.assert_array_equal(points, MESH.coords)
        assert [b.type for b in cells] == ["triangle"]
        np.testing.assert_array_equal(cells[0].data, MESH.cells)
        assert [s[0] for s in steps] == [0.0, 0.25, 0.5]
        for (t, point_data, cell_data), (_, h_all, u_all, w_all) in zip(steps, expected):
            np.testing.assert_array_equal(point_data["h"], h_all)
            np.testing.assert_array_equal(cell_data["u"][0], u_all)
            np.testing.assert_array_equal(cell_data["w"][0], w_all)
            assert cell_data["w"][0].dtype == np.int64
        assert not [f for f in os.listdir(directory) if f.endswith(".tmp")]


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_restarted_run_continues_the_series_dropping_later_steps(comm, tmp_path):
    directory = shared_path(comm, tmp_path, "out")
    c2n, x, h, u, w = declare(comm)
    out = mc.Output(directory, coords=x, cells=c2n)
    for t in range(4):
        out.write(t, {"u": u})
        step(c2n, h, u, w)
    again = mc.Output(directory, coords=x, cells=c2n, keep_until=1)
    again.write(2, {"u": u, "h": h})
    expected = u.gather()
    if comm.rank == 0:
        _, _, steps = read_series(again.index)
        assert [s[0] for s in steps] == [0.0, 1.0, 2.0]
        np.testing.assert_array_equal(steps[2][2]["u"][0], expected)
        assert "h" in steps[2][1] and "h" not in steps[1][1]
    missing = shared_path(comm, tmp_path, "none")
    assert "cannot be continued" in failure_on_every_rank(
        comm, lambda: mc.Output(missing, coords=x, cells=c2n, keep_until=3))


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_bad_output_fails_on_every_rank_and_keeps_the_complete_steps(comm, tmp_path, monkeypatch):
    from meshchain.io import ranked

    directory = shared_path(comm, tmp_path, "out")
    c2n, x, h, u, w, elsewhere = declare(comm, other_set=True)
    with pytest.raises(mc.OutputError, match="the cells' map must point at the nodes"):
        mc.Output(directory, coords=u, cells=c2n)
    with pytest.raises(mc.OutputError, match="not supported"):
        mc.Output(directory, coords=h, cells=c2n)
    out = mc.Output(directory, coords=x, cells=c2n, name="flow")
    out.write(0, {"u": u})
    with pytest.raises(mc.OutputError, match="Dat 'elsewhere' lives on set 'edges'"):
        out.write(1, {"e": elsewhere})
    with pytest.raises(mc.OutputError, match="pass Dats"):
        out.write(1, {"g": mc.Global(1, 0.0, "g")})
    with pytest.raises(mc.OutputError, match="field name"):
        out.write(1, {"a/b": u})
    if comm.size > 1:  # one rank passes a bad field: no hang, every rank raises
        one_rank_wrong = {"u": u} if comm.rank == 0 else {"e": elsewhere}
        assert "'elsewhere'" in failure_on_every_rank(comm, lambda: out.write(1, one_rank_wrong))
    if comm.rank == comm.size - 1:
        def full(descriptor):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ranked.os, "fsync", full)
    message = failure_on_every_rank(comm, lambda: out.write(1, {"u": u}))
    assert "flow_000001.h5" in message and "No space left" in message
    monkeypatch.undo()
    blocker = shared_path(comm, tmp_path, "a_file")
    if comm.rank == 0:
        open(blocker, "w").close()
    comm.Barrier()
    assert "cannot be created" in failure_on_every_rank(
        comm, lambda: mc.Output(os.path.join(blocker, "sub"), coords=x, cells=c2n))
    if comm.rank == 0:
        assert sorted(os.listdir(directory)) == ["flow.xdmf", "flow_000000.h5", "flow_mesh.h5"]
        _, _, steps = read_series(out.index)
        assert [s[0] for s in steps] == [0.0]


def test_the_airfoil_example_writes_the_flow_for_paraview(tmp_path, capsys):
    """``--output DIR --output-every N``: the initial state and every N-th iteration; the
    density and pressure follow from ``q``; a restart continues the series."""
    import importlib.util
    from pathlib import Path

    from meshchain.apps.airfoil import gm1

    path = Path(__file__).resolve().parents[1] / "examples" / "airfoil.py"
    spec = importlib.util.spec_from_file_location("example_airfoil_output", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    flow, state = tmp_path / "flow", str(tmp_path / "state.h5")
    example.main(["--size", "8", "12", "--iters", "20", "--output", str(flow), "--output-every", "10",
                  "--checkpoint", state, "--checkpoint-every", "15"])
    capsys.readouterr()
    points, cells, steps = read_series(flow / "airfoil.xdmf")
    assert [s[0] for s in steps] == [0.0, 10.0, 20.0] and cells[0].type == "quad"
    q = steps[2][2]["q"][0]
    np.testing.assert_array_equal(steps[2][2]["density"][0].ravel(), q[:, 0])
    pressure = gm1 * (q[:, 3] - 0.5 * (q[:, 1] ** 2 + q[:, 2] ** 2) / q[:, 0])
    np.testing.assert_allclose(steps[2][2]["pressure"][0].ravel(), pressure, rtol=1e-13)
    mc.reset_runtime()
    example.main(["--size", "8", "12", "--iters", "20", "--output", str(flow), "--output-every", "10",
                  "--restart", state])
    _, _, restarted = read_series(flow / "airfoil.xdmf")
    assert [s[0] for s in restarted] == [0.0, 10.0, 20.0]
    np.testing.assert_array_equal(restarted[2][2]["q"][0], q)


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_read_only_output_directory_fails_on_every_rank(comm, tmp_path):
    directory = shared_path(comm, tmp_path, "locked")
    c2n, x, h, u, w = declare(comm)
    out = mc.Output(directory, coords=x, cells=c2n)
    out.write(0, {"u": u})
    comm.Barrier()
    if comm.rank == 0:
        os.chmod(directory, 0o500)
    comm.Barrier()
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("this user (root) writes to read-only directories; the disk-failure test covers writing")
        message = failure_on_every_rank(comm, lambda: out.write(1, {"u": u}))
        assert "output_000001.h5" in message and "cannot write beside it" in message
    finally:
        comm.Barrier()
        if comm.rank == 0:
            os.chmod(directory, 0o700)
