"""Dynamic scheduling of a phase's blocks on Python threads (CC-overlap, Nakajima).

A :class:`ChunkedCall` runs the same blocks as a backend's static phase call, colour after
colour, but hands them out in *chunks* (a few consecutive positions of a colour's block
order, each one call of a compiled function that does not hold the GIL) to the persistent
threads of a :class:`WorkerPool` and to the calling thread. The calling thread may first
drive communication (``run(driver)``: poll the messages of a halo exchange) and join the
computation once its messages are complete, so the exchange progresses while the interior
is computed, and no core is left idle once it is done.

Chunks are *groups* in order (one group per run and colour): a chunk starts only when
every chunk of earlier groups has finished. Chunks are handed out in order, so the lowest
unfinished group's chunks are always held by threads free to run them: no deadlock. The
per-block partial rows of reductions are combined afterwards in block order, so the
results are those of the static call, bit for bit, whatever the thread count or chunk size.

Examples
--------
>>> out = []
>>> groups = [[(out.append, ("a",)), (out.append, ("b",))], [(out.append, ("c",))]]
>>> call = ChunkedCall(groups, [(out.append, ("end",))], pool=WorkerPool(2))
>>> call.run(lambda: True) is not None  # the driver's messages are complete at once
True
>>> sorted(out[:2]), out[2:], call.chunks, call.workers
(['a', 'b'], ['c', 'end'], 3, 2)
>>> call.pool.close()
"""

from __future__ import annotations

import bisect

import threading
import time
import weakref

from ..comm.progress import TURNING_PAUSE
from ..core import profiling
from ..core.errors import ConfigurationError

__all__ = ["WorkerPool", "ChunkedCall"]


class _PoolState:
    """What the pool's threads share (the threads hold this, not the pool, so that a pool
    nobody uses any more is collected and its threads told to stop)."""

    def __init__(self):
        self.condition = threading.Condition()
        self.generation, self.task, self.busy, self.closing, self.error = 0, None, 0, False, None

    def serve(self) -> None:
        """A worker thread: run each task handed out once, until the pool closes."""
        seen = 0
        while True:
            with self.condition:
                while self.generation == seen and not self.closing:
                    self.condition.wait()
                if self.closing:
                    return
                seen, task = self.generation, self.task
            try:
                task()
            except BaseException as exc:  # noqa: BLE001 - the thread lives on; join() raises it
                self.error = self.error or exc
            finally:
                with self.condition:
                    self.busy -= 1
                    if not self.busy:
                        self.condition.notify_all()

    def close(self) -> None:
        with self.condition:
            self.closing = True
            self.condition.notify_all()


