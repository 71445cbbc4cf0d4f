"""A captured step's plan replayed by compiled calls on several ranks.

On one process a captured step's replay is one compiled call already. On several ranks
its plan (:mod:`.plans`) runs its steps in Python: each exchange is packed and started,
the core computed, the messages waited for and unpacked, the rest computed, a few
microseconds of Python and mpi4py per step, which a replay of small steps cannot hide.
:class:`CompiledReplay` runs the same plan as one call of a function the backend compiles
(:mod:`meshchain.backends.numba_replay`) per :data:`PIECE` prepared calls: the same
prepared calls with the same arguments, the same exchanges' packing, ``MPI_Startall``,
``MPI_Waitall`` and unpacking on the same buffers, and the same reductions over ranks
(``MPI_Iallreduce``, ``MPI_Wait``), in the same order, so it sends the same messages and
computes the same bits. The plan's timings are taken inside it (by the processor's
time-stamp counter where :func:`~meshchain.comm.by_address.cycle_seconds` trusts it, else by
the clock ``time.perf_counter`` reads) and added to its account as the Python path adds them.

What it needs, else the plan replays in Python as before (each rank decides alone: both
ways send the same messages in the same order):

* a plan of several ranks whose calls cannot fail (a plan that agrees on failures after
  every run keeps doing so in Python);
* the backend's prepared calls (the numba backend's; not tiled, chunked, GPU or reference
  calls), no boundary tasks, computation overlapping messages as one call (progress
  ``"none"`` or ``"thread"``);
* exchanges of the ``"persistent"`` transport with no rows staged through a device;
* any reductions over ranks: they are reset, started and waited for inside the compiled
  calls where the Python path does so (reset before their step, started after it, waited
  for where a later step reads or reduces the global again), so every rank starts the same
  collectives in the same order whichever way it runs the plan; a reduction no later step
  needs is handed back in flight, as the Python path leaves it (the global's pending
  reduction, finished when its value is read);
* no profiler recording and no hang diagnostics watching (those runs go through Python,
  which reports each step), and a step not run with ``ca="auto"`` (its learner times every
  run, and its decisions are collective: a rank replaying compiled would skip them).

Compiled replays are not observed by the model (:mod:`.auto`): its driver overheads ``o_r``
and ``o_l`` are those of plans run step by step.

A plan is compiled once it has been replayed :data:`COMPILE_AFTER` times (a piece takes a
few seconds the first time on a machine, and loads from the disk cache afterwards), so a
step replayed a few times never pays for it. Pieces keep a long plan's compile in check:
compiling one function, and the boxing of its arguments, takes time that grows faster than
its size. MG-CFD's captured cycle on 2 ranks, 90 calls, the first time on a machine: 2-3
minutes as one function; about one as pieces of 12 whose arguments were boxed as one tuple
each; 18 s with each call's, exchange's and reduction's arguments boxed on their own
(:mod:`meshchain.backends.numba_replay`; pieces of 6 and 24 took longer:
``benchmarks/replay_compile.py``). ``mc.stats()`` counts the compiles under the plan's first
loop (its ``time_compile``, ``compilations`` and ``cache_hits``).

Examples
--------
>>> import numpy as np
>>> from meshchain.engine.plans import Plan, Step
>>> CompiledReplay.make(Plan([Step(core=lambda: None)], None), backend=None, report=None) is None
True
"""

from __future__ import annotations

import warnings
import weakref
from typing import NamedTuple

import numpy as np

from ..comm.agree import abort_all
from ..comm.by_address import cycle_seconds
from ..core import activity, profiling
from ..core.errors import InternalError, MeshchainWarning

__all__ = ["CompiledReplay", "COMPILE_AFTER"]

#: Replays of a plan before it is compiled (a piece costs a few seconds the first time).
COMPILE_AFTER = 32

#: Prepared calls per compiled piece of a replay: compiling one function (and the boxing of its
#: arguments) takes time that grows faster than its size (90 calls in one piece: minutes; MG-CFD's
#: cycle compiled in 18 s as pieces of 12, 20 s as pieces of 6, 23 s as pieces of 24).
PIECE = 12


class Piece(NamedTuple):
    """A stretch of a replay's program compiled as one function: its operations numbered
    within it, and the plan's calls, exchanges and reductions they use (their numbers in the
    whole program, in the piece's order); ``last``: it adds the timings up."""

    program: list
    calls: tuple
    exchanges: tuple
    reductions: tuple
    last: bool


