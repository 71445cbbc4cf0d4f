"""Hang diagnostics: a rank that waits (or computes) longer than ``hang_timeout`` says where.

``mc.configure(hang_timeout=s)`` (or ``MESHCHAIN_HANG_TIMEOUT=s``) starts one daemon
*watchdog* thread per process (:func:`watch`). While it runs, the engine notes the plan it
runs and the communication layer the wait it is in (:mod:`meshchain.core.activity`):
halo exchanges (:func:`wait_transport`, :func:`wait_messages`, :func:`wait_any`),
reductions over ranks (:func:`wait_request`) and the blocking collectives meshchain runs
for the user (``with activity.waiting("collective ...")``). The waits that can tell which
messages are still missing then poll (``Testsome``/``Testany``/``Test``, spinning for
:data:`SPIN_SECONDS`, then sleeping a little longer each time, up to
:data:`LONGEST_PAUSE`) instead of blocking, and keep the record up to date. Without a
timeout nothing is noted and every wait blocks as before: the hot paths test one name,
:data:`meshchain.core.activity.watched`.

The watchdog wakes every ``min(timeout / 4, 0.5)`` seconds, reads that record (plain
Python data: it makes no MPI call, except ``Abort``) and, the first time a wait has lasted
longer than the timeout, writes a report to standard error (once per wait)::

    ==== meshchain hang report: rank 1 ====
    rank 1 waits in the halo exchange of 'b' (forward, transport 'persistent') of chain 'rk', for 0.62 s so far
    outstanding: messages from rank 0 (of neighbours 0, 2)
    action: keeps waiting (hang_action='report'; each wait is reported once)
    thread stacks (most recent call first):
    Thread 0x00007f3c2e7fc640 (most recent call first):
      File ".../meshchain/comm/hang.py", line 318 in run
      ...
    Current thread 0x00007f3c35a2b740 (most recent call first):
      ...
    ==== end of meshchain hang report: rank 1 ====

The second line names what the rank waits in: ``the halo exchange of <dats> (forward or
reverse, transport <t>)`` (``the start of`` it, for the ``"neighbour"`` and ``"rma"``
transports, whose start can wait for other ranks), ``a reduction over ranks``,
``collective <function>``, and the plan it runs (``of loop 'update'``, ``of chain 'rk'``).
``outstanding:`` lists the neighbours whose messages to this rank have not arrived (the
rank that holds the others up is among them); ``sends not complete:`` those this rank's
messages to have not completed, where that can be told. With the ``"neighbour"`` and
``"rma"`` transports, whose completion is one for all neighbours, it reads ``outstanding:
ranks 0, 2, all its neighbours (not observable per neighbour with transport
'neighbour')``; a collective waits for ``every rank of the communicator``. The stacks are
``faulthandler.dump_traceback(all_threads=True)``.

A rank that computes in one plan (no wait pending) for longer than the timeout reports,
once per stretch of computation, ``rank 0 is still computing in loop 'slow', for 0.61 s so
far (no message or collective pending)``, so that a stuck rank names its own loop.

``hang_action="abort"`` then aborts the job: the report is flushed (and written under
``$MESHCHAIN_ABORT_REPORTS``, as :func:`~meshchain.comm.agree.abort_all` does), and after
:data:`~meshchain.comm.agree.ABORT_GRACE_SECONDS` the watchdog calls ``comm.Abort(1)`` (its
one MPI call; the process exits with status 1 should ``Abort`` return).

Examples
--------
>>> from meshchain.core.config import Config
>>> from meshchain.core import activity
>>> dog = watch(Config(hang_timeout=30.0))
>>> activity.watched, dog.timeout, dog.interval
(True, 30.0, 0.5)
>>> unwatch(); activity.watched
False
"""

from __future__ import annotations

import faulthandler
import io
import os
import sys
import threading
import time
import traceback

from ..core import activity
from .agree import ABORT_GRACE_SECONDS, _keep_report

__all__ = ["watch", "unwatch", "Watchdog", "describe_exchange", "start_transport", "wait_transport", "wait_messages",
           "wait_any", "wait_request", "SPIN_SECONDS", "LONGEST_PAUSE"]

#: Seconds a polled wait spins (yielding the core) before it starts to sleep between tests.
SPIN_SECONDS = 1e-3
#: The first and the longest sleep between two tests of a polled wait (each sleep doubles).
FIRST_PAUSE, LONGEST_PAUSE = 2e-5, 1e-3

