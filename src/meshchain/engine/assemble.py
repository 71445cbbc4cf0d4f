"""Assembling an executable plan from a unit's schedule.

For each segment of the :class:`~meshchain.inspector.schedule.Schedule`: the storage
records of its loops' dats and globals, their maps' local values and the block
colourings of its runs (:class:`~meshchain.backends.base.PhaseRun`), turned into one
prepared backend call per phase by the first registered phase variant that applies
(:data:`PHASE_VARIANTS`: chunks on threads for an interior with ``interior="dynamic"``,
sparse tiles when the chain asks for them, else one plain call); its
exchanges, with their rows and persistent requests; on several ranks the reduction
buffers of its globals; and the storage whose halo validity changes. What each run of
the plan adds to the statistics is read off the schedule (:mod:`.accounting`).

On several ranks the ranks agree on failures when the plan is built (compiling can fail
on some ranks only: a rank with no iterations of a loop compiles nothing for it), so all
of them raise the same error and none runs the plan.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.engine.strategies import schedule_for
>>> from meshchain.engine.units import Unit
>>> from meshchain.ir.loop import make_loop
>>> cells = mc.Set(3, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> one = mc.Kernel.from_source("def one(a):\\n    a[0] = 1.0\\n")
>>> session = mc.get_runtime()
>>> unit = Unit((make_loop(one, cells, (q(mc.WRITE),)),), None, session.store)
>>> plan = assemble(session, unit, schedule_for(session, unit, "serial"))
>>> plan.run()
>>> q.data[:, 0].tolist()
[1.0, 1.0, 1.0]
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from ..backends.base import PhaseRun
from ..comm.agree import agree_on_failure
from ..comm.exchange import GROUPED_TAG
from ..core import profiling
from ..core.access import Access
from ..core.errors import MeshchainWarning
from .accounting import PlanAccount, account_for, add_compiling
from .boundary import boundary_task_calls, layer_rows
from .eager import eager_splits
from .plans import Plan, Reduction, Step
from .rebind import Binding
from .replay import CompiledReplay
from .tiling import Tiling, tiled_phase
from .traffic import moved_bytes

__all__ = ["assemble", "PHASE_VARIANTS", "phase_variant"]


def assemble(session, unit, schedule, *, profile=None, tiling: Tiling | None = None) -> Plan:
    """The executable plan of ``unit`` run by ``schedule`` (collective on several ranks)."""
    if not session.distributed:
        return _assembled(session, unit, schedule, profile, tiling)
    plan = failure = None
    try:
        plan = _assembled(session, unit, schedule, profile, tiling)
    except Exception as exc:  # noqa: BLE001 - agreed on below, then raised on every rank
        failure = exc
    try:
        agree_on_failure(session.comm, failure)
        _agree_on_rebinding(session.comm, plan.binding)
    except BaseException:
        if plan is not None:
            plan.close()
        raise
    return plan


PHASE_VARIANTS: list = []
"""``(name, make)`` in the order they are tried: ``make(builder, bound, interior)`` returns
``(call, [(loop, colours), ...])`` for a phase of bound runs, or None where it does not apply."""


def phase_variant(name: str):
    """Register ``make`` as a way to prepare a phase (tried before those registered later)."""
    def register(make):
        PHASE_VARIANTS.append((name, make))
        return make

    return register


@phase_variant("chunked")
def _chunked_phase(builder, bound, interior: bool):
    """``interior="dynamic"``: the runs that overlap messages in flight, in chunks on threads."""
    if not (interior and builder.tiling is None and builder.session.config.interior == "dynamic"):
        return None
    call = builder.backend.chunked(bound, builder._report, workers=builder.backend.chunk_workers())
    return call, _run_colours(bound)


@phase_variant("tiled")
def _tiled_phase(builder, bound, interior: bool):
    """A sparse-tiled chain: the phase's runs tile by tile (None where tiling does not apply)."""
    if builder.tiling is None:
        return None
    tiled = tiled_phase(builder.session, bound, builder.tiling, builder._report)
    if tiled is None:
        return None
    builder.tile_plans.extend(tiled.plans)
    builder.groups += len(tiled.plans)
    return tiled.call, [(run.loop, plan.ncolours) for plan in tiled.plans for run in bound]


