"""OP2 HDF5 meshes: OP2's layout; ASCII -> HDF5 -> read gives the same mesh, written and read
on 1-4 ranks (each rank reading only its rows); Airfoil on the HDF5 mesh prints the ASCII
mesh's rms; bad files fail on every rank naming the file and dataset."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

import meshchain as mc
from helpers import failure_on_every_rank
from meshchain.meshes import (AirfoilBlocks, naca0012, read_op2_ascii, read_op2_hdf5, write_op2_ascii,
                              write_op2_hdf5)

MESH = naca0012(8, 12)
FIELDS = ("x", "cell", "edge", "ecell", "bedge", "becell", "bound")


def shared_path(comm, tmp_path, name):
    """One path for all ranks (each rank has its own tmp_path)."""
    return comm.bcast(str(tmp_path / name), root=0)


def test_ascii_to_hdf5_and_back_gives_the_same_mesh_in_op2s_layout(tmp_path):
    write_op2_ascii(MESH, tmp_path / "new_grid.dat")
    ascii_mesh = read_op2_ascii(tmp_path / "new_grid.dat")
    write_op2_hdf5(ascii_mesh, tmp_path / "new_grid.h5")
    assert read_op2_hdf5(tmp_path / "new_grid.h5") == MESH
    with h5py.File(tmp_path / "new_grid.h5", "r") as f:
        assert {k: f[k][()].tolist() for k in ("nodes", "edges", "bedges", "cells")} == {
            "nodes": [MESH.nnode], "edges": [MESH.nedge], "bedges": [MESH.nbedge], "cells": [MESH.ncell]}
        assert f["pcell"].shape == (MESH.ncell, 4) and f["pcell"].dtype == np.int32
        assert f["pbecell"].shape == (MESH.nbedge, 1)
        assert f["pcell"].attrs["type"] == b"int" and f["pcell"].attrs["dim"].tolist() == [4]
        assert f["p_x"].attrs["type"] == b"double" and f["p_x"].attrs["size"].tolist() == [MESH.nnode]
        np.testing.assert_array_equal(f["pecell"][()], MESH.ecell)
        np.testing.assert_array_equal(f["p_bound"][()].ravel(), MESH.bound)


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=300)
def test_written_from_ranks_and_read_in_blocks_gives_the_same_mesh(comm, tmp_path):
    """Declared and partitioned on N ranks, written without gathering; read back on N ranks,
    each rank holding only its block of rows; the blocks make up the original mesh."""
    serial = shared_path(comm, tmp_path, "serial.h5")
    ranked = shared_path(comm, tmp_path, "ranked.h5")
    if comm.rank == 0:
        write_op2_hdf5(MESH, serial)
    mc.reset_runtime(comm=comm)
    declared = MESH.declare()
    mc.partition("kway")
    write_op2_hdf5(declared, ranked)
    read = read_op2_hdf5(ranked)
    if comm.size > 1:
        assert isinstance(read, AirfoilBlocks) and len(read.cell) < MESH.ncell
        parts = comm.gather({f: getattr(read, f) for f in FIELDS}, root=0)
        if comm.rank == 0:
            for field in FIELDS:
                np.testing.assert_array_equal(np.concatenate([p[field] for p in parts]), getattr(MESH, field))
    else:
        assert read == MESH
    if comm.rank == 0:
        with h5py.File(serial, "r") as a, h5py.File(ranked, "r") as b:
            assert sorted(a) == sorted(b)
            for name in a:
                np.testing.assert_array_equal(a[name][()], b[name][()], err_msg=name)
    # declared from the blocks and written again: the same file
    mc.reset_runtime(comm=comm)
    again = shared_path(comm, tmp_path, "again.h5")
    problem = read.declare()
    mc.partition("rib", coords=problem.p_x)
    write_op2_hdf5(problem, again)
    if comm.rank == 0:
        with h5py.File(serial, "r") as a, h5py.File(again, "r") as b:
            for name in a:
                np.testing.assert_array_equal(a[name][()], b[name][()], err_msg=name)


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_airfoil_on_the_hdf5_mesh_prints_the_rms_of_the_ascii_mesh(comm, tmp_path):
    from mpi4py import MPI

    from meshchain.apps import airfoil

    ascii_path, h5_path = shared_path(comm, tmp_path, "grid.dat"), shared_path(comm, tmp_path, "grid.h5")
    if comm.rank == 0:
        write_op2_ascii(MESH, ascii_path)
        write_op2_hdf5(read_op2_ascii(ascii_path), h5_path)
    comm.Barrier()
    mc.reset_runtime(comm=MPI.COMM_SELF)
    serial = airfoil.run(airfoil.declare(read_op2_ascii(ascii_path)), 60, report_every=20, out=None)
    mc.reset_runtime(comm=comm)
    ranked = airfoil.run(airfoil.declare(read_op2_hdf5(h5_path)), 60, report_every=20, out=None)
    assert [it for it, _ in ranked] == [20, 40, 60]
    for (_, rms), (_, rms_serial) in zip(ranked, serial):
        assert rms == pytest.approx(rms_serial, rel=1e-12, abs=0)


def test_the_airfoil_example_reads_and_writes_hdf5_meshes(tmp_path, capsys):
    """``--mesh new_grid.h5`` prints what ``--mesh new_grid.dat`` prints, digit for digit."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "airfoil.py"
    spec = importlib.util.spec_from_file_location("example_airfoil_h5", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    write_op2_ascii(MESH, tmp_path / "grid.dat")
    example.main(["--mesh", str(tmp_path / "grid.dat"), "--iters", "200", "--write-mesh", str(tmp_path / "g.h5")])
    from_ascii = capsys.readouterr().out.splitlines()
    mc.reset_runtime()
    example.main(["--mesh", str(tmp_path / "g.h5"), "--iters", "200"])
    assert capsys.readouterr().out.splitlines() == from_ascii and len(from_ascii) == 2


def _damaged(path, name, edit):
    """A copy of the mesh at ``path`` with ``edit(h5file)`` applied."""
    with h5py.File(path, "r") as src, h5py.File(name, "w") as dst:
        for key in src:
            src.copy(key, dst)
        edit(dst)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_bad_hdf5_meshes_fail_on_every_rank_naming_file_and_dataset(comm, tmp_path):
    good = shared_path(comm, tmp_path, "good.h5")
    names = {k: shared_path(comm, tmp_path, f"{k}.h5") for k in ("junk", "cut", "nomap", "shape", "range", "set")}
    if comm.rank == 0:
        write_op2_hdf5(MESH, good)
        with open(names["junk"], "wb") as f:
            f.write(b"this is not HDF5")
        with open(good, "rb") as f, open(names["cut"], "wb") as g:
            g.write(f.read()[: os.path.getsize(good) // 2])
        _damaged(good, names["nomap"], lambda f: f.__delitem__("pecell"))

        def reshape(f):
            del f["pcell"]
            f["pcell"] = MESH.cell[:, :3]

        def out_of_range(f):
            f["pedge"][5, 1] = MESH.nnode + 3

        def bad_set(f):
            del f["cells"]
            f["cells"] = np.array([1.5])

        _damaged(good, names["shape"], reshape)
        _damaged(good, names["range"], out_of_range)
        _damaged(good, names["set"], bad_set)
    comm.Barrier()
    mc.reset_runtime(comm=comm)
    missing = shared_path(comm, tmp_path, "missing.h5")
    assert "missing.h5" in failure_on_every_rank(comm, lambda: read_op2_hdf5(missing))
    with pytest.raises(FileNotFoundError):
        read_op2_hdf5(missing)
    assert "junk.h5" in failure_on_every_rank(comm, lambda: read_op2_hdf5(names["junk"]))
    assert "cut.h5" in failure_on_every_rank(comm, lambda: read_op2_hdf5(names["cut"]))
    message = failure_on_every_rank(comm, lambda: read_op2_hdf5(names["nomap"]))
    assert "nomap.h5" in message and "'pecell'" in message and "missing" in message
    message = failure_on_every_rank(comm, lambda: read_op2_hdf5(names["shape"]))
    assert "'pcell'" in message and f"({MESH.ncell}, 4)" in message
    message = failure_on_every_rank(comm, lambda: read_op2_hdf5(names["range"]))
    assert "map pedge[5]" in message and f"node {MESH.nnode + 3}" in message
    with pytest.raises(mc.MapError):
        read_op2_hdf5(names["range"])
    assert "'cells'" in failure_on_every_rank(comm, lambda: read_op2_hdf5(names["set"]))


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_mesh_that_cannot_be_written_leaves_the_old_file_and_fails_everywhere(comm, tmp_path, monkeypatch):
    """The disk fails under the last rank's write: every rank raises naming the file, the
    previous file is intact and no temporary file is left; a directory that does not exist
    and objects sharing a name are refused too."""
    from meshchain.io import ranked

    directory = shared_path(comm, tmp_path, "out")
    path = os.path.join(directory, "grid.h5")
    if comm.rank == 0:
        os.mkdir(directory)
        write_op2_hdf5(MESH, path)
    comm.Barrier()
    mc.reset_runtime(comm=comm)
    declared = naca0012(4, 6).declare()
    mc.partition("block")
    if comm.rank == comm.size - 1:
        def full(descriptor):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(ranked.os, "fsync", full)
    message = failure_on_every_rank(comm, lambda: write_op2_hdf5(declared, path))
    assert "grid.h5" in message and "No space left" in message
    monkeypatch.undo()
    nowhere = os.path.join(directory, "no", "grid.h5")
    assert "cannot write beside it" in failure_on_every_rank(comm, lambda: write_op2_hdf5(declared, nowhere))
    with pytest.raises(mc.MeshFileError, match="share a name"):
        write_op2_hdf5([declared.nodes, declared.nodes], path)
    if comm.size > 1:  # one rank passes something else: no hang, every rank raises
        odd = [declared.nodes] if comm.rank == 0 else [declared.nodes, "not an object"]
        assert "str is not a Set" in failure_on_every_rank(comm, lambda: write_op2_hdf5(odd, path))
    comm.Barrier()
    if comm.rank == 0:
        assert os.listdir(directory) == ["grid.h5"]
        assert read_op2_hdf5_whole(path) == MESH


def read_op2_hdf5_whole(path):
    """The whole mesh in ``path`` read on this process alone."""
    from mpi4py import MPI

    mc.reset_runtime(comm=MPI.COMM_SELF)
    return read_op2_hdf5(path)


@mc.kernel
def node_sum(x0, x1, x2, x3, total):
    total[0] += x0[0] + x1[0] + x2[0] + x3[0]
    total[1] += x0[1] + x1[1] + x2[1] + x3[1]


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_any_op2_hdf5_file_declares_its_sets_maps_and_dats(comm, tmp_path):
    """``declare_op2_hdf5`` (OP2's op_decl_*_hdf5 for any application): the declared objects
    equal the mesh's arrays, and a loop over them gives the one-process result."""
    from meshchain.meshes import declare_op2_hdf5

    path = shared_path(comm, tmp_path, "grid.h5")
    if comm.rank == 0:
        write_op2_hdf5(MESH, path)
    comm.Barrier()
    mc.reset_runtime(comm=comm)
    found = declare_op2_hdf5(path, sets=["nodes", "cells", "bedges"], maps={"pcell": ("cells", "nodes")},
                             dats={"p_x": "nodes", "p_bound": "bedges"})
    total = mc.Dat(found["cells"], 2, None, "total")
    mc.partition("block")
    pcell, p_x = found["pcell"], found["p_x"]
    mc.par_loop(node_sum, found["cells"], *[p_x(mc.READ, pcell[k]) for k in range(4)], total(mc.INC))
    gathered = (p_x.gather(), found["p_bound"].gather(), total.gather())
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[0], MESH.x)
        np.testing.assert_array_equal(gathered[1].ravel(), MESH.bound)
        assert gathered[1].dtype == np.int32 and pcell.arity == 4
        np.testing.assert_allclose(gathered[2], MESH.x[MESH.cell].sum(axis=1), rtol=1e-14)
    with pytest.raises(mc.DeclarationError, match=r"\['edges'\]"):
        declare_op2_hdf5(path, sets=["nodes"], maps={"pedge": ("edges", "nodes")})
    message = failure_on_every_rank(comm, lambda: declare_op2_hdf5(path, sets=["nodes", "edges"],
                                                                   maps={"pedge": ("nodes", "edges")}))
    assert "'pedge'" in message and f"({MESH.nnode}," in message