_clock = time.perf_counter
_watchdog: Watchdog | None = None


# --- switching the watchdog on and off -------------------------------------------------------------


def watch(config, comm=None) -> Watchdog | None:
    """Apply ``config.hang_timeout`` and ``config.hang_action`` to this process: start (or
    retune) the watchdog and note activity when the timeout is set, stop both when it is
    None. ``comm`` (None on one process) gives the rank reported and the communicator a
    ``hang_action="abort"`` aborts. Call it whenever a session is made or reconfigured
    (local: no MPI call but reading the rank). Returns the watchdog, or None.

    >>> from meshchain.core.config import Config
    >>> watch(Config()) is None
    True
    """
    global _watchdog
    timeout = config.hang_timeout
    if timeout is None:
        unwatch()
        return None
    rank = 0 if comm is None else comm.rank
    if _watchdog is None or not _watchdog.is_alive():
        _watchdog = Watchdog(timeout, action=config.hang_action, rank=rank, comm=comm)
        _watchdog.start()
    else:
        _watchdog.retune(timeout, action=config.hang_action, rank=rank, comm=comm)
    activity.watched = True
    return _watchdog


def unwatch() -> None:
    """Stop noting activity and stop the watchdog (it ends within one interval)."""
    global _watchdog
    activity.watched = False
    if _watchdog is not None:
        _watchdog.stop()
        _watchdog = None


# --- the watchdog ------------------------------------------------------------------------------------


class Watchdog(threading.Thread):
    """The daemon thread that reports waits (and computation) longer than ``timeout`` seconds.

    Parameters
    ----------
    timeout : float
        Seconds a wait (or a stretch of computation in one plan) may last unreported.
    action : {"report", "abort"}
        What follows a report: nothing (the rank keeps waiting) or aborting the job.
    rank : int
        The rank named in reports.
    comm : mpi4py communicator or None
        What ``"abort"`` aborts (None: the process exits with status 1).
    stream : file, optional
        Where reports go (default: ``sys.stderr`` at the time of the report).

    :meth:`check` does one round of the thread's work (tests call it with a made-up time).

    Examples
    --------
    >>> import io
    >>> from meshchain.core import activity
    >>> dog, out = Watchdog(0.5, rank=3, stream=io.StringIO()), None
    >>> activity.watched = True
    >>> with activity.Wait("collective example") as record:
    ...     dog.check(record.since + 0.1) is None        # not yet
    ...     out = dog.check(record.since + 0.7)          # reported ...
    ...     dog.check(record.since + 9.0) is None        # ... once
    True
    True
    >>> activity.watched = False
    >>> print(out.splitlines()[1])
    rank 3 waits in collective example, for 0.70 s so far
    """

    def __init__(self, timeout: float, *, action: str = "report", rank: int = 0, comm=None, stream=None):
        super().__init__(name="meshchain-hang-watchdog", daemon=True)
        self.stream = stream
        self._stop_event = threading.Event()
        self._reported = None  # the wait (or computation: (unit, since)) reported last
        self._seen = None  # the computation seen at the check before
        self.retune(timeout, action=action, rank=rank, comm=comm)

    def retune(self, timeout: float, *, action: str = "report", rank: int = 0, comm=None) -> None:
        """Change the timeout, action, rank and communicator (takes effect at the next check)."""
        self.timeout, self.action, self.rank, self.comm = float(timeout), action, rank, comm
        self.interval = min(self.timeout / 4, 0.5)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.check()

    def check(self, now: float | None = None) -> str | None:
        """Report (and act) if the current wait, or the current plan's computation, has lasted
        longer than the timeout and was not reported yet; return the report, else None."""
        now = _clock() if now is None else now
        record, unit = activity.wait, activity.unit
        if record is not None:
            if record is self._reported or now - record.since < self.timeout:
                return None
            self._reported = record
            text = _wait_report(self.rank, record, unit, now - record.since)
        elif unit is not None:
            # the engine notes the unit and its start in two steps: a computation is reported
            # only when the same one was seen at the check before (never a half-written pair)
            key = (unit, max(activity.unit_since, activity.wait_ended))
            seen, self._seen = self._seen, key
            if now - key[1] < self.timeout or key == self._reported or key != seen:
                return None
            self._reported = key
            text = (f"rank {self.rank} is still computing in {unit}, for {now - key[1]:.2f} s so far "
                    "(no message or collective pending)")
        else:
            return None
        return self._emit(text)

    def _emit(self, text: str) -> str:
        action = ("aborts the job (hang_action='abort')" if self.action == "abort" else
                  "keeps waiting (hang_action='report'; each wait is reported once)")
        rank = self.rank
        head = (f"==== meshchain hang report: rank {rank} ====\n{text}\naction: {action}\n"
                "thread stacks (most recent call first):\n")
        stream = self.stream if self.stream is not None else sys.stderr
        stacks = _stacks(stream, head)
        tail = f"==== end of meshchain hang report: rank {rank} ====\n"
        stream.write(tail)
        stream.flush()
        report = head + stacks + tail
        if self.action == "abort":
            self._abort(report)
        return report

    def _abort(self, report: str) -> None:
        try:
            _keep_report(report)
            time.sleep(ABORT_GRACE_SECONDS)  # for mpiexec to forward the report
        finally:
            try:
                if self.comm is not None:
                    self.comm.Abort(1)
            finally:
                os._exit(1)  # Abort may return before the job is torn down: never go on