@phase_variant("plain")
def _plain_phase(builder, bound, interior: bool):
    """One backend call for the phase (the fallback: always applies)."""
    return builder.backend.phase(bound, builder._report), _run_colours(bound)


def _run_colours(bound) -> list:
    return [(run.loop, run.colouring.ncolours) for run in bound if run.colouring is not None]


def _agree_on_rebinding(comm, binding) -> None:
    """Every rank rebinds the plan, or none does (a rank building it again alone would wait
    in the build's collectives for the others forever)."""
    from mpi4py import MPI

    binding.supported = bool(comm.allreduce(int(binding.supported), op=MPI.MIN))


def _assembled(session, unit, schedule, profile, tiling) -> Plan:
    distributed = session.distributed
    layouts = [session.layout.of(loop.iterset) for loop in unit.loops] if distributed else None
    account = PlanAccount({}, None, unit.chain, [])
    builder = _Builder(session, unit, tiling, account)
    splits = eager_splits(session, unit, schedule)
    try:
        exchanges = [[builder.exchange(spec) for spec in segment.exchanges] for segment in schedule.segments]
        steps = [builder.step(segment, schedule.strategy, exchanges=exchanges[i], posted=i - 1 in splits,
                              split=splits.get(i), eager=exchanges[i + 1] if i in splits else ())
                 for i, segment in enumerate(schedule.segments)]
    except BaseException:
        for close in builder.closers:  # exchanges made so far hold persistent requests
            close()
        raise
    counted = account_for(schedule, unit.names, layouts=layouts, chain=unit.chain, colours=builder.colours,
                          profile=profile, tiling=builder.tiling_stats(tiling), arithmetic=builder.arithmetic,
                          moved=_traffic(session, unit))
    account.loops, account.chain = counted.loops, counted.chain
    plan = Plan(steps, account, kernels=unit.kernels, comm=session.comm if distributed else None,
                closers=builder.closers, chain=unit.options is not None,
                agree=any(session.backend.may_fail(loop) for loop in unit.loops),
                overlap=session.overlap() if distributed else None)
    plan.binding = Binding(unit.records, steps=plan.steps, exchanges=builder.exchanges,
                           prepared=builder.prepared, prepare=session.backend.prepare_data)
    if distributed:
        plan.compiler = functools.partial(_compiled_replay, session)
    else:
        plan.repeater = functools.partial(_repeater, session, plan)
    return plan


def _compiled_replay(session, plan):
    """``plan``'s compiled replay (:mod:`.replay`), its compile counted under the plan's first loop."""
    return CompiledReplay.make(plan, backend=session.backend, report=_compile_report(session, plan))


def _repeater(session, plan, call):
    """The backend's repeater of ``plan``'s one call (:meth:`~.plans.Plan.run_times`), its
    compile counted under the plan's first loop."""
    return session.backend.repeater(call, _compile_report(session, plan))


def _compile_report(session, plan):
    """``report(seconds, compiled, hits)``: a compile made for ``plan`` as a whole, counted under
    its first loop."""
    first = next(iter(plan.account.loops), plan.name)

    def report(seconds: float, compiled: bool, hits: int) -> None:
        add_compiling(session.recorder, first, seconds, compiled=compiled, hits=hits)

    return report


