"""Plans as values: built on the first execution in a state, looked up and run afterwards;
caches emptied by the events they name; statistics read off the plan equal what running
counted; a failing loop discards only the loops that depend on it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.core.cache import Cache, CacheRegistry

from helpers import host_rows

OFFSET = 1.0


@mc.kernel
def shifted(a):
    a[0] = a[0] + OFFSET


@mc.kernel
def double(a, b):
    b[0] = 2.0 * a[0]


@mc.kernel
def spread(x1, x2, r1, r2, total):
    r1[0] += x2[0]
    r2[0] += x1[0]
    total[0] += x1[0] * x2[0]


def ring(n=12):
    nodes, edges = mc.Set(n, "nodes"), mc.Set(n, "edges")
    e2n = mc.Map(edges, nodes, 2, np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1), "e2n")
    x = mc.Dat(nodes, 1, np.arange(n, dtype=np.float64), "x")
    r = mc.Dat(nodes, 1, None, "r")
    total = mc.Global(1, 0.0, "total")
    return nodes, edges, e2n, x, r, total


def plans():
    return mc.get_runtime().pipeline.plans


def test_a_plan_is_built_once_and_replayed(backend):
    nodes, edges, e2n, x, r, total = ring()
    for _ in range(5):
        mc.par_loop(spread, edges, x(mc.READ, e2n[0]), x(mc.READ, e2n[1]), r(mc.INC, e2n[0]), r(mc.INC, e2n[1]),
                    total(mc.INC))
        mc.flush()
    assert len(plans()) == 1
    plan = next(iter(plans().values()))
    assert plan.account.runs == 5
    expected = 5 * (np.roll(np.arange(12.0), -1) + np.roll(np.arange(12.0), 1))
    np.testing.assert_array_equal(r.data[:, 0], expected)
    assert total.value[0] == 5 * float(np.sum(np.arange(12.0) * np.roll(np.arange(12.0), -1)))


def test_chains_replay_one_plan_and_count_like_separate_runs():
    nodes, edges, e2n, x, r, total = ring()
    y = mc.Dat(nodes, 1, None, "y")
    for _ in range(4):
        with mc.loop_chain("pair"):
            mc.par_loop(spread, edges, x(mc.READ, e2n[0]), x(mc.READ, e2n[1]), r(mc.INC, e2n[0]), r(mc.INC, e2n[1]),
                        total(mc.INC))
            mc.par_loop(double, nodes, r(mc.READ), y(mc.WRITE))
    assert len(plans()) == 1
    stats = mc.stats()
    assert stats.loops["spread"].calls == 4 and stats.loops["spread"].iterations == 4 * 12
    assert stats.loops["double"].calls == 4 and stats.chains["pair"].executions == 4
    assert stats.chains["pair"].loops == 8 and stats.chains["pair"].mode == "serial"
    np.testing.assert_array_equal(y.data[:, 0], 2 * r.data_ro[:, 0])


def test_configure_drops_plans_and_a_changed_constant_rebuilds_them(monkeypatch):
    global OFFSET
    cells = mc.Set(3, "cells")
    q = mc.Dat(cells, 1, None, "q")
    mc.par_loop(shifted, cells, q(mc.RW))
    mc.flush()
    first = next(iter(plans().values()))
    mc.par_loop(shifted, cells, q(mc.RW))
    mc.flush()
    assert next(iter(plans().values())) is first, "the same state runs the same plan"
    closed = []
    close = type(first).close
    monkeypatch.setattr(type(first), "close", lambda plan: (closed.append(plan), close(plan)))
    OFFSET = 10.0
    try:
        mc.par_loop(shifted, cells, q(mc.RW))
        assert q.data[0, 0] == 12.0, "a changed module constant compiles a new version"
    finally:
        OFFSET = 1.0
    assert next(iter(plans().values())) is not first
    assert closed == [first], "the stale plan is dropped and closed, as an evicted one"
    counted = mc.stats().caches["plans"]
    assert (counted.misses, counted.hits) == (2, 1), "rebuilt under its key: counted as built, not reused"
    mc.configure(block_size=16)
    assert len(plans()) == 0, "configure drops every plan"
    assert mc.stats().loops["shifted"].calls == 3, "statistics of dropped plans are kept"


def test_statistics_survive_eviction_and_reset(backend):
    session = mc.get_runtime()
    session.pipeline.plans.limit = 2
    sets = [mc.Set(n, f"s{n}") for n in (2, 3, 4)]
    dats = [mc.Dat(s, 1, None, f"d{s.size}") for s in sets]
    for _ in range(3):
        for s, d in zip(sets, dats):  # three plans through a cache of two: one is always dropped
            mc.par_loop(shifted, s, d(mc.RW))
            mc.flush()
    stats = mc.stats()
    assert stats.loops["shifted"].calls == 9 and stats.loops["shifted"].iterations == 3 * (2 + 3 + 4)
    mc.stats(reset=True)
    assert mc.stats().loops == {}
    mc.par_loop(shifted, sets[0], dats[0](mc.RW))
    assert mc.stats().loops["shifted"].calls == 1
    assert dats[0].data[:, 0].tolist() == [4.0, 4.0]


def test_cache_events_and_drops():
    dropped = []
    caches = CacheRegistry()
    plans_ = caches.cache("plans", limit=2, events=("partition",), on_drop=dropped.append)
    other = caches.cache("other", limit=8, events=("configure",))
    plans_["a"], plans_["b"], plans_["c"] = 1, 2, 3
    other["x"] = 9
    assert dropped == [1] and plans_.get("a") is None and plans_["c"] == 3
    caches.notify("partition")
    assert len(plans_) == 0 and dropped == [1, 2, 3] and other["x"] == 9
    caches.notify("configure")
    assert len(other) == 0
    with pytest.raises(mc.InternalError, match="unknown invalidation event"):
        caches.notify("restart")
    with pytest.raises(mc.InternalError, match="unknown invalidation event"):
        Cache("bad", limit=1, events=("sometimes",))
    again = caches.cache("other", limit=1)
    assert caches["other"] is again and len(again) == 0


@mc.kernel
def pick(a, b):
    b[0] = a[int(a[0])]  # an index outside the view where a[0] is not 0


def test_a_failure_discards_only_the_loops_that_depend_on_it():
    mc.configure(backend="reference", trace_length=100)
    cells = mc.Set(3, "cells")
    a = mc.Dat(cells, 1, [0.0, 3.0, 0.0], "a")
    b = mc.Dat(cells, 1, [5.0, 5.0, 5.0], "b")
    c = mc.Dat(cells, 1, None, "c")
    d = mc.Dat(cells, 1, [1.0, 2.0, 3.0], "d")
    e = mc.Dat(cells, 1, None, "e")
    mc.par_loop(pick, cells, a(mc.READ), b(mc.WRITE))            # fails on element 1
    mc.par_loop(double, cells, b(mc.READ), c(mc.WRITE))          # reads what failed: discarded
    mc.par_loop(double, cells, d(mc.READ), e(mc.WRITE), name="independent")
    with pytest.raises(mc.KernelRuntimeError, match="element 1") as raised:
        mc.flush()
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "1 pending loop(s) that depended on the failed one were discarded: double" in notes
    assert "1 pending loop(s) that did not depend on it are still pending: independent" in notes
    assert isinstance(raised.value.__cause__, IndexError), "the kernel's own error is kept as the cause"
    assert [entry.loop.name for entry in mc.get_runtime().trace] == ["independent"]
    assert host_rows(c)[:, 0].tolist() == [0.0, 0.0, 0.0], "the dependent loop did not run"
    assert e.data[:, 0].tolist() == [2.0, 4.0, 6.0], "the independent loop runs when forced"


def test_statistics_count_plans_built_and_reused_and_kernels_compiled():
    """Objects reused build one plan, replayed after; a new Global per step declared alike
    reuses it too (bound to the new global), and mc.stats() shows both. ``reset`` starts the
    counters again."""
    nodes = mc.Set(8, "nodes")
    x = mc.Dat(nodes, 1, np.arange(8.0), "x")
    total = mc.Kernel.from_source("def total(a, s):\n    s[0] += a[0]\n")
    kept = mc.Global(1, 0.0, "kept")
    for _ in range(5):
        mc.par_loop(total, nodes, x(mc.READ), kept(mc.INC))
        mc.flush()
    reused = mc.stats(reset=True)
    plans, schedules = reused.caches["plans"], reused.caches["schedules"]
    assert (plans.misses, plans.hits, schedules.misses) == (1, 4, 1)
    assert reused.compiled[0] >= 1 and reused.compiled[1] <= reused.compiled[0]
    assert "plans" in str(reused) and "kernels compiled:" in str(reused)
    for _ in range(5):
        fresh = mc.Global(1, 0.0, "fresh")
        mc.par_loop(total, nodes, x(mc.READ), fresh(mc.INC))
        assert fresh.value[0] == 28.0
    rebound = mc.stats(reset=True).caches
    assert (rebound["plans"].misses, rebound["plans"].hits) == (0, 5)
    assert rebound["loop structures"].misses == 0 and rebound["loop structures"].hits is None
    for _ in range(3):
        other = mc.Global(1, 0.0, "other", dtype=np.float32)  # another dtype: another structure, once
        mc.par_loop(total, nodes, x(mc.READ), other(mc.INC))
        assert other.value[0] == 28.0
    replanned = mc.stats().caches
    assert (replanned["plans"].misses, replanned["plans"].hits) == (1, 2)
    assert replanned["loop structures"].misses == 1


def test_temporaries_go_when_dropped_without_waiting_for_the_garbage_collector():
    """No cache holds a temporary dat or global, and an object and its arguments form no
    reference cycle: once the next step's objects are bound, the last step's are freed by
    reference counting alone (the unit holds only its latest execution's objects)."""
    import gc
    import weakref

    cells = mc.Set(50, "cells")
    x = mc.Dat(cells, 1, np.arange(50.0), "x")
    copy = mc.Kernel.from_source("def copy(a, c):\n    c[0] = a[0]\n")
    total = mc.Kernel.from_source("def total(c, s):\n    s[0] += c[0]\n")
    gone = []
    gc.disable()
    store = mc.get_runtime().store
    before = len(store)
    try:
        for _ in range(4):
            c, s = mc.Dat(cells, 1, None, "c"), mc.Global(1, 0.0, "s")
            mc.par_loop(copy, cells, x(mc.READ), c(mc.WRITE))
            mc.par_loop(total, cells, c(mc.READ), s(mc.INC))
            assert s.value[0] == 1225.0
            gone.append((weakref.ref(c), weakref.ref(s)))
            del c, s
        assert all(c() is None and s() is None for c, s in gone[:-1]), "freed without a collection"
        assert len(store) == before + 2  # the records of the last step's two objects only
    finally:
        gc.enable()


@settings(max_examples=25, deadline=None)
@given(uses=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1)), min_size=1, max_size=6),
       global_at=st.integers(0, 6))
