"""Hang diagnostics (``hang_timeout``): the watchdog on one process, and three ranks one of
which computes for seconds while the others wait for it.

The scenarios on several ranks run this file as a script under ``mpiexec -n 3``
(``python tests/test_hang_mpi.py DIRECTORY ACTION``): every rank sends its standard error
to ``DIRECTORY/rank<r>.err`` (the reports of different ranks never interleave) and rank 0
prints one ``RESULT {json}`` line. The wall clock is asserted only loosely: the reports
come after ``hang_timeout`` and the abort long before the stuck rank would finish.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import launch_script

import meshchain as mc
from meshchain.comm import hang
from meshchain.comm.exchange import HaloExchange, HaloItem
from meshchain.core import activity
from meshchain.core.config import Config
from meshchain.core.errors import ConfigurationError

TIMEOUT = 0.5
"""The ``hang_timeout`` of the scenarios (seconds)."""
STUCK = 2.0
"""Seconds the stuck rank's kernel sleeps, per round of the report scenario."""
ABORT_STUCK = 30.0
"""Seconds the stuck rank's kernel would sleep in the abort scenario (the job ends long before)."""
SCRIPT_TIMEOUT = 90
"""Seconds after which a launch is killed (the scenarios take a few)."""
ROUNDS = ("persistent", "neighbour")
"""The transports of the report scenario's rounds: one that tells which neighbours' messages
are missing, one whose completion is one for all neighbours."""


@pytest.fixture
def watched():
    """Activity noted (as while a watchdog runs), and nothing left noted afterwards."""
    activity.watched = True
    yield
    activity.watched, activity.unit, activity.wait = False, None, None


# --- one process ---------------------------------------------------------------------------------------


def test_a_wait_is_reported_once_after_the_timeout_with_its_neighbours_and_every_threads_stack(watched, tmp_path):
    with open(tmp_path / "err", "w+") as stream:
        dog = hang.Watchdog(TIMEOUT, rank=4, stream=stream)
        activity.unit = "loop 'update'"
        with activity.Wait("the halo exchange of 'q'", neighbours=[5, 3]) as record:
            record.outstanding, record.sending = (5,), (3,)
            assert dog.check(record.since + 0.4) is None
            assert dog.check(record.since + 0.6) is not None
            assert dog.check(record.since + 5.0) is None  # once per wait
        with activity.Wait("collective agree_on_failure") as other:  # a new wait: reported again
            assert dog.check(other.since + 0.6) is not None
        stream.seek(0)
        text = stream.read()
    first, second = text.split("==== end of meshchain hang report: rank 4 ====\n")[:2]
    assert first.startswith("==== meshchain hang report: rank 4 ====\n")
    lines = first.splitlines()
    assert lines[1] == "rank 4 waits in the halo exchange of 'q' of loop 'update', for 0.60 s so far"
    assert lines[2] == "outstanding: messages from rank 5 (of neighbours 3, 5)"
    assert lines[3] == "sends not complete: to rank 3"
    assert lines[4].startswith("action: keeps waiting")
    assert "Current thread" in first and "most recent call first" in first  # faulthandler's stacks
    assert "test_hang_mpi.py" in first
    assert "rank 4 waits in collective agree_on_failure of loop 'update'" in second
    assert "outstanding: every rank of the communicator (a collective)" in second


def test_a_plan_computing_longer_than_the_timeout_is_reported_once(watched):
    dog = hang.Watchdog(TIMEOUT, rank=2, stream=_Sink())
    activity.unit, activity.unit_since, activity.wait_ended = "chain 'rk'", 100.0, 0.0
    assert dog.check(100.3) is None
    report = dog.check(100.7)
    assert "rank 2 is still computing in chain 'rk', for 0.70 s so far (no message or collective pending)" in report
    assert "Thread" in report and "most recent call last" in report  # stacks formatted here: no file
    assert dog.check(101.5) is None  # once
    # a wait that ended later starts a new stretch of computation
    activity.wait_ended = 101.6
    assert dog.check(101.8) is None
    assert "for 0.70 s" in dog.check(102.3)
    # the engine notes a new unit and its start in two steps: a half-written pair is not reported
    dog = hang.Watchdog(TIMEOUT, stream=_Sink())
    activity.unit, activity.unit_since = "loop 'next'", 100.0  # new unit, start not yet noted
    assert dog.check(200.0) is None
    activity.unit_since = 200.1
    assert dog.check(200.2) is None and dog.check(200.3) is None


