"""Captured steps (``mc.capture``): replays equal the uncaptured step bit for bit, objects made
inside a step start each replay from their initial values, other arguments or a change of
structure capture again, and what a replay could not repeat is refused.

The property tests over random programs (captured against uncaptured, 1-4 ranks, and across
repartitions) are in ``test_chains.py``, ``test_chains_mpi.py`` and ``test_repartition.py``."""

from __future__ import annotations

import numpy as np
import pytest

import meshchain as mc
from meshchain.meshes import structured_tris

from devices import DEVICE_BACKENDS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCALE = mc.Kernel.from_source("def scale(a, f):\n    a[0] = a[0] * f[0] + 1\n")
SPREAD = mc.Kernel.from_source("def spread(a0, a1, t0, t1):\n    t0[0] += a0[0]\n    t1[0] += a1[0]\n")
TOTAL = mc.Kernel.from_source("def total(t, s, lo):\n    s[0] += t[0]\n    lo[0] = min(lo[0], t[0])\n")
FILL = mc.Kernel.from_source("def fill(a, t):\n    t[0] = 2 * a[0]\n")


def mesh():
    d = structured_tris(4, 3).declare()
    u = mc.Dat(d.nodes, 1, np.arange(d.nodes.size)[:, None] % 7, "u", dtype=np.int64)
    return d, u


def step_body(d, u, factor):
    """A step as users write it: a new Global per reduction, a temporary Dat per step."""
    f = mc.Global(1, factor, "f", dtype=np.int64)
    mc.par_loop(SCALE, d.nodes, u(mc.RW), f(mc.READ))
    t = mc.Dat(d.nodes, 1, None, "t", dtype=np.int64)  # zeros: increments build on them
    mc.par_loop(SPREAD, d.facets, u(mc.READ, d.facet2node[0]), u(mc.READ, d.facet2node[1]),
                t(mc.INC, d.facet2node[0]), t(mc.INC, d.facet2node[1]))
    w = mc.Dat(d.nodes, 1, None, "w", dtype=np.int64)  # written whole before it is read
    mc.par_loop(FILL, d.nodes, t(mc.READ), w(mc.WRITE))
    s, lo = mc.Global(1, 0, "s", dtype=np.int64), mc.Global(1, 10**9, "lo", dtype=np.int64)
    mc.par_loop(TOTAL, d.nodes, w(mc.READ), s(mc.INC), lo(mc.MIN))
    return s, lo


def scale(d, u, factor):
    mc.par_loop(SCALE, d.nodes, u(mc.RW), mc.Global(1, factor, "f", dtype=np.int64)(mc.READ))


def uncaptured_sums(factor, steps):
    d, u = mesh()
    sums = []
    for _ in range(steps):
        s, lo = step_body(d, u, factor)
        sums.append((int(s.value[0]), int(lo.value[0])))
    return sums, u.data_ro.copy()


def test_replays_equal_the_uncaptured_step_and_objects_made_inside_start_from_their_initial_values():
    want, want_u = uncaptured_sums(2, 5)
    mc.reset_runtime()
    d, u = mesh()
    step = mc.capture(step_body)
    got = []
    for _ in range(5):
        s, lo = step(d, u, 2)
        got.append((int(s.value[0]), int(lo.value[0])))
    assert got == want
    np.testing.assert_array_equal(u.data_ro, want_u)
    assert (step.captures, step.replays) == (1, 4)
    capture = next(iter(step._kept.values()))
    restored = {id(storage) for storage, *_ in capture.dats + capture.globals}
    session = mc.get_runtime()
    assert len(capture.dats) == 1 and len(capture.globals) == 2  # t, s and lo; not w (written whole), not f (read)
    assert {id(session.storage(s)), id(session.storage(lo))} <= restored


