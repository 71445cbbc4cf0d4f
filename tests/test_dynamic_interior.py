"""Dynamic interior scheduling (``Backend.chunked``) against the static phase call.

Random chains of loops (direct and indirect dats, INC through maps, whole maps, global
INC/MIN/MAX) are run through meshchain once, which binds their phases; each bound phase
is then run again from the same data by ``backend.phase(runs)()`` and by
``backend.chunked(runs, ...).run(driver)`` with every thread count, chunk size and
driver, and every array must come out bit for bit the same. The data are random floats,
so a change in the order of any sum would show.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends.numba_codegen import reduction_args
from meshchain.backends.threads import ChunkedCall, WorkerPool
from meshchain.core.storage import GlobalStorage
from test_backends_property import kernel_source


def _quiet(*_):
    """A compile report that records nothing."""


def captured_phases(monkeypatch):
    """Record the bound runs of every phase the session's backend prepares."""
    backend = mc.get_runtime().backend
    phases, original = [], backend.phase

    def phase(runs, report):
        phases.append(list(runs))
        return original(runs, report)

    monkeypatch.setattr(backend, "phase", phase)
    return backend, phases


def arrays_of_runs(runs) -> list:
    """Every array a phase may write, once: dats' host rows, globals' values, reduction targets."""
    found = {}
    for run in runs:
        for record in run.data:
            array = record.value if isinstance(record, GlobalStorage) else record.host
            found.setdefault(id(array), array)
        for array in run.targets.values():
            found.setdefault(id(array), array)
    return list(found.values())


def restore(arrays, saved) -> None:
    for array, values in zip(arrays, saved):
        np.copyto(array, values)


def bits(arrays) -> list[bytes]:
    return [array.tobytes() for array in arrays]


def make_driver(kind: str, calls: int):
    """A driver that is complete at once, after ``calls`` polls, or never; counts its polls."""
    count = [0]

    def driver():
        count[0] += 1
        return kind == "now" or (kind == "after" and count[0] > calls)

    driver.count = count
    return driver


# --------------------------------------------------------------------------- #
# Random chains
# --------------------------------------------------------------------------- #
ARG_KINDS = ("direct_read", "direct_write", "direct_rw", "direct_inc", "indirect_read", "indirect_inc",
             "whole_read", "whole_inc", "global_read", "global_inc", "global_min", "global_max")


@st.composite
def chains(draw):
    """Sizes, one map's values, and per loop a list of (argument kind, dim, which dat/global)."""
    n_iter = draw(st.integers(1, 160))
    n_target = draw(st.integers(1, 40))
    arity = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31))
    loops = draw(st.lists(st.lists(st.tuples(st.sampled_from(ARG_KINDS), st.integers(1, 2), st.integers(0, 1)),
                                   min_size=1, max_size=4), min_size=1, max_size=3))
    return n_iter, n_target, arity, seed, loops


def declare(spec):
    """The mesh, two dats per (set, dim) and two globals per (dim, mode), and each loop's arguments."""
    n_iter, n_target, arity, seed, loops = spec
    rng = np.random.default_rng(seed)
    cells, nodes = mc.Set(n_iter, "cells"), mc.Set(n_target, "nodes")
    c2n = mc.Map(cells, nodes, arity, rng.integers(0, n_target, size=(n_iter, arity)), "c2n")
    objects: dict = {}

    def dat(s, dim, which):
        key = (s.name, dim, which)
        if key not in objects:
            objects[key] = mc.Dat(s, dim, rng.standard_normal((s.size, dim)), f"{s.name}{dim}{which}")
        return objects[key]

    def glob(dim, which):
        key = ("g", dim, which)
        if key not in objects:
            objects[key] = mc.Global(dim, rng.standard_normal(dim), f"g{dim}{which}", dtype=np.float64)
        return objects[key]

    modes = {"read": mc.READ, "write": mc.WRITE, "rw": mc.RW, "inc": mc.INC, "min": mc.MIN, "max": mc.MAX}
    loop_args = []
    for arguments in loops:
        args, used = [], set()
        for kind, dim, which in arguments:
            place, mode = kind.split("_")
            if place == "direct":
                obj, arg = dat(cells, dim, which), None
            elif place == "global":
                obj = glob(dim, which)
            else:
                obj = dat(nodes, dim, which)
            if id(obj) in used:  # one access per object and loop
                continue
            used.add(id(obj))
            if place == "indirect":
                arg = obj(modes[mode], c2n[which % arity])
            elif place == "whole":
                arg = obj(modes[mode], c2n)
            else:
                arg = obj(modes[mode])
            args.append(arg)
        loop_args.append(args)
    return cells, loop_args


