"""Live repartitioning (``mc.repartition``): nothing lost or duplicated, loops after it equal
a serial run, Airfoil's rms history unchanged, bad input refused on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.meshes import naca0012

from chain_programs import Program, programs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::meshchain.MeshchainWarning")

MOVES = st.lists(st.tuples(st.sampled_from(["rib", "kway", "block"]), st.sampled_from([None, "dat", "array"]),
                           st.integers(0, 2**31 - 1)), min_size=1, max_size=3)


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def repartition(program, weights, method, kind, seed):
    """One move: ``kind`` None (no weights), a weight Dat, or this rank's owned weights."""
    chosen = None
    if kind == "dat":
        chosen = weights
    elif kind == "array":
        chosen = weights.data[:, 0].copy()
    mc.repartition(method, coords=program.coords if method == "rib" else None, weights=chosen, seed=seed % 1000)


def run_with_moves(comm, spec, moves, *, captured=False):
    """Run the program, repartition after each execution (checking that every gathered dat
    and global is unchanged by each move), and return the final results. ``captured``: each
    execution is a captured step (``mc.capture``), captured again after every move."""
    mc.reset_runtime(comm=comm)
    program = Program(spec, method="rib")
    nodes = program.coords.dataset
    rng = np.random.default_rng(5)
    weights = mc.Dat(nodes, 1, rng.random((nodes.size, 1)) * 10.0, "weights")
    program.run(True, executions=1, captured=captured)
    for method, kind, seed in moves:
        before = program.results()
        repartition(program, weights, method, kind, seed)
        after = program.results()
        if comm.rank == 0:
            for old, new in zip(before, after):
                np.testing.assert_array_equal(new, old)
        program.run(True, executions=1, captured=captured)
    if captured:  # on one rank a move changes nothing: the step is replayed
        moved = len(moves) if comm.size > 1 else 0
        assert (program.step.captures, program.step.replays) == (1 + moved, len(moves) - moved)
    return program.results(), program


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5), moves=MOVES, captured=st.booleans())
def test_random_repartitions_lose_nothing_and_loops_after_them_equal_serial(comm, spec, moves, captured):
    """... also when the executions are a captured step, which each move makes capture again."""
    expected, _ = _serial_results(spec, executions=1 + len(moves))
    results, program = run_with_moves(comm, spec, moves, captured=captured)
    if comm.rank == 0:
        for got, want in zip(results, expected):
            np.testing.assert_array_equal(got, want)
    for s in program.sets.values():  # every element is owned exactly once
        assert comm.allreduce(mc.get_runtime().n_owned(s)) == s.size


def _serial_results(spec, *, executions):
    mc.reset_runtime(comm=self_comm())
    program = Program(spec, method="rib")
    program.run(True, executions=executions)
    return program.results(), program


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
def test_weighted_rib_moves_elements_to_balance_the_weights(comm):
    mc.reset_runtime(comm=comm)
    mesh = naca0012(10, 15)
    declared = mesh.declare()
    nodes = declared.p_x.dataset
    weights = mc.Dat(nodes, 1, None, "load", dtype=np.float64)
    ids = mc.Dat(nodes, 1, np.arange(nodes.size)[:, None], "ids", dtype=np.int64)
    mc.partition("rib", coords=declared.p_x)
    weights.data[:] = 9.0 if comm.rank == 0 else 1.0  # rank 0's region weighs 9x
    owned_before = set(mc.get_runtime().layout_of(nodes).global_ids[: len(ids.data)].tolist())
    unweighted = comm.allgather(float(weights.data.sum()))
    mc.repartition("rib", coords=declared.p_x, weights=weights)
    weighted = comm.allgather(float(weights.data.sum()))
    assert max(weighted) / min(weighted) < max(unweighted) / min(unweighted)
    assert max(weighted) / min(weighted) < 1.2  # balanced by weight, not by count
    counts = comm.allgather(len(weights.data))
    assert max(counts) > 1.5 * min(counts)  # ... so the counts are unequal
    owned_after = set(mc.get_runtime().layout_of(nodes).global_ids[: len(ids.data)].tolist())
    assert comm.allreduce(len(owned_before - owned_after)) > 0  # elements moved
    gathered = ids.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[:, 0], np.arange(nodes.size))


def airfoil_history(comm, iters, **options):
    from test_airfoil import airfoil

    mc.reset_runtime(comm=comm)
    problem = airfoil.declare(naca0012(10, 15))
    history = airfoil.run(problem, iters, report_every=5, out=None, **options)
    return np.array([rms for _, rms in history])


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("method", ["kway", "block", "rib"])
def test_airfoil_repartitioned_mid_run_prints_the_unpartitioned_rms(comm, method):
    serial = airfoil_history(self_comm(), 30)
    moved = airfoil_history(comm, 30, repartition_at=12, repartition_method=method, ca=True)
    np.testing.assert_allclose(moved, serial, rtol=1e-12, atol=0)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=120)
@pytest.mark.parametrize("bad, message", [
    (dict(method="sideways"), "unknown"),
    (dict(method="rib"), "coordinates"),
    (dict(method="rib", weights="wrong shape"), "shape"),
    (dict(method="rib", weights="negative"), "negative"),
    (dict(method="rib", weights="nan"), "finite"),
    (dict(method="rib", weights="other set"), "seed set"),
])
def test_bad_repartition_input_is_refused_on_every_rank(comm, bad, message):
    mc.reset_runtime(comm=comm)
    mesh = naca0012(6, 9)
    declared = mesh.declare()
    nodes = declared.p_x.dataset
    cells = mc.Dat(declared.cells, 1, None, "on_cells")
    values = mc.Dat(nodes, 1, np.arange(nodes.size, dtype=np.float64)[:, None], "values")
    mc.partition("rib", coords=declared.p_x)
    n = mc.get_runtime().n_owned(nodes)
    weights = {"wrong shape": np.ones(n + 1), "negative": -np.ones(n), "nan": np.full(n, np.nan),
               "other set": cells, None: None}[bad.get("weights")]
    coords = declared.p_x if bad.get("weights") else None
    layout_before = mc.get_runtime().layout
    with pytest.raises(mc.MeshchainError, match=message):
        mc.repartition(bad["method"], coords=coords, weights=weights)
    assert mc.get_runtime().layout is layout_before  # nothing moved
    gathered = values.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[:, 0], np.arange(nodes.size))


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_repartition_before_partition_is_refused(comm):
    mc.reset_runtime(comm=comm)
    naca0012(6, 9).declare()
    with pytest.raises(mc.DeclarationError, match="mc.partition"):
        mc.repartition("block")