def _wait_report(rank: int, record, unit, waited: float) -> str:
    """The lines of a report on ``record`` (a :class:`~meshchain.core.activity.Wait`)."""
    where = f" of {unit}" if unit is not None else ""
    lines = [f"rank {rank} waits in {record.what}{where}, for {waited:.2f} s so far"]
    outstanding, neighbours, note = record.outstanding, record.neighbours, record.note
    if neighbours is None:
        lines.append("outstanding: every rank of the communicator (a collective)" + (f" ({note})" if note else ""))
    elif note:  # the wait cannot tell its neighbours apart
        lines.append(f"outstanding: {_ranks(outstanding)}, all its neighbours ({note})")
    elif neighbours:
        told = f"messages from {_ranks(outstanding)}" if outstanding else "no message to this rank"
        lines.append(f"outstanding: {told} (of neighbours {', '.join(map(str, neighbours))})")
        if record.sending:
            lines.append(f"sends not complete: to {_ranks(record.sending)}")
    return "\n".join(lines)


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _stacks(stream, head: str) -> str:
    """Write ``head`` and every thread's stack to ``stream`` (``faulthandler`` where the
    stream is a file, else formatted here); return the stacks' text when formatted here."""
    stream.write(head)
    stream.flush()
    try:
        fileno = stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        fileno = None
    if fileno is not None:
        faulthandler.dump_traceback(file=stream, all_threads=True)
        return ""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    text = "".join(f"Thread {ident:#x} ({names.get(ident, '?')}; most recent call last):\n"
                   + "".join(traceback.format_stack(frame))
                   for ident, frame in sys._current_frames().items())  # noqa: SLF001 - the only way
    stream.write(text)
    return text


# --- waits that note what they wait for ----------------------------------------------------------------


def describe_exchange(exchange, reverse: bool = False) -> str:
    """What reports call a :class:`~meshchain.comm.exchange.HaloExchange`: its dats (its
    ``label``, which the engine sets) or else its tag, direction and transport.

    >>> from mpi4py import MPI
    >>> from meshchain.comm.exchange import HaloExchange
    >>> exchange = HaloExchange(MPI.COMM_SELF, [], tag=4, transport="p2p")
    >>> describe_exchange(exchange)
    "the halo exchange tagged 4 (forward, transport 'p2p')"
    >>> exchange.label = "'q'"; describe_exchange(exchange, True)
    "the halo exchange of 'q' (reverse, transport 'p2p')"
    """
    label = getattr(exchange, "label", None)
    name = f"of {label}" if label else f"tagged {exchange.tag}"
    return f"the halo exchange {name} ({'reverse' if reverse else 'forward'}, transport {exchange.transport!r})"


class _Backoff:
    """Between two tests of a polled wait: yield the core for :data:`SPIN_SECONDS`, then sleep,
    each time twice as long, from :data:`FIRST_PAUSE` up to :data:`LONGEST_PAUSE` (an
    oversubscribed core is then free for the rank that sends to this one)."""

    __slots__ = ("began", "pause")

    def __init__(self):
        self.began, self.pause = _clock(), 0.0

    def __call__(self) -> None:
        if not self.pause:
            if _clock() - self.began < SPIN_SECONDS:
                os.sched_yield()
                return
            self.pause = FIRST_PAUSE
        time.sleep(self.pause)
        self.pause = min(2 * self.pause, LONGEST_PAUSE)