def test_a_loop_found_by_structure_is_the_loop_checked_the_long_way(uses, global_at):
    """A loop over new objects declared alike (found by its structure, not checked again) has
    the fields of the same loop checked the long way, whichever arguments share an object and
    in whatever order; and it sums what the first objects' loop summed."""
    n = 10
    nodes, edges = mc.Set(n, "nodes"), mc.Set(n, "edges")
    e2n = mc.Map(edges, nodes, 2, np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1), "e2n")
    global_at = min(global_at, len(uses))  # the global's place among the arguments
    names = [f"a{k}" for k in range(len(uses))]
    names.insert(global_at, "s")
    body = " + ".join(f"a{k}[0]" for k in range(len(uses)))
    kernel = mc.Kernel.from_source(f"def k({', '.join(names)}):\n    s[0] += {body}\n")
    records = mc.get_runtime().loop_records

    def declared():  # two dats on nodes (read through e2n), one on edges (read directly)
        dats = [mc.Dat(nodes if k < 2 else edges, 1, np.arange(n, dtype=np.float64) * (k + 1), f"d{k}")
                for k in range(3)]
        return dats, mc.Global(1, 0.0, "s")

    def arguments(dats, total) -> tuple:
        args = [dats[k](mc.READ) if k == 2 else dats[k](mc.READ, e2n[index]) for k, index in uses]
        args.insert(global_at, total(mc.INC))
        return tuple(args)

    def fields(loop):
        slot = {id(obj): position for position, obj in enumerate(loop.data)}
        return (loop.kernel, loop.iterset, loop.name, loop.specs, loop.maps, loop.shape, loop.indirect_writes,
                tuple(slot[id(obj)] for obj in loop.reads), tuple(slot[id(obj)] for obj in loop.writes),
                sorted(slot[i] for i in loop.read_ids), sorted(slot[i] for i in loop.write_ids))

    first_dats, first_total = declared()
    first = records.loop(kernel, edges, arguments(first_dats, first_total), None)
    mc.par_loop(kernel, edges, *arguments(first_dats, first_total))
    for _ in range(2):
        dats, total = declared()
        args = arguments(dats, total)
        found = records.loop(kernel, edges, args, None)
        checked = mc.get_runtime()._checked_loop(kernel, edges, args, None)
        assert found is not first and found.args == args
        assert found.data == checked.data and found.reads == checked.reads and found.writes == checked.writes
        assert fields(found) == fields(checked) == fields(first)
        mc.par_loop(kernel, edges, *args)
        assert total.value.tolist() == first_total.value.tolist()