def test_other_arguments_capture_again_and_each_capture_is_replayed():
    d, u = mesh()
    v = mc.Dat(d.nodes, 1, u.data_ro.copy(), "v", dtype=np.int64)
    step = mc.capture(step_body)
    sums = [int(step(d, x, k)[0].value[0]) for x, k in ((u, 2), (v, 2), (u, 3), (u, 2), (v, 2), (u, 3))]
    assert (step.captures, step.replays) == (3, 3)
    # u took factors 2, 3, 2, 3 and v 2, 2: the same as uncaptured
    mc.reset_runtime()
    d2, u2 = mesh()
    v2 = mc.Dat(d2.nodes, 1, u2.data_ro.copy(), "v", dtype=np.int64)
    want = [int(step_body(d2, x, k)[0].value[0]) for x, k in ((u2, 2), (v2, 2), (u2, 3), (u2, 2), (v2, 2), (u2, 3))]
    assert sums == want


def test_configure_captures_again_and_a_new_session_too():
    want_u = uncaptured_sums(2, 5)[1]
    mc.reset_runtime()
    d, u = mesh()
    step = mc.capture(step_body)
    step(d, u, 2), step(d, u, 2)
    mc.configure(block_size=4)
    step(d, u, 2), step(d, u, 2)
    assert (step.captures, step.replays) == (2, 2)
    mc.reset_runtime()  # the same objects (kept on one process), a new session
    step(d, u, 2)
    assert (step.captures, step.replays) == (3, 2)
    np.testing.assert_array_equal(u.data_ro, want_u)


def test_loops_pending_before_a_step_run_first_in_order():
    d, u = mesh()
    double = mc.Kernel.from_source("def double(a):\n    a[0] = 2 * a[0]\n")
    step = mc.capture(lambda: scale(d, u, 3))
    start = u.data_ro.copy()
    for _ in range(2):
        mc.par_loop(double, d.nodes, u(mc.RW))  # pending when the step is called
        step()
    np.testing.assert_array_equal(u.data_ro, (((start * 2) * 3 + 1) * 2) * 3 + 1)


@pytest.mark.parametrize("inside", ["read", "write", "flush", "chain", "nested", "replayed", "assembly", "solve",
                                    "nothing"])
def test_what_a_replay_cannot_repeat_is_refused_and_the_steps_loops_are_discarded(inside):
    d, u = mesh()
    start = u.data_ro.copy()
    inner = mc.capture(lambda: scale(d, u, 3), name="inner")
    if inside == "solve":  # a matrix assembled before the step, solved inside it
        matrix = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A")
        spring = mc.Kernel.from_source("def spring(a):\n" + "".join(f"    a[{i}, {j}] += {3.0 if i == j else -1.0}\n"
                                                                      for i in range(3) for j in range(3)))
        mc.par_loop(spring, d.cells, matrix(mc.INC, (d.cell2node, d.cell2node)))
        x, b = mc.Dat(d.nodes, 1, None, "x"), mc.Dat(d.nodes, 1, np.ones(d.nodes.size), "b")

    def body():
        if inside != "nothing":
            scale(d, u, 2)
        if inside == "read":
            u.data_ro  # noqa: B018 - the refused read
        elif inside == "write":
            u.data[:] = 0
        elif inside == "flush":
            mc.flush()
        elif inside == "chain":
            with mc.loop_chain("inner"):
                pass
        elif inside in ("nested", "replayed"):  # a step captured inside, or one captured before and replayed
            inner()
        elif inside == "solve":  # (refused naming an internal dat before)
            mc.solve(matrix, x, b)
        elif inside == "assembly":
            A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A")
            ones = mc.Kernel.from_source("def ones(a):\n" + "".join(f"    a[{i}, {j}] += 1.0\n"
                                                                     for i in range(3) for j in range(3)))
            mc.par_loop(ones, d.cells, A(mc.INC, (d.cell2node, d.cell2node)))

    step = mc.capture(body, name="refused")
    if inside == "replayed":
        inner()
        start = u.data_ro.copy()
    with pytest.raises(mc.CaptureError, match="'refused': mc.solve" if inside == "solve" else "'refused'"):
        step()
    assert len(mc.get_runtime().trace) == 0  # the step's loops were discarded
    np.testing.assert_array_equal(u.data_ro, start)
    assert step.captures == 0


