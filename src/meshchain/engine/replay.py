"""A captured step's plan replayed by one compiled call on several ranks.

On one process a captured step's replay is one compiled call already. On several ranks
its plan (:mod:`.plans`) runs its steps in Python: each exchange is packed and started,
the core computed, the messages waited for and unpacked, the rest computed, a few
microseconds of Python and mpi4py per step, which a replay of small steps cannot hide.
:class:`CompiledReplay` runs the same plan as one call of a function the backend compiles
(:mod:`meshchain.backends.numba_replay`): the same prepared calls with the same arguments,
the same exchanges' packing, ``MPI_Startall``, ``MPI_Waitall`` and unpacking on the same
buffers, in the same order, so it sends the same messages and computes the same bits. The
plan's timings are taken inside it (the clock ``time.perf_counter`` reads) and added to
its account as the Python path adds them.

What it needs, else the plan replays in Python as before (each rank decides alone: both
ways send the same messages in the same order):

* a plan of several ranks whose calls cannot fail (a plan that agrees on failures after
  every run keeps doing so in Python);
* the backend's prepared calls (the numba backend's; not tiled, chunked, GPU or reference
  calls), no boundary tasks, computation overlapping messages as one call (progress
  ``"none"`` or ``"thread"``);
* exchanges of the ``"persistent"`` transport with no rows staged through a device;
* reductions over ranks that no later step of the plan reads (they are reset before the
  call and started after it, as the Python path does around their step);
* no profiler recording and no hang diagnostics watching (those runs go through Python,
  which reports each step), and a step not run with ``ca="auto"`` (its learner times every
  run, and its decisions are collective: a rank replaying compiled would skip them).

Compiled replays are not observed by the model (:mod:`.auto`): its driver overheads ``o_r``
and ``o_l`` are those of plans run step by step.

A plan is compiled once it has been replayed :data:`COMPILE_AFTER` times (a compile takes
a second or so the first time on a machine, and loads from the disk cache afterwards), so a
step replayed a few times never pays for it. ``mc.stats()`` counts the compile under the
plan's first loop (its ``time_compile``, ``compilations`` and ``cache_hits``).

Examples
--------
>>> import numpy as np
>>> from meshchain.engine.plans import Plan, Step
>>> CompiledReplay.make(Plan([Step(core=lambda: None)], None), backend=None, report=None) is None
True
"""

from __future__ import annotations

import warnings

import numpy as np

from ..comm.agree import abort_all
from ..core.errors import InternalError, MeshchainWarning

__all__ = ["CompiledReplay", "COMPILE_AFTER"]

#: Replays of a plan before it is compiled (a compile costs about a second the first time).
COMPILE_AFTER = 32


class CompiledReplay:
    """One plan as one compiled call (see the module docstring); :meth:`make` builds it."""

    __slots__ = ("plan", "call", "_calls", "_exchanges", "_fixed", "_records", "_settle", "_reductions", "_validity")

    def __init__(self, plan, call, calls, exchanges, fixed):
        """``call``: the backend's compiled replay (bound by :meth:`_bind` before each run after
        a change of binding); ``calls`` and ``exchanges``: the plan's, in program order;
        ``fixed``: the arguments before the calls' (addresses, stamps, scratch, terms, seconds)."""
        self.plan, self.call, self._calls, self._exchanges, self._fixed = plan, call, calls, exchanges, fixed
        self._records = None
        self._settle = self._reductions = self._validity = ()

    @classmethod
    def make(cls, plan, *, backend, report):
        """The compiled replay of ``plan``, or None where it cannot be had (see the module
        docstring). ``report(seconds, compiled, cache_hits)``: told of the compile."""
        from ..comm.compiled import addresses  # mpi4py: never imported before the session starts MPI

        if not _eligible(plan) or addresses() is None:
            return None
        parts = [exchange.compiled_parts() for exchange in _exchanges(plan)]
        if any(part is None for part in parts):
            return None
        calls, program, terms, slots, nstamps = _program(plan)
        fixed = (addresses(), np.zeros(nstamps), np.zeros(2, dtype=np.int64), terms, None)
        sample = fixed[:4] + (np.zeros(max(len(slots), 1)),) + tuple(call.arguments for call in calls) + tuple(parts)
        try:
            call = backend.replay(calls, len(parts), program, sample, lambda _, s, c, h: report(s, c, h))
        except Exception as exc:  # noqa: BLE001 - the Python path still runs the plan: say so, do not fail
            warnings.warn(MeshchainWarning(f"[replay] the replay of {plan.label} could not be compiled; it runs step by "
                                           f"step in Python: {type(exc).__name__}: {exc}"), stacklevel=2)
            return None
        if call is None:
            return None
        fixed = fixed[:4] + (plan.account.measure(slots),)
        return cls(plan, call, calls, _exchanges(plan), fixed)

    def run(self) -> None:
        """Run the plan once (what :meth:`~meshchain.engine.plans.Plan.run` does, but for the
        runs' count and the chain's total, which its caller adds)."""
        plan = self.plan
        if plan.binding is None or plan.binding.records is not self._records:
            self._bind()
        for storage in self._settle:
            if storage.pending is not None:
                storage.settle()
        reductions = self._reductions
        for reduction in reductions:
            reduction.reset()
        call = self.call
        try:
            error = call.entry(call.boxed)
        except Exception as exc:  # noqa: BLE001 - messages may be in flight: the job ends, as for a call that cannot fail
            abort_all(plan.comm, "a loop that cannot fail", exc)
            raise  # pragma: no cover - Abort does not return
        if error:
            abort_all(plan.comm, "communication", InternalError(f"MPI returned error code {error} in the compiled replay "
                                                               f"of {plan.label}"))
        for reduction in reductions:
            reduction.start()
        for storage, depth in self._validity:
            storage.valid_depth = depth

    def _bind(self) -> None:
        """Take the plan's arguments, exchanges' arrays and records as bound now (after a rebind)."""
        plan = self.plan
        parts = tuple(exchange.compiled_parts() for exchange in self._exchanges)
        self.call.bind(self._fixed + tuple(call.arguments for call in self._calls) + parts)
        steps = plan.steps
        self._settle = tuple(storage for step in steps for storage in step.settle)
        self._reductions = tuple(reduction for step in steps for reduction in step.reductions)
        final = {}  # storage -> the depth its last step leaves it at (as the steps set them in turn)
        for step in steps:
            for storage, depth in step.validity:
                final.pop(id(storage), None)
                final[id(storage)] = (storage, depth)
        self._validity = tuple(final.values())
        self._records = None if plan.binding is None else plan.binding.records