# float results that depend on the order of every update
ORDER_SENSITIVE_UPDATES = {
    "read": "s = s * 0.7 + {value}",
    mc.WRITE: "{target} = s * 1.1 + {k + j}",
    mc.RW: "{target} = {target} * 0.9 + s",
    mc.INC: "{target} += s * 0.3 + {j + 1}.1",
    mc.MIN: "{target} = min({target}, s - {j})",
    mc.MAX: "{target} = max({target}, s + {j})",
}


def kernel_for(args) -> str:
    """A kernel whose float results depend on the order of every update."""
    return kernel_source(args, ORDER_SENSITIVE_UPDATES, name="chained", start="0.25")


def run_chain(spec) -> None:
    cells, loop_args = declare(spec)
    with mc.loop_chain("dynamic"):
        for position, args in enumerate(loop_args):
            mc.par_loop(mc.Kernel.from_source(kernel_for(args)), cells, *args, name=f"loop{position}")
    mc.flush()


def assert_chunked_matches_static(backend, runs, configurations) -> None:
    arrays = arrays_of_runs(runs)
    saved = [array.copy() for array in arrays]
    type(backend).phase(backend, runs, _quiet)()  # not the capturing wrapper
    expected = bits(arrays)
    for workers, chunk_blocks, kind, calls in configurations:
        restore(arrays, saved)
        call = backend.chunked(runs, _quiet, workers=workers, chunk_blocks=chunk_blocks)
        driver = make_driver(kind, calls)
        completed = call.run(driver)
        assert bits(arrays) == expected, (workers, chunk_blocks, kind, calls)
        polled = driver.count[0]
        assert polled >= 1
        assert (completed is not None) == (kind == "now" or (kind == "after" and polled > calls))
        assert call.workers == workers
    restore(arrays, saved)
    call()  # and without a driver
    assert bits(arrays) == expected


CONFIGURATIONS = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.sampled_from(("now", "after", "never")),
                                    st.integers(0, 5)), min_size=1, max_size=4)