def wait_messages(requests, owners, what: str, note: str = "") -> None:
    """Complete ``requests`` (``MPI_Testsome`` in a loop, backing off), noting in a
    :class:`~meshchain.core.activity.Wait` which neighbours' messages are outstanding:
    ``owners[i]`` is ``(neighbour, receiving)`` of ``requests[i]`` (``receiving``: a receive
    from the neighbour, else a send to it). Requests already complete or inactive count as
    complete.

    >>> from mpi4py import MPI
    >>> import numpy as np
    >>> box, out = np.zeros(1), np.ones(1)
    >>> requests = [MPI.COMM_SELF.Irecv(box, source=0, tag=9), MPI.COMM_SELF.Isend(out, dest=0, tag=9)]
    >>> wait_messages(requests, [(0, True), (0, False)], "halo exchange example"); box.tolist()
    [1.0]
    """
    from mpi4py import MPI

    with activity.Wait(what, {n for n, _ in owners}, note) as record:
        left = set(range(len(requests)))
        backoff = _Backoff()
        while left:
            done = MPI.Request.Testsome(requests)
            if done is None:  # no request is active any more
                return
            if done:
                left.difference_update(done)
                record.outstanding = tuple(sorted({owners[i][0] for i in left if owners[i][1]}))
                record.sending = tuple(sorted({owners[i][0] for i in left if not owners[i][1]}))
            else:
                backoff()


def _unobservable(transport, reverse: bool) -> tuple:
    """``(neighbours, note)`` of a wait of ``transport`` that cannot tell its neighbours apart."""
    direction = transport.directions[reverse]
    neighbours = {n for n, _, _ in direction.into_ranges} | {n for n, _, _ in direction.out_ranges}
    return neighbours, f"not observable per neighbour with transport {transport.name!r}"


def start_transport(transport, reverse: bool, what: str) -> None:
    """``transport.start(reverse)`` of a collective transport (``"neighbour"``, ``"rma"``), noted
    as a wait in the start of ``what``: its first run makes collective objects, and an
    ``"rma"`` run's access epoch waits until its targets have begun the same run."""
    with activity.Wait(f"the start of {what}", *_unobservable(transport, reverse)):
        transport.start(reverse)


def wait_transport(transport, reverse: bool, what: str) -> None:
    """``transport.wait(reverse)`` (a :class:`~meshchain.comm.transports.Transport` with a run in
    flight), noted as ``what``: the requests of transports that keep one per message are
    completed by :func:`wait_messages` first; the others (one completion for all neighbours)
    wait as usual, with every neighbour of the direction noted as outstanding."""
    flight = transport.in_flight(reverse)
    if flight is None:
        with activity.Wait(what, *_unobservable(transport, reverse)):
            transport.wait(reverse)
        return
    if flight:
        wait_messages([request for _, _, request in flight], [(n, receiving) for n, receiving, _ in flight], what)
    transport.wait(reverse)  # complete: returns at once


def wait_any(requests, what: str, neighbours, outstanding) -> tuple:
    """``MPI.Request.Testany(requests)`` until one completes (backing off), noted as ``what``
    with ``outstanding`` of ``neighbours`` missing; returns ``(index, done)`` as ``Testany``
    (``index`` is ``MPI.UNDEFINED`` when no request is active any more)."""
    from mpi4py import MPI

    with activity.Wait(what, neighbours) as record:
        record.outstanding = tuple(sorted(outstanding))
        backoff = _Backoff()
        while True:
            index, done = MPI.Request.Testany(requests)
            if done:
                return index, done
            backoff()


def wait_request(request, what: str) -> None:
    """``request.Wait()`` for a collective's request (``Iallreduce``), polled with ``Test`` and
    noted as ``what`` (every rank of the communicator outstanding).

    >>> from mpi4py import MPI
    >>> import numpy as np
    >>> out = np.zeros(1)
    >>> wait_request(MPI.COMM_SELF.Iallreduce(np.ones(1), out), "a reduction over ranks"); out.tolist()
    [1.0]
    """
    with activity.Wait(what):
        backoff = _Backoff()
        while not request.Test():
            backoff()