class _Builder:
    """Binds the segments of one plan (see the module docstring)."""

    def __init__(self, session, unit, tiling, account):
        self.session, self.unit, self.tiling, self.account = session, unit, tiling, account
        self.backend = session.backend
        self.colours: dict = {}
        self.arithmetic: dict = {}  # loop name -> iterations per run by index arithmetic
        self.closers: list = []
        self.tile_plans: list = []
        self.groups = 0
        self.exchanges: list = []  # (exchange, the object keys of its items)
        self.prepared: set = set()  # (object key, write): storage handed to the backend's prepare_data

    # --- one segment ------------------------------------------------------------------------------

    def step(self, segment, strategy: str, *, exchanges, posted: bool = False, split=None, eager=()) -> Step:
        """The bound step of ``segment``: ``exchanges`` its exchange objects (``posted``: begun
        by the step before); ``split`` ``(loop position, iteration)`` cuts the rest there, its
        owned iterations below the cut forming the tail, run after ``eager`` (the next step's
        exchanges) begin (see :mod:`.eager`)."""
        session, unit = self.session, self.unit
        reductions = self._reductions(segment) if session.distributed else {}
        flying = bool(exchanges) and bool(segment.core)
        core, core_share = self._phase(segment.core, reductions, interior=flying)
        rest_runs, tail_runs = _cut(segment.rest, split)
        tasks = self._tasks(segment, rest_runs, reductions, exchanges)
        rest, rest_share = self._phase(rest_runs, reductions) if tasks is None else (None, self._share(rest_runs))
        tail, tail_share = self._phase(tail_runs, reductions, interior=True)
        settle = []
        if session.distributed:
            settle = [unit.storage[a.obj] for p in segment.loops for a in unit.signature[p].args if a.is_global]
        validity = [(unit.storage[key], depth) for key, depth in segment.validity]
        waits = unit.names[segment.loops[0]] if strategy == "per-loop" else None
        return Step(settle=_distinct(settle), reductions=[r for rs in reductions.values() for r in rs.values()],
                    exchanges=exchanges, core=core, rest=rest, validity=validity, core_share=core_share,
                    rest_share=rest_share, waits=waits, posted=posted, eager=eager, tail=tail, tail_share=tail_share,
                    tasks=tasks, detail={"core": self._detail(segment.core), "rest": self._detail(rest_runs),
                                         "tail": self._detail(tail_runs)})

    def _detail(self, runs) -> tuple:
        """``(loop name, iterations, of them on the exec halo)`` of each of ``runs`` that has iterations."""
        unit, layout = self.unit, self.session.layout if self.session.distributed else None
        found = []
        for run in runs:
            if run.end > run.start:
                loop = unit.loops[run.loop]
                owned = layout.of(loop.iterset).n_owned if layout is not None else run.end
                found.append((loop.name, run.end - run.start, max(0, run.end - max(run.start, owned))))
        return tuple(found)

    def _tasks(self, segment, runs, reductions, exchanges):
        """The step's boundary tasks (``boundary="tasks"``), or None: its rest runs in bulk."""
        if self.session.config.boundary != "tasks" or self.tiling is not None or not self.session.distributed:
            return None
        bound = self._bound(runs, reductions)
        tasks, why_not = boundary_task_calls(self.session, self.unit, segment, bound, exchanges, self._report)
        if tasks is not None:
            self._count_arithmetic(bound)
        if why_not is not None:
            warnings.warn(MeshchainWarning(f"[boundary-bulk] loops {list(self.unit.names)} run their boundary in "
                                           f"bulk, not as tasks: {why_not}."), stacklevel=2)
        return tasks

    def _share(self, runs) -> int:
        """The account's compute index of the rest's runs (run as tasks)."""
        counted = [(self.unit.loops[run.loop].name, run.end - run.start) for run in runs if run.end > run.start]
        if not counted or self.backend.times_itself:
            return -1
        return self.account.add_phase(counted)

    def _reductions(self, segment) -> dict:
        """Per loop position that reduces globals: argument position -> its :class:`Reduction`
        (one per distinct global of the loop)."""
        from mpi4py import MPI

        operations = {Access.INC: MPI.SUM, Access.MIN: MPI.MIN, Access.MAX: MPI.MAX}
        found = {}
        for position in segment.reduces:
            loop, by_global = self.unit.loops[position], {}
            for i, arg in enumerate(loop.args):
                if arg.data.is_global and arg.access is not Access.READ:
                    storage = self.unit.storage[self.unit.signature[position].args[i].obj]
                    if id(storage) not in by_global:
                        by_global[id(storage)] = Reduction(self.session.comm, storage, operations[arg.access],
                                                           inc=arg.access is Access.INC, loop=loop.name)
                    found.setdefault(position, {})[i] = by_global[id(storage)]
        return found

    def exchange(self, spec):
        unit, layout = self.unit, self.session.layout
        items = []
        for key, lo, hi in spec.items:
            storage = unit.storage[key]
            set_layout = layout.of(unit.objects[key].dataset)
            items.append((storage, layer_rows(set_layout.exports, lo, hi), layer_rows(set_layout.imports, lo, hi)))
        tag = GROUPED_TAG if spec.grouped else items[0][0].tag
        exchange = self.backend.halo_exchange(self.session.comm, items, tag=tag, transport=self.session.transport)
        exchange.label = ", ".join(repr(unit.objects[key].name) for key, _, _ in spec.items)  # for hang reports
        self.closers.append(exchange.close)
        self.exchanges.append((exchange, tuple(key for key, _, _ in spec.items)))
        return exchange

    # --- phases -----------------------------------------------------------------------------------

    def _phase(self, runs, reductions, *, interior: bool = False):
        """A prepared call for ``runs`` (schedule runs) and its index into the account's
        compute times (-1: the backend times itself, or there is nothing to run).
        ``interior``: the runs overlap messages in flight (``interior="dynamic"`` chunks them)."""
        bound = self._bound(runs, reductions)
        if not bound:
            return None, -1
        self._count_arithmetic(bound)
        for _, make in PHASE_VARIANTS:  # the first variant that applies makes the call
            made = make(self, bound, interior)
            if made is not None:
                break
        call, colours = made
        for loop, ncolours in colours:
            self._colour(loop, ncolours)
        if call is None or self.backend.times_itself:
            return call, -1
        return call, self.account.add_phase([(run.loop.name, run.end - run.start) for run in bound])

    def _bound(self, runs, reductions) -> list:
        """The :class:`PhaseRun` pieces of ``runs`` (schedule runs) that have iterations."""
        return [piece for run in runs if run.end > run.start for piece in self._bind(run, reductions)]

    def _bind(self, run, reductions) -> list:
        """``run`` as :class:`PhaseRun` pieces: one, or for a lowered grid loop the iterations
        in its block's middle by index arithmetic and the others through maps (see
        :mod:`.grids`; not in a plan with sparse tiles, which run lowered grid loops as mesh loops)."""
        unit = self.unit
        loop = self._layers_here(unit.loops[run.loop])
        keys = {}
        for i, spec in enumerate(loop.specs):
            keys.setdefault(spec.slot, unit.signature[run.loop].args[i].obj)
        data = tuple(unit.storage[keys[slot]] for slot in range(len(keys)))
        self._prepare(loop, keys)
        maps = tuple(_map_rows(loop, slot, self.session.layout.values(m)) for slot, m in enumerate(loop.maps))
        targets = {}
        if run.targets != "global":
            for i, reduction in reductions.get(run.loop, {}).items():
                targets[i] = reduction.owned if run.targets == "owned" else reduction.scratch
        timer = self.account.timer(loop.name) if self.backend.times_itself else None
        whole = PhaseRun(loop, run.start, run.end, data, maps, targets, None, timer)
        arithmetic = self._arithmetic(loop)
        if arithmetic is None or run.start >= arithmetic.count:
            pieces = [whole]
        else:
            middle = min(run.end, arithmetic.count)
            pieces = [whole._replace(loop=arithmetic.loop, end=middle, maps=()), whole._replace(start=middle)]
        return [self._coloured(piece) for piece in pieces if piece.end > piece.start]

    def _layers_here(self, loop):
        """``loop``, or where this rank's local numbering breaks the arithmetic by which it finds an
        extruded map's targets per layer, the loop reading every layer's stored rows instead."""
        layout = self.session.layout
        if not self.session.distributed or all(layout.follows_layers(loop.maps[spec.map_slot])
                                                for spec in loop.specs if spec.layers):
            return loop
        return loop.with_stored_rows

    def _count_arithmetic(self, bound) -> None:
        """Add the iterations of ``bound``'s pieces that run by index arithmetic to the account."""
        for piece in bound:
            if any(spec.grid for spec in piece.loop.specs):
                name = piece.loop.name
                self.arithmetic[name] = self.arithmetic.get(name, 0) + piece.end - piece.start

    def _arithmetic(self, loop):
        """``loop``'s part by index arithmetic on this rank (a lowered grid loop's), or None."""
        if self.tiling is not None or not self.backend.grid_arithmetic or not self.session.distributed:
            return None
        return self.session.grid_lowering.arithmetic(loop, self.session.layout)

    def _coloured(self, piece) -> PhaseRun:
        """``piece`` with the block colouring of its range, when the backend asks for one."""
        block_size = self.backend.colouring_block_size(piece.loop)
        if block_size is None:
            return piece
        return piece._replace(colouring=self.session.colouring(piece.loop, piece.start, piece.end,
                                                               block_size=block_size))

    def _prepare(self, loop, keys) -> None:
        """Hand the loop's dats to the backend's ``prepare_data`` (``keys``: slot -> object key)."""
        for spec in loop.specs:
            prepared = (keys[spec.slot], spec.access.writes)
            if spec.kind != "global" and prepared not in self.prepared:
                self.prepared.add(prepared)
                self.backend.prepare_data(self.unit.storage[prepared[0]], write=prepared[1])

    def _colour(self, loop, count: int) -> None:
        position = self.unit.loops.index(loop.recorded)
        self.colours[position] = max(self.colours.get(position, 0), count)

    def _report(self, loop, seconds: float, compiled: bool, hits: int) -> None:
        add_compiling(self.session.recorder, loop.name, seconds, compiled=compiled, hits=hits)
        profiler = profiling.active
        if profiler is not None:
            ended = profiling._clock()
            what = "compile" if compiled and not hits else "load" if compiled else "generate"
            profiler.span(profiling.label(f"{what} {loop.name}", "compile", cached=bool(hits)), ended - seconds, ended)

    def tiling_stats(self, tiling):
        if tiling is None:
            return None
        plans = self.tile_plans
        return (tiling.tile_size, self.groups, max((p.ntiles for p in plans), default=0),
                max((p.ncolours for p in plans), default=0))