def test_watch_starts_retunes_and_stops_the_watchdog():
    try:
        dog = hang.watch(Config(hang_timeout=8.0))
        assert activity.watched and dog.is_alive() and dog.daemon and (dog.timeout, dog.interval) == (8.0, 0.5)
        assert hang.watch(Config(hang_timeout=0.2, hang_action="abort")) is dog
        assert (dog.timeout, dog.interval, dog.action) == (0.2, 0.05, "abort")
    finally:
        hang.unwatch()
    assert not activity.watched
    dog.join(2)
    assert not dog.is_alive()
    assert hang.watch(Config()) is None and not activity.watched


def test_the_options_are_checked_and_read_from_the_environment():
    for bad in (0, -1.0, "1", True, float("inf")):
        with pytest.raises(ConfigurationError, match="hang_timeout"):
            Config(hang_timeout=bad)
    with pytest.raises(ConfigurationError, match="hang_action"):
        Config(hang_action="shout")
    config = Config.from_env({"MESHCHAIN_HANG_TIMEOUT": "2.5", "MESHCHAIN_HANG_ACTION": "abort"})
    assert (config.hang_timeout, config.hang_action) == (2.5, "abort")
    assert Config.from_env({"MESHCHAIN_HANG_TIMEOUT": "off"}).hang_timeout is None
    with pytest.raises(ConfigurationError, match="MESHCHAIN_HANG_TIMEOUT"):
        Config.from_env({"MESHCHAIN_HANG_TIMEOUT": "soon"})


def test_waits_that_cannot_tell_neighbours_apart_name_them_all(watched):
    seen = []

    class Whole:  # a transport whose run completes as a whole (as "neighbour" and "rma")
        name = "rma"

        class directions:  # noqa: N801 - stands in for the transport's attribute
            pass

        def in_flight(self, reverse):
            return None

        def wait(self, reverse):
            record = activity.wait
            seen.append((record.what, record.outstanding, record.note))

    direction = type("Direction", (), {"into_ranges": ((2, 0, 4),), "out_ranges": ((1, 0, 2), (2, 2, 3))})()
    Whole.directions = (direction, direction)
    hang.wait_transport(Whole(), False, "the halo exchange of 'q'")
    assert seen == [("the halo exchange of 'q'", (1, 2), "not observable per neighbour with transport 'rma'")]
    assert activity.wait is None and activity.wait_ended > 0


def test_exchanges_poll_only_while_watched(monkeypatch):
    from mpi4py import MPI

    values = np.array([[1.0], [0.0]])
    exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0]}, {0: [1]})], tag=5, transport="p2p")
    exchange.label = "'v'"
    noted = []
    real = hang.wait_messages

    def spy(requests, owners, what, note=""):
        noted.append((owners, what))
        real(requests, owners, what, note)

    monkeypatch.setattr(hang, "wait_messages", spy)
    exchange.begin()
    exchange.end()  # not watched: the blocking wait, nothing noted
    assert noted == [] and values[1, 0] == 1.0
    activity.watched = True
    try:
        values[0, 0] = 2.0
        exchange.begin()
        exchange.end()
    finally:
        activity.watched = False
    assert noted == [([(0, True), (0, False)], "the halo exchange of 'v' (forward, transport 'p2p')")]
    assert values[1, 0] == 2.0 and activity.wait is None
    exchange.close()


