"""Boundary tasks of a plan's step (``mc.configure(boundary="tasks")``).

Where a step exchanges halos, its rest (the iterations that touch received rows) is cut
into tasks by the neighbours whose messages each iteration needs
(:func:`meshchain.inspector.tasks.boundary_tasks`), and each task becomes one prepared
backend call: a one-tile plan over the rest's runs (the backend's ``tiled`` call), so it
runs just its iterations, program order kept. The plan then waits for the messages
neighbour by neighbour (:func:`meshchain.comm.exchange.arrivals`) and runs each task as
soon as its neighbours' messages are in (:class:`BoundaryTasks`).

Steps where this cannot work run the rest in bulk, as without the option: an exchange
whose transport completes all neighbours at once (``"neighbour"``, ``"rma"``) or that
stages rows through a device, a backend that cannot run listed iterations, a sparse-tiled
chain, arguments other than dats and globals, or more than 63 neighbours.

Examples
--------
>>> calls = []
>>> tasks = BoundaryTasks(((0, lambda: calls.append("mine")), (0b10, lambda: calls.append("needs 7"))), {7: 0b10})
>>> waiting, failure = tasks.ready(0, None)
>>> waiting, calls
([1], ['mine'])
>>> tasks.ready(0b10, None, waiting)[0], calls
([], ['mine', 'needs 7'])
"""

from __future__ import annotations

import numpy as np

from ..inspector.tasks import boundary_tasks
from ..inspector.tiling import single_tile_plan
from ..ir.loop import argument_rows, map_rows_of
from ..types.args import DIRECT, GLOBAL, INDIRECT, STENCIL, WHOLE_MAP
from .plans import guarded

__all__ = ["BoundaryTasks", "boundary_task_calls", "layer_rows"]


class BoundaryTasks:
    """A step's tasks: ``calls`` as ``(mask, call)`` (in a valid order) and each neighbour's
    bit (``bits``)."""

    __slots__ = ("calls", "bits")

    def __init__(self, calls, bits: dict):
        self.calls, self.bits = tuple(calls), dict(bits)

    def ready(self, arrived: int, failure, waiting=None):
        """Run the tasks of ``waiting`` (positions; default all) whose neighbours are all in
        ``arrived``, in order; return ``(positions still waiting, failure)``. A task's
        predecessors need a subset of its neighbours and come earlier in the order, so they
        have run. After a failure, tasks are skipped."""
        calls, still = self.calls, []
        for position in range(len(calls)) if waiting is None else waiting:
            mask, call = calls[position]
            if mask & ~arrived:
                still.append(position)
            elif failure is None:
                failure = guarded(call)
        return still, failure


def boundary_task_calls(session, unit, segment, bound, exchanges, report):
    """``(tasks, why not)``: the :class:`BoundaryTasks` of a step's rest ``bound`` (PhaseRuns,
    program order), or None and the reason the step runs its rest in bulk (None when there
    is nothing to wait for)."""
    backend = session.backend
    if not bound or not exchanges:
        return None, None
    if not backend.can_tile:
        return None, f"the {backend.name} backend cannot run listed iterations"
    if not all(e.arrives_by_neighbour for e in exchanges):
        return None, (f"the {session.transport} transport completes all neighbours at once, or halos are staged "
                      f"through a device; use transport='persistent' or 'p2p'")
    touched = [_touched(unit, run) for run in bound]
    if any(t is None for t in touched):
        return None, "a loop has arguments other than dats and globals"
    imports, rows = _imports(session, unit, segment), {}
    for _, run in touched:
        for key, _ in run:
            rows[key] = len(unit.storage[key].host)
    for key in imports:
        rows.setdefault(key, len(unit.storage[key].host))
    neighbours = sorted({n for by_neighbour in imports.values() for n in by_neighbour})
    tasks = boundary_tasks(touched, imports, rows, neighbours)
    if tasks is None:
        return None, f"this rank has {len(neighbours)} neighbours, more than a mask holds"
    calls = []
    for task in tasks:
        elements = {run: offsets for run, offsets in task.parts}
        plan = single_tile_plan([run.start + elements.get(r, np.zeros(0, dtype=np.int64))
                                 for r, run in enumerate(bound)])
        calls.append((task.mask, backend.tiled(plan, bound, report)))
    # bits in the order the inspector numbered the neighbours
    return BoundaryTasks(calls, {n: 1 << k for k, n in enumerate(neighbours)}), None


def _touched(unit, run):
    """``(iterations, [(dat key, rows per iteration)])`` of a bound run; None when one of its
    arguments is neither a dat (directly or through a map) nor a global."""
    loop, position = run.loop, unit.loops.index(run.loop.recorded)
    n = run.end - run.start
    found = []
    for i, spec in enumerate(loop.specs):
        if spec.kind == GLOBAL:
            continue
        key = unit.signature[position].args[i].obj
        if spec.kind in (DIRECT, STENCIL):  # a grid loop's arithmetic part reaches its points by its geometry
            rows = argument_rows(spec, np.arange(run.start, run.end, dtype=np.int64))
        elif spec.kind in (INDIRECT, WHOLE_MAP):
            rows = map_rows_of(spec, run.maps[spec.map_slot], np.arange(run.start, run.end, dtype=np.int64))
        else:
            return None
        found.append((key, rows.astype(np.int64, copy=False).reshape(n, -1)))
    return n, found


def _imports(session, unit, segment) -> dict:
    """``{dat key: {neighbour: rows}}`` received by the step's exchanges."""
    imports: dict = {}
    for spec in segment.exchanges:
        for key, lo, hi in spec.items:
            layout = session.layout.of(unit.objects[key].dataset)
            for neighbour, received in layer_rows(layout.imports, lo, hi).items():
                by_neighbour = imports.setdefault(key, {})
                by_neighbour[neighbour] = np.concatenate([by_neighbour.get(neighbour, np.zeros(0, np.int64)),
                                                          received])
    return imports


def layer_rows(table: dict, lo: int, hi: int) -> dict:
    """Per neighbour, the rows of layers ``lo+1..hi`` in ``table`` (``{neighbour: [per layer]}``)."""
    rows = {}
    for neighbour, per_layer in table.items():
        chosen = per_layer[lo:hi]
        joined = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
        if joined.size:
            rows[neighbour] = joined
    return rows
