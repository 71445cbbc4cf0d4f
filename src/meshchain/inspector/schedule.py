"""Schedules: one execution of a unit (a loop or a chain) as immutable data.

The engine runs every unit, on one rank or many, loop by loop or communication-avoiding,
through one pipeline (:mod:`meshchain.engine.plans`)::

    for each segment: begin exchanges -> core runs -> end exchanges -> rest runs
                      -> reductions over ranks -> halo validity

A :class:`Schedule` says what each step does, in terms of small integer keys (the
unit's loops by position, its dats by the keys of :class:`~.chain.ArgSig`, its sets by
set keys). It is built by pure functions from the unit's signature, the sets'
:class:`~meshchain.partition.layout.SetLayout`, and the valid halo depth of each dat:

* :func:`serial_schedule`: one process, every loop over its whole set, nothing exchanged;
* :func:`per_loop_schedule`: the paper's Alg. 1 for each loop in turn, one message per dat
  per neighbour, the halo validity carried from loop to loop;
* :func:`ca_schedule`: Alg. 2 over the segments of :func:`~.chain.plan_chain`, one grouped
  message per neighbour per segment (it may ask for more halo layers first).

A run is ``(loop, start, end, targets)``: iterations ``[start, end)`` of the unit's loop
``loop``, reducing globals into ``targets``: ``"global"`` (the global itself, one
process), ``"owned"`` (this rank's part, combined over ranks after the segment) or
``"scratch"`` (exec-halo iterations, which run redundantly and must not count).

Examples
--------
>>> from meshchain.core.access import Access
>>> from meshchain.inspector.chain import ArgSig, LoopSig
>>> from meshchain.inspector.schedule import serial_schedule
>>> inc = LoopSig("inc", 0, (ArgSig(0, False, False, Access.INC, 0),))
>>> schedule = serial_schedule((inc, inc), sizes={0: 5})
>>> [s.core for s in schedule.segments]
[(Run(loop=0, start=0, end=5, targets='global'), Run(loop=1, start=0, end=5, targets='global'))]
"""

from __future__ import annotations

from typing import NamedTuple

from ..partition.layout import MAX_LEVEL
from .chain import SetFacts, plan_chain, validity_after

__all__ = ["Run", "ExchangeSpec", "Segment", "Schedule", "MoreLayers", "serial_schedule", "per_loop_schedule",
           "ca_schedule", "set_facts"]


class Run(NamedTuple):
    loop: int
    start: int
    end: int
    targets: str


class ExchangeSpec(NamedTuple):
    """Bring each ``(dat key, lo, hi)`` of ``items`` from valid depth ``lo`` to ``hi``: one
    message per neighbour for all items (``grouped``) or, for one item, with the dat's tag.
    ``sizes`` are the bytes this rank sends to each neighbour, ``(neighbour, bytes)``."""

    items: tuple
    grouped: bool
    sizes: tuple

    @property
    def messages(self) -> int:
        return len(self.sizes)

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.sizes)

    @property
    def largest(self) -> int:
        return max((size for _, size in self.sizes), default=0)


class Segment(NamedTuple):
    """Loops ``loops`` (unit positions) with their exchanges, run at ``depths`` over
    ``iterations`` (owned plus exec halo) each.

    ``cores`` are the core iterations each loop *could* overlap with an exchange (the
    model's ``S^c``); the ``core`` runs overlap what is really in flight. ``validity`` is
    every dat's valid depth after the segment, ``reduces`` the loops whose globals are
    combined over ranks afterwards, ``reason`` why the segment could not start earlier.
    """

    loops: tuple
    depths: tuple
    iterations: tuple
    exchanges: tuple
    cores: tuple
    core: tuple
    rest: tuple
    validity: tuple
    reduces: tuple
    reason: str | None = None
    required: tuple = ()


class Schedule(NamedTuple):
    strategy: str
    segments: tuple
    depth: int = 0


class MoreLayers(NamedTuple):
    """Not a schedule: build halo layers up to ``depth`` and inspect again."""

    depth: int


def serial_schedule(loops, *, sizes: dict) -> Schedule:
    """One process: every loop over its whole set, in order (``sizes`` by set key)."""
    runs = tuple(Run(position, 0, sizes[loop.iterset], "global") for position, loop in enumerate(loops))
    positions = tuple(range(len(loops)))
    ends = tuple(r.end for r in runs)
    segment = Segment(positions, (0,) * len(loops), ends, (), ends, runs, (), (), ())
    return Schedule("serial", (segment,))


def set_facts(layouts: dict) -> dict:
    """The :class:`~.chain.SetFacts` of each set key, from its layout."""
    return {key: SetFacts(tuple(int(c) for c in layout.covered_depths))
            for key, layout in layouts.items()}


