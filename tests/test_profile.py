"""The profiler (``mc.profile``, ``config.profile``) and the summary (``mc.stats(summary=True)``):
traces valid in the trace-event format, events that name what ran and add up, and bandwidth
figures that follow from the access descriptors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import meshchain as mc
from meshchain.apps import airfoil
from meshchain.core.profiling import loop_seconds, validate_trace
from meshchain.meshes import naca0012

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


@mc.kernel
def double(a):
    a[0] *= 2.0


@mc.kernel
def add_up(a, s):
    s[0] += a[0]


def _complete(events, cat=None):
    return [e for e in events if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def test_a_profile_block_writes_a_valid_trace_of_what_ran(tmp_path):
    mc.reset_runtime()
    cells = mc.Set(500, "cells")
    q = mc.Dat(cells, 1, np.ones(500), "q")
    path = tmp_path / "sub" / "trace.json"
    with mc.profile(path) as profile:
        for _ in range(3):
            mc.par_loop(double, cells, q(mc.RW))
        total = mc.Global(1, 0.0, "total")
        mc.par_loop(add_up, cells, q(mc.READ), total(mc.INC))
    assert float(total.value[0]) == 500 * 8.0
    document = json.loads(path.read_text())
    assert validate_trace(document) == []
    assert profile.path == path and document["traceEvents"] == profile.events
    runs = [e["name"] for e in _complete(profile.events, "unit")]
    assert runs == ["loop double"] * 3 + ["loop add_up"]
    assert {e["name"] for e in _complete(profile.events, "build")} >= {"build loop double", "build loop add_up"}
    phases = _complete(profile.events, "phase")
    assert [e["args"]["loops"] for e in phases[:1]] == [{"double": {"owned": 500, "redundant": 0}}]
    for e in _complete(profile.events):  # inside the block, in order of time on one track
        assert 0 <= e["ts"] and e["ts"] + e["dur"] <= profile.seconds * 1e6 + 1
    names = {e["args"]["name"] for e in profile.events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0"}


def test_nothing_is_recorded_outside_a_block_and_blocks_do_not_nest(tmp_path):
    mc.reset_runtime()
    cells = mc.Set(10, "cells")
    q = mc.Dat(cells, 1, np.ones(10), "q")
    with mc.profile() as profile:
        with pytest.raises(mc.ConfigurationError, match="do not nest"):
            with mc.profile():
                pass
        mc.par_loop(double, cells, q(mc.RW))
    before = len(profile.events)
    mc.par_loop(double, cells, q(mc.RW))
    mc.flush()
    assert len(profile.events) == before and profile.path is None
    assert float(q.data_ro[0, 0]) == 4.0


def test_a_profile_that_cannot_be_written_raises_an_output_error(tmp_path):
    mc.reset_runtime()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(mc.OutputError, match="cannot write the profile"):
        with mc.profile(blocker / "trace.json"):
            pass


def test_a_captured_replay_is_an_event_around_its_plan_run():
    mc.reset_runtime()
    cells = mc.Set(8, "cells")
    q = mc.Dat(cells, 1, np.ones(8), "q")

    @mc.capture(name="twice")
    def step():
        mc.par_loop(double, cells, q(mc.RW))
        mc.par_loop(double, cells, q(mc.RW))

    step()
    with mc.profile() as profile:
        step()
        step()
    replays = _complete(profile.events, "replay")
    runs = _complete(profile.events, "unit")
    assert [e["name"] for e in replays] == ["replay twice"] * 2
    assert [e["name"] for e in runs] == ["chain twice"] * 2
    for replay, run in zip(replays, runs):
        assert replay["ts"] <= run["ts"] and run["ts"] + run["dur"] <= replay["ts"] + replay["dur"] + 1e-3
    assert float(q.data_ro[0, 0]) == 2.0 ** 6


def test_loop_seconds_add_up_to_the_runs():
    mc.reset_runtime()
    problem = airfoil.declare(naca0012(12, 18))
    airfoil.run(problem, 1, out=None, ca=False)
    with mc.profile() as profile:
        for _ in range(2):
            airfoil.iterate(problem, ca=False)
    per_loop = loop_seconds(profile.events)
    assert set(per_loop) == {"save_soln", "adt_calc", "res_calc", "bres_calc", "update"}
    runs = sum(e["dur"] for e in _complete(profile.events, "unit")) * 1e-6
    assert sum(per_loop.values()) == pytest.approx(runs, rel=1e-9)
    assert runs <= profile.seconds


def test_the_session_wide_profile_is_written_at_exit(tmp_path):
    path = tmp_path / "run.json"
    script = ("import numpy as np, meshchain as mc\n"
              "s = mc.Set(10, 's'); d = mc.Dat(s, 1, np.ones(10), 'd')\n"
              "k = mc.Kernel.from_source('def k(a):\\n    a[0] += 1.0\\n')\n"
              "mc.par_loop(k, s, d(mc.RW)); mc.flush()\n")
    env = {**os.environ, "MESHCHAIN_PROFILE": str(path)}
    env.pop("MESHCHAIN_MPI_CHILD", None)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    document = json.loads(path.read_text())
    assert validate_trace(document) == []
    assert [e["name"] for e in _complete(document["traceEvents"], "unit")] == ["loop k"]


def test_configure_profile_starts_and_writes_a_profile(tmp_path):
    mc.reset_runtime()
    cells = mc.Set(10, "cells")
    q = mc.Dat(cells, 1, np.ones(10), "q")
    path = tmp_path / "configured.json"
    mc.configure(profile=path)
    try:
        mc.par_loop(double, cells, q(mc.RW))
        mc.flush()
    finally:
        mc.configure(profile=None)
    document = json.loads(path.read_text())
    assert [e["name"] for e in _complete(document["traceEvents"], "unit")] == ["loop double"]


def test_the_summary_bandwidth_is_the_loops_bytes_over_its_compute_time():
    mc.reset_runtime()
    cells = mc.Set(20_000, "cells")
    q = mc.Dat(cells, 1, np.ones(20_000), "q")
    mc.par_loop(double, cells, q(mc.RW))
    mc.stats(reset=True)
    for _ in range(4):
        mc.par_loop(double, cells, q(mc.RW))
    summary = mc.stats(summary=True)
    row = summary.loops["double"]
    plain = mc.stats().loops["double"]
    assert row.calls == 4 and row.bytes_moved == 4 * 20_000 * 8 * 2  # RW: read and written
    assert row.gbytes_per_second == pytest.approx(row.bytes_moved / plain.time_compute / 1e9, rel=1e-9)
    assert summary.copy_bandwidth > 0 and "double" in str(summary)
    assert 0 < row.percent <= 100


@pytest.mark.mpi(nprocs=2, timeout=240)
def test_a_two_rank_airfoil_ca_trace(comm, tmp_path_factory):
    mc.reset_runtime(comm=comm)
    problem = airfoil.declare(naca0012(24, 36))
    airfoil.run(problem, 1, out=None, ca=True)
    path = comm.bcast(str(tmp_path_factory.mktemp("trace") / "airfoil.json") if comm.rank == 0 else None)
    mc.stats(reset=True)
    with mc.profile(path):
        for _ in range(3):
            airfoil.iterate(problem, ca=True)
    stats = mc.stats(all_ranks=True)
    summary = mc.stats(summary=True)
    if comm.rank == 0:
        document = json.loads(open(path).read())
        assert validate_trace(document) == []
        events = document["traceEvents"]
        assert {e["pid"] for e in events} == {0, 1}
        ranks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        assert ranks == {"rank 0", "rank 1"}
        runs = [e for e in _complete(events, "unit") if e["pid"] == 0]
        assert [e["name"] for e in runs] == ["loop save_soln", "chain stage", "chain stage"] * 3
        posts = [e for e in _complete(events, "exchange") if e["name"] == "stage: post"]
        waits = [e for e in _complete(events, "exchange") if e["name"] == "stage: wait"]
        assert len(posts) == len(waits) == 2 * 6
        assert all(e["args"]["neighbours"] == [1 - e["pid"]] for e in posts)
        assert sum(e["args"]["bytes"] for e in posts) == stats.chains["stage"].bytes_sent
        halo = [e for e in _complete(events, "phase") if e["name"] == "stage: halo"]
        assert halo and all(sum(c["redundant"] for c in e["args"]["loops"].values()) > 0 for e in halo)
        per_loop = loop_seconds(events)
        assert set(per_loop) == {"save_soln", "adt_calc", "res_calc", "bres_calc", "update"}
        runs = sum(e["dur"] for e in _complete(events, "unit")) * 1e-6
        reading = [e for e in _complete(events, "reduction") if e["name"] == "update: reduction wait"]
        assert reading and all(e["args"]["loops"] == ["update"] for e in reading)  # reading rms waits for update's
        assert runs <= sum(per_loop.values()) <= runs + sum(e["dur"] for e in reading) * 1e-6 + 1e-9
    assert summary.ranks == 2 and summary.chains["stage"].mode == "ca"
    assert summary.chains["stage"].messages == stats.chains["stage"].messages
    assert summary.loops["update"].bytes_moved == stats.loops["update"].bytes_moved
    assert summary.loops["update"].time_max >= summary.loops["update"].time_min > 0


def test_pool_threads_that_run_chunks_get_tracks_of_their_own():
    import time as clock

    from meshchain.backends.threads import ChunkedCall, WorkerPool

    mc.reset_runtime()

    def slow(_):
        clock.sleep(0.002)

    groups = [[(slow, (i,)) for i in range(12)]]
    call = ChunkedCall(groups, pool=WorkerPool(2))
    try:
        with mc.profile() as profile:
            call.run()
    finally:
        call.pool.close()
    chunks = [e for e in _complete(profile.events, "phase") if e["name"] == "worker: core chunks"]
    names = {e["tid"]: e["args"]["name"] for e in profile.events if e["name"] == "thread_name"}
    assert chunks and sum(e["args"]["chunks"] for e in chunks) <= 12
    assert all(names[e["tid"]] != "main" for e in chunks)  # the pool's threads, not the caller
    assert validate_trace({"traceEvents": profile.events}) == []