class CompiledReplay:
    """One plan as a few compiled calls (see the module docstring); :meth:`make` builds it."""

    __slots__ = ("plan", "pieces", "_calls", "_exchanges", "_fixed", "_records", "_bound", "_run", "_started",
                 "_in_flight")

    def __init__(self, plan, pieces, calls, exchanges, fixed, started, finished):
        """``pieces``: ``(Piece, the backend's compiled replay of it)`` in program order (bound by
        :meth:`_bind` before each run after a change of binding); ``calls`` and ``exchanges``: the
        plan's, in program order; ``fixed``: the arguments before the calls' (addresses, stamps,
        scratch, terms, seconds); ``started``: per reduction of the plan (in step order) its
        :class:`~meshchain.comm.compiled.CompiledReduction`; ``finished``: the numbers of those
        the compiled calls also wait for."""
        self.plan, self.pieces, self._calls, self._exchanges, self._fixed = plan, pieces, calls, exchanges, fixed
        self._started = started
        self._in_flight = tuple(number for number in range(len(started)) if number not in finished)
        self._records = self._run = self._bound = None

    @classmethod
    def make(cls, plan, *, backend, report):
        """The compiled replay of ``plan``, or None where it cannot be had (see the module
        docstring). ``report(seconds, compiled, cache_hits)``: told of each piece's compile."""
        from ..comm.compiled import CompiledReduction, addresses  # mpi4py: imported once the session started MPI

        if not _eligible(plan) or addresses() is None:
            return None
        exchanges = _exchanges(plan)
        parts = [exchange.compiled_parts() for exchange in exchanges]
        if any(part is None for part in parts):
            return None
        calls, program, terms, slots, nstamps, finished = _program(plan)
        reductions = _reductions(plan)
        started = tuple(CompiledReduction(plan.comm, reduction.owned, reduction.op) for reduction in reductions)
        tick = cycle_seconds()  # seconds per stamp unit (None: the stamps are seconds)
        stamps = np.zeros(nstamps, dtype=np.float64 if tick is None else np.int64)
        fixed = (addresses(), stamps, np.zeros(2, dtype=np.int64), terms, np.zeros(max(len(slots), 1)))
        reduction_parts = _reduction_parts(reductions, started)
        compiled = []
        for piece in _pieces(program, PIECE):
            sample = _arguments(piece, fixed, [call.arguments for call in calls], parts, reduction_parts)
            try:
                call = backend.replay([calls[i] for i in piece.calls], len(piece.exchanges), piece.program, sample,
                                      lambda _, s, c, h: report(s, c, h),
                                      reductions=[reductions[r].inc for r in piece.reductions], ticks=tick is not None)
            except Exception as exc:  # noqa: BLE001 - the Python path still runs the plan: say so, do not fail
                warnings.warn(MeshchainWarning(f"[replay] the replay of {plan.label} could not be compiled; it runs step "
                                               f"by step in Python: {type(exc).__name__}: {exc}"), stacklevel=2)
                return None
            if call is None:
                return None
            compiled.append((piece, call))
        fixed = fixed[:4] + (plan.account.measure(slots, unit=1.0 if tick is None else tick),)
        return cls(plan, tuple(compiled), calls, exchanges, fixed, started, finished)

    def run(self) -> None:
        """Run the plan once, counted and timed, as :meth:`~meshchain.engine.plans.Plan.run`
        does (a chain's total time is taken by the compiled call's first and last stamps)."""
        plan = self.plan
        if plan.binding is None or plan.binding.records is not self._records:
            self._bind()
        self._run()

    def again(self, pipeline, unit, state):
        """A function that runs the plan again as now bound, for a captured step's next replay
        (:meth:`~meshchain.engine.pipeline.Pipeline.run_unit`): it returns True where it ran, or
        False with nothing run where anything that picks or prepares the plan changed since
        (the plan dropped from the cache or closed, other objects bound to the plan or to
        ``unit``, a halo depth of ``unit``'s dats other than ``state``, a kernel's globals, a
        profiler or hang diagnostics watching). Its checks and the run are one Python call of
        locals: on 2 ranks it took 0.7-0.9 µs less a replay than the same work through the
        pipeline, the plan and this object. It holds the plan weakly (its compiled arguments
        strongly, until the step replays again)."""
        plan = self.plan
        guard = _Guard(weakref.ref(plan), plan.binding, self._records, unit, unit.records,
                       tuple(zip(unit.dats(), state)), plan.kernels, pipeline)
        return _runner(plan, *self._bound, guard=guard)

    def _bind(self) -> None:
        """Take the plan's arguments, exchanges' arrays and records as bound now (after a rebind)."""
        plan = self.plan
        parts = [exchange.compiled_parts() for exchange in self._exchanges]
        steps = plan.steps
        reductions = _reductions(plan)
        reduction_parts = _reduction_parts(reductions, self._started)
        arguments = [call.arguments for call in self._calls]
        for piece, call in self.pieces:
            call.bind(_arguments(piece, self._fixed, arguments, parts, reduction_parts))
        final = {}  # storage -> the depth its last step leaves it at (as the steps set them in turn)
        for step in steps:
            for storage, depth in step.validity:
                final.pop(id(storage), None)
                final[id(storage)] = (storage, depth)
        settle = tuple(storage for step in steps for storage in step.settle)
        self._bound = (tuple((call.entry, call.boxed) for _, call in self.pieces), settle,
                       tuple((reductions[number], self._started[number]) for number in self._in_flight),
                       tuple(final.values()))
        self._run = _runner(plan, *self._bound)
        self._records = None if plan.binding is None else plan.binding.records


