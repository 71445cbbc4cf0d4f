"""Progress modes of halo exchanges: ``test()`` on every transport, the ``Poller`` moving a
large (rendezvous) message while the main thread computes, MPICH's asynchronous progress
thread, and the checks that refuse a mode that cannot work.

The wall clock is never asserted, only the order of events: the poller saw the exchange
complete before the computation ended; the data arrived while both ranks slept.

Some scenarios need MPI started with another environment (MPICH's TCP module, its
asynchronous progress thread): plain tests run this file as a script under ``mpiexec``
(``python tests/test_progress_mpi.py SCENARIO``), which prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import launch_script

import meshchain.comm.progress as progress
import meshchain.comm.transports as transports
import meshchain.comm.world as world
from meshchain.comm.exchange import TRANSPORTS, HaloExchange, HaloItem
from meshchain.comm.progress import PROGRESS_MODES, Poller, check_progress, measure_progress
from meshchain.core.errors import ConfigurationError, MeshchainError

BIG = 8 << 20
"""Bytes per message: far above MPICH's eager limit, so the rendezvous protocol (which
needs both sides to call MPI) moves them."""
NAP = 0.3
"""Seconds of the stand-in computation."""
VARIANTS = (*TRANSPORTS, "neighbour-ineighbor")
"""Every transport, and the neighbour transport without persistent collectives."""
TCP = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
SCRIPT_TIMEOUT = 240


class variant:
    """``with variant(name) as transport``: the transport to build, with the neighbour
    transport's persistent collectives turned off for ``"neighbour-ineighbor"``."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> str:
        self.saved = transports.Neighbour.use_persistent
        transports.Neighbour.use_persistent = self.name != "neighbour-ineighbor"
        return "neighbour" if self.name == "neighbour-ineighbor" else self.name

    def __exit__(self, *exc_info):
        transports.Neighbour.use_persistent = self.saved


# --- exchange patterns every rank knows in full -----------------------------------------------------------


class Ring:
    """``nbytes`` of float64 rows from every rank to ranks ``rank ± 1`` (one message per
    neighbour), the values depending on the rank and the run."""

    def __init__(self, comm, nbytes: int):
        self.size, self.rank, self.rows = comm.size, comm.rank, nbytes // 8
        self.halo = len(self.neighbours(self.rank)) * self.rows

    def neighbours(self, rank: int) -> list:
        return sorted({(rank - 1) % self.size, (rank + 1) % self.size})

    def owned(self, rank: int, run: int) -> np.ndarray:
        return rank * 1e7 + run * 0.5 + np.arange(len(self.neighbours(rank)) * self.rows, dtype=np.float64)

    def exchange(self, comm, transport: str) -> tuple[HaloExchange, np.ndarray]:
        rows, halo = self.rows, self.halo
        values = np.zeros((2 * halo, 1))
        mine = self.neighbours(self.rank)
        exports = {n: np.arange(i * rows, (i + 1) * rows) for i, n in enumerate(mine)}
        imports = {n: halo + np.arange(i * rows, (i + 1) * rows) for i, n in enumerate(mine)}
        return HaloExchange(comm, [HaloItem(values, exports, imports)], tag=11, transport=transport), values

    def received(self, run: int) -> np.ndarray:
        """The halo rows after a forward run: each neighbour's block for this rank."""
        blocks = []
        for n in self.neighbours(self.rank):
            at = self.neighbours(n).index(self.rank) * self.rows
            blocks.append(self.owned(n, run)[at: at + self.rows])
        return np.concatenate(blocks)

    def arrived(self, exchange: HaloExchange, run: int, reverse: bool = False) -> bool:
        """Whether the received words are in the exchange's wire (read without calling MPI)."""
        wire = exchange.send.buffer if reverse else exchange.receive.buffer
        return wire.tobytes() == self.received(run).tobytes()


def gather_to_zero(comm, transport: str, rows: int = 3):
    """Ranks >= 1 send ``rows`` rows to rank 0, which keeps rank s's in rows
    ``[s * rows, (s + 1) * rows)`` (forward); reverse runs send them back. Returns the
    exchange and the values."""
    rank, size = comm.rank, comm.size
    if rank == 0:
        values = np.zeros((size * rows, 1))
        item = HaloItem(values, {}, {s: np.arange(s * rows, (s + 1) * rows) for s in range(1, size)})
    else:
        values = np.zeros((rows, 1))
        item = HaloItem(values, {0: np.arange(rows)}, {})
    return HaloExchange(comm, [item], tag=9, transport=transport), values