def test_an_abort_on_one_process_ends_it_with_the_report(tmp_path):
    script = tmp_path / "nap.py"
    script.write_text("import time\n"
                      "import meshchain as mc\n\n\n"
                      "@mc.kernel\n"
                      "def nap(a):\n"
                      "    time.sleep(a[0])\n\n\n"
                      "s = mc.Set(1, 's')\n"
                      "mc.par_loop(nap, s, mc.Dat(s, 1, [30.0], 'a')(mc.READ))\n"
                      "mc.flush()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MESHCHAIN_", "HYDI_"))}
    env.update(MESHCHAIN_BACKEND="reference", MESHCHAIN_HANG_TIMEOUT="0.3", MESHCHAIN_HANG_ACTION="abort")
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=25, env=env)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - began < 20
    assert "rank 0 is still computing in loop 'nap'" in done.stderr, done.stderr
    assert "action: aborts the job (hang_action='abort')" in done.stderr
    assert "Current thread" in done.stderr and "==== end of meshchain hang report: rank 0 ====" in done.stderr
    assert 'nap.py", line 7 in nap' in done.stderr  # the kernel's own line, in the main thread's stack


class _Sink:
    """A stream without a file descriptor (the stacks are then formatted by the watchdog)."""

    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass


# --- three ranks: mpiexec -n 3 python tests/test_hang_mpi.py DIRECTORY ACTION ------------------------------


@pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
def test_the_stuck_rank_names_its_chain_and_its_neighbours_name_it(tmp_path):
    status, output = launch(tmp_path, "report", {})
    assert status == 0, f"exit {status}:\n{output[-6000:]}\n{_reports_text(tmp_path)}"
    result = [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")][-1]
    assert result["correct"], result
    stuck = result["stuck"]
    assert len(stuck) == 1, result  # the sleeping cell is owned by one rank
    stuck = stuck[0]
    reports = read_reports(tmp_path)
    for rank, found in reports.items():
        for report in found:  # every report carries every thread's stack and says what follows
            assert "Current thread" in report and "most recent call first" in report, report
            assert "action: keeps waiting (hang_action='report'" in report, report
    computing = [r for r in reports[stuck] if "is still computing" in r]
    assert len(computing) == len(ROUNDS), reports[stuck]  # once per round
    assert all(f"rank {stuck} is still computing in chain 'rk'" in r for r in computing)
    waiting = {transport: [] for transport in ROUNDS}
    for rank, found in reports.items():
        for report in found:
            match = re.search(r"waits in (?:the start of )?the halo exchange of 'b' \(forward, transport '(\w+)'\) "
                              r"of chain 'rk'", report)
            if match:
                waiting[match.group(1)].append((rank, report))
    for transport in ROUNDS:  # every neighbour of the stuck rank waits for it in the exchange of 'b'
        assert {rank for rank, _ in waiting[transport]} == set(result["neighbours"][str(stuck)]), (transport, reports)
        for rank, report in waiting[transport]:
            outstanding = re.search(r"outstanding: (?:messages from )?ranks? ((?:\d+, )*\d+)", report)
            assert outstanding and str(stuck) in outstanding.group(1).split(", "), report
    assert all("not observable per neighbour with transport 'neighbour'" in r for _, r in waiting["neighbour"])
    assert not any("not observable" in r for _, r in waiting["persistent"])
    for rank, found in reports.items():  # one report per round: the stuck rank computes, the others wait
        assert len(found) == len(ROUNDS) and (rank == stuck or not any("computing" in r for r in found)), found


@pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
def test_hang_action_abort_ends_the_job_with_the_report(tmp_path):
    began = time.monotonic()
    status, output = launch(tmp_path, "abort", {})
    assert status != 0, output[-3000:]
    assert time.monotonic() - began < ABORT_STUCK - 5  # long before the stuck rank would go on
    assert "RESULT" not in output
    reports = [r for found in read_reports(tmp_path).values() for r in found]
    assert reports, f"no report:\n{output[-3000:]}"
    assert all("action: aborts the job (hang_action='abort')" in r and "Current thread" in r for r in reports)


def launch(directory: Path, action: str, environment: dict) -> tuple[int, str]:
    """This file as a script under ``mpiexec -n 3`` (killed, with everything it started, after
    :data:`SCRIPT_TIMEOUT` seconds); (exit status, output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "MESHCHAIN_", "HYDI_"))}
    env.update(environment)
    return launch_script([str(Path(__file__).resolve()), str(directory), action], env, nprocs=3,
                         timeout=SCRIPT_TIMEOUT, what=action, detail=lambda: _reports_text(directory))


def read_reports(directory: Path) -> dict:
    """Rank -> the hang reports in its standard error."""
    found = {}
    for path in sorted(directory.glob("rank*.err")):
        rank = int(path.stem[len("rank"):])
        text = path.read_text(errors="replace")
        found[rank] = re.findall(rf"==== meshchain hang report: rank {rank} ====\n.*?"
                                 rf"==== end of meshchain hang report: rank {rank} ====\n", text, re.S)
    return found


def _reports_text(directory: Path) -> str:
    return "\n".join(f"--- {path.name}:\n{path.read_text(errors='replace')[-4000:]}"
                     for path in sorted(directory.glob("rank*.err")))


# --- the script's side -------------------------------------------------------------------------------------


@mc.kernel
def slow(delay, a, b):
    if delay[0] > 0.0:
        time.sleep(delay[0])  # the stuck rank: its own loop, in its own chain
    b[0] = a[0] + 1.0


@mc.kernel
def flux(b1, b2, r1, r2):
    r1[0] += b2[0]
    r2[0] += b1[0]


def main(directory: str, action: str) -> None:
    """The scenario on every rank (see the module docstring)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    error = os.open(os.path.join(directory, f"rank{comm.rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(error, 2)  # this rank's reports go to its own file
    from meshchain.meshes import structured_quads

    mc.reset_runtime(comm=comm, backend="reference", eager=False, progress="none", transport=ROUNDS[0])
    mesh = structured_quads(6, 6)
    d = mesh.declare()
    delay = mc.Dat(d.cells, 1, None, "delay")
    a = mc.Dat(d.cells, 1, np.arange(mesh.ncell, dtype=np.float64), "a")
    b = mc.Dat(d.cells, 1, None, "b")
    r = mc.Dat(d.cells, 1, None, "r")
    mc.partition("rib", coords=d.coords)
    layout = mc.get_runtime().layout.of(d.cells)
    owned = np.asarray(layout.global_ids[:layout.n_owned])

    def step():
        with mc.loop_chain("rk", ca=False):
            mc.par_loop(slow, d.cells, delay(mc.READ), a(mc.READ), b(mc.WRITE))
            mc.par_loop(flux, d.facets, b(mc.READ, d.facet2cell[0]), b(mc.READ, d.facet2cell[1]),
                        r(mc.INC, d.facet2cell[0]), r(mc.INC, d.facet2cell[1]))
        mc.flush()

    step()  # unwatched: compiles what the first run compiles (slow on an oversubscribed core)
    delay.data[owned == 14, 0] = STUCK if action == "report" else ABORT_STUCK  # a cell well inside: one rank owns it
    rounds = ROUNDS if action == "report" else ROUNDS[:1]
    mc.configure(hang_timeout=TIMEOUT, hang_action="abort" if action == "abort" else "report")
    for transport in rounds:
        mc.configure(transport=transport)
        step()
    everywhere = comm.gather((bool(np.any(owned == 14)), sorted(int(n) for n in layout.imports)), root=0)
    gathered = r.gather()
    if comm.rank == 0:
        expected = np.zeros(mesh.ncell)
        left, right = mesh.facet_cells[:, 0], mesh.facet_cells[:, 1]
        np.add.at(expected, left, np.arange(mesh.ncell, dtype=np.float64)[right] + 1.0)
        np.add.at(expected, right, np.arange(mesh.ncell, dtype=np.float64)[left] + 1.0)
        stuck = [rank for rank, (owns, _) in enumerate(everywhere) if owns]
        neighbours = {rank: near for rank, (_, near) in enumerate(everywhere)}
        correct = bool(np.array_equal(gathered[:, 0], (1 + len(rounds)) * expected))
        print("RESULT " + json.dumps({"stuck": stuck, "neighbours": neighbours, "correct": correct}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
