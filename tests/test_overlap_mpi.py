"""Overlap through the whole library: every schedule (exchange-then-compute, core during the
exchange, boundary-first eager sends), progress mode and interior scheduling gives the bits
of the reference on random meshes, loops and chains (1-4 ranks), Airfoil's rms history to
1e-12; eager sends really happen; statistics report the hidden fraction and the imbalance
over ranks; ``mc.rebalance`` removes a measured imbalance and keeps every value; bad choices
are refused on every rank with the configuration unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.meshes import naca0012, structured_quads

from chain_programs import Program, programs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::meshchain.MeshchainWarning")

REFERENCE = dict(overlap=False, eager=False, progress="none", interior="static")
VARIANTS = [
    dict(overlap=True, eager=False, progress="none", interior="static"),   # core during the exchange
    dict(overlap=True, eager=True, progress="none", interior="static"),    # boundary-first eager
    dict(overlap=True, eager=True, progress="poll", interior="static"),
    dict(overlap=True, eager=True, progress="poll", interior="dynamic"),
    dict(overlap=True, eager=True, progress="none", interior="dynamic"),
]
RMA_POLLING = [dict(overlap=True, eager=True, progress="poll", interior=interior, transport="rma")
               for interior in ("static", "dynamic")]
"""The rma transport's completion notices need the origin's MPI calls after its own run is
complete: the poller (static) and the driving thread (dynamic) keep making them."""


def run_with(comm, spec, mode, options):
    mc.reset_runtime(comm=comm, block_size=8, **options)
    program = Program(spec)
    program.run(mode, executions=2)
    return program.results(), mc.stats()


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=900)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5), mode=st.sampled_from([None, True, False]))
def test_every_schedule_and_progress_mode_gives_the_bits_of_exchange_then_compute(comm, spec, mode):
    reference, _ = run_with(comm, spec, mode, REFERENCE)
    for options in VARIANTS:
        results, stats = run_with(comm, spec, mode, options)
        if comm.size > 1:
            assert (stats.progress, stats.interior) == (options["progress"], options["interior"])
        if comm.rank == 0:
            for got, want in zip(results, reference):
                np.testing.assert_array_equal(got, want, err_msg=str(options))


def airfoil_history(comm, iters, *, ca=False, **options):
    from test_airfoil import airfoil

    mc.reset_runtime(comm=comm, **options)
    problem = airfoil.declare(naca0012(10, 15))
    history = airfoil.run(problem, iters, report_every=5, out=None, ca=ca)
    return np.array([rms for _, rms in history])


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
@pytest.mark.parametrize("ca", [False, True])
def test_airfoil_in_every_mode_prints_the_serial_rms(comm, ca):
    serial = airfoil_history(self_comm(), 20)
    for options in [REFERENCE, *VARIANTS, *RMA_POLLING]:
        history = airfoil_history(comm, 20, ca=ca, **options)
        np.testing.assert_allclose(history, serial, rtol=1e-12, atol=0, err_msg=str(options))


def plan_steps():
    return [step for plan in mc.get_runtime().pipeline.plans.values() for step in plan.steps]


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_loop_by_loop_airfoil_posts_res_calc_exchanges_eagerly_during_adt_calc(comm):
    from test_airfoil import airfoil

    mc.reset_runtime(comm=comm, eager=True)
    problem = airfoil.declare(naca0012(10, 15))
    airfoil.run(problem, 3, report_every=5, out=None, ca=False)
    steps = plan_steps()
    eager = [s for s in steps if s.eager]
    assert eager, "no step posted the next step's exchanges"
    assert all(s.tail is not None or s.rest is not None for s in eager)
    assert sum(s.posted for s in steps) == len(eager)  # every eager post is skipped by the step after it
    record = mc.stats().loops["res_calc"]
    assert record.time_flight > 0 and 0 < record.hidden <= 1
    mc.reset_runtime(comm=comm, eager=False)
    problem = airfoil.declare(naca0012(10, 15))
    airfoil.run(problem, 3, report_every=5, out=None, ca=False)
    assert not any(s.eager or s.posted for s in plan_steps())


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_stats_over_ranks_report_each_ranks_compute_and_wait_and_the_imbalance(comm):
    from test_airfoil import airfoil

    mc.reset_runtime(comm=comm, progress="none")
    problem = airfoil.declare(naca0012(10, 15))
    airfoil.run(problem, 3, report_every=5, out=None, ca=True)
    stats = mc.stats(all_ranks=True)
    assert stats.progress == "none" and stats.interior == "static"
    for name in ("res_calc", "update", "chain stage"):
        record = stats.imbalance[name]
        assert len(record.compute) == len(record.wait) == comm.size
        assert record.compute_ratio >= 1.0
        assert record.compute_ratio <= comm.size + 1e-9
    local = mc.stats()
    assert comm.allgather(local.loops["res_calc"].time_compute) == list(stats.imbalance["res_calc"].compute)
    text = str(stats)
    assert "progress none" in text and "imbalance" in text


COSTLY = """
def costly(q):
    x = 0.0
    for i in range(4000):
        x = x * 0.999 + 1.0
    q[0] += 1.0 + 0.0 * x