def test_an_error_while_capturing_records_nothing_and_the_next_call_captures_again():
    d, u = mesh()
    start = u.data_ro.copy()
    calls = []

    def body():
        scale(d, u, 2)
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("first call fails")

    step = mc.capture(body)
    with pytest.raises(ZeroDivisionError):
        step()
    np.testing.assert_array_equal(u.data_ro, start)
    step(), step()
    assert (step.captures, step.replays, len(calls)) == (1, 1, 2)
    np.testing.assert_array_equal(u.data_ro, (start * 2 + 1) * 2 + 1)


def test_a_replay_that_fails_on_the_quick_way_raises_as_the_loop_does_and_replays_once_mended():
    """A kernel whose index comes from a global runs with bounds checks: on a replay (the quick
    way on one process) a value out of range raises the loop's KernelRuntimeError, and leaves
    nothing pending; with a value in range the step replays again."""
    mc.reset_runtime()
    cells = mc.Set(4, "cells")
    src = mc.Dat(cells, 3, np.arange(12.0).reshape(4, 3), "src")
    out = mc.Dat(cells, 1, None, "out")
    which = mc.Global(1, 1, "which", dtype=np.int64)
    pick = mc.Kernel.from_source("def pick(s, k, o):\n    o[0] = s[k[0]]\n")
    step = mc.capture(lambda: mc.par_loop(pick, cells, src(mc.READ), which(mc.READ), out(mc.WRITE)), name="pick")
    step(), step()
    assert step.replays == 1 and next(iter(step._kept.values())).rerun is not None  # replays the quick way
    which.value = 7
    with pytest.raises(mc.KernelRuntimeError, match="'pick'"):
        step()
    assert len(mc.get_runtime().trace) == 0
    which.value = 2
    step()
    np.testing.assert_array_equal(out.data_ro[:, 0], np.arange(12.0).reshape(4, 3)[:, 2])


def test_capture_options_and_bad_use():
    d, u = mesh()

    @mc.capture(name="named", ca=True)
    def named():
        scale(d, u, 1)

    named(), named()
    assert named.options.name == "named" and named.options.ca is True
    assert mc.stats().chains["named"].executions == 2
    with pytest.raises(mc.CaptureError, match="callable"):
        mc.capture(3)
    with pytest.raises(mc.ConfigurationError, match="ca must be"):
        mc.capture(named, ca="sometimes")


@pytest.mark.parametrize("backend", ["reference", *DEVICE_BACKENDS])
def test_replays_on_the_other_backends_equal_the_uncaptured_step(backend):
    """Backends whose plans cannot take other objects (the reference, the device) replay their
    plan as built: the same bits as numba uncaptured."""
    want, want_u = uncaptured_sums(2, 4)
    mc.reset_runtime(backend=backend, cache_dir=mc.get_runtime().config.cache_dir)
    d, u = mesh()
    step = mc.capture(step_body)
    got = [tuple(int(g.value[0]) for g in step(d, u, 2)) for _ in range(4)]
    assert got == want and (step.captures, step.replays) == (1, 3)
    np.testing.assert_array_equal(u.data_ro, want_u)


def test_a_step_called_inside_a_loop_chain_block_is_refused_before_anything_runs():
    d, u = mesh()
    step = mc.capture(lambda: scale(d, u, 2), name="scaled")
    step()
    start = u.data_ro.copy()
    with pytest.raises(mc.CaptureError, match="'scaled' called while 'block'"):
        with mc.loop_chain("block"):
            scale(d, u, 3)
            step()
    assert len(mc.get_runtime().trace) == 1  # the block's loop stays pending, as after any error in a block
    np.testing.assert_array_equal(u.data_ro, start * 3 + 1)