@settings(max_examples=7, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(spec=chains(), block_size=st.sampled_from([4, 8, 16, 64]), configurations=CONFIGURATIONS)
def test_chunked_is_bit_identical_to_the_static_phase(monkeypatch, spec, block_size, configurations):
    mc.reset_runtime(cache_dir=mc.get_runtime().config.cache_dir)
    mc.configure(backend="numba", block_size=block_size)
    backend, phases = captured_phases(monkeypatch)
    run_chain(spec)
    assert phases
    for runs in list(phases):
        assert_chunked_matches_static(backend, runs, configurations + [(2, 1, "after", 3), (0, 2, "after", 2)])


def two_loop_chain(n: int = 600):
    """An edge loop incrementing nodes and a global sum, then a loop reading that global."""
    rng = np.random.default_rng(7)
    edges, nodes = mc.Set(n, "edges"), mc.Set(n // 3, "nodes")
    e2n = mc.Map(edges, nodes, 2, rng.integers(0, n // 3, size=(n, 2)), "e2n")
    w = mc.Dat(edges, 1, rng.standard_normal((n, 1)), "w")
    r = mc.Dat(nodes, 2, rng.standard_normal((n // 3, 2)), "r")
    total = mc.Global(1, 0.5, "total", dtype=np.float64)
    scaled = mc.Dat(edges, 1, None, "scaled")
    spread = mc.Kernel.from_source("def spread(w, a, b, t):\n    a[0] += w[0]\n    b[1] += w[0] * 0.3\n"
                                   "    t[0] += w[0] * 1.7\n")
    scale = mc.Kernel.from_source("def scale(w, t, s):\n    s[0] = w[0] / t[0]\n")
    with mc.loop_chain("two"):
        mc.par_loop(spread, edges, w(mc.READ), r(mc.INC, e2n[0]), r(mc.INC, e2n[1]), total(mc.INC))
        mc.par_loop(scale, edges, w(mc.READ), total(mc.READ), scaled(mc.WRITE))
    mc.flush()


def test_a_later_run_reads_the_reduced_global_as_the_static_phase_does(monkeypatch):
    mc.configure(backend="numba", block_size=8)
    backend, phases = captured_phases(monkeypatch)
    two_loop_chain()
    runs = max(phases, key=len)
    assert [run.loop.name for run in runs] == ["spread", "scale"]  # one phase of both loops
    configurations = [(w, c, "now", 0) for w in range(4) for c in (1, 3)]
    assert_chunked_matches_static(backend, runs, configurations)


def test_a_chunked_call_takes_new_arrays_where_it_is_rebound():
    """Rebinding (a plan bound to new dats, see meshchain.engine.rebind) replaces arguments by
    their position in ``arguments``: every chunk's, then every finishing call's."""
    old, new, out, seen = np.arange(4.0), np.arange(4.0) + 10, np.zeros(4), []

    def add(lo, hi, src, dst):
        dst[lo:hi] += src[lo:hi]

    call = ChunkedCall([[(add, (0, 2, old, out)), (add, (2, 4, old, out))]], [(seen.append, (old,))],
                       pool=WorkerPool(1))
    flat = call.arguments
    assert len(flat) == 9 and [i for i, a in enumerate(flat) if a is old] == [2, 6, 8]
    call.rebind([(2, new), (6, new), (8, new)])
    call()
    assert out.tolist() == [10.0, 11.0, 12.0, 13.0] and seen == [new]
    assert [i for i, a in enumerate(call.arguments) if a is new] == [2, 6, 8]


def test_chunks_cover_every_colour_and_reuse_one_pool(monkeypatch):
    mc.configure(backend="numba", block_size=8)
    backend, phases = captured_phases(monkeypatch)
    two_loop_chain()
    runs = max(phases, key=len)
    chunk_blocks = 3
    call = backend.chunked(runs, _quiet, workers=2, chunk_blocks=chunk_blocks)
    expected = sum(-(-int(last - first) // chunk_blocks) for run in runs
                   for first, last in zip(run.colouring.colour_offsets[:-1], run.colouring.colour_offsets[1:]))
    reduces = sum(1 for run in runs[:-1] if reduction_args(run.loop.specs))  # one group before the next run
    assert call.chunks == expected + reduces
    again = backend.chunked(runs, _quiet, workers=2, chunk_blocks=1)
    assert again.pool is call.pool
    call()
    threads = threading.active_count()
    for _ in range(5):
        again.run(make_driver("after", 2))
    assert threading.active_count() == threads


def test_chunked_of_nothing_is_none(monkeypatch):
    mc.configure(backend="numba", block_size=8)
    backend, phases = captured_phases(monkeypatch)
    two_loop_chain()
    empty = [run._replace(end=run.start) for run in phases[0]]
    assert backend.chunked(empty, _quiet, workers=1) is None


def test_a_failing_kernel_raises_and_leaves_no_thread_busy(monkeypatch):
    mc.configure(backend="numba", block_size=4, debug=True)
    backend, phases = captured_phases(monkeypatch)
    n = 200
    cells = mc.Set(n, "cells")
    where = mc.Dat(cells, 1, np.zeros((n, 1)), "where")
    out = mc.Dat(cells, 1, None, "out")
    pick = mc.Kernel.from_source("def pick(i, o):\n    o[int(i[0])] = 1.0\n")
    mc.par_loop(pick, cells, where(mc.READ), out(mc.WRITE), name="pick")
    mc.flush()
    (runs,) = phases
    index = runs[0].data[0].host
    for workers in (0, 1, 3):
        index[n // 2, 0] = 5.0  # out of the view of one element
        call = backend.chunked(runs, _quiet, workers=workers, chunk_blocks=2)
        with pytest.raises(mc.KernelRuntimeError, match="pick"):
            call.run(make_driver("never", 0))
        assert call.pool._state.busy == 0 and not call.pool._use.locked()
        index[n // 2, 0] = 0.0
        call.run(make_driver("now", 0))  # works again


def test_the_driver_is_polled_while_workers_compute(monkeypatch):
    mc.configure(backend="numba", block_size=64)
    backend, phases = captured_phases(monkeypatch)
    n = 20000
    cells = mc.Set(n, "cells")
    x = mc.Dat(cells, 1, np.linspace(0.0, 1.0, n).reshape(n, 1), "x")
    y = mc.Dat(cells, 1, None, "y")
    slow = mc.Kernel.from_source("def slow(x, y):\n    s = x[0]\n    for k in range(2000):\n"
                                 "        s = s * 0.999 + 0.001\n    y[0] = s\n")
    mc.par_loop(slow, cells, x(mc.READ), y(mc.WRITE), name="slow")
    mc.flush()
    (runs,) = phases
    driver = make_driver("never", 0)
    assert backend.chunked(runs, _quiet, workers=2, chunk_blocks=1).run(driver) is None
    assert driver.count[0] > 0


def test_the_calling_thread_turns_progress_between_its_chunks_once_the_driver_is_done():
    """``turn`` (an exchange's MPI progress that the neighbours may need) runs only after the
    driver is done: at once, then between this thread's chunks, at most every ``turn_every``."""
    log = []
    chunks = [[(log.append, ("chunk",))] * 6]
    pool = WorkerPool(0)  # one chunk between polls: the order is fixed
    try:
        for every, expected in ((0.0, ["chunk"] * 2 + ["turn", "chunk"] * 4 + ["turn"]),
                                (3600.0, ["chunk"] * 2 + ["turn"] + ["chunk"] * 4)):
            log.clear()
            driver = make_driver("after", 2)
            completed = ChunkedCall(chunks, pool=pool).run(driver, turn=lambda: log.append("turn"), turn_every=every)
            assert completed is not None and log == expected
        log.clear()
        assert ChunkedCall(chunks, pool=pool).run(make_driver("never", 0), turn=lambda: log.append("turn")) is None
        assert log == ["chunk"] * 6  # the messages were never complete: nothing to turn for
    finally:
        pool.close()


class DrivenExchange:
    """A stand-in for a halo exchange, complete at the first test, that logs its calls."""

    idle, running = False, "forward"

    def __init__(self, log: list, owes_progress: bool):
        self.log, self.owes_progress = log, owes_progress

    def test(self) -> bool:
        self.log.append("test")
        return True

    def progress(self) -> None:
        self.log.append("turn")


def test_a_polling_overlap_hands_owed_progress_to_the_thread_that_drove_the_messages():
    from meshchain.engine.plans import Overlap

    log = []
    pool = WorkerPool(0)
    try:
        for owes in (True, False):
            log.clear()
            call = ChunkedCall([[(log.append, ("chunk",))] * 3], pool=pool)
            failure, completed = Overlap("poll").run(call, [DrivenExchange(log, owes)])
            assert failure is None and completed is not None and log.count("chunk") == 3
            assert log[:3] == (["test", "turn", "chunk"] if owes else ["test", "chunk", "chunk"])
            assert ("turn" in log) == owes
    finally:
        pool.close()


def test_the_reference_backend_cannot_chunk():
    mc.configure(backend="reference")
    backend = mc.get_runtime().backend
    assert not backend.can_chunk
    with pytest.raises(mc.ConfigurationError, match="reference backend cannot schedule interior"):
        backend.chunked([], _quiet, workers=2)


def test_bad_chunk_options_are_refused():
    mc.configure(backend="numba")
    backend = mc.get_runtime().backend
    assert backend.can_chunk
    with pytest.raises(mc.ConfigurationError, match="chunk_blocks >= 1"):
        backend.chunked([], _quiet, workers=1, chunk_blocks=0)


def test_chunks_wait_for_earlier_groups_and_failures_stop_cleanly():
    """The scheduler alone: a group starts after the previous one; an error stops every thread."""
    log, lock = [], threading.Lock()

    def note(group):
        with lock:
            log.append(group)

    groups = [[(note, (g,))] * 5 for g in range(6)]
    pool = WorkerPool(3)
    try:
        for _ in range(20):
            log.clear()
            ChunkedCall(groups, pool=pool).run(make_driver("after", 1))
            assert log == sorted(log) and len(log) == 30

        def boom():
            raise ValueError("boom")

        failing = ChunkedCall([[(note, (0,))] * 4, [(boom, ())] * 3, [(note, (2,))] * 4], pool=pool,
                              failure=lambda exc: RuntimeError(f"wrapped {exc}"))
        log.clear()
        with pytest.raises(RuntimeError, match="wrapped boom"):
            failing()
        assert 2 not in log and pool._state.busy == 0
    finally:
        pool.close()
