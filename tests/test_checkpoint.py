"""Checkpoint and restart (``mc.checkpoint`` / ``mc.restore``): written on N ranks, restored
on M (N, M in 1..4) bit for bit; atomic (a crash before the rename keeps the previous
checkpoint); bad files and other meshes fail on every rank, naming the file and object."""

from __future__ import annotations

import os

import numpy as np
import pytest

import meshchain as mc
from helpers import failure_on_every_rank
from meshchain.io import checkpoint as module
from meshchain.meshes import structured_tris

MESH = structured_tris(7, 5)


@mc.kernel
def spread(a, b, acc_a, acc_b):
    acc_a[0] += 3 * b[0] - a[0]
    acc_b[0] += 2 * a[0] + b[1]


def declare(comm, *, seed=0, edges_values=None):
    """A small mesh with integer-valued dats of two dtypes and a global; partitioned."""
    mc.reset_runtime(comm=comm)
    rng = np.random.default_rng(seed)
    nodes, edges = mc.Set(MESH.nnode, "nodes"), mc.Set(MESH.nfacet, "edges")
    e2n = mc.Map(edges, nodes, 2, MESH.facets if edges_values is None else edges_values, "e2n")
    u = mc.Dat(nodes, 2, rng.integers(-5, 6, size=(MESH.nnode, 2)).astype(np.float64), "u")
    acc = mc.Dat(nodes, 1, None, "acc", dtype=np.int64)
    steps = mc.Global(1, 7, "steps", dtype=np.int64)
    mc.partition("block")
    return e2n, u, acc, steps


def advance(e2n, u, acc):
    with mc.loop_chain("advance", ca=True):
        mc.par_loop(spread, e2n.source, u(mc.READ, e2n[0]), u(mc.READ, e2n[1]), acc(mc.INC, e2n[0]),
                    acc(mc.INC, e2n[1]))


def shared_path(comm, tmp_path, name):
    """One path for all ranks (each rank has its own tmp_path)."""
    return comm.bcast(str(tmp_path / name), root=0)


@pytest.mark.mpi(nprocs=(4,), timeout=300)
def test_written_on_n_ranks_restored_on_m_ranks_bit_for_bit(comm, tmp_path):
    """Every (N, M) in 1..4 x 1..4, with sub-communicators of the 4 ranks."""
    for writers in range(1, comm.size + 1):
        path = shared_path(comm, tmp_path, f"n{writers}.h5")
        sub = comm.Split(0 if comm.rank < writers else 1, comm.rank)
        expected = None
        if comm.rank < writers:
            e2n, u, acc, steps = declare(sub)
            advance(e2n, u, acc)
            steps.value = 11
            mc.checkpoint(path, [u, acc, steps])
            expected = (u.gather(), acc.gather())
        expected = comm.bcast(expected, root=0)
        for readers in range(1, comm.size + 1):
            sub_readers = comm.Split(0 if comm.rank < readers else 1, comm.rank)
            if comm.rank < readers:
                _, u, acc, steps = declare(sub_readers, seed=99)
                mc.restore(path, [u, acc, steps])
                assert int(steps.value[0]) == 11
                got = (u.gather(), acc.gather())
                if comm.rank == 0:
                    np.testing.assert_array_equal(got[0], expected[0], err_msg=f"u: {writers} -> {readers} ranks")
                    np.testing.assert_array_equal(got[1], expected[1], err_msg=f"acc: {writers} -> {readers}")
            comm.Barrier()
            sub_readers.Free()
        sub.Free()


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_restored_run_continues_as_an_uninterrupted_one(comm, tmp_path):
    path = shared_path(comm, tmp_path, "run.h5")
    e2n, u, acc, steps = declare(comm)
    for _ in range(3):
        advance(e2n, u, acc)
    mc.checkpoint(path, [u, acc])
    for _ in range(2):
        advance(e2n, u, acc)
    uninterrupted = acc.gather()
    e2n, u, acc, steps = declare(comm, seed=5)
    mc.restore(path, [u, acc])
    for _ in range(2):
        advance(e2n, u, acc)
    if comm.rank == 0:
        np.testing.assert_array_equal(acc.gather(), uninterrupted)
    else:
        acc.gather()


