"""The runtime: statistics, lazy evaluation, Global/Dat accessors, thread-count determinism,
the numba on-disk cache across processes, and empty sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import meshchain as mc

from helpers import host_rows


@mc.kernel
def step(a, d):
    """a = 10 a + d: applying it with d = 1, 2, 3 to zeros gives 123 only in that order."""
    a[0] = a[0] * 10.0 + d[0]


@mc.kernel
def accumulate(a, s):
    s[0] += a[0]


@mc.kernel
def flux(x1, x2, w, r1, r2, total):
    f = w[0] * (x2[0] - x1[0]) + w[1]
    r1[0] += f
    r2[0] -= 0.5 * f
    total[0] += f * w[0]


def digits(*values):
    return [mc.Global(1, float(v), f"d{v}") for v in values]


# --------------------------------------------------------------------------- #
# Statistics
# --------------------------------------------------------------------------- #
def test_stats_counts_calls_and_iterations(backend):
    cells, nodes = mc.Set(5, "cells"), mc.Set(3, "nodes")
    q, p = mc.Dat(cells, 1, None, "q"), mc.Dat(nodes, 1, None, "p")
    (one,) = digits(1)
    for _ in range(3):
        mc.par_loop(step, cells, q(mc.RW), one(mc.READ))
    mc.par_loop(step, nodes, p(mc.RW), one(mc.READ), name="on_nodes")
    stats = mc.stats()
    assert stats.backend == backend
    assert set(stats.loops) == {"step", "on_nodes"}
    assert (stats.loops["step"].calls, stats.loops["step"].iterations) == (3, 15)
    assert (stats.loops["on_nodes"].calls, stats.loops["on_nodes"].iterations) == (1, 3)
    assert stats.loops["step"].core_iterations == 15
    if backend == "numba":
        assert stats.loops["step"].colours == 1
        assert stats.loops["step"].compilations + stats.loops["on_nodes"].compilations <= 1
    assert stats.as_dict()["loops"]["step"]["calls"] == 3
    assert "on_nodes" in str(stats)
    assert q.data[:, 0].tolist() == [111.0] * 5


def test_stats_snapshot_and_reset():
    mc.configure(backend="reference")
    cells = mc.Set(4, "cells")
    q = mc.Dat(cells, 1, None, "q")
    (one,) = digits(1)
    mc.par_loop(step, cells, q(mc.RW), one(mc.READ))
    snapshot = mc.stats(reset=True)
    assert snapshot.loops["step"].calls == 1
    assert mc.stats().loops == {}
    mc.par_loop(step, cells, q(mc.RW), one(mc.READ))
    assert mc.stats().loops["step"].calls == 1
    assert snapshot.loops["step"].calls == 1, "a snapshot must not change afterwards"


# --------------------------------------------------------------------------- #
# Lazy evaluation (trace_length > 1)
# --------------------------------------------------------------------------- #
def record_123(cells, q):
    for d in digits(1, 2, 3):
        mc.par_loop(step, cells, q(mc.RW), d(mc.READ))


@pytest.mark.parametrize("force", ["data", "data_ro", "flush", "value", "stats"])
def test_loops_wait_until_forced_then_run_in_order(backend, force):
    mc.configure(trace_length=10)
    cells = mc.Set(4, "cells")
    q = mc.Dat(cells, 1, None, "q")
    total = mc.Global(1, 0.0, "total")
    record_123(cells, q)
    mc.par_loop(accumulate, cells, q(mc.READ), total(mc.INC))
    runtime = mc.get_runtime()
    assert len(runtime.trace) == 4
    assert not host_rows(q).any() and host_rows(total)[0] == 0.0, "nothing may run before evaluation is forced"  # peek
    if force == "data":
        result = q.data
    elif force == "data_ro":
        result = q.data_ro
    elif force == "flush":
        mc.flush()
        assert len(runtime.trace) == 0
        result = host_rows(q)
    elif force == "value":
        assert total.value[0] == 4 * 123.0
        result = host_rows(q)
    else:
        assert mc.stats().loops["step"].calls == 3
        assert len(runtime.trace) == 0
        result = host_rows(q)
    assert result[:, 0].tolist() == [123.0] * 4
    assert total.value[0] == 4 * 123.0


def test_trace_runs_when_it_reaches_trace_length():
    mc.configure(backend="reference", trace_length=2)
    cells = mc.Set(2, "cells")
    q = mc.Dat(cells, 1, None, "q")
    one, two, three = digits(1, 2, 3)
    mc.par_loop(step, cells, q(mc.RW), one(mc.READ))
    assert len(mc.get_runtime().trace) == 1 and not host_rows(q).any()
    mc.par_loop(step, cells, q(mc.RW), two(mc.READ))
    assert len(mc.get_runtime().trace) == 0 and host_rows(q)[0, 0] == 12.0
    mc.par_loop(step, cells, q(mc.RW), three(mc.READ))
    assert len(mc.get_runtime().trace) == 1 and host_rows(q)[0, 0] == 12.0
    assert q.data[0, 0] == 123.0


def test_user_write_after_pending_loops(backend):
    """Writing through dat.data first runs the pending loops, so the user's write wins."""
    mc.configure(trace_length=10)
    cells = mc.Set(3, "cells")
    q = mc.Dat(cells, 1, None, "q")
    record_123(cells, q)
    q.data[:] = 7.0
    mc.flush()
    assert q.data[:, 0].tolist() == [7.0] * 3