def test_airfoil_captured_prints_the_rms_history_of_airfoil_uncaptured():
    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    histories = []
    for captured in (False, True):
        mc.reset_runtime(cache_dir=mc.get_runtime().config.cache_dir)
        problem = airfoil.declare(naca0012(10, 15))
        histories.append(airfoil.run(problem, 6, report_every=2, out=None, captured=captured))
    assert histories[1] == histories[0]  # one process: the same loops in the same order, the same bits
    assert mc.stats().chains["iteration"].executions == 6


# --- step.repeat(times): the replays after the first in one compiled call where they can be ---------


def counting_runs(monkeypatch):
    """Count ``Plan.run`` calls (one per replay made in Python) and ``Plan.run_times`` calls
    that ran (one per compiled repeat)."""
    from meshchain.engine.plans import Plan

    counts = {"run": 0, "times": 0}
    run, run_times = Plan.run, Plan.run_times

    def counted_run(plan):
        counts["run"] += 1
        return run(plan)

    def counted_times(plan, times):
        ran = run_times(plan, times)
        counts["times"] += times if ran else 0
        return ran

    monkeypatch.setattr(Plan, "run", counted_run)
    monkeypatch.setattr(Plan, "run_times", counted_times)
    return counts


@pytest.mark.parametrize("times", [1, 2, 7])
def test_repeat_equals_that_many_calls_and_replays_in_one_compiled_call(monkeypatch, times):
    """A step with a reduction into a global made outside it (summed over every replay, as
    calls sum it) and a field it updates: ``repeat`` gives the bits of ``times`` calls; after
    the capture and the first replay, the rest runs in one compiled call, counted as runs."""
    spread = mc.Kernel.from_source("def spread(a, s):\n    s[0] += a[0]\n")

    def program(repeat: bool):
        mc.reset_runtime()
        d, u = mesh()
        total = mc.Global(1, 0, "total", dtype=np.int64)

        @mc.capture(name="scaled")
        def step():
            scale(d, u, 3)
            mc.par_loop(spread, d.nodes, u(mc.READ), total(mc.INC))

        if repeat:
            assert step.repeat(times) is None
        else:
            for _ in range(times):
                step()
        return u.data_ro.copy(), int(total.value[0]), step

    want_u, want_total, _ = program(False)
    counts = counting_runs(monkeypatch)
    got_u, got_total, step = program(True)
    np.testing.assert_array_equal(got_u, want_u)
    assert got_total == want_total and (step.captures, step.replays) == (1, times - 1)
    assert counts == ({"run": min(times, 2), "times": max(times - 2, 0)})
    assert mc.stats().chains["scaled"].executions == times


def test_repeat_replays_in_python_what_it_restores_and_returns_the_last_calls_result(monkeypatch):
    """``step_body`` makes a temporary and globals that its loops change without overwriting
    them whole: each replay restores them first, so ``repeat`` replays one by one."""
    want, want_u = uncaptured_sums(2, 5)
    mc.reset_runtime()
    d, u = mesh()
    counts = counting_runs(monkeypatch)
    step = mc.capture(step_body)
    s, lo = step.repeat(5, d, u, 2)
    assert (int(s.value[0]), int(lo.value[0])) == want[-1]
    np.testing.assert_array_equal(u.data_ro, want_u)
    assert (step.captures, step.replays, counts["times"]) == (1, 4, 0)


def test_repeat_refuses_bad_times_and_captures_again_after_a_change_of_structure():
    d, u = mesh()
    step = mc.capture(lambda: scale(d, u, 2), name="twice")
    start = u.data_ro.copy()
    for bad in (0, -3, 2.5, True, "4", None):
        with pytest.raises(mc.CaptureError, match=r"'twice': repeat's times must be"):
            step.repeat(bad)
    np.testing.assert_array_equal(u.data_ro, start)  # nothing ran
    step.repeat(4)
    mc.configure(block_size=3)
    step.repeat(4)
    assert (step.captures, step.replays) == (2, 6)
    want = start
    for _ in range(8):
        want = want * 2 + 1
    np.testing.assert_array_equal(u.data_ro, want)