def test_a_plan_that_cannot_take_new_objects_is_built_for_them():
    """The reference backend's calls cannot be rebound: a new Global per step builds its plan
    again (counted), with the right value each time; the numba backend's are rebound."""
    nodes = mc.Set(8, "nodes")
    x = mc.Dat(nodes, 1, np.arange(8.0), "x")
    total = mc.Kernel.from_source("def total(a, s):\n    s[0] += a[0]\n")
    for backend, built in (("reference", 4), ("numba", 1)):
        mc.configure(backend=backend)
        mc.stats(reset=True)
        for step in range(4):
            fresh = mc.Global(1, float(step), "fresh")
            mc.par_loop(total, nodes, x(mc.READ), fresh(mc.INC))
            assert fresh.value[0] == 28.0 + step
        assert mc.stats().caches["plans"].misses == built, backend


def test_cache_counters_survive_a_backend_made_anew_and_reset():
    registry = CacheRegistry()
    first = registry.cache("modules", limit=4, counts_hits=True)
    first["a"] = 1
    first.hits += 2
    again = registry.cache("modules", limit=4, counts_hits=True)
    assert registry.counts()["modules"] == ("modules", 2, 1, 0)
    again["b"] = 2
    again["b"] = 3  # the same key: stored again, not built
    plain = registry.cache("plain", limit=1)
    plain["x"] = 1
    plain["y"] = 2  # evicts x; a second build
    assert registry.counts()["modules"].misses == 2 and registry.counts()["plain"] == ("plain", None, 2, 1)
    registry.reset_counts()
    assert registry.counts()["modules"] == ("modules", 0, 0, 1)