def _eligible(plan) -> bool:
    if plan.comm is None or plan._agree or plan.overlap.progress not in ("none", "thread"):
        return False
    reduced = set()
    for step in plan.steps:
        if step.tasks is not None or any(id(storage) in reduced for storage in step.settle):
            return False
        if any(getattr(call, "function", None) is None for call in (step.core, step.rest, step.tail)
               if call is not None):
            return False
        reduced.update(id(reduction.storage) for reduction in step.reductions)
    return True


def _exchanges(plan) -> list:
    """The plan's exchanges, each once, in the order they first begin."""
    found = {}
    for step in plan.steps:
        for exchange in (*step.exchanges, *step.eager):
            found.setdefault(id(exchange), exchange)
    return list(found.values())


def _program(plan):
    """``(calls, program, terms, slots, stamps)``: the plan's steps as replay operations, in the
    order :meth:`~meshchain.engine.plans.Plan._steps` runs them, and its timings as ``(slot,
    end stamp, begin stamp)`` rows over the account slots ``slots``."""
    calls, program, terms, slots = [], [], [], {}
    number = {id(exchange): j for j, exchange in enumerate(_exchanges(plan))}
    stamps = 0

    def stamp() -> int:
        nonlocal stamps
        program.append(("stamp", stamps))
        stamps += 1
        return stamps - 1

    def call(prepared) -> None:
        if prepared is not None:
            program.append(("call", len(calls)))
            calls.append(prepared)

    def add(slot, end, begin) -> None:
        terms.append((slots.setdefault(slot, len(slots)), end, begin))

    flight = None  # the eager messages of the next step: (posted stamp, [(end, begin)] computed since)
    for step in plan.steps:
        if not step.posted:
            program.extend(("begin", number[id(exchange)]) for exchange in step.exchanges)
            flight = (stamp(), [])
        t0 = stamp()
        call(step.core)
        t1 = stamp()
        program.extend(("end", number[id(exchange)]) for exchange in step.exchanges)
        t2 = stamp()
        call(step.rest)
        t3 = stamp()
        if step.exchanges:  # progress "none"/"thread": complete at the end of the wait
            posted, before = flight
            add(("flight", step.waits), t2, posted)
            for end, begin in [*before, (t1, t0)]:
                add(("hidden", step.waits), end, begin)
        if step.eager:
            program.extend(("begin", number[id(exchange)]) for exchange in step.eager)
            t4 = stamp()
            call(step.tail)
            t5 = stamp()
            flight = (t4, [(t5, t4)])
            if step.tail_share >= 0:
                add(("compute", step.tail_share), t5, t4)
            if step.waits is None:
                add(("core",), t5, t4)
        if step.core_share >= 0:
            add(("compute", step.core_share), t1, t0)
        if step.rest_share >= 0:
            add(("compute", step.rest_share), t3, t2)
        if step.waits is not None:
            add(("wait", step.waits), t2, t1)
        else:
            add(("chain_wait",), t2, t1)
            add(("core",), t1, t0)
            add(("halo",), t3, t2)
    program, same = _merged_stamps(program)
    table = np.array([(slot, same[end], same[begin]) for slot, end, begin in terms], dtype=np.int64).reshape(-1, 3)
    return calls, program, table, list(slots), max(len(set(same.values())), 1)


def _merged_stamps(program):
    """``program`` with each run of stamps that nothing separates taken once, and the stamps
    renumbered: ``(program, {old stamp: new stamp})``.

    >>> _merged_stamps([("stamp", 0), ("stamp", 1), ("call", 0), ("stamp", 2)])
    ([('stamp', 0), ('call', 0), ('stamp', 1)], {0: 0, 1: 0, 2: 1})
    """
    merged, same, previous = [], {}, None
    for operation, number in program:
        if operation != "stamp":
            merged.append((operation, number))
            previous = None
            continue
        if previous is None:
            previous = len(set(same.values()))
            merged.append(("stamp", previous))
        same[number] = previous
    return merged, same