def test_configure_runs_pending_loops():
    mc.configure(backend="reference", trace_length=10)
    cells = mc.Set(2, "cells")
    q = mc.Dat(cells, 1, None, "q")
    record_123(cells, q)
    mc.configure(block_size=8)
    assert len(mc.get_runtime().trace) == 0 and host_rows(q)[:, 0].tolist() == [123.0] * 2


# --------------------------------------------------------------------------- #
# Global.value and Dat.data_ro
# --------------------------------------------------------------------------- #
def test_global_value_setter():
    g = mc.Global(3, 0.0, "g")
    g.value = 2.5
    assert g.value.tolist() == [2.5] * 3
    g.value = [1, 2, 3]
    assert g.value.tolist() == [1.0, 2.0, 3.0] and g.value.dtype == np.float64
    copy = g.value
    with pytest.raises(ValueError, match="read-only"):  # writing to the copy would change nothing: refused
        copy[0] = 99.0
    assert g.value[0] == 1.0, "value must return a copy"
    with pytest.raises(mc.DataShapeError, match=r"Global 'g'.*shape \(2,\), expected \(3,\)"):
        g.value = [1.0, 2.0]
    n = mc.Global(1, 0, "n", dtype=np.int32)
    with pytest.raises(mc.DataShapeError, match=r"Global 'n': cannot store float64 data as int32"):
        n.value = 0.5
    assert n.value.tolist() == [0]


def test_global_value_setter_runs_pending_loops_first(backend):
    mc.configure(trace_length=10)
    cells = mc.Set(4, "cells")
    q = mc.Dat(cells, 1, np.arange(4.0), "q")
    total = mc.Global(1, 0.0, "total")
    mc.par_loop(accumulate, cells, q(mc.READ), total(mc.INC))
    total.value = 100.0  # the pending reduction must run before this assignment, not after
    assert total.value[0] == 100.0
    mc.par_loop(accumulate, cells, q(mc.READ), total(mc.INC))
    assert total.value[0] == 106.0


def test_dat_data_ro_is_read_only(backend):
    cells = mc.Set(3, "cells")
    q = mc.Dat(cells, 1, np.arange(3.0), "q")
    view = q.data_ro
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 5.0
    np.testing.assert_array_equal(view, q.data)
    (one,) = digits(1)
    mc.par_loop(step, cells, q(mc.RW), one(mc.READ))
    assert q.data_ro[:, 0].tolist() == [1.0, 11.0, 21.0]
    assert q.data.flags.writeable, "data_ro must not make the dat itself read-only"