class _Guard(NamedTuple):
    """What :meth:`CompiledReplay.again` checks before it runs the plan again (and the pipeline,
    whose counters a run adds to)."""

    plan: weakref.ref
    binding: object
    records: tuple  # the plan's binding's, as the compiled call was bound to them
    unit: object
    unit_records: tuple  # the unit's, when the guard was made
    depths: tuple  # (storage, valid depth) per dat of the unit
    kernels: tuple
    pipeline: object


def _runner(plan, calls, settle, in_flight, validity, *, guard=None):
    """The run of ``plan``'s compiled replay as bound: settle the globals read first (whose
    reductions are in flight), call each piece's entry point on its boxed arguments (``calls``),
    hand back the reductions left in flight (``in_flight``: ``(reduction, its compiled
    reduction)``), set the dats' valid halo depths (``validity``) and count the run; True. With
    a :class:`_Guard`, first its checks (False, nothing run, where one fails) and the pipeline's
    counters. One closure over locals: a Python call less per replay than a guard calling a run."""
    comm, label, account = plan.comm, plan.label, plan.account
    plan_of, binding, records, unit, unit_records, depths, kernels, pipeline = guard or (None,) * 8
    plans = None if pipeline is None else pipeline.plans

    def run() -> bool:
        if plan_of is not None:
            plan = plan_of()
            if (plan is None or not plan.compiled or binding.records is not records
                    or unit.records is not unit_records or profiling.active is not None or activity.watched):
                return False
            for storage, depth in depths:
                if storage.valid_depth != depth:
                    return False
            for kernel in kernels:
                if not kernel.unchanged():
                    return False
            pipeline.sequence += 1
            account.sequence = pipeline.sequence
            plans.hits += 1
        for storage in settle:
            if storage.pending is not None:
                storage.settle()
        error = 0
        for entry, boxed in calls:  # each piece runs (no request left in flight), the first error reported
            try:
                code = entry(boxed)
            except Exception as exc:  # noqa: BLE001 - messages may be in flight: the job ends, as for a call that cannot fail
                abort_all(comm, "a loop that cannot fail", exc)
                raise  # pragma: no cover - Abort does not return
            error = error or code
        if error:
            abort_all(comm, "communication", InternalError(f"MPI returned error code {error} in the compiled replay "
                                                          f"of {label}"))
        for reduction, started in in_flight:  # started inside the call; read after the plan (or never): as start() leaves it
            pending = reduction.pending
            pending.request = started.request_object()
            reduction.storage.pending = pending
        for storage, depth in validity:
            storage.valid_depth = depth
        account.runs += 1
        return True

    return run


def _eligible(plan) -> bool:
    if plan.comm is None or plan._agree or plan.overlap.progress not in ("none", "thread"):
        return False
    for step in plan.steps:
        if step.tasks is not None:
            return False
        if any(getattr(call, "function", None) is None for call in (step.core, step.rest, step.tail)
               if call is not None):
            return False
    return True


def _pieces(program, size: int) -> list:
    """``program`` cut into :class:`Piece` s of at most ``size`` calls each (at least one piece).

    >>> [(p.program, p.calls, p.exchanges, p.last) for p in _pieces(
    ...     [("begin", 4), ("call", 7), ("call", 8), ("end", 4), ("stamp", 0), ("call", 9)], 2)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [([('begin', 0), ('call', 0), ('call', 1), ('end', 0), ('stamp', 0)], (7, 8), (4,), False),
     ([('call', 0)], (9,), (), True)]
    """
    cuts, calls = [0], 0
    for position, (operation, _) in enumerate(program):
        if operation == "call":
            if calls == size:
                cuts.append(position)
                calls = 0
            calls += 1
    cuts.append(len(program))
    pieces = []
    for begin, end in zip(cuts, cuts[1:]):
        local = {"call": {}, "exchange": {}, "reduction": {}}
        ops = []
        for operation, number in program[begin:end]:
            kind = _KIND_OF.get(operation)
            ops.append((operation, number if kind is None else local[kind].setdefault(number, len(local[kind]))))
        pieces.append(Piece(ops, *(tuple(local[kind]) for kind in ("call", "exchange", "reduction")),
                            last=end == len(program)))
    return pieces


_KIND_OF = {"call": "call", "begin": "exchange", "end": "exchange", "reset": "reduction", "reduce": "reduction",
            "finish": "reduction"}  # operations numbering something of the plan (a stamp numbers a clock reading)