def test_entry_point_keys_tell_apart_what_numba_types_tell_apart():
    """The numba backend finds compiled entry points by ``_type_key`` instead of
    ``numba.typeof``: equal keys must mean equal Numba types, for every kind of argument a
    plan passes (arrays of each layout and flag, read-only views, scalars)."""
    import numba

    from meshchain.backends.base import readonly
    from meshchain.backends.numba_backend import _type_key

    matrix = np.zeros((4, 3))
    values = [matrix, np.ones((2, 5)), matrix[:, 0], matrix.T, matrix[::2], readonly(matrix), np.zeros((4, 1)),
              np.zeros(0), np.zeros(3, dtype=np.int32), np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.uint64),
              True, False, np.bool_(True), 0, 7, -2**63, 2**63 - 1, np.int64(3), np.int32(3), 1.5, np.float64(1.5)]
    for a in values:
        for b in values:
            if _type_key(a) == _type_key(b):
                assert numba.typeof(a) == numba.typeof(b), (a, b)
    assert all(_type_key(v) is not None for v in values)
    assert _type_key(2**63) is None and _type_key((1, 2)) is None  # left to numba.typeof


def _array_of(record):
    from meshchain.core.storage import GlobalStorage

    return record.value if isinstance(record, GlobalStorage) else record.host


