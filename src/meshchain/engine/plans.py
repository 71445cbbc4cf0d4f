"""Executable plans: a unit's schedule with everything bound, run again and again.

This is the one pipeline every unit runs through, a single loop or a chain, on one rank
or many, loop by loop or communication-avoiding, tiled or not::

    for each step (a segment of the schedule):
        finish reductions of globals its loops use     (their Iallreduce was in flight)
        begin exchanges, unless the step before did    (pack + start, one call each)
        core                                           (one prepared backend call)
        end exchanges                                  (wait + unpack, one call each)
        rest                                           (one prepared backend call)
        begin the next step's exchanges (eager)        (boundary first: :mod:`.eager`)
        tail: the rest's interior                      (while the eager messages travel)
        start reductions over ranks                    (Iallreduce, finished when needed)
        mark halo validity

Computation that overlaps messages in flight (the core, the tail) runs through the
plan's :class:`Overlap`: as one call (progress ``"none"``, or ``"thread"``: MPICH's own
progress thread moves the messages), with a polling communication thread beside it
(``"poll"``), or in chunks handed to worker threads (``interior="dynamic"``), the
thread that drives communication joining once its messages are complete. Each exchange
records how long its messages were in flight and how much of that time the rank spent
computing (the achieved overlap the model uses).

Everything a step needs (prepared backend calls, exchanges with their buffers and
persistent requests, reduction buffers, the storage records whose validity changes) is
bound when the plan is built (:mod:`.assemble`); running it allocates nothing and
validates nothing. What a run adds to the statistics was counted when the plan was
built (:mod:`.accounting`); a run adds its times.

On several ranks a failure (a kernel raising on some elements) does not stop the
pipeline's communication: the failing rank skips the remaining computation but still
completes every exchange and reduction, so no rank waits for a message that never
comes, and then all ranks agree (:func:`~meshchain.comm.agree.agree_on_failure`) and
raise the same error. Plans whose calls cannot raise (compiled loops without index
checks) skip the agreement; a failure in the communication itself aborts the job.

Examples
--------
A plan of one step whose core is any callable (the engine binds backend calls):

>>> from meshchain.engine.accounting import PlanAccount
>>> calls = []
>>> account = PlanAccount({}, None, None, [[("hello", 1)]])
>>> plan = Plan([Step(core=lambda: calls.append("ran"), core_share=0)], account)
>>> plan.run(); plan.run()
>>> calls, account.runs
(['ran', 'ran'], 2)
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from ..backends.threads import ChunkedCall
from ..comm.agree import abort_all, agree_on_failure
from ..comm.exchange import arrivals
from ..comm.hang import wait_request
from ..comm.progress import owed_progress
from ..core import activity as _activity
from ..core import profiling as _profiling
from . import replay as _replay
from .traced import trace_run, trace_simple, trace_step

__all__ = ["Plan", "Step", "Reduction", "Overlap", "guarded"]

_clock = time.perf_counter


class PendingReduction:
    """A reduction over ranks in flight; ``finish(value)`` completes it into the global.
    ``label``: the profiler's label of waiting for it (names the loop that reduces)."""

    __slots__ = ("request", "result", "inc", "label")

    def __init__(self, result, inc: bool, loop: str = ""):
        self.request, self.result, self.inc = None, result, inc
        self.label = _profiling.label(f"{loop}: reduction wait" if loop else "reduction wait", "reduction",
                                      loops=[loop] if loop else [])

    def complete(self) -> None:
        """Wait for the request (if it is still in flight); the result is then in ``result``."""
        if self.request is None:
            return
        if _activity.watched:  # polled and noted for hang diagnostics
            loops = self.label.args["loops"]
            wait_request(self.request, "a reduction over ranks (Iallreduce of a global"
                                       + (f" reduced by loop {loops[0]!r})" if loops else ")"))
        else:
            self.request.Wait()
        self.request = None

    def finish(self, value: np.ndarray) -> None:
        self.complete()
        if self.inc:
            value += self.result
        else:
            value[...] = self.result