def _traffic(session, unit):
    """``moved(position, iterations)``: the bytes iterations of the unit's loop ``position`` move."""
    layout = session.layout

    def rows(dat) -> int:
        return session.storage(dat).host.shape[0]

    def map_itemsize(m) -> int:
        values = layout.values(m)
        return 4 if values is None else values.dtype.itemsize

    def moved(position: int, iterations: int) -> int:
        return moved_bytes(unit.loops[position], iterations, rows=rows, map_itemsize=map_itemsize)

    return moved


def _cut(runs, split) -> tuple:
    """``runs`` (a segment's rest) cut at ``split`` = ``(loop position, iteration)``: the
    owned iterations of that loop below the cut move to the tail (see :mod:`.eager`)."""
    if split is None:
        return runs, ()
    position, at = split
    rest, tail = [], []
    for run in runs:
        if run.loop == position and run.targets == "owned" and run.start < at:
            tail.append(run._replace(end=min(at, run.end)))
            if at < run.end:
                rest.append(run._replace(start=at))
        else:
            rest.append(run)
    return tuple(rest), tuple(tail)


def _distinct(records) -> list:
    seen = {}
    for record in records:
        seen.setdefault(id(record), record)
    return list(seen.values())


def _map_rows(loop, slot: int, values):
    """What a loop gets of map ``slot``: its rows, or for an extruded map whose targets the loop
    finds per layer by arithmetic (:attr:`~meshchain.ir.loop.ArgSpec.layers`) the bottom layer's
    rows only (every ``layers``-th row: the elements are numbered column by column)."""
    layers = next((s.layers[0] for s in loop.specs if s.map_slot == slot and s.layers), 0)
    return values if not layers else np.ascontiguousarray(values[::layers])

