"""Executable plans: a unit's schedule with everything bound, run again and again.

This is the one pipeline every unit runs through, a single loop or a chain, on one rank
or many, loop by loop or communication-avoiding, tiled or not::

    for each step (a segment of the schedule):
        finish reductions of globals its loops use     (their Iallreduce was in flight)
        begin exchanges                                (pack + start, one call each)
        core                                           (one prepared backend call)
        end exchanges                                  (wait + unpack, one call each)
        rest                                           (one prepared backend call)
        start reductions over ranks                    (Iallreduce, finished when needed)
        mark halo validity

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

import numpy as np

from ..comm.agree import abort_all, agree_on_failure

__all__ = ["Plan", "Step", "Reduction"]

_clock = time.perf_counter


class PendingReduction:
    """A reduction over ranks in flight; ``finish(value)`` completes it into the global."""

    __slots__ = ("request", "result", "inc")

    def __init__(self, result, inc: bool):
        self.request, self.result, self.inc = None, result, inc

    def finish(self, value: np.ndarray) -> None:
        self.request.Wait()
        if self.inc:
            value += self.result
        else:
            value[...] = self.result


class Reduction:
    """A global reduced by a loop of a segment on several ranks: the owned iterations reduce
    into ``owned``, the exec-halo iterations (run redundantly) into ``scratch``; after the
    segment ``owned`` is combined over ranks (``Iallreduce``) into the global."""

    __slots__ = ("comm", "storage", "owned", "scratch", "op", "inc", "pending")

    def __init__(self, comm, storage, op, *, inc: bool):
        self.comm, self.storage, self.op, self.inc = comm, storage, op, inc
        self.owned = np.zeros_like(storage.value)
        self.scratch = np.zeros_like(storage.value)
        self.pending = PendingReduction(np.empty_like(storage.value), inc)

    def reset(self) -> None:
        if self.inc:
            self.owned.fill(0)
        else:
            np.copyto(self.owned, self.storage.value)
        np.copyto(self.scratch, self.owned)

    def start(self) -> None:
        pending = self.pending
        pending.request = self.comm.Iallreduce(self.owned, pending.result, self.op)
        self.storage.pending = pending


class Step:
    """One segment of a plan, bound (see the module docstring). ``core_share`` and
    ``rest_share`` index the account's compute times, ``waits`` names the loop whose
    exchanges these are (loop by loop) or is None (a chain's grouped exchange)."""

    __slots__ = ("settle", "reductions", "exchanges", "core", "rest", "validity", "core_share", "rest_share", "waits")

    def __init__(self, *, settle=(), reductions=(), exchanges=(), core=None, rest=None, validity=(), core_share=-1,
                 rest_share=-1, waits=None):
        self.settle, self.reductions, self.exchanges = tuple(settle), tuple(reductions), tuple(exchanges)
        self.core, self.rest, self.validity = core, rest, tuple(validity)
        self.core_share, self.rest_share, self.waits = core_share, rest_share, waits


class Plan:
    """A unit's executable plan: its steps, the account its runs add to, the kernels whose
    globals it froze, and what to release when it is dropped."""

    __slots__ = ("steps", "account", "kernels", "comm", "closers", "_flag", "_simple", "chain", "_agree")

    def __init__(self, steps, account, *, kernels=(), comm=None, closers=(), chain: bool = False,
                 agree: bool = True):
        """``agree``: running the plan can fail on some ranks only (the backend says so of its
        loops, the same on every rank), so the ranks agree on failures after every run."""
        self.steps, self.account, self.kernels = tuple(steps), account, tuple(kernels)
        self.comm, self.closers, self.chain = comm, tuple(closers), chain
        self._flag = np.zeros(2, dtype=np.int32)
        self._agree = agree
        only = self.steps[0] if len(self.steps) == 1 else None
        self._simple = (comm is None and only is not None and not only.exchanges and not only.reductions
                        and not only.settle and not only.validity and only.rest is None)

    def current(self) -> bool:
        """Whether every kernel's globals are still those the plan was compiled with."""
        for kernel in self.kernels:
            if not kernel.unchanged():
                return False
        return True

    def run(self) -> None:
        """Run the plan once (see the module docstring)."""
        if self._simple:  # one process, one step: run its one call
            step, account = self.steps[0], self.account
            began = _clock()
            if step.core is not None:
                step.core()
            seconds = _clock() - began
            if step.core_share >= 0:
                account.compute[step.core_share] += seconds
            if self.chain:
                account.total += seconds
            account.runs += 1
            return
        began = _clock()
        if self.comm is None:
            failure = self._steps()
        else:
            failure = self._communicating()
        account = self.account
        account.runs += 1
        if self.chain:
            account.total += _clock() - began
        if self.comm is not None and (self._agree or failure is not None):
            if not self._agree:  # a call that promised not to raise did: the others do not expect to agree
                abort_all(self.comm, "a loop that cannot fail", failure)
            agree_on_failure(self.comm, failure, self._flag)
        elif failure is not None:
            raise failure

    def _communicating(self):
        """:meth:`_steps` on several ranks: computation that fails is agreed on afterwards; a
        failure in the communication itself cannot be (the other ranks would wait for it
        forever), so it aborts the job."""
        try:
            return self._steps()
        except Exception as exc:  # noqa: BLE001 - reported, then the job ends
            abort_all(self.comm, "communication", exc)
            raise  # pragma: no cover - Abort does not return

    def _steps(self):
        account, failure = self.account, None
        compute = account.compute
        for step in self.steps:
            for storage in step.settle:
                if storage.pending is not None:
                    storage.settle()
            for reduction in step.reductions:
                reduction.reset()
            for exchange in step.exchanges:
                exchange.begin()
            t0 = _clock()
            if step.core is not None and failure is None:
                failure = _guarded(step.core)
            t1 = _clock()
            for exchange in step.exchanges:
                exchange.end()
            t2 = _clock()
            if step.rest is not None and failure is None:
                failure = _guarded(step.rest)
            t3 = _clock()
            for reduction in step.reductions:
                reduction.start()
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
        """Release what the plan holds outside Python (persistent requests, device buffers)."""
        for closer in self.closers:
            closer()
        self.closers = ()


def _guarded(call):
    """Run a prepared call; return the exception it raised (None when it did not)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - handed to the agreement, raised after it
        return exc
    return None