class Reduction:
    """A global reduced by a loop of a segment on several ranks: the owned iterations reduce
    into ``owned``, the exec-halo iterations (run redundantly) into ``scratch``; after the
    segment ``owned`` is combined over ranks (``Iallreduce``) into the global."""

    __slots__ = ("comm", "storage", "owned", "scratch", "op", "inc", "pending")

    def __init__(self, comm, storage, op, *, inc: bool, loop: str = ""):
        self.comm, self.storage, self.op, self.inc = comm, storage, op, inc
        self.owned = np.zeros_like(storage.value)
        self.scratch = np.zeros_like(storage.value)
        self.pending = PendingReduction(np.empty_like(storage.value), inc, loop)

    def reset(self) -> None:
        if self.inc:  # (fill and item assignment: half the time of np.copyto on these tiny arrays)
            self.owned.fill(0)
            self.scratch.fill(0)
        else:
            self.owned[...] = self.storage.value
            self.scratch[...] = self.owned

    def start(self) -> None:
        pending = self.pending
        pending.request = self.comm.Iallreduce(self.owned, pending.result, self.op)
        self.storage.pending = pending


class Step:
    """One segment of a plan, bound (see the module docstring). ``core_share``,
    ``rest_share`` and ``tail_share`` index the account's compute times, ``waits`` names
    the loop whose exchanges these are (loop by loop) or is None (a chain's grouped
    exchange). ``posted``: the step before began ``exchanges`` (eagerly); ``eager``: the
    next step's exchanges, begun after ``rest`` and before ``tail``; ``tasks``: the rest as
    :class:`~meshchain.engine.boundary.BoundaryTasks`, run as their neighbours' messages
    arrive (then ``rest`` is None)."""

    __slots__ = ("settle", "reductions", "exchanges", "core", "rest", "validity", "core_share", "rest_share", "waits",
                 "posted", "eager", "tail", "tail_share", "tasks", "detail", "labels")

    def __init__(self, *, settle=(), reductions=(), exchanges=(), core=None, rest=None, validity=(), core_share=-1,
                 rest_share=-1, waits=None, posted=False, eager=(), tail=None, tail_share=-1, tasks=None, detail=None):
        self.tasks = tasks
        self.detail = detail or {}  # phase -> ((loop name, iterations, redundant iterations), ...): for the profiler
        self.labels = None  # the profiler's event labels, made at the first profiled run
        self.settle, self.reductions, self.exchanges = tuple(settle), tuple(reductions), tuple(exchanges)
        self.core, self.rest, self.validity = core, rest, tuple(validity)
        self.core_share, self.rest_share, self.waits = core_share, rest_share, waits
        self.posted, self.eager, self.tail, self.tail_share = posted, tuple(eager), tail, tail_share


class Overlap:
    """How a plan runs computation while messages are in flight (see the module docstring).

    ``progress``: ``"none"``, ``"poll"`` or ``"thread"``; ``poller``: the session's
    :class:`~meshchain.comm.progress.Poller` (``"poll"``). :meth:`run` returns ``(failure,
    completed)``: the exception the call raised (None) and when the messages were seen
    complete during it (None: not seen, the wait will tell).

    >>> Overlap("none").run(lambda: None, ())
    (None, None)
    """

    __slots__ = ("progress", "poller")

    def __init__(self, progress: str, poller=None):
        self.progress, self.poller = progress, poller

    def run(self, call, exchanges):
        polling = self.progress == "poll" and exchanges
        if isinstance(call, ChunkedCall):  # interior="dynamic": this thread drives the messages, then joins
            driver, turn = (_driver(exchanges), owed_progress(exchanges)) if polling else (None, None)
            try:
                return None, call.run(driver, turn=turn)
            except Exception as exc:  # noqa: BLE001 - handed to the agreement, raised after it
                return exc, None
        if not polling:
            return guarded(call), None
        self.poller.watch(exchanges)
        try:
            failure = guarded(call)
        finally:  # even on an interrupt: the thread then makes no more MPI calls
            completed = self.poller.release()
        return failure, completed