def gathered(rank: int, rows: int, reverse: bool) -> np.ndarray:
    """What rank ``rank`` (>= 1) sends in a forward run, or receives in a reverse run."""
    return (-10.0 * (rank + 1) if reverse else 100.0 * (rank + 1)) - np.arange(rows, dtype=np.float64)


def fill(comm, values, rows: int, reverse: bool) -> None:
    """Before a run: the senders' rows, and -1 where words are to arrive."""
    values[...] = -1.0
    if comm.rank and not reverse:
        values[:, 0] = gathered(comm.rank, rows, False)
    elif comm.rank == 0 and reverse:
        for s in range(1, comm.size):
            values[s * rows: (s + 1) * rows, 0] = gathered(s, rows, True)


def check_gathered(comm, values, rows: int, reverse: bool, name: str) -> list:
    """What went wrong in the values after a run."""
    if comm.rank:
        right = np.array_equal(values[:, 0], gathered(comm.rank, rows, reverse))
    else:
        right = all(np.array_equal(values[s * rows: (s + 1) * rows, 0], gathered(s, rows, reverse))
                    for s in range(1, comm.size))
    return [] if right else [f"{name}: wrong values after end (reverse={reverse})"]


# --- test(): False until the partner starts, True after ------------------------------------------------


def wait_by_testing(test) -> None:
    while not test():
        time.sleep(1e-4)


def ordered_runs(comm, order, name: str) -> list:
    """One forward and one reverse run of ``gather_to_zero``, the receivers beginning (and
    testing) before the senders, ordered by a barrier on ``order``; what went wrong."""
    rank, rows, problems = comm.rank, 3, []
    with variant(name) as transport:
        exchange, values = gather_to_zero(comm, transport, rows)
        # collective objects (graph communicators, windows) are made at each direction's first run
        exchange.begin(), exchange.end(), exchange.begin_reverse("replace"), exchange.end_reverse()
        for reverse in (False, True):
            fill(comm, values, rows, reverse)
            begin = (lambda: exchange.begin_reverse("replace")) if reverse else exchange.begin
            test = exchange.test_reverse if reverse else exchange.test
            if (rank == 0) != reverse:  # receiving: begin first
                begin()
                if test():
                    problems.append(f"{name}: test() is True before the senders began (reverse={reverse})")
                order.Barrier()
            else:
                order.Barrier()
                begin()
            wait_by_testing(test)
            if not test():
                problems.append(f"{name}: test() went back to False (reverse={reverse})")
            (exchange.end_reverse if reverse else exchange.end)()
            problems += check_gathered(comm, values, rows, reverse, name)
        exchange.close()
    return problems


@pytest.mark.mpi(nprocs=(2, 3), timeout=180)
def test_test_is_false_until_the_partner_begins_and_end_unpacks_after_it(comm):
    order = comm.Dup()
    try:
        problems = [p for name in VARIANTS for p in ordered_runs(comm, order, name)]
    finally:
        order.Free()
    everywhere = comm.allgather(problems)
    assert not any(everywhere), everywhere


def test_test_on_one_process():
    from mpi4py import MPI

    values = np.zeros((4, 1))
    for transport in TRANSPORTS:
        idle = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {}, {})], tag=2, transport=transport)
        with pytest.raises(MeshchainError, match=r"test\(\) of a halo exchange needs a forward run"):
            idle.test()
        idle.begin()
        assert idle.test() and idle.test()
        idle.end()
        idle.begin_reverse("sum")
        assert idle.test_reverse()
        with pytest.raises(MeshchainError, match="needs a forward run"):
            idle.test()
        idle.end_reverse()
        with pytest.raises(MeshchainError, match=r"test_reverse\(\) .* needs a reverse run"):
            idle.test_reverse()
        idle.close()
        values[...] = np.arange(4.0)[:, None]
        self = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0, 1]}, {0: [3, 2]})], tag=2, transport=transport)
        assert self.idle is False
        for _ in range(2):
            self.begin()
            wait_by_testing(self.test)
            self.end()
        assert values[:, 0].tolist() == [0.0, 1.0, 1.0, 0.0]
        self.begin_reverse("sum")
        wait_by_testing(self.test_reverse)
        self.end_reverse()
        assert values[:, 0].tolist() == [0.0, 2.0, 1.0, 0.0]
        self.close()