"""


def imbalanced(comm):
    """Quads on a 2 x 1 rectangle; one costly loop over elements tied to the cells of the left
    quarter, so RIB on cell centres (which cuts the longest side first) gives one rank all of it."""
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(32, 16, lx=2.0, ly=1.0)
    declared = mesh.declare()
    cells = declared.cells
    centres_rows = mesh.coords[mesh.cells].mean(axis=1)
    centres = mc.Dat(cells, 2, centres_rows, "centres")
    left = np.flatnonzero(centres_rows[:, 0] < 0.5)
    heavy = mc.Set(len(left), "heavy")
    heavy2cell = mc.Map(heavy, cells, 1, left[:, None], "heavy2cell")
    q = mc.Dat(cells, 1, None, "q", dtype=np.float64)
    light = mc.Kernel.from_source("def light(q):\n    q[0] += 1.0\n")
    costly = mc.Kernel.from_source(COSTLY)
    mc.partition("rib", coords=centres)

    def run(times):
        for _ in range(times):
            mc.par_loop(light, cells, q(mc.RW))
            mc.par_loop(costly, heavy, q(mc.INC, heavy2cell[0]))
            mc.flush()

    expected = np.zeros(cells.size)
    np.add.at(expected, left, 1.0)
    return run, q, centres, heavy, cells, expected


def load(session, costs, cells, heavy):
    """Each rank's work by the measured costs: owned light and costly iterations."""
    return (session.n_owned(cells) * costs["light"] + session.n_owned(heavy) * costs["costly"])


@pytest.mark.mpi(nprocs=(2, 3), timeout=300, alone=True)  # measures the ranks' compute times
def test_rebalance_moves_the_costly_region_apart_and_keeps_every_value(comm):
    run, q, centres, heavy, cells, expected = imbalanced(comm)
    run(4)
    session = mc.get_runtime()
    heavy_before = comm.allgather(session.n_owned(heavy))
    cells_before = comm.allgather(session.n_owned(cells))
    assert max(heavy_before) > 0.9 * heavy.size  # one rank holds (almost) all the costly work
    imbalance = mc.stats(all_ranks=True).imbalance["costly"]
    assert imbalance.compute_ratio > 1.5
    before = q.gather()
    result = mc.rebalance("rib", coords=centres)
    after = q.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(after, before)
        np.testing.assert_array_equal(before[:, 0], 4 * (1.0 + expected))
    assert result.costs["costly"] > result.costs["light"] > 0
    assert math.isclose(result.imbalance, max(comm.allgather(float(result.weights.sum())))
                        / np.mean(comm.allgather(float(result.weights.sum()))), rel_tol=1e-12)
    heavy_after = comm.allgather(session.n_owned(heavy))
    cells_after = comm.allgather(session.n_owned(cells))
    assert cells_after != cells_before and sum(cells_after) == cells.size and sum(heavy_after) == heavy.size
    loads_before = np.array(comm.allgather(0.0 + cells_before[comm.rank] * result.costs["light"]
                                           + heavy_before[comm.rank] * result.costs["costly"]))
    loads_after = np.array(comm.allgather(load(session, result.costs, cells, heavy)))
    assert loads_after.max() / loads_after.mean() < loads_before.max() / loads_before.mean()
    assert loads_after.max() / loads_after.mean() < 1.35
    assert max(heavy_after) < max(heavy_before)  # the costly elements are spread now
    run(2)
    final = q.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(final[:, 0], 6 * (1.0 + expected))


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=120)
def test_unknown_progress_and_interior_are_refused_on_every_rank_and_nothing_changes(comm):
    mc.reset_runtime(comm=comm, progress="none")
    with pytest.raises(mc.ConfigurationError, match="smoke signals"):
        mc.configure(progress="smoke signals")
    with pytest.raises(mc.ConfigurationError, match="interior"):
        mc.configure(interior="sideways")
    assert mc.get_runtime().config.progress == "none"
    assert mc.get_runtime().config.interior == "static"


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_thread_progress_without_mpichs_progress_thread_is_refused_on_every_rank(comm):
    mc.reset_runtime(comm=comm, progress="poll")
    with pytest.raises(mc.ConfigurationError, match="MPIR_CVAR_ASYNC_PROGRESS|MESHCHAIN_PROGRESS"):
        mc.configure(progress="thread")
    assert mc.get_runtime().config.progress == "poll"


@pytest.mark.mpi(nprocs=(1, 2), timeout=120)
def test_dynamic_interior_on_a_backend_that_cannot_chunk_is_refused(comm):
    mc.reset_runtime(comm=comm, backend="reference")
    with pytest.raises(mc.ConfigurationError, match="interior='dynamic'"):
        mc.configure(interior="dynamic")
    assert mc.get_runtime().config.interior == "static"