def _driver(exchanges):
    def complete() -> bool:
        for exchange in exchanges:
            if not exchange.test():
                return False
        return True

    return complete


class Plan:
    """A unit's executable plan: its steps, the account its runs add to, the kernels whose
    globals it froze, and what to release when it is dropped."""

    __slots__ = ("steps", "account", "kernels", "comm", "closers", "_flag", "_simple", "chain", "_agree", "overlap",
                 "binding", "name", "labels", "compiler", "compiled", "replays", "repeater", "repeated", "__weakref__")

    def __init__(self, steps, account, *, kernels=(), comm=None, closers=(), chain: bool = False,
                 agree: bool = True, overlap: Overlap | None = None):
        """``agree``: running the plan can fail on some ranks only (the backend says so of its
        loops, the same on every rank), so the ranks agree on failures after every run;
        ``overlap``: how computation runs beside messages (default: one call, no progress)."""
        self.overlap = overlap if overlap is not None else Overlap("none")
        self.binding = None  # the objects bound, and how to bind others (:class:`~.rebind.Binding`)
        self.steps, self.account, self.kernels = tuple(steps), account, tuple(kernels)
        self.comm, self.closers, self.chain = comm, tuple(closers), chain
        loops, chain_name = ((), None) if account is None else (account.loops, account.chain_name)
        self.name = chain_name if chain and chain_name else next(iter(loops), "")  # what the profiler calls the run
        self.labels = None  # the profiler's labels of the whole run, made at the first profiled run
        self._flag = np.zeros(2, dtype=np.int32)
        self._agree = agree
        self.compiler = None  # makes the plan's compiled replay (:mod:`.replay`), set by the builder
        self.compiled = None  # that replay once made (False: it cannot be had)
        self.replays = 0  # runs as a captured step's replay
        self.repeater = None  # makes what runs the one step's call several times in a row (one process)
        self.repeated = None  # that once made (False: it cannot be had)
        only = self.steps[0] if len(self.steps) == 1 else None
        self._simple = (comm is None and only is not None and not only.exchanges and not only.reductions
                        and not only.settle and not only.validity and only.rest is None)

    def current(self) -> bool:
        """Whether every kernel's globals are still those the plan was compiled with."""
        for kernel in self.kernels:
            if not kernel.unchanged():
                return False
        return True

    @property
    def label(self) -> str:
        """What runs: ``"chain 'rk'"`` or ``"loop 'update'"``."""
        return f"{'chain' if self.chain else 'loop'} {self.name!r}"

    def run_compiled(self) -> bool:
        """Run the plan once as its compiled replay (:mod:`.replay`), made once the plan has been
        run this way :data:`~meshchain.engine.replay.COMPILE_AFTER` times, where it can be and
        nobody watches the steps (no profiler, no hang diagnostics); False where it did not run
        (then :meth:`run` it). For a captured step's replays on several ranks."""
        compiled = self.compiled
        if compiled is None:
            self.replays += 1
            if self.comm is None or self.compiler is None or self.replays <= _replay.COMPILE_AFTER:
                return False
            compiled = self.compiled = self.compiler(self) or False
        if not compiled or _profiling.active is not None or _activity.watched:
            return False
        compiled.run()
        return True

    def again(self, pipeline, unit):
        """For a captured step's next replay on one process: a function that runs this plan
        again (:meth:`run`) and returns True, or returns False with nothing run where anything
        that picks or prepares it changed since (the plan dropped, its objects or ``unit``'s
        rebound, a kernel's globals, a profiler or hang diagnostics watching); None for a plan
        of several steps. It skips the capture's and the pipeline's look-ups (a weak reference
        to the plan)."""
        if not self._simple:
            return None
        plan_of, binding, kernels, plans = weakref.ref(self), self.binding, self.kernels, pipeline.plans
        records, unit_records = binding.records, unit.records

        def again(times: int = 1) -> bool:
            again.done = 0
            plan = plan_of()
            if (plan is None or plan.compiled is False or binding.records is not records
                    or unit.records is not unit_records or _profiling.active is not None or _activity.watched):
                return False
            for kernel in kernels:
                if not kernel.unchanged():
                    return False
            if times == 1:
                plans.hits += 1
                plan.run()
                again.done = 1
                return True
            runs, failed = plan.account.runs, True
            try:
                if not plan.run_times(times):
                    for _ in range(times):
                        plan.run()
                failed = False
            finally:  # counted as that many replays would be: a failing one is a hit, not a run
                again.done = plan.account.runs - runs
                plans.hits += again.done + failed
            return True

        again.done = 0  # the runs the last call made (also when one raised)
        return again

    def run_times(self, times: int) -> bool:
        """Run a plan of one step on one process ``times`` times in a row in one compiled call
        (the backend's :meth:`~meshchain.backends.base.Backend.repeater`; a captured step's
        ``repeat``), accounted as ``times`` runs; False with nothing run where it cannot be (a
        plan of several steps, a backend that repeats in Python, a profiler or hang diagnostics
        watching): then :meth:`run` it ``times`` times."""
        if not self._simple or _profiling.active is not None or _activity.watched:
            return False
        step, repeated = self.steps[0], self.repeated
        if repeated is None:
            made = None if step.core is None or self.repeater is None else self.repeater(step.core)
            repeated = self.repeated = made or False
        if repeated is False:
            return False
        repeated.prepare()  # compiled or loaded before the clock starts (counted as compiling)
        account = self.account
        began = _clock()
        try:
            repeated.run(times)
        finally:  # the runs made, also when one raised
            seconds = _clock() - began
            if step.core_share >= 0:
                account.compute[step.core_share] += seconds
            if self.chain:
                account.total += seconds
            account.runs += repeated.done
        return True

    def run(self) -> None:
        """Run the plan once (see the module docstring)."""
        profiler = _profiling.active
        if _activity.watched:
            _activity.unit, _activity.unit_since = self.label, _clock()
        if self._simple:  # one process, one step: run its one call
            step, account = self.steps[0], self.account
            began = _clock()
            try:
                if step.core is not None:
                    step.core()
            finally:
                _activity.unit = None
            ended = _clock()
            seconds = ended - began
            if step.core_share >= 0:
                account.compute[step.core_share] += seconds
            if self.chain:
                account.total += seconds
            account.runs += 1
            if profiler is not None:
                trace_simple(profiler, self, began, ended)
            return
        began = _clock()
        if self.comm is None:
            failure = self._steps(profiler)
        else:
            failure = self._communicating(profiler)
        account = self.account
        account.runs += 1
        ended = _clock()
        if self.chain:
            account.total += ended - began
        try:
            if self.comm is not None and (self._agree or failure is not None):
                if not self._agree:  # a call that promised not to raise did: the others do not expect to agree
                    abort_all(self.comm, "a loop that cannot fail", failure)
                agree_on_failure(self.comm, failure, self._flag)
            elif failure is not None:
                raise failure
        finally:
            if profiler is not None:
                trace_run(profiler, self, began, ended, _clock())
            _activity.unit = None

    def _communicating(self, profiler):
        """:meth:`_steps` on several ranks: computation that fails is agreed on afterwards; a
        failure in the communication itself cannot be (the other ranks would wait for it
        forever), so it aborts the job."""
        try:
            return self._steps(profiler)
        except Exception as exc:  # noqa: BLE001 - reported, then the job ends
            abort_all(self.comm, "communication", exc)
            raise  # pragma: no cover - Abort does not return

    def _steps(self, profiler=None):
        """Run the steps; ``profiler``: the active :class:`~meshchain.core.profiling.Profiler` (or None)."""
        account, failure, overlap = self.account, None, self.overlap
        compute = account.compute
        flight = None  # eager messages of the next step: (posted at, computed since, seen complete at)
        for step in self.steps:
            s0 = _clock() if profiler is not None else 0.0
            for storage in step.settle:
                if storage.pending is not None:
                    storage.settle()
            for reduction in step.reductions:
                reduction.reset()
            s1 = _clock() if profiler is not None else 0.0
            if not step.posted:
                for exchange in step.exchanges:
                    exchange.begin()
                flight = (_clock(), 0.0, None)
            t0 = _clock()
            seen = None
            if step.core is not None and failure is None:
                failure, seen = overlap.run(step.core, step.exchanges)
            t1 = _clock()
            if step.tasks is not None:
                failure, computed = _run_tasks(step, failure)
                t3 = _clock()
                t2 = t3 - computed  # the waits, then the tasks' computing
            else:
                for exchange in step.exchanges:
                    exchange.end()
                t2 = _clock()
                if step.rest is not None and failure is None:
                    failure = guarded(step.rest)
                t3 = _clock()
            if step.exchanges:
                _hidden(account, step.waits, flight, t0, t1, t2, seen)
            t4 = t5 = t3
            if step.eager:
                for exchange in step.eager:
                    exchange.begin()
                t4 = _clock()
                seen = None
                if step.tail is not None and failure is None:
                    failure, seen = overlap.run(step.tail, step.eager)
                t5 = _clock()
                flight = (t4, (t5 if seen is None else min(seen, t5)) - t4, seen)
                if step.tail_share >= 0:
                    compute[step.tail_share] += t5 - t4
                if step.waits is None:
                    account.core += t5 - t4
            for reduction in step.reductions:
                reduction.start()
            if profiler is not None:
                trace_step(profiler, self, step, (s0, s1, t0, t1, t2, t3, t4, t5, _clock()))
            for storage, depth in step.validity:
                storage.valid_depth = depth
            if step.core_share >= 0:
                compute[step.core_share] += t1 - t0
            if step.rest_share >= 0:
                compute[step.rest_share] += t3 - t2
            if step.waits is not None:
                account.wait[step.waits] = account.wait.get(step.waits, 0.0) + (t2 - t1)
            else:
                account.chain_wait += t2 - t1
                account.core += t1 - t0
                account.halo += t3 - t2
        return failure

    def close(self) -> None:
        """Release what the plan holds outside Python (persistent requests, device buffers) and
        finish its reductions over ranks still in flight (no request outlives the plan)."""
        self.compiled = False  # its exchanges' requests are freed below
        for closer in self.closers:
            closer()
        self.closers = ()
        for step in self.steps:
            for reduction in step.reductions:
                reduction.pending.complete()