# --- the poller moves a large message while the main thread computes -----------------------------------


_SPIN = []


def spin(seconds: float) -> None:
    """A compiled busy loop of about ``seconds`` that releases the GIL (numba, nogil)."""
    if not _SPIN:
        from numba import njit

        @njit(nogil=True)
        def loop(n):
            x = 0.0
            for i in range(n):
                x = x * 0.999999 + i
            return x

        loop(10)
        start = time.perf_counter()
        loop(10**7)
        _SPIN.append((loop, 10**7 / max(time.perf_counter() - start, 1e-6)))
    loop, per_second = _SPIN[0]
    loop(int(seconds * per_second))


def overlap(comm, name: str, compute, poller: Poller | None, *, reverse: bool = False) -> dict:
    """Begin a ring exchange of ``BIG`` bytes per neighbour (forward, or reverse with
    ``"replace"``), compute (the poller watching, if any), end it; whether it was complete
    before the computation ended, or (no poller) whether the data had arrived when it
    ended, and whether the values are right."""
    ring = Ring(comm, BIG)
    owned, halo = slice(None, ring.halo), slice(ring.halo, None)
    sent, kept = (halo, owned) if reverse else (owned, halo)
    with variant(name) as transport:
        exchange, values = ring.exchange(comm, transport)
        # collective objects are made at each direction's first run
        exchange.begin(), exchange.end(), exchange.begin_reverse("replace"), exchange.end_reverse()
        values[sent, 0] = ring.owned(comm.rank, 1)
        comm.Barrier()
        exchange.begin_reverse("replace") if reverse else exchange.begin()
        if poller is not None:
            poller.watch([exchange])
        compute()
        computed = time.perf_counter()
        done = poller.release() if poller is not None else None
        arrived = ring.arrived(exchange, 1, reverse)
        exchange.end_reverse() if reverse else exchange.end()
        right = values[kept, 0].tobytes() == ring.received(1).tobytes()
        exchange.close()
    return {"early": done is not None and done < computed, "arrived": arrived, "right": right}


ATTEMPTS = 3  # runs of one case before its poller counts as failed (a poller that never tests fails all)


def overlap_problems(comm, *, numba: bool) -> list:
    """What goes wrong with a poller (every variant; with a numba busy loop too where
    ``numba``), and in the control: p2p without a poller must leave some rank's data unmoved
    (otherwise the proof would prove nothing)."""
    runs = [(name, how, reverse) for name in VARIANTS for how, reverse in (("sleep", False), ("sleep", True))]
    runs += [("persistent", "numba", False), ("p2p", "numba", False)] if numba else []
    problems = []
    if numba:
        spin(0)  # compiled (and calibrated) before the clock matters
    with Poller() as poller:
        for name, how, reverse in runs:
            compute = (lambda: spin(NAP)) if how == "numba" else (lambda: time.sleep(NAP))
            for _ in range(ATTEMPTS):  # an oversubscribed rank's poller may get no core for a whole run
                outcome = overlap(comm, name, compute, poller, reverse=reverse)
                if not outcome["right"] or all(comm.allgather(outcome["early"])):
                    break
            what = f"{name} ({how}{', reverse' if reverse else ''})"
            if not outcome["early"]:
                problems.append(f"{what}: the poller did not see the exchange complete before the computation ended")
            if not outcome["right"]:
                problems.append(f"{what}: wrong values")
    control = comm.allgather(overlap(comm, "p2p", lambda: time.sleep(NAP), None))
    if all(c["arrived"] for c in control) and not progress.async_progress_enabled():
        problems.append("control: without a poller every rank's data arrived during the computation")
    return problems


@pytest.mark.mpi(nprocs=(2, 3), timeout=240)
def test_a_poller_moves_a_large_message_while_the_main_thread_computes(comm):
    everywhere = comm.allgather(overlap_problems(comm, numba=comm.size == 2))
    assert not any(everywhere), everywhere