# --------------------------------------------------------------------------- #
# Thread-count determinism
# --------------------------------------------------------------------------- #
def run_flux(threads):
    mc.configure(backend="numba", threads=threads, block_size=16)
    rng = np.random.default_rng(42)
    nnode, nedge = 300, 2000
    nodes, edges = mc.Set(nnode, "nodes"), mc.Set(nedge, "edges")
    e2n = mc.Map(edges, nodes, 2, rng.integers(0, nnode, size=(nedge, 2)), "e2n")
    x = mc.Dat(nodes, 1, rng.standard_normal(nnode) * 10.0 ** rng.integers(-8, 8, nnode), "x")
    w = mc.Dat(edges, 2, rng.standard_normal((nedge, 2)) * 10.0 ** rng.integers(-8, 8, (nedge, 2)), "w")
    res = mc.Dat(nodes, 1, None, "res")
    total = mc.Global(1, 0.0, "total")
    for _ in range(2):
        mc.par_loop(flux, edges, x(mc.READ, e2n[0]), x(mc.READ, e2n[1]), w(mc.READ),
                    res(mc.INC, e2n[0]), res(mc.INC, e2n[1]), total(mc.INC))
    import numba

    assert numba.get_num_threads() == threads
    assert mc.stats().loops["flux"].colours > 1
    return res.data.copy(), total.value


def test_results_bit_identical_for_any_thread_count():
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba's pool has a single thread")
    res1, total1 = run_flux(1)
    res2, total2 = run_flux(2)
    res2b, total2b = run_flux(2)
    assert np.count_nonzero(res1) > 250 and total1[0] != 0.0
    for res, total in ((res2, total2), (res2b, total2b)):
        np.testing.assert_array_equal(res.view(np.uint64), res1.view(np.uint64))
        np.testing.assert_array_equal(total.view(np.uint64), total1.view(np.uint64))