class WorkerPool:
    """Persistent daemon threads that each run a task handed to them, then wait for the next.

    Parameters
    ----------
    workers : int
        The number of threads (0: none; the calling thread then does all the work). They are
        started on first use and reused by every later call.

    Examples
    --------
    >>> import threading
    >>> pool = WorkerPool(2)
    >>> seen = set()
    >>> pool.start(lambda: seen.add(threading.get_ident())); pool.join()
    >>> len(seen), threading.get_ident() in seen
    (2, False)
    >>> pool.close()
    """

    def __init__(self, workers: int):
        if workers < 0:
            raise ConfigurationError(f"a worker pool needs workers >= 0, not {workers}")
        self.workers = int(workers)
        self._state = _PoolState()
        self._threads: list[threading.Thread] = []
        self._use = threading.Lock()  # one task at a time
        self._finalizer = weakref.finalize(self, self._state.close)

    def start(self, task) -> None:
        """Have every worker call ``task()`` once (returns at once; :meth:`join` waits)."""
        self._use.acquire()
        try:
            if len(self._threads) < self.workers:
                self._spawn()
        except BaseException:
            self._use.release()
            raise
        state = self._state
        with state.condition:
            state.task, state.busy = task, self.workers
            state.generation += 1
            state.condition.notify_all()

    def join(self) -> None:
        """Wait until every worker has finished the task given to :meth:`start` (and raise
        what escaped it in a worker, if anything did)."""
        state = self._state
        try:
            with state.condition:
                while state.busy:
                    state.condition.wait()
                state.task, error, state.error = None, state.error, None
        finally:
            self._use.release()
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the threads (they finish what they run first; call it between tasks). A later
        :meth:`start` makes new ones."""
        self._state.close()
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._state = _PoolState()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, self._state.close)

    def _spawn(self) -> None:
        for k in range(len(self._threads), self.workers):
            thread = threading.Thread(target=self._state.serve, name=f"meshchain-worker-{k}", daemon=True)
            thread.start()
            self._threads.append(thread)


class _Progress:
    """One execution of a :class:`ChunkedCall`: the next chunk to hand out, the chunks still
    running per group, the first group not finished and the first failure."""

    def __init__(self, chunks, group_of, sizes):
        self.chunks, self.group_of, self.remaining = chunks, group_of, list(sizes)
        self.next, self.frontier, self.error = 0, 0, None
        self.tickets, self.condition = threading.Lock(), threading.Condition()

    def finished(self) -> bool:
        """Whether nothing is left to run (all groups done, or a chunk failed)."""
        return self.frontier == len(self.remaining) or self.error is not None

    def work(self) -> None:
        """Take and run chunks until none is left to take."""
        while self.work_one():
            pass

    def work_traced(self) -> None:
        """:meth:`work` on a pool thread: while a profile is recorded, one event on this
        thread's track spans the chunks it ran (:mod:`meshchain.core.profiling`)."""
        profiler = profiling.active
        if profiler is None:
            self.work()
            return
        began, chunks = profiling._clock(), 0
        while self.work_one():
            chunks += 1
        if chunks:
            profiler.span(profiling.label("worker: core chunks", "phase", phase="core", loops={}, chunks=chunks),
                          began, profiling._clock())

    def work_one(self) -> bool:
        """Take the next chunk and run it once earlier groups are done; False: none was left
        (or a chunk failed)."""
        with self.tickets:
            i = self.next
            if i >= len(self.chunks) or self.error is not None:
                return False
            self.next = i + 1
        group = self.group_of[i]
        if group > self.frontier and not self._wait_for(group):
            return False
        function, arguments = self.chunks[i]
        try:
            function(*arguments)
        except BaseException as exc:  # noqa: BLE001 - raised in the calling thread
            self.fail(exc)
            return False
        self._done(group)
        return True

    def fail(self, exc: BaseException) -> None:
        with self.condition:
            if self.error is None:
                self.error = exc
            self.condition.notify_all()

    def _wait_for(self, group: int) -> bool:
        with self.condition:
            while self.frontier < group and self.error is None:
                self.condition.wait()
            return self.error is None

    def _done(self, group: int) -> None:
        with self.condition:
            self.remaining[group] -= 1
            if self.remaining[group] == 0:  # then group == frontier: later groups wait for it
                while self.frontier < len(self.remaining) and self.remaining[self.frontier] == 0:
                    self.frontier += 1
                self.condition.notify_all()