# --- checking and measuring modes in the harness's MPI (no asynchronous progress) -----------------------


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_check_progress_in_a_normal_run(comm):
    assert check_progress("none", comm) == "none"
    assert check_progress("poll", comm) == "poll"  # mpi4py asks for MPI_THREAD_MULTIPLE
    for bad in ("busy", None, "Poll"):
        with pytest.raises(ConfigurationError, match="unknown progress mode .*'none', 'poll', 'thread'"):
            check_progress(bad, comm)
    if progress.async_progress_enabled():
        pytest.skip("this MPI was started with MPICH's asynchronous progress")
    with pytest.raises(ConfigurationError, match="'thread' needs MPICH's asynchronous progress thread.*"
                                                 "MESHCHAIN_PROGRESS=thread or MPIR_CVAR_ASYNC_PROGRESS=1"):
        check_progress("thread", comm)
    with pytest.raises(ConfigurationError, match="'thread' needs MPICH's asynchronous"):
        measure_progress(comm, lambda: None, modes=("none", "thread"))


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_measure_progress_gives_every_rank_the_same_positive_times(comm):
    measured = measure_progress(comm, lambda: time.sleep(2e-3), nbytes=1 << 20, repeats=3)
    assert set(measured) >= {"none", "poll"} and all(seconds > 0 for seconds in measured.values())
    assert comm.allgather(measured) == [measured] * comm.size
    only = measure_progress(comm, lambda: time.sleep(1e-3), nbytes=100, repeats=1, modes=("poll",))
    assert list(only) == ["poll"]
    calls = []

    def failing():
        calls.append(1)
        if comm.rank == 1 and len(calls) == 2:
            raise ValueError("kernel failed")

    with pytest.raises(ValueError, match="kernel failed"):  # on every rank, and nobody hangs
        measure_progress(comm, failing, nbytes=64, repeats=2)


# --- one process: checks and the poller ------------------------------------------------------------------


def clear_async_variables(monkeypatch) -> None:
    """Unset MPICH's asynchronous-progress variables for the test (restored afterwards)."""
    for name in (*world.ASYNC_PROGRESS_VARIABLES, world.PROGRESS_VARIABLE):
        monkeypatch.setenv(name, "")  # recorded, so that deleting it is undone too
        monkeypatch.delenv(name)


def test_check_progress_says_why_a_mode_cannot_work(monkeypatch):
    from mpi4py import MPI

    assert [check_progress(mode) for mode in PROGRESS_MODES] == list(PROGRESS_MODES)
    with pytest.raises(ConfigurationError,
                       match=r"unknown progress mode 'async': choose one of 'none', 'poll', 'thread'"):
        check_progress("async")
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_FUNNELED)
    with pytest.raises(ConfigurationError, match="'poll' .* MPI_THREAD_SERIALIZED .* runs at MPI_THREAD_FUNNELED"):
        check_progress("poll", MPI.COMM_SELF)
    with pytest.raises(ConfigurationError,
                       match="'thread' needs MPI at MPI_THREAD_MULTIPLE.*MESHCHAIN_PROGRESS=thread"):
        check_progress("thread", MPI.COMM_SELF)
    assert check_progress("none", MPI.COMM_SELF) == "none"
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_SERIALIZED)
    assert check_progress("poll", MPI.COMM_SELF) == "poll"
    assert check_progress("thread") == "thread"  # no communicator: one process


def test_async_progress_is_read_through_mpi_t_else_from_the_environment(monkeypatch):
    from mpi4py import MPI

    assert progress._read_cvar("MPIR_CVAR_ASYNC_PROGRESS") == int(world.async_progress_requested())
    assert progress._read_cvar("MPIR_CVAR_NO_SUCH_VARIABLE") == 0
    clear_async_variables(monkeypatch)
    monkeypatch.setattr(progress, "_cvar_cache", {"async": None})  # MPI_T unusable
    monkeypatch.setattr(world, "_async_at_init", None)  # someone else initialised MPI
    assert not progress.async_progress_enabled()
    monkeypatch.setenv("MPICH_ASYNC_PROGRESS", "yes")
    assert progress.async_progress_enabled()
    monkeypatch.setenv("MPIR_CVAR_ASYNC_PROGRESS", "0")  # MPICH reads this spelling last
    assert not progress.async_progress_enabled()
    monkeypatch.setattr(world, "_async_at_init", True)  # what the environment said at MPI_Init wins
    assert progress.async_progress_enabled()
    monkeypatch.setattr(progress, "_cvar_cache", {"async": 0})  # and what MPICH read, above all
    assert not progress.async_progress_enabled()
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_MULTIPLE)
    with pytest.raises(ConfigurationError, match="not switched on when MPI started: set MESHCHAIN_PROGRESS=thread"):
        check_progress("thread", MPI.COMM_SELF)