def per_loop_schedule(loops, *, layouts: dict, valid: dict, built: int, row_bytes: dict,
                      overlap: bool = True) -> Schedule:
    """Alg. 1 for each loop in turn: exchange what it reads deeper than valid, one message
    per dat and neighbour; then the next loop sees the validity this one leaves."""
    facts = set_facts(layouts)
    segments, valid = [], dict(valid)
    for position, loop in enumerate(loops):
        plan = plan_chain((loop,), facts, built=built, limit=max(built, 1))
        for part in plan.segments:  # one loop: one segment
            segment, valid = _segment(loops, position, part, layouts, valid, row_bytes, overlap, grouped=False)
            segments.append(segment)
    return Schedule("per-loop", tuple(segments), max([1, *(d for s in segments for d in s.depths)]))


def ca_schedule(loops, *, layouts: dict, valid: dict, built: int, limit: int, row_bytes: dict,
                names=None, overlap: bool = True):
    """Alg. 2 over the chain's segments (one grouped exchange each), or :class:`MoreLayers`
    when the plan needs halo layers that are not built yet."""
    plan = plan_chain(tuple(loops), set_facts(layouts), built=built, limit=limit, names=names)
    if plan.more_layers is not None and plan.more_layers > built:
        return MoreLayers(min(plan.more_layers, limit))
    segments, valid = [], dict(valid)
    for part in plan.segments:
        segment, valid = _segment(loops, part.start, part, layouts, valid, row_bytes, overlap, grouped=True)
        segments.append(segment)
    deepest = max([0, *(d for s in segments for d in s.depths), *(d for s in segments for _, d in s.required)])
    return Schedule("ca", tuple(segments), deepest)


def _segment(loops, first: int, part, layouts, valid: dict, row_bytes: dict, overlap: bool, *, grouped: bool):
    positions = tuple(range(first, first + len(part.depths)))
    chosen = [loops[p] for p in positions]
    stale = tuple((key, valid.get(key, 0), depth) for key, depth in part.required if valid.get(key, 0) < depth)
    exchanges = _exchanges(stale, layouts, row_bytes, chosen, grouped)
    in_flight = bool(exchanges) and overlap
    sets = [layouts[loop.iterset] for loop in chosen]
    cores = tuple(layout.core(t) if t < MAX_LEVEL else 0 for layout, t in zip(sets, part.thresholds))
    core = tuple(Run(p, 0, c if in_flight else 0, "owned") for p, c in zip(positions, cores))
    rest = []
    for p, layout, run, depth in zip(positions, sets, core, part.depths):
        rest += [Run(p, run.end, layout.n_owned, "owned"), Run(p, layout.n_owned, layout.exec_end(depth), "scratch")]
    after = dict(valid)
    for key, _, hi in stale:
        after[key] = max(after.get(key, 0), hi)
    for loop, layout, depth in zip(chosen, sets, part.depths):
        after = validity_after(loop, depth, after, layout.covered)
    reduces = tuple(p for p, loop in zip(positions, chosen)
                    if any(a.is_global and a.access.writes for a in loop.args))
    iterations = tuple(layout.exec_end(depth) for layout, depth in zip(sets, part.depths))
    segment = Segment(positions, tuple(part.depths), iterations, exchanges, cores, tuple(r for r in core if r.end > r.start),
                      tuple(r for r in rest if r.end > r.start), tuple(sorted(after.items())), reduces,
                      part.reason, tuple(part.required))
    return segment, after


def _exchanges(stale, layouts, row_bytes: dict, chosen, grouped: bool) -> tuple:
    if not stale:
        return ()
    dataset = {a.obj: a.dataset for loop in chosen for a in loop.args if not a.is_global}
    sizes = [_sizes(layouts[dataset[key]], lo, hi, row_bytes[key]) for key, lo, hi in stale]
    if grouped:
        total: dict = {}
        for per_neighbour in sizes:
            for neighbour, nbytes in per_neighbour.items():
                total[neighbour] = total.get(neighbour, 0) + nbytes
        return (ExchangeSpec(stale, True, tuple(sorted(total.items()))),)
    return tuple(ExchangeSpec((item,), False, tuple(sorted(s.items()))) for item, s in zip(stale, sizes))


def _sizes(layout, lo: int, hi: int, row_bytes: int) -> dict:
    """Bytes sent to each neighbour to bring a dat on ``layout`` from depth ``lo`` to ``hi``."""
    sizes = {}
    for neighbour, per_layer in layout.exports.items():
        rows = sum(len(rows) for rows in per_layer[lo:hi])
        if rows:
            sizes[neighbour] = rows * row_bytes
    return sizes