# --------------------------------------------------------------------------- #
# The numba on-disk cache is reused by a later process
# --------------------------------------------------------------------------- #
CACHE_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import meshchain as mc

    cells = mc.Set(5, "cells")
    q = mc.Dat(cells, 1, np.arange(5.0), "q")

    @mc.kernel
    def cached_bump(a):
        a[0] += 1.5

    mc.par_loop(cached_bump, cells, q(mc.RW))
    mc.par_loop(cached_bump, cells, q(mc.RW))
    s = mc.stats().loops["cached_bump"]
    print(json.dumps(dict(compilations=s.compilations, cache_hits=s.cache_hits, calls=s.calls,
                          data=q.data[:, 0].tolist())))
    """
)


def test_numba_cache_reused_across_processes(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(CACHE_SCRIPT)
    cache = tmp_path / "cache"
    env = dict(os.environ, MESHCHAIN_CACHE_DIR=str(cache), MESHCHAIN_BACKEND="numba")
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["data"] == second["data"] == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert first["calls"] == second["calls"] == 2
    assert first["cache_hits"] == 0, "the first process starts from an empty cache"
    assert second["cache_hits"] >= 1, f"the second process should load the compiled loop from disk: {second}"
    generated = list((cache / "numba").glob("cached_bump_*.py"))
    assert len(generated) == 1
    assert list((cache / "numba").rglob("*.nbi")), "Numba's cache index should sit beside the generated module"


def test_a_compile_lock_held_elsewhere_is_waited_for_then_skipped_with_a_warning(tmp_path):
    """Ranks sharing a cache compile a loop once (one holds the lock, the others wait, then load
    it); a lock held too long (a holder stopped in a debugger, a stale NFS lock) is given up
    with a warning and the function compiled here, and a free lock is taken without one."""
    import fcntl
    import importlib.util
    import warnings

    from meshchain.backends.compile_once import compiling_alone, lock_path

    source = tmp_path / "held_module.py"
    source.write_text("import numba\n\n\n@numba.njit(cache=True)\ndef held(x):\n    return x + 1\n")
    spec = importlib.util.spec_from_file_location("held_module", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = lock_path(module.held)
    assert path.endswith(".nbi.lock") and os.path.isabs(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process compiling (a second descriptor conflicts like one)
    try:
        with pytest.warns(mc.MeshchainWarning, match=r"\[compile-lock\] waited 0 s"):
            with compiling_alone(module.held, wait=0.2):
                assert module.held.compile("int64(int64)") is not None
    finally:
        os.close(holder)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with compiling_alone(module.held, wait=0.2):
            assert module.held(1) == 2


def test_a_loop_already_in_the_disk_cache_is_loaded_without_the_compile_lock(tmp_path):
    """Ranks starting with a warm cache load their loops side by side: with the signature on
    disk, :func:`compiling_alone` takes no lock (a lock held elsewhere is not waited for); a
    signature not on disk still waits for it."""
    import fcntl
    import importlib.util
    import warnings

    import numba

    from meshchain.backends.compile_once import cached_on_disk, compiling_alone, lock_path

    source = tmp_path / "warm_module.py"
    source.write_text("import numba\n\n\n@numba.njit(cache=True)\ndef warm(x):\n    return x + 1\n")

    def fresh():  # another process's dispatcher: nothing compiled in memory
        spec = importlib.util.spec_from_file_location("warm_module", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.warm

    on_disk, elsewhere = (numba.int64,), (numba.float64,)
    first = fresh()
    assert not cached_on_disk(first, on_disk)
    first.compile(on_disk)
    second = fresh()
    assert cached_on_disk(second, on_disk) and not cached_on_disk(second, elsewhere)
    path = lock_path(second)
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process compiling something
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with compiling_alone(second, on_disk, wait=0.2):
                second.compile(on_disk)
        assert second(1) == 2 and second.stats.cache_hits[on_disk] == 1  # loaded, not compiled
        with pytest.warns(mc.MeshchainWarning, match=r"\[compile-lock\] waited 0 s"):
            with compiling_alone(second, elsewhere, wait=0.2):
                second.compile(elsewhere)
    finally:
        os.close(holder)


# --------------------------------------------------------------------------- #
# Empty sets
# --------------------------------------------------------------------------- #
@mc.kernel
def touch_all(a, b1, b2, whole, direct, total, smallest):
    b1[0] += a[0]
    b2[0] += whole[1, 0]
    direct[0] = a[0]
    total[0] += 1.0
    smallest[0] = min(smallest[0], a[0])


def test_empty_iteration_set(backend):
    nodes, edges = mc.Set(3, "nodes"), mc.Set(0, "edges")
    e2n = mc.Map(edges, nodes, 2, np.zeros((0, 2), dtype=np.int64), "e2n")
    a = mc.Dat(nodes, 1, np.arange(3.0), "a")
    b = mc.Dat(nodes, 1, np.arange(3.0), "b")
    direct = mc.Dat(edges, 1, None, "direct")
    total, smallest = mc.Global(1, 5.0, "total"), mc.Global(1, 7.0, "smallest")
    mc.par_loop(touch_all, edges, a(mc.READ, e2n[0]), b(mc.INC, e2n[0]), b(mc.INC, e2n[1]),
                a(mc.READ, e2n), direct(mc.WRITE), total(mc.INC), smallest(mc.MIN))
    assert b.data[:, 0].tolist() == [0.0, 1.0, 2.0]
    assert direct.data.shape == (0, 1)
    assert total.value.tolist() == [5.0] and smallest.value.tolist() == [7.0]
    record = mc.stats().loops["touch_all"]
    assert (record.calls, record.iterations) == (1, 0)


def test_empty_data_set(backend):
    empty = mc.Set(0, "empty")
    q = mc.Dat(empty, 3, None, "q", dtype=np.int32)
    (one,) = digits(1)
    count = mc.Global(1, 0, "count", dtype=np.int64)
    mc.par_loop(mc.Kernel.from_source("def k(a, d, c):\n    a[0] = d[0]\n    c[0] += 1\n"), empty,
                q(mc.WRITE), one(mc.READ), count(mc.INC))
    assert q.data.shape == (0, 3) and q.data.dtype == np.int32
    assert count.value.tolist() == [0]


def test_changing_a_read_global_does_not_recompile():
    """Globals read by kernels are run-time arguments: a new value reuses the compiled loop."""
    mc.configure(backend="numba")
    cells = mc.Set(5, "cells")
    out = mc.Dat(cells, 1, None, "out")
    scale = mc.Global(1, 2.0, "scale")

    @mc.kernel
    def scaled_copy(o, s):
        o[0] = s[0] * 3.0

    mc.par_loop(scaled_copy, cells, out(mc.WRITE), scale(mc.READ))
    compiled = mc.stats().loops["scaled_copy"].compilations
    for value in (5.0, -1.5):
        scale.value = value
        mc.par_loop(scaled_copy, cells, out(mc.WRITE), scale(mc.READ))
        np.testing.assert_array_equal(out.data[:, 0], np.full(5, value * 3.0))
    assert mc.stats().loops["scaled_copy"].compilations == compiled