def test_meshchain_progress_thread_prepares_mpi_before_it_starts(monkeypatch):
    import mpi4py

    monkeypatch.setattr(mpi4py.rc, "thread_level", "funneled")
    monkeypatch.setattr(world, "_async_at_init", None)
    clear_async_variables(monkeypatch)
    monkeypatch.setenv("MESHCHAIN_PROGRESS", "thread")
    world._prepare_mpi()
    assert (os.environ["MPIR_CVAR_ASYNC_PROGRESS"], mpi4py.rc.thread_level) == ("1", "multiple")
    assert world.async_progress_at_init() is True
    monkeypatch.setenv("MPIR_CVAR_ASYNC_PROGRESS", "0")  # the user's own setting stays
    world._prepare_mpi()
    assert os.environ["MPIR_CVAR_ASYNC_PROGRESS"] == "0" and world.async_progress_at_init() is False
    monkeypatch.setenv("MESHCHAIN_PROGRESS", "poll")
    monkeypatch.setattr(mpi4py.rc, "thread_level", "serialized")
    world._prepare_mpi()
    assert mpi4py.rc.thread_level == "serialized"


def wait_until(condition, seconds: float = 10) -> None:
    """Sleep until ``condition()`` (a generous deadline, only so that a bug cannot hang)."""
    deadline = time.perf_counter() + seconds
    while not condition() and time.perf_counter() < deadline:
        time.sleep(1e-3)
    assert condition()


class OwingExchange:
    """A stand-in for a halo exchange whose own run is complete at once while the rank still
    owes its neighbours MPI progress: counts the poller's ``progress()`` calls."""

    idle, running, owes_progress = False, "forward", True

    def __init__(self, *, failing: bool = False):
        self.tests = self.turns = 0
        self.failing = failing

    def test(self) -> bool:
        self.tests += 1
        return True

    def progress(self) -> None:
        self.turns += 1
        if self.failing:
            raise RuntimeError("probe failed")


def returns_promptly(call, seconds: float = 10):
    """``call()``'s result, failing the test (instead of hanging) when it blocks ``seconds``."""
    result = []
    helper = threading.Thread(target=lambda: result.append(call()), daemon=True)
    helper.start()
    helper.join(seconds)
    assert result, f"{call} did not return"
    return result[0]


def test_a_poller_keeps_mpi_progressing_after_its_exchanges_are_complete_until_release():
    owing = OwingExchange()
    with Poller(interval=0) as poller:
        poller.watch([owing])
        wait_until(lambda: owing.turns >= 3)  # the "computation" goes on after completion
        done = poller.release()
        assert done is not None and owing.tests == 1
        turned = owing.turns
        time.sleep(0.05)
        assert owing.turns == turned  # released: no MPI call from the thread any more


def test_release_never_waits_for_a_turning_pause_and_a_new_watch_is_tested_at_once(monkeypatch):
    monkeypatch.setattr(progress, "TURNING_PAUSE", 3600.0)  # the second progress call would come in an hour
    first, second = OwingExchange(), OwingExchange()
    poller = Poller(interval=0)
    poller.watch([first])
    wait_until(lambda: first.turns == 1)  # the first call comes at once
    assert returns_promptly(poller.release) is not None
    poller.watch([second])
    wait_until(lambda: second.turns == 1)  # tested and turned without waiting out the pause
    assert (first.tests, first.turns) == (1, 1)  # the earlier watch's exchange is left alone
    assert returns_promptly(poller.release) is not None
    poller.watch([first])
    returns_promptly(poller.close)  # closing in a pause ends the thread at once
    assert poller._thread is None


