"""MG-CFD (issue 37): the generated input, its files, and the solver on 1-4 ranks, loop by loop
and communication-avoiding, against OP2's own MG-CFD (reference data in tests/data/mgcfd)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.apps import mgcfd
from meshchain.core.errors import MeshFileError, MeshFileNotFoundError
from meshchain.meshes import channel_bump, read_input_dat
from meshchain.meshes.mgcfd import GROUPS, read_level



@settings(max_examples=12, deadline=None)
@given(n=st.sampled_from([1, 2, 4, 6]), levels=st.integers(1, 3), shuffle=st.booleans(), bump=st.floats(0.0, 0.3))
def test_every_dual_cell_of_every_level_is_closed(n, levels, shuffle, bump):
    """Σ outward edge weights + Σ outward boundary weights = 0 at every node; every edge
    weight points from its first node to its second; each side's inward weights sum to its
    projected area (the floor's bump included)."""
    if n % (1 << (levels - 1)):
        levels = 1
    mesh = channel_bump(n, levels=levels, bump=bump, shuffle=shuffle, seed=n)
    for level in mesh.levels:
        assert level.closure_error() < 1e-13
        along = level.coords[level.edges[:, 1]] - level.coords[level.edges[:, 0]]
        assert (np.einsum("ij,ij->i", level.edge_weights, along) > 0).all()
        by_group = {g: level.bnd_weights[level.bnd_groups == g].sum(axis=0) for g in GROUPS.values()}
        np.testing.assert_allclose(by_group[GROUPS["inlet"]], [1.0, 0.0, 0.0], atol=1e-13)
        np.testing.assert_allclose(by_group[GROUPS["outlet"]], [-1.0, 0.0, 0.0], atol=1e-13)
        np.testing.assert_allclose(by_group[GROUPS["floor"]][1], 3.0, rtol=1e-13)
        np.testing.assert_allclose(by_group[GROUPS["ceiling"]], [0.0, -3.0, 0.0], atol=1e-13)
        np.testing.assert_allclose(by_group[GROUPS["sides"]], [0.0, 0.0, 0.0], atol=1e-13)


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_coarse_node_is_a_fine_node_and_restricts_from_its_neighbourhood(shuffle):
    mesh = channel_bump(8, levels=4, shuffle=shuffle)
    for fine, coarse in zip(mesh.levels, mesh.levels[1:]):
        hit = np.bincount(fine.to_coarse, minlength=coarse.nodes)
        assert hit.min() >= 1 and hit.max() <= 8
        same = np.all(np.isclose(fine.coords, coarse.coords[fine.to_coarse], rtol=0, atol=1e-15), axis=1)
        assert np.bincount(fine.to_coarse[same], minlength=coarse.nodes).min() == 1  # nested: exactly one
        distance = np.linalg.norm(fine.coords - coarse.coords[fine.to_coarse], axis=1)
        spacing = np.linalg.norm(fine.coords[fine.edges[:, 1]] - fine.coords[fine.edges[:, 0]], axis=1).max()
        assert distance.max() <= spacing
    assert mesh.levels[-1].to_coarse is None


def test_sizes_and_bad_arguments():
    assert [lv.nodes for lv in channel_bump(4, levels=3).levels] == [325, 63, 16]
    for bad in (dict(n=3, levels=2), dict(n=0), dict(n=2, levels=0), dict(n=2, bump=1.0)):
        with pytest.raises(mc.DeclarationError, match="channel_bump"):
            channel_bump(**{"n": 2, **bad})


def test_written_input_reads_back_in_op2s_layout(tmp_path):
    mesh = channel_bump(4, levels=3, shuffle=True)
    path = mesh.write(tmp_path, prefix="c")
    files = read_input_dat(path)
    assert [f.name for f in files] == ["c.L0.h5", "c.L1.h5", "c.L2.h5"]
    for level, name in zip(mesh.levels, files):
        sizes, rows = read_level(name)
        assert sizes == {"nodes": level.nodes, "edges": len(level.edges), "bnd_nodes": len(level.bnd_nodes)}
        for dataset, values in level.datasets().items():
            np.testing.assert_array_equal(rows[dataset].reshape(values.shape), values, err_msg=dataset)
        with h5py.File(name, "r") as f:
            assert f["edge-->node"].dtype == np.int32 and f["edge_weights"].attrs["dim"][0] == 3
            assert f["edge_weights"].attrs["type"] == b"double"
    assert "node-->mg_node" not in read_level(files[-1])[1]


def test_bad_input_files_are_refused_naming_what_is_wrong(tmp_path):
    with pytest.raises(MeshFileNotFoundError, match="does not exist"):
        read_input_dat(tmp_path / "missing.dat")
    bad = tmp_path / "input.dat"
    bad.write_text("size=3\n[levels]\n0=a.h5\n")
    with pytest.raises(MeshFileError, match="num_levels"):
        read_input_dat(bad)
    bad.write_text("num_levels=2\nbase_array_index=1\n[levels]\n0=a.h5\n1=b.h5\n")
    with pytest.raises(MeshFileError, match="0-based"):
        read_input_dat(bad)
    bad.write_text("num_levels=2\n[levels]\n0=a.h5\n")
    with pytest.raises(MeshFileError, match=r"levels \[1\]"):
        read_input_dat(bad)
    path = channel_bump(2, levels=1).write(tmp_path / "one")
    with h5py.File(path.parent / "channel.L0.h5", "a") as f:
        del f["edge_weights"]
    with pytest.raises(MeshFileError, match="edge_weights"):
        read_level(path.parent / "channel.L0.h5")
    with pytest.raises(MeshFileNotFoundError, match="level file"):
        read_level(tmp_path / "none.h5")


def test_a_captured_cycle_replays_the_bits_of_the_cycle():
    """``run(..., captured=True)`` replays a cycle captured once (across runs): the rms history
    and every level's variables of the uncaptured run, bit for bit; ``after_level0`` (which
    runs between a cycle's loops) is refused with it."""
    mesh = channel_bump(2, levels=2, shuffle=True)
    plain = mgcfd.declare(mesh, synthetic_loops=2)
    history, expected = mgcfd.run(plain, 4), _final(plain)
    mc.reset_runtime()
    problem = mgcfd.declare(mesh, synthetic_loops=2)
    assert mgcfd.run(problem, 1, captured=True) + mgcfd.run(problem, 3, captured=True) == history
    assert (problem.captured[False].captures, problem.captured[False].replays) == (1, 3)
    for got, want in zip(_final(problem), expected):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(mc.ConfigurationError, match="after_level0 runs between a cycle's loops"):
        mgcfd.run(problem, 1, captured=True, after_level0=lambda problem: None)


def test_synthetic_loops_must_be_even():
    with pytest.raises(mc.ConfigurationError, match="even"):
        mgcfd.declare(channel_bump(2, levels=1), synthetic_loops=3)


def shared_folder(comm, tmp_path, name):
    """One folder for all ranks (each rank has its own tmp_path)."""
    return Path(comm.bcast(str(tmp_path / name), root=0))


def _final(problem):
    return [level.variables.gather() for level in problem.levels]


@pytest.mark.mpi(nprocs=(2, 4), timeout=600)
def test_ranks_and_ca_reproduce_the_serial_run(comm, tmp_path):
    """From files read in rank blocks, with the synthetic chain loop by loop and CA, on N
    ranks: the serial run's rms history and final variables on every level."""
    from mpi4py import MPI

    mesh = channel_bump(4, levels=3, shuffle=True)
    folder = shared_folder(comm, tmp_path, "mesh")
    if comm.rank == 0:
        mesh.write(folder)
    comm.Barrier()
    mc.reset_runtime(comm=MPI.COMM_SELF)
    serial = mgcfd.declare(mesh, synthetic_loops=4)
    history = mgcfd.run(serial, 3)
    expected = _final(serial)
    for ca in (False, True):
        mc.reset_runtime(comm=comm)
        problem = mgcfd.declare(folder / "input.dat", synthetic_loops=4, ca=ca, method="kway" if ca else "rib")
        found = mgcfd.run(problem, 3)
        np.testing.assert_allclose(found, history, rtol=1e-13, atol=0)
        final = _final(problem)
        if comm.rank == 0:
            for got, want in zip(final, expected):  # relative to the values' scale (momenta near 0 cross zero)
                assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()


REFERENCE = Path(__file__).parent / "data" / "mgcfd" / "channel4"
"""A small generated mesh and OP2's own MG-CFD's output on it (``op2_reference.h5``'s
attributes say which OP2, which commands): level 0 after each cycle's level-0 step, and every
level after 10 cycles, from OP2's sequential build and from its MPI build on 3 ranks."""


def _op2(run: str) -> dict:
    with h5py.File(REFERENCE / "op2_reference.h5", "r") as f:
        return {name: f[run][name][()] for name in f[run]}


def test_the_stored_reference_mesh_is_what_the_generator_makes():
    mesh = channel_bump(4, levels=3, shuffle=True, seed=0)
    for level, name in zip(mesh.levels, read_input_dat(REFERENCE / "input.dat")):
        _, rows = read_level(name)
        for dataset, values in level.datasets().items():
            np.testing.assert_array_equal(rows[dataset].reshape(values.shape), values, err_msg=dataset)


@pytest.mark.mpi(nprocs=(1, 3), timeout=600)
def test_mgcfd_equals_op2s_mgcfd_cycle_by_cycle(comm):
    """Level 0 after every cycle's level-0 step and every level after 10 cycles equal OP2's
    sequential and 3-rank MPI runs to 1e-12 of the values' scale (bit for bit, serially,
    against OP2's sequential build)."""
    mc.reset_runtime(comm=comm)
    problem = mgcfd.declare(REFERENCE / "input.dat", synthetic_loops=2, ca=comm.size > 1)
    snapshots = []
    mgcfd.run(problem, 10, after_level0=lambda p: snapshots.append(p.levels[0].variables.gather()))
    final = _final(problem)
    if comm.rank:
        return
    for run in ("seq", "mpi3"):
        op2 = _op2(run)
        found = {**{f"L0.cycle={c + 1}": v for c, v in enumerate(snapshots)},
                 **{f"final.L{l}": v for l, v in enumerate(final)}}
        assert sorted(found) == sorted(op2)
        for name, want in op2.items():
            got = found[name].reshape(want.shape)
            assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max(), (run, name)
            if comm.size == 1 and run == "seq":
                np.testing.assert_array_equal(got, want, err_msg=name)


def test_the_example_writes_input_runs_it_and_compares_with_op2s_files(tmp_path, capsys):
    import runpy

    example = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "mgcfd.py"))
    mc.reset_runtime()
    assert example["main"](["--generate", "2", "--levels", "2", "--cycles", "2", "--write-mesh", str(tmp_path),
                            "--write-variables", str(tmp_path / "run."), "--snapshots", str(tmp_path / "run.")]) == 0
    first = capsys.readouterr().out
    assert "wrote" in first and first.count("e-0") >= 2 and "ms per cycle" in first
    mc.reset_runtime()
    assert example["main"](["--input", str(tmp_path / "input.dat"), "--cycles", "2", "--compare",
                            str(tmp_path / "run.")]) == 0
    second = capsys.readouterr().out
    assert "level 0: largest relative difference from OP2 0.000e+00" in second
    assert "level 1: largest relative difference from OP2 0.000e+00" in second
    assert (tmp_path / "run.variables.L0.cycle=2.h5").exists()


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_level_file_one_rank_cannot_read_fails_every_rank(comm, tmp_path):
    """Rank 1 sees a broken level file (its own copy of the input), rank 0 a good one: both
    raise, with rank 1's reason, instead of one rank waiting for the other."""
    folder = tmp_path / "mesh"
    channel_bump(2, levels=2).write(folder)
    if comm.rank == 1:
        with h5py.File(folder / "channel.L1.h5", "a") as f:
            del f["bnd_node_weights"]
    mc.reset_runtime(comm=comm)
    with pytest.raises(MeshFileError, match="bnd_node_weights"):
        mgcfd.declare(folder / "input.dat")