def _arguments(piece: Piece, fixed, calls, exchanges, reductions) -> tuple:
    """The arguments of ``piece``'s compiled function: ``fixed`` (only the last piece adds
    the timings up: the others get no terms), then its calls', exchanges' and reductions'."""
    functions, stamps, scratch, terms, acc = fixed
    if not piece.last:
        terms = np.zeros((0, 3), dtype=np.int64)
    return ((functions, stamps, scratch, terms, acc) + tuple(calls[i] for i in piece.calls)
            + tuple(exchanges[j] for j in piece.exchanges) + tuple(reductions[r] for r in piece.reductions))


def _reductions(plan) -> tuple:
    """The plan's reductions over ranks, in the order its steps start them."""
    return tuple(reduction for step in plan.steps for reduction in step.reductions)


def _reduction_parts(reductions, started) -> tuple:
    """Per reduction, what the compiled replay's ``("reset", r)``, ``("reduce", r)`` and
    ``("finish", r)`` take (:mod:`meshchain.backends.numba_replay`): owned values, result,
    handles, request, status, the global's value as bound now, and the scratch values."""
    return tuple((reduction.owned, reduction.pending.result, io.handles, io.request, io.status, reduction.storage.value,
                  reduction.scratch) for reduction, io in zip(reductions, started))


def _exchanges(plan) -> list:
    """The plan's exchanges, each once, in the order they first begin."""
    found = {}
    for step in plan.steps:
        for exchange in (*step.exchanges, *step.eager):
            found.setdefault(id(exchange), exchange)
    return list(found.values())


def _program(plan):
    """``(calls, program, terms, slots, stamps, finished)``: the plan's steps as replay
    operations, in the order :meth:`~meshchain.engine.plans.Plan._steps` runs them, its timings
    as ``(slot, end stamp, begin stamp)`` rows over the account slots ``slots``, and the
    numbers of the reductions a later step waits for (the others are left in flight)."""
    calls, program, terms, slots = [], [], [], {}
    reductions = _ReductionOrder()
    exchange_number = {id(exchange): j for j, exchange in enumerate(_exchanges(plan))}
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
    first = stamp()
    for step in plan.steps:
        program.extend(reductions.before(step))
        if not step.posted:
            program.extend(("begin", exchange_number[id(exchange)]) for exchange in step.exchanges)
            flight = (stamp(), [])
        t0 = stamp()
        call(step.core)
        t1 = stamp()
        program.extend(("end", exchange_number[id(exchange)]) for exchange in step.exchanges)
        t2 = stamp()
        call(step.rest)
        t3 = stamp()
        if step.exchanges:  # progress "none"/"thread": complete at the end of the wait
            posted, before = flight
            add(("flight", step.waits), t2, posted)
            for end, begin in [*before, (t1, t0)]:
                add(("hidden", step.waits), end, begin)
        if step.eager:
            program.extend(("begin", exchange_number[id(exchange)]) for exchange in step.eager)
            t4 = stamp()
            call(step.tail)
            t5 = stamp()
            flight = (t4, [(t5, t4)])
            if step.tail_share >= 0:
                add(("compute", step.tail_share), t5, t4)
            if step.waits is None:
                add(("core",), t5, t4)
        program.extend(reductions.after(step))
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
    if plan.chain:
        add(("total",), stamp(), first)
    program, same = _merged_stamps(program)
    table = np.array([(slot, same[end], same[begin]) for slot, end, begin in terms], dtype=np.int64).reshape(-1, 3)
    return calls, program, table, list(slots), max(len(set(same.values())), 1), reductions.finished


class _ReductionOrder:
    """Numbers a plan's reductions over ranks as :func:`_program` meets them, and places their
    operations where :meth:`~meshchain.engine.plans.Plan._steps` does the same: before a step,
    ``("finish", r)`` for each global it settles that an earlier step reduced, then ``("reset",
    r)`` for its own; after it, ``("reduce", r)``. ``finished``: the numbers waited for."""

    def __init__(self):
        self.count, self.finished = 0, set()
        self._in_flight: dict = {}  # storage id -> the number of its reduction started and not finished
        self._numbers = range(0)  # the step's own

    def before(self, step) -> list:
        operations = []
        for storage in step.settle:
            reduced = self._in_flight.pop(id(storage), None)
            if reduced is not None:
                operations.append(("finish", reduced))
                self.finished.add(reduced)
        self._numbers = range(self.count, self.count + len(step.reductions))
        self.count += len(step.reductions)
        return operations + [("reset", reduced) for reduced in self._numbers]

    def after(self, step) -> list:
        for reduction, reduced in zip(step.reductions, self._numbers):
            self._in_flight[id(reduction.storage)] = reduced
        return [("reduce", reduced) for reduced in self._numbers]


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