def walking_step(width: int):
    """A new session and a captured step whose every replay steps an index one further along
    rows of ``width`` values: ``(step, src, where, out)``; replay ``width`` reads out of range."""
    mc.reset_runtime()
    cells = mc.Set(4, "cells")
    src = mc.Dat(cells, width, np.arange(4.0 * width).reshape(4, width), "src")
    where = mc.Dat(cells, 1, None, "where", dtype=np.int64)
    out = mc.Dat(cells, 1, None, "out")
    walk = mc.Kernel.from_source("def walk(s, i, o):\n    i[0] += 1\n    o[0] = s[i[0]]\n")
    step = mc.capture(lambda: mc.par_loop(walk, cells, src(mc.READ), where(mc.RW), out(mc.WRITE)), name="walk")
    return step, src, where, out


def test_a_kernel_error_in_a_compiled_repeat_raises_as_a_replay_does(monkeypatch):
    """The fourth replay is out of range inside the compiled repeat (the capture and the first
    replay ran in Python), and raises the loop's error."""
    step, src, where, out = walking_step(3)
    counts = counting_runs(monkeypatch)
    with pytest.raises(mc.KernelRuntimeError, match="'walk'"):
        step.repeat(5)
    assert counts["run"] == 2 and len(mc.get_runtime().trace) == 0
    np.testing.assert_array_equal(where.data_ro[:, 0], [3, 2, 2, 2])  # the failing replay stopped at its first element
    where.data[:] = 0
    step.repeat(2)
    np.testing.assert_array_equal(out.data_ro[:, 0], src.data_ro[:, 2])


def test_a_failing_compiled_repeat_counts_what_the_calls_would_count():
    """The eighth replay fails inside the compiled repeat: replays, executions and plan hits
    count the replays made, as the same calls one by one count them."""
    def run(repeat: bool):
        step, _, where, out = walking_step(8)
        with pytest.raises(mc.KernelRuntimeError, match="'walk'"):
            if repeat:
                step.repeat(20)
            else:
                for _ in range(20):
                    step()
        stats = mc.stats()
        return (step.replays, stats.chains["walk"].executions, stats.caches["plans"].hits,
                where.data_ro.copy(), out.data_ro.copy())

    calls, repeated = run(False), run(True)
    assert calls[:3] == repeated[:3] == (6, 7, 7)
    np.testing.assert_array_equal(repeated[3], calls[3])
    np.testing.assert_array_equal(repeated[4], calls[4])


def test_the_repeaters_compile_is_counted_once_and_a_steps_keyword_named_times_is_its_own():
    """The repeater is compiled (or loaded) for the call's argument types once per process: its
    own dtypes here (a uint32 dat, a uint64 global), so that no other test made it first."""
    mc.reset_runtime()
    cells = mc.Set(5, "cells")
    u = mc.Dat(cells, 1, np.arange(5, dtype=np.uint32), "u", dtype=np.uint32)
    bump = mc.Kernel.from_source("def bump(a, k):\n    a[0] = a[0] * k[0] + 1\n")

    @mc.capture(name="bumped")
    def step(times=2):
        mc.par_loop(bump, cells, u(mc.RW), mc.Global(1, times, "k", dtype=np.uint64)(mc.READ))

    step.repeat(2, times=3)  # captured, replayed once: nothing made for the repeat yet
    before = mc.stats().loops["bump"].compilations
    step.repeat(3, times=3)  # a replay, then two in one compiled call: _mc_repeat compiled or loaded
    middle = mc.stats().loops["bump"].compilations
    step.repeat(3, times=3)
    assert (middle - before, mc.stats().loops["bump"].compilations - middle) == (1, 0)
    want = np.arange(5, dtype=np.uint32)
    for _ in range(8):
        want = want * np.uint32(3) + np.uint32(1)
    np.testing.assert_array_equal(u.data_ro[:, 0], want)