def test_a_crash_before_the_rename_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "safe.h5")
    e2n, u, acc, steps = declare(None)
    mc.checkpoint(path, [u, acc])
    saved = u.data_ro.copy()

    def crash(temporary):
        raise RuntimeError("killed while writing")

    monkeypatch.setattr(module, "_before_rename", crash)
    u.data[:] = -1.0
    with pytest.raises(RuntimeError, match="killed"):
        mc.checkpoint(path, [u, acc])
    monkeypatch.undo()
    mc.restore(path, [u, acc])
    np.testing.assert_array_equal(u.data_ro, saved)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_bad_checkpoints_fail_on_every_rank_and_change_nothing(comm, tmp_path):
    good = shared_path(comm, tmp_path, "good.h5")
    e2n, u, acc, steps = declare(comm)
    mc.checkpoint(good, [u, acc, steps])
    before = u.data_ro.copy()
    broken = shared_path(comm, tmp_path, "broken.h5")
    truncated = shared_path(comm, tmp_path, "truncated.h5")
    if comm.rank == 0:
        with open(broken, "wb") as f:
            f.write(b"not an HDF5 file at all")
        with open(good, "rb") as f, open(truncated, "wb") as g:
            g.write(f.read()[: os.path.getsize(good) // 2])
    comm.Barrier()
    assert "missing.h5" in failure_on_every_rank(comm, lambda: mc.restore(shared_path(comm, tmp_path, "missing.h5"), [u]))
    assert "broken.h5" in failure_on_every_rank(comm, lambda: mc.restore(broken, [u]))
    assert "truncated.h5" in failure_on_every_rank(comm, lambda: mc.restore(truncated, [u]))
    ghost = mc.Dat(u.dataset, 1, None, "ghost")
    assert "Dat 'ghost'" in failure_on_every_rank(comm, lambda: mc.restore(good, [ghost]))
    assert "cannot write beside it" in failure_on_every_rank(comm, lambda: mc.checkpoint(str(tmp_path / "no" / "dir.h5"), [u]))
    np.testing.assert_array_equal(u.data_ro, before)
    # another mesh: the same sizes, other connectivity (a map's hash differs)
    _, u, acc, steps = declare(comm, edges_values=MESH.facets[:, ::-1])
    assert "map e2n" in failure_on_every_rank(comm, lambda: mc.restore(good, [u]))
    with pytest.raises(mc.CheckpointError, match="distinct names"):
        mc.checkpoint(good, [u, u])
    if comm.size > 1:  # one rank passes something else: no hang, every rank raises
        odd = [u] if comm.rank == 0 else [u, u]
        assert "distinct names" in failure_on_every_rank(comm, lambda: mc.checkpoint(good, odd))
        assert "distinct names" in failure_on_every_rank(comm, lambda: mc.restore(good, odd))


@pytest.mark.mpi(nprocs=(3,), timeout=300)
def test_airfoil_checkpointed_on_two_ranks_restarts_on_three_with_the_serial_rms(comm, tmp_path):
    """Issue 20's restart test: 2 ranks run to iteration 40 and checkpoint; 3 ranks restore
    and run to 80; the rms at 80 equals an uninterrupted one-process run's to 1e-12."""
    from mpi4py import MPI

    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    mesh = naca0012(8, 12)
    mc.reset_runtime(comm=MPI.COMM_SELF)
    serial = airfoil.run(airfoil.declare(mesh), 80, report_every=20, out=None)
    path = shared_path(comm, tmp_path, "airfoil.h5")
    pair = comm.Split(0 if comm.rank < 2 else 1, comm.rank)
    if comm.rank < 2:
        mc.reset_runtime(comm=pair)
        airfoil.run(airfoil.declare(mesh), 40, report_every=20, out=None, checkpoint=path, checkpoint_every=40)
    comm.Barrier()
    pair.Free()
    mc.reset_runtime(comm=comm)
    problem = airfoil.declare(mesh, method="kway")
    first = airfoil.restore_state(problem, path)
    restarted = airfoil.run(problem, 80, report_every=20, out=None, start=first)
    assert first == 40 and [it for it, _ in restarted] == [60, 80]
    for (it, rms), (it_serial, rms_serial) in zip(restarted, serial[2:]):
        assert it == it_serial and rms == pytest.approx(rms_serial, rel=1e-12, abs=0)


def test_the_airfoil_example_restarts_from_its_checkpoint(tmp_path, capsys):
    """``--checkpoint`` then ``--restart`` prints the lines of an uninterrupted run after the
    checkpoint's iteration, digit for digit."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "airfoil.py"
    spec = importlib.util.spec_from_file_location("example_airfoil", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    mesh = ["--size", "8", "12"]
    example.main([*mesh, "--iters", "300"])
    uninterrupted = capsys.readouterr().out.splitlines()
    state = str(tmp_path / "state.h5")
    mc.reset_runtime()
    example.main([*mesh, "--iters", "200", "--checkpoint", state, "--checkpoint-every", "100"])
    assert capsys.readouterr().out.splitlines() == uninterrupted[:2]
    mc.reset_runtime()
    example.main([*mesh, "--iters", "300", "--restart", state])
    assert capsys.readouterr().out.splitlines() == uninterrupted[2:]