def _run_tasks(step, failure):
    """Run a step's boundary tasks as the messages they need arrive: those needing none at
    once, then after each neighbour's messages (unpacked as they come) the tasks now ready.
    Returns the failure and the seconds spent computing."""
    tasks, arrived = step.tasks, 0
    began = _clock()
    waiting, failure = tasks.ready(arrived, failure)
    computed = _clock() - began
    for neighbour in arrivals(step.exchanges):
        arrived |= tasks.bits.get(neighbour, 0)
        if waiting:
            began = _clock()
            waiting, failure = tasks.ready(arrived, failure, waiting)
            computed += _clock() - began
    return failure, computed


def _hidden(account, name, flight, t0, t1, t2, seen) -> None:
    """Add a step's exchange to ``account.flight``/``account.hidden`` (under the loop
    ``name``, or None for a chain): the seconds from posting to completion (seen by a
    progress driver, else the end of the wait) and how many of them the rank computed."""
    posted, before, seen_before = flight
    if seen_before is not None:  # complete while the step before still computed
        complete, hidden = seen_before, before
    else:
        complete = seen if seen is not None else t2
        hidden = before + max(0.0, min(t1, complete) - t0)
    span = account.flight.setdefault(name, [0.0, 0.0])
    span[0] += max(complete - posted, 0.0)
    span[1] += hidden


def guarded(call):
    """Run a prepared call; return the exception it raised (None when it did not)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - handed to the agreement, raised after it
        return exc
    return None