class _Call:
    """A prepared call's stand-in: its arguments and their substitutions."""

    def __init__(self, arguments):
        self.arguments = tuple(arguments)

    def rebind(self, substitutions):
        arguments = list(self.arguments)
        for position, array in substitutions:
            arguments[position] = array
        self.arguments = tuple(arguments)


class _Exchange:
    rebindable = True

    def __init__(self):
        self.rebound = []

    def rebind(self, arrays):
        self.rebound.append(list(arrays))


class _Reduction:
    def __init__(self, storage):
        self.storage = storage


def _bound_plan(records):
    """A plan whose steps, exchange and call name the records of keys 0-2 in every way a
    rebind changes: settle, validity, reductions, an exchange naming key 0 twice, a call
    taking key 0's array writable and read-only, key 1's and key 2's read-only."""
    from meshchain.backends.base import readonly
    from meshchain.engine.plans import Step
    from meshchain.engine.rebind import Binding

    call = _Call([_array_of(records[0]), readonly(_array_of(records[0])), _array_of(records[1]),
                  readonly(_array_of(records[2]))])
    steps = [Step(core=call, settle=(records[0], records[2]), validity=((records[1], 1),),
                  reductions=(_Reduction(records[0]), _Reduction(records[2]))),
             Step(settle=(records[1],))]
    exchange = _Exchange()
    prepared = []
    binding = Binding(records, steps=steps, exchanges=[(exchange, (0, 0, 1))], prepared=[(1, True)],
                      prepare=lambda record, write: prepared.append((record, write)))
    return binding, steps, exchange, call, prepared


def _plan_state(records, steps, exchange, call, prepared):
    """What the plan names, as keys of ``records`` (an array: its record's key, or None, and
    whether it is writable)."""
    key = {id(r): k for k, r in enumerate(records)}
    arrays = {id(_array_of(r)): k for k, r in enumerate(records)}

    def array_key(a):
        return arrays.get(id(a), arrays.get(id(a.base))), a.flags.writeable

    return ([([key[id(r)] for r in step.settle], [(key[id(r)], d) for r, d in step.validity],
              [key[id(red.storage)] for red in step.reductions]) for step in steps],
            [[array_key(a) for a in rebound] for rebound in exchange.rebound],
            [array_key(a) for a in call.arguments], [(key[id(r)], w) for r, w in prepared])


@pytest.mark.parametrize("changed", [0, 1, 2])
def test_rebinding_one_object_changes_what_rebinding_the_general_way_changes(changed):
    """``Binding.rebind`` with one new object (its own path, ``_rebind_one``) leaves the plan
    as the general path (``_rebind_many``) does: the same steps, exchange, call arguments and
    prepared records, the old object's reduction over ranks finished before it is let go."""
    from meshchain.core.storage import DatStorage, GlobalStorage

    def records():
        return (GlobalStorage(np.zeros(2)), DatStorage(np.zeros((5, 1)), n_owned=4), GlobalStorage(np.ones(2)))

    class Pending:
        def __init__(self, settled, storage):
            self.settled, self.storage = settled, storage

        def finish(self, value):
            self.settled.append(id(self.storage))

    outcomes = []
    for way in ("one", "general"):
        old = records()
        binding, steps, exchange, call, prepared = _bound_plan(old)
        settled = []
        for record in (old[0], old[2]):
            record.pending = Pending(settled, record)
        new = tuple(records()[k] if k == changed else old[k] for k in range(3))
        done = binding.rebind(None, new) if way == "one" else binding._rebind_many([changed], new)
        assert done and binding.records == new
        outcomes.append((_plan_state(new, steps, exchange, call, prepared),
                         [k for s in settled for k, r in enumerate(old) if id(r) == s]))
    assert outcomes[0] == outcomes[1]
    (steps_named, exchanged, arguments, prepared), settled = outcomes[0]
    assert steps_named == [([0, 2], [(1, 1)], [0, 2]), ([1], [], [])]
    assert exchanged == ([[(0, True), (0, True), (1, True)]] if changed in (0, 1) else [])
    assert arguments == [(0, True), (0, False), (1, True), (2, False)]  # the new records' arrays
    assert prepared == ([(1, True)] if changed == 1 else [])
    assert settled == ([changed] if changed in (0, 2) else [])  # the old global's reduction finished first