def test_an_error_in_a_progress_call_comes_back_from_release_and_the_poller_goes_on():
    failing, fine = OwingExchange(failing=True), OwingExchange()
    with Poller(interval=0) as poller:
        poller.watch([failing])
        wait_until(lambda: failing.turns == 1)
        with pytest.raises(RuntimeError, match="probe failed"):
            poller.release()
        poller.watch([fine])
        wait_until(lambda: fine.turns >= 1)
        assert poller.release() is not None and failing.turns == 1


def test_progress_of_a_halo_exchange():
    from mpi4py import MPI

    for transport in TRANSPORTS:
        values = np.arange(4.0)[:, None]
        exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0]}, {0: [3]})], tag=3, transport=transport)
        assert exchange.owes_progress == (transport == "rma")
        exchange.progress()  # between runs too: it never starts, tests or ends one
        assert exchange.running is None
        exchange.begin()
        exchange.progress()
        assert exchange.running == "forward"
        exchange.end()
        assert values[:, 0].tolist() == [0.0, 1.0, 2.0, 0.0]
        exchange.close()
        with pytest.raises(MeshchainError, match="closed"):
            exchange.progress()


def test_poller_on_one_process():
    from mpi4py import MPI

    with pytest.raises(ConfigurationError, match="interval"):
        Poller(interval=-1)
    values = np.arange(4.0)[:, None]
    exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0]}, {0: [3]})], tag=3)
    idle = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {}, {})], tag=3)
    poller = Poller(interval=0)
    assert poller.release() is None  # nothing watched
    before = time.perf_counter()
    poller.watch(())  # nothing to watch: no thread
    assert before <= poller.release() <= time.perf_counter() and poller._thread is None
    idle.begin()
    poller.watch([idle])
    assert poller.release() is not None and poller._thread is None
    idle.end()
    for _ in range(3):  # one thread, reused
        exchange.begin()
        poller.watch([exchange, idle])
        with pytest.raises(MeshchainError, match="already watches"):
            poller.watch([exchange])
        wait_until(lambda: poller._done_at is not None)
        done = poller.release()
        assert done is not None and done <= time.perf_counter()
        exchange.end()
    assert values[3, 0] == 0.0 and exchange.running is None
    values[3, 0] = 7.0
    exchange.begin_reverse("max")  # a reverse run: the poller tests it with test_reverse()
    assert exchange.running == "reverse"
    poller.watch([exchange])
    wait_until(lambda: poller._done_at is not None)
    assert poller.release() is not None
    exchange.end_reverse()
    assert values[0, 0] == 7.0
    poller.watch([exchange])  # not begun: the thread's error comes back from release()
    assert poller._out.wait(10)
    with pytest.raises(MeshchainError, match="needs a forward run"):
        poller.release()
    poller.close()
    poller.close()
    with pytest.raises(MeshchainError, match="closed"):
        poller.watch(())
    exchange.close()
    assert measure_progress(MPI.COMM_SELF, lambda: None) == {}
    with pytest.raises(ConfigurationError, match="nbytes"):
        measure_progress(None, lambda: None, nbytes=0)


# --- other MPI start-ups: this file as a script under mpiexec -------------------------------------------


def launch(scenario: str, environment: dict, *, nprocs: int = 2, script: list | None = None) -> tuple[int, str]:
    """Run ``python <this file> scenario`` (or ``python script...``) under ``mpiexec -n nprocs``
    with ``environment`` added to a clean one; (exit status, output). Killed, with
    everything it started, after :data:`SCRIPT_TIMEOUT` seconds."""
    ours = {"MESHCHAIN_PROGRESS", *world.ASYNC_PROGRESS_VARIABLES, *TCP}
    env = {k: v for k, v in os.environ.items()
           if k not in ours and not k.startswith(("PMI_", "MESHCHAIN_MPI_", "HYDI_"))}
    env.update(environment)
    return launch_script(script or [str(Path(__file__).resolve()), scenario], env, nprocs=nprocs,
                         timeout=SCRIPT_TIMEOUT, what=scenario)