class ChunkedCall:
    """A prepared call whose chunks run on a :class:`WorkerPool` and the calling thread.

    Parameters
    ----------
    groups : list of list of (callable, tuple)
        The chunks, group after group: ``function(*arguments)`` (a compiled function that
        releases the GIL). Chunks of one group run in any order and at once; a group starts
        when the previous one has finished. Empty groups are dropped.
    finish : list of (callable, tuple)
        Called in order on the calling thread once every chunk has finished.
    pool : WorkerPool, keyword-only
        The threads that take chunks besides the calling thread.
    failure : callable, keyword-only
        ``failure(exc)`` is the exception to raise for ``exc`` raised by a chunk or a
        finishing call (default: ``exc`` itself).

    Attributes
    ----------
    chunks : int
        The number of chunks.
    workers : int
        The pool's thread count.
    """

    def __init__(self, groups, finish=(), *, pool: WorkerPool, failure=None):
        groups = [list(group) for group in groups if len(group)]
        self._chunks = [chunk for group in groups for chunk in group]
        self._group_of = [g for g, group in enumerate(groups) for _ in group]
        self._sizes = [len(group) for group in groups]
        self._finish = list(finish)
        self.pool, self._failure = pool, failure

    @property
    def chunks(self) -> int:
        return len(self._chunks)

    @property
    def arguments(self) -> tuple:
        """Every chunk's arguments, then every finishing call's, one after another (what
        :meth:`rebind` addresses by position)."""
        return tuple(value for _, arguments in self._chunks + self._finish for value in arguments)

    def rebind(self, substitutions) -> None:
        """Put ``(position, array)`` of :attr:`arguments` in place (each alike the one it
        replaces: see :mod:`meshchain.engine.rebind`)."""
        calls, starts, start = self._chunks + self._finish, [], 0
        for _, arguments in calls:
            starts.append(start)
            start += len(arguments)
        changed: dict = {}
        for position, array in substitutions:
            number = bisect.bisect_right(starts, position) - 1
            changed.setdefault(number, []).append((position - starts[number], array))
        for number, pairs in changed.items():
            function, arguments = calls[number]
            arguments = list(arguments)
            for at, array in pairs:
                arguments[at] = array
            calls[number] = (function, tuple(arguments))
        count = len(self._chunks)
        self._chunks, self._finish = calls[:count], calls[count:]

    @property
    def workers(self) -> int:
        return self.pool.workers

    def __call__(self) -> None:
        """Run every chunk (the pool's threads and this one), then the finishing calls."""
        self.run()

    def run(self, driver=None, *, interval: float = 2e-5, turn=None, turn_every: float = TURNING_PAUSE) -> float | None:
        """Run the call while this thread drives communication.

        The pool's threads start taking chunks at once. This thread calls ``driver()`` (True
        once its messages are complete; called at least once) until it returns True or the
        work is done: every ``interval`` seconds while the pool's threads compute, or, with a
        pool of no threads, alternating with one chunk at a time. Then it takes chunks too
        until none is left (calling ``turn`` between them, if given, once the driver is done),
        waits for the pool's threads, and runs the finishing calls.

        Parameters
        ----------
        driver : callable, optional
            Progresses communication; returns True once it is complete.
        interval : float, keyword-only
            Seconds between calls of ``driver`` while the pool's threads compute.
        turn : callable, optional, keyword-only
            Once ``driver`` returned True: called at once, then between the chunks this
            thread runs, at most every ``turn_every`` seconds (to keep MPI's progress engine
            turning for the neighbours, :meth:`~meshchain.comm.exchange.HaloExchange.progress`).
        turn_every : float, keyword-only
            Seconds between two calls of ``turn`` (default: the poller's
            :data:`~meshchain.comm.progress.TURNING_PAUSE`).

        Returns
        -------
        float or None
            ``time.perf_counter()`` when ``driver()`` first returned True; None if it never did
            before the work ran out (or there is no driver).

        Raises
        ------
        Exception
            The first exception of a chunk (through ``failure``), once every thread is idle;
            an exception of ``driver`` or ``turn`` as it is, once every thread is idle.
        """
        progress = _Progress(self._chunks, self._group_of, self._sizes)
        self.pool.start(progress.work_traced)
        completed = None
        try:
            if driver is not None:
                completed = self._drive(driver, progress, interval)
            if turn is not None and completed is not None:
                self._work_turning(progress, turn, turn_every)
            else:
                progress.work()
        except BaseException as exc:
            progress.fail(exc)  # the workers stop taking chunks
            raise
        finally:
            self.pool.join()
        if progress.error is not None:
            self._reraise(progress.error)
        try:
            for function, arguments in self._finish:
                function(*arguments)
        except Exception as exc:  # noqa: BLE001 - raised through ``failure``
            self._reraise(exc)
        return completed

    def _drive(self, driver, progress: _Progress, interval: float) -> float | None:
        """Call ``driver`` until it returns True (the time then) or the work runs out (None)."""
        if self.pool.workers == 0:  # one chunk between polls (Devito's "pokempi")
            while True:
                if driver():
                    return time.perf_counter()
                if not progress.work_one():
                    return None
        pause = threading.Event().wait
        while True:
            if driver():
                return time.perf_counter()
            if progress.finished():
                return None
            pause(interval)

    @staticmethod
    def _work_turning(progress: _Progress, turn, every: float) -> None:
        """Take chunks until none is left, calling ``turn`` first and then between chunks at
        most every ``every`` seconds."""
        due = time.perf_counter()
        while True:
            if time.perf_counter() >= due:
                turn()
                due = time.perf_counter() + every
            if not progress.work_one():
                return

    def _reraise(self, exc: BaseException):
        raised = exc if self._failure is None else self._failure(exc)
        if raised is exc:
            raise exc
        raise raised from exc
