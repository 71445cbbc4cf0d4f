"""Boundary tasks (``mc.configure(boundary="tasks")``, the stencil paper's tiles as tasks):
the inspector's groups respect every dependence; on 2-4 ranks tasks give the bits of the bulk
order for random programs, loop by loop and communication-avoiding, on both transports that
wait neighbour by neighbour; a task starts as soon as its neighbours' messages are in, before
a late neighbour's message arrives."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from chain_programs import Program, programs
from meshchain.comm.exchange import HaloExchange
from meshchain.engine import boundary, plans
from meshchain.inspector.tasks import boundary_tasks


@st.composite
def inspector_cases(draw):
    """Random runs touching random rows of two dats, some rows received from neighbours."""
    rows = {"u": draw(st.integers(1, 12)), "v": draw(st.integers(1, 12))}
    neighbours = list(range(draw(st.integers(1, 4))))
    imports = {dat: {n: draw(st.lists(st.integers(0, count - 1), max_size=3, unique=True))
                     for n in neighbours} for dat, count in rows.items()}
    touched = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 5))
        run = []
        for dat in draw(st.lists(st.sampled_from(["u", "v"]), max_size=2, unique=True)):
            k = draw(st.integers(1, 3))
            run.append((dat, np.array(draw(st.lists(st.integers(0, rows[dat] - 1), min_size=n * k,
                                                    max_size=n * k)), dtype=np.int64).reshape(n, k)))
        touched.append((n, run))
    return touched, imports, rows, neighbours


@settings(max_examples=200, deadline=None)
@given(case=inspector_cases())
def test_tasks_cover_every_iteration_once_and_order_every_dependence(case):
    touched, imports, rows, neighbours = case
    tasks = boundary_tasks(touched, {d: {n: np.array(r, dtype=np.int64) for n, r in by.items()}
                                     for d, by in imports.items()}, rows, neighbours)
    owner = {}  # (run, iteration) -> (position of its task, mask)
    for position, task in enumerate(tasks):
        for run, elements in task.parts:
            for e in elements.tolist():
                assert (run, e) not in owner
                owner[run, e] = (position, task.mask)
    assert len(owner) == sum(n for n, _ in touched)
    received = {(d, r): 1 << n for d, by in imports.items() for n, rs in by.items() for r in rs}
    received_mask = {}
    for (d, r), bit in received.items():
        received_mask[d, r] = received_mask.get((d, r), 0) | bit
    earlier = {}  # (dat, row) -> [(run, iteration)] that touched it before
    for run, (n, accesses) in enumerate(touched):
        for e in range(n):
            position, mask = owner[run, e]
            for dat, rows_of in accesses:
                for r in rows_of[e].tolist():
                    assert received_mask.get((dat, r), 0) & ~mask == 0  # waits for the rows it touches
                    for before in earlier.get((dat, r), []):
                        if before[0] < run:  # an earlier loop touched the row: it must run first
                            before_position, before_mask = owner[before]
                            assert before_mask & ~mask == 0 and before_position <= position
        for e in range(n):
            for dat, rows_of in accesses:
                for r in rows_of[e].tolist():
                    earlier.setdefault((dat, r), []).append((run, e))


def run_program(spec, comm, mode, **options):
    mc.reset_runtime(comm=comm, **options)
    program = Program(spec)
    program.run(mode)
    return program.results()


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=600)
@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5), transport=st.sampled_from(["persistent", "p2p"]),
       backend=st.sampled_from(["numba", "reference"]))
def test_random_programs_in_tasks_give_the_bits_of_the_bulk_order(comm, spec, transport, backend, monkeypatch):
    runs = []
    original = plans._run_tasks

    def counted(step, failure):
        runs.append(len(step.tasks.calls))
        return original(step, failure)

    monkeypatch.setattr(plans, "_run_tasks", counted)
    begun = []
    begin = HaloExchange.begin

    def counted_begin(exchange):
        begun.append(exchange)
        return begin(exchange)

    monkeypatch.setattr(HaloExchange, "begin", counted_begin)
    for mode in (None, True):
        before = len(runs)
        bulk = run_program(spec, comm, mode, transport=transport, backend=backend)
        assert len(runs) == before  # the bulk order runs no task
        tasks = run_program(spec, comm, mode, transport=transport, backend=backend, boundary="tasks")
        for want, got in zip(bulk, tasks):
            if got is not None:  # gathered dats live on rank 0 only
                np.testing.assert_array_equal(got, want)
    # where halos travelled, the iterations that needed them ran as tasks
    assert comm.allreduce(len(runs)) > 0 or comm.allreduce(len(begun)) == 0


@pytest.mark.mpi(nprocs=(3,), timeout=300)
def test_a_task_starts_before_a_late_neighbours_message_arrives(comm, monkeypatch):
    """A 30 x 8 grid in three 10 x 8 blocks; rank 2 starts late. Rank 1 runs the points next
    to rank 0 as soon as rank 0's ghosts are in, before rank 2's arrive; the result equals
    the bulk order's, bit for bit.

    Rank 2 starts its step only once rank 1 has started a task (a message on a separate
    communicator says so), so the order does not hang on timing; an implementation that waits
    for every neighbour first never sends it, and rank 2 starts after 60 s: the order is wrong."""
    events, gate, armed = [], comm.Dup(), []
    arrivals, guarded = plans.arrivals, boundary.guarded

    def logged_arrivals(exchanges):
        for neighbour in arrivals(exchanges):
            events.append(("arrived", neighbour))
            yield neighbour

    def logged_call(call):
        events.append(("task", None))
        if armed and armed.pop():  # the timed step's first task on rank 1: rank 2 may start
            gate.send(None, dest=2, tag=1)
        return guarded(call)

    monkeypatch.setattr(plans, "arrivals", logged_arrivals)
    monkeypatch.setattr(boundary, "guarded", logged_call)
    results = []
    for option in ("bulk", "tasks"):
        mc.reset_runtime(comm=comm, boundary=option, transport="persistent")
        g = mc.Grid((30, 8), "g")
        inner = g.interior(1)
        start = np.arange(240, dtype=np.int64).reshape(30, 8) % 17
        a, b = mc.Dat(g, 1, start, "a", dtype=np.int64), mc.Dat(g, 1, start, "b", dtype=np.int64)
        star = mc.Stencil([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], "star")
        body = "(s, out):\n    out[0] = s[0, 0] + 2 * s[1, 0] - s[2, 0] + s[3, 0] - s[4, 0]\n"
        # two kernels: a plan with tasks cannot take other objects, so one structure alternating
        # between (a, b) and (b, a) would be built again (collectively) at every execution
        forth, back = (mc.Kernel.from_source(f"def {name}{body}") for name in ("forth", "back"))
        mc.partition("block", blocks=(3, 1))
        for _ in range(2):  # then the plans (built collectively) are cached for the states the step meets
            mc.par_loop(forth, inner, a(mc.READ, star), b(mc.WRITE))
            mc.flush()
            mc.par_loop(back, inner, b(mc.READ, star), a(mc.WRITE))
            mc.flush()
        mc.par_loop(forth, inner, a(mc.READ, star), b(mc.WRITE))
        mc.flush()
        built = mc.stats().caches["plans"].misses
        events.clear()
        comm.Barrier()
        gated = option == "tasks"
        if gated and comm.rank == 1:
            armed.append(True)
        if gated and comm.rank == 2:
            deadline = time.monotonic() + 60.0
            while not gate.Iprobe(source=1, tag=1) and time.monotonic() < deadline:
                time.sleep(0.01)
        mc.par_loop(back, inner, b(mc.READ, star), a(mc.WRITE))
        mc.flush()
        assert mc.stats().caches["plans"].misses == built  # no plan built (collectively) in the step
        if gated and comm.rank == 2:
            gate.recv(source=1, tag=1)
        results.append(a.gather())
        if option == "tasks" and comm.rank == 1:
            order = [kind if who is None else f"{kind} {who}" for kind, who in events]
            assert order.index("arrived 0") < order.index("task") < order.index("arrived 2"), order
    gate.Free()
    if comm.rank == 0:
        np.testing.assert_array_equal(results[1], results[0])


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_airfoil_in_tasks_follows_the_bulk_order(comm):
    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    histories = []
    for option in ("bulk", "tasks"):
        mc.reset_runtime(comm=comm, boundary=option)
        problem = airfoil.declare(naca0012(8, 12))
        histories.append([rms for _, rms in airfoil.run(problem, 20, report_every=5, out=None, ca=True)])
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-12, atol=0)


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_transport_that_completes_all_neighbours_at_once_runs_the_boundary_in_bulk_and_says_so(comm):
    spec = (("quads", 4, 3), (("cells", (("ca", mc.INC, None, None), ("na", mc.READ, "cell2node", None))),
                              ("nodes", (("na", mc.RW, None, None),))))
    bulk = run_program(spec, comm, True, transport="neighbour")
    with pytest.warns(mc.MeshchainWarning, match=r"\[boundary-bulk\].*neighbour transport"):
        tasks = run_program(spec, comm, True, transport="neighbour", boundary="tasks")
    for want, got in zip(bulk, tasks):
        if got is not None:
            np.testing.assert_array_equal(got, want)


def test_bad_boundary_options_are_refused():
    with pytest.raises(mc.ConfigurationError, match="boundary 'soon' is unknown"):
        mc.configure(boundary="soon")


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
@pytest.mark.parametrize("progress", ["poll", "none"])
def test_tasks_under_a_polling_progress_thread_give_the_bits_of_the_bulk_order(comm, progress):
    """The poller may complete a whole run (Testall) before the tasks wait for it: every
    message then counts as arrived, is unpacked, and every task runs."""
    spec = (("quads", 6, 5), (("cells", (("ca", mc.INC, None, None), ("na", mc.READ, "cell2node", None))),
                              ("facets", (("cb", mc.INC, "facet2cell", None), ("ca", mc.READ, "facet2cell", 1))),
                              ("nodes", (("na", mc.RW, None, None),))))
    for mode in (None, True):
        bulk = run_program(spec, comm, mode, transport="persistent", progress=progress)
        tasks = run_program(spec, comm, mode, transport="persistent", progress=progress, boundary="tasks")
        for want, got in zip(bulk, tasks):
            if got is not None:
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("transport", ["persistent", "p2p"])
def test_messages_completed_by_another_test_count_as_arrived(transport):
    """A run that a progress poller completed (``test()``, MPI's Testall) before the tasks
    wait: arrivals still unpacks every message and names every neighbour."""
    from mpi4py import MPI

    from meshchain.comm.exchange import HaloItem, arrivals

    values = np.array([[1.0], [2.0], [0.0], [0.0]])
    exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0, 1]}, {0: [2, 3]})], tag=9,
                            transport=transport)
    exchange.begin()
    while not exchange.test():
        pass
    assert list(arrivals([exchange])) == [0]
    assert values[:, 0].tolist() == [1.0, 2.0, 1.0, 2.0]
    exchange.begin()  # and the exchange runs again afterwards
    assert list(arrivals([exchange])) == [0]
    exchange.close()