def result_of(scenario: str, environment: dict) -> dict:
    status, output = launch(scenario, environment)
    results = [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]
    assert status == 0 and results, f"{scenario} failed (exit {status}):\n{output[-6000:]}"
    return results[-1]


@pytest.mark.timeout(2 * SCRIPT_TIMEOUT + 60)
def test_a_poller_moves_a_large_message_over_mpichs_tcp_module():
    probe = ["-c", "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"]
    status, output = launch("probe", {**TCP, "MPIR_CVAR_ASYNC_PROGRESS": "0"}, script=probe)
    if status != 0:
        pytest.skip(f"MPICH's TCP module (libfabric's tcp provider) cannot start here: {output[-600:]}")
    outcome = result_of("poll", {**TCP, "MPIR_CVAR_ASYNC_PROGRESS": "0"})
    assert outcome == {"problems": [[], []]}, outcome


@pytest.mark.timeout(SCRIPT_TIMEOUT + 60)
def test_mpichs_progress_thread_moves_a_large_message_while_both_ranks_sleep():
    outcome = result_of("thread", {"MPIR_CVAR_ASYNC_PROGRESS": "1"})
    assert outcome == {"problems": [[], []]}, outcome


@pytest.mark.timeout(SCRIPT_TIMEOUT + 60)
def test_meshchain_progress_thread_starts_mpi_with_mpichs_progress_thread():
    outcome = result_of("thread-world", {"MESHCHAIN_PROGRESS": "thread"})
    assert outcome == {"problems": [[], []]}, outcome


def asleep(comm, name: str) -> list:
    """With MPICH's progress thread: a ring exchange of ``BIG`` bytes begun, both ranks
    asleep, the data is there when they wake (read without calling MPI) and one ``test()``
    says complete."""
    ring = Ring(comm, BIG)
    with variant(name) as transport:
        exchange, values = ring.exchange(comm, transport)
        exchange.begin(), exchange.end()
        values[: ring.halo, 0] = ring.owned(comm.rank, 1)
        comm.Barrier()
        exchange.begin()
        time.sleep(NAP)
        arrived, complete = ring.arrived(exchange, 1), exchange.test()
        exchange.end()
        exchange.close()
    return ([] if arrived else [f"{name}: the data had not arrived when the ranks woke"]) + (
        [] if complete else [f"{name}: test() was False when the ranks woke"])


def thread_problems(comm, *, from_world: bool) -> list:
    from mpi4py import MPI

    problems = []
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE or not progress.async_progress_enabled():
        problems.append(f"thread level {MPI.Query_thread()}, async progress {progress.async_progress_enabled()}")
    if from_world and (world.async_progress_at_init() is not True or os.environ.get("MPIR_CVAR_ASYNC_PROGRESS") != "1"):
        problems.append("world_communicator() did not switch on asynchronous progress")
    try:
        check_progress("thread", comm)
    except ConfigurationError as refused:
        problems.append(f"check_progress refused 'thread': {refused}")
    for name in VARIANTS:
        problems += asleep(comm, name)
    measured = measure_progress(comm, lambda: time.sleep(1e-3), nbytes=1 << 16, repeats=2)
    if sorted(measured) != sorted(PROGRESS_MODES):
        problems.append(f"measure_progress timed {sorted(measured)}")
    return problems


def main(scenario: str) -> None:
    """A scenario on every rank of ``mpiexec``; rank 0 prints ``RESULT {"problems": [per rank]}``."""
    if scenario == "thread-world":
        import mpi4py

        mpi4py.rc.thread_level = "funneled"  # world_communicator() must ask for more
        first = "mpi4py.MPI" not in sys.modules
        comm = world.world_communicator()
    else:
        from mpi4py import MPI

        comm, first = MPI.COMM_WORLD, True
    try:
        if scenario == "poll":
            problems = overlap_problems(comm, numba=True)
        else:
            problems = thread_problems(comm, from_world=scenario == "thread-world")
            problems += [] if first else ["mpi4py.MPI was imported before world_communicator()"]
    except Exception:  # noqa: BLE001 - a rank that fails must not leave the other hanging
        import traceback

        traceback.print_exc()
        comm.Abort(1)
    everywhere = comm.gather(problems, root=0)
    if comm.rank == 0:
        print("RESULT " + json.dumps({"problems": everywhere}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
