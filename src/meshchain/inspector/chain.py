"""The chain inspector: the paper's Alg. 3, generalised to every access mode and map.

A pure function from a chain's *signature* (per loop: its iteration set and, per
argument, the object, whether it goes through a map, and the access mode) and the
mesh's layer facts to a :class:`ChainPlan`: where the chain must be split into
segments, each segment's per-loop execution depth, core threshold and the valid halo
depth each dat needs when the segment starts (what its one grouped exchange brings).

Semantics of depths (see :mod:`meshchain.partition.layout`): a loop at execution
depth ``e`` runs the owned elements and the exec halo of layers ``1..e``; it reads
data of layers ``<= max(1, e)`` through maps and ``<= e`` directly; what it writes
through maps is complete for targets of data layer ``<= e - 1`` (given their old values
there); what it writes directly is complete to data layer ``covered(e)`` of its set.

Walking a segment backwards with a demand ``w[D]`` (the depth dat ``D`` must be valid
to after the current loop; 0 at the end: owned values), each loop gets the smallest
depth that produces what later loops demand, and the demand before it becomes the
largest of what it reads and, for dats it does not overwrite completely, what was
demanded after it (old values are kept or added to). The walk stops, and a new
segment begins, where a demand cannot be met without an exchange: deeper than the
allowed halo (a direct write runs redundantly on the halo of any set, as deep as its
exec layers cover the data layer demanded), or a global reduced by a loop and used by
a later one (its ``Iallreduce`` must finish first).

Core thresholds (Alg. 2's shrinking core): while the grouped exchange is in flight,
loop ``l`` runs the owned elements farther than ``t_l`` hops from the partition
boundary. ``t_l`` keeps phase 1 away from values that are still arriving or that an
earlier loop only writes in phase 2, and from values an earlier loop still has to
read in phase 2.

Examples
--------
>>> from meshchain.core.access import Access
>>> from meshchain.inspector.chain import ArgSig, LoopSig, SetFacts, plan_chain
>>> edges, nodes = 0, 1
>>> update = LoopSig("update", edges, (ArgSig(0, False, True, Access.INC, nodes),   # res
...                                   ArgSig(1, False, True, Access.READ, nodes)))  # pres
>>> flux = LoopSig("flux", edges, (ArgSig(0, False, True, Access.READ, nodes),     # res
...                               ArgSig(2, False, True, Access.INC, nodes)))      # flux
>>> facts = {edges: SetFacts((0, 0, 1)), nodes: SetFacts((0, 1, 2))}
>>> plan = plan_chain((update, flux), facts, built=2, limit=16)
>>> [s.depths for s in plan.segments], dict(plan.segments[0].required)
([(2, 1)], {0: 1, 1: 2})
"""

from __future__ import annotations

from typing import NamedTuple

from ..core.access import Access

__all__ = ["ArgSig", "LoopSig", "SetFacts", "SegmentPlan", "ChainPlan", "plan_chain", "core_thresholds",
           "validity_after"]


class ArgSig(NamedTuple):
    """One argument: ``obj`` (a key of the dat or global), ``is_global``, ``indirect``
    (through a map), ``access`` and ``dataset`` (key of the dat's set)."""

    obj: int
    is_global: bool
    indirect: bool
    access: Access
    dataset: int


class LoopSig(NamedTuple):
    name: str
    iterset: int
    args: tuple


class SetFacts(NamedTuple):
    """``covered[e]`` (agreed over ranks) for ``e = 0..built``: the deepest data layer of the
    set that a loop run at execution depth ``e`` computes completely."""

    covered: tuple


class SegmentPlan(NamedTuple):
    """Loops ``start..end-1`` run with one exchange; ``required``: ``(obj, depth)`` pairs."""

    start: int
    end: int
    depths: tuple
    thresholds: tuple
    required: tuple
    reason: str | None  # why the segment could not start earlier (None for the first one)


class ChainPlan(NamedTuple):
    segments: tuple
    depth: int  # halo layers the plan uses
    more_layers: int | None  # build this many layers and inspect again (None: final)


def plan_chain(loops, facts: dict, *, built: int, limit: int, names: dict | None = None) -> ChainPlan:
    """Split ``loops`` (a tuple of :class:`LoopSig`) into segments and plan each.

    ``facts`` maps set keys to :class:`SetFacts`; ``built`` is the number of halo layers
    that exist, ``limit`` the most the chain may use; ``names`` maps object keys to names
    for the reasons.
    """
    names = names or {}
    segments, end, deepest, more = [], len(loops), 0, None
    while end > 0:
        start, depths, required, reason, request = _walk(loops, end, facts, built, limit, names)
        if request is not None:
            more = request if more is None else max(more, request)
        deepest = max([deepest, *depths, *(d for _, d in required)])
        thresholds = core_thresholds(loops[start:end], depths, dict(required))
        segments.insert(0, SegmentPlan(start, end, depths, thresholds, required, reason))
        end = start
    if more is None and deepest > built:
        more = deepest
    return ChainPlan(tuple(segments), deepest, more)


def _walk(loops, end, facts, built, limit, names):
    """Walk back from ``end``; return (start, depths, required, reason, more_layers)."""
    demand: dict[int, int] = {}
    later_globals: dict[int, str] = {}
    depths: list[int] = []
    request = None
    for position in range(end - 1, -1, -1):
        loop = loops[position]
        depth, problem, wants = _depth(loop, demand, facts, built, limit, names)
        if problem is None:
            problem = _global_conflict(loop, later_globals, names)
        if wants is not None:
            request = wants if request is None else max(request, wants)
        if problem is not None:
            required = tuple(sorted((k, v) for k, v in demand.items() if v > 0))
            return position + 1, tuple(reversed(depths)), required, problem, request
        depths.append(depth)
        demand = _demand_before(loop, depth, demand)
        for arg in loop.args:
            if arg.is_global:
                later_globals.setdefault(arg.obj, loop.name)
    required = tuple(sorted((k, v) for k, v in demand.items() if v > 0))
    return 0, tuple(reversed(depths)), required, None, request


def _depth(loop, demand, facts, built, limit, names):
    """(execution depth, problem or None, layers to build first or None)."""
    depth = 1 if any(a.indirect and a.access.writes and not a.is_global for a in loop.args) else 0
    for arg in loop.args:
        if arg.is_global or not arg.access.writes:
            continue
        wanted = demand.get(arg.obj, 0)
        if arg.indirect:
            depth = max(depth, wanted + 1)
            continue
        found = _covering_depth(facts[loop.iterset], wanted)
        if found is None:
            if built < limit:
                return depth, "more halo layers must be built to decide", built + 1
            return depth, (f"loop {loop.name!r} writes {names.get(arg.obj, arg.obj)!r} directly but a later loop "
                           f"needs it valid {wanted} layer(s) into the halo, and covering data layer {wanted} "
                           f"needs more than {limit} layers"), None
        depth = max(depth, found)
    if depth > limit:
        return depth, f"loop {loop.name!r} would have to run {depth} halo layers deep (allowed: {limit})", None
    return depth, None, None


def _covering_depth(set_facts: SetFacts, wanted: int):
    for e, covered in enumerate(set_facts.covered):
        if covered >= wanted:
            return e
    return None


def _global_conflict(loop, later_globals: dict, names) -> str | None:
    for arg in loop.args:
        if arg.is_global and arg.access.is_reduction and arg.obj in later_globals:
            return (f"global {names.get(arg.obj, arg.obj)!r} is reduced by loop {loop.name!r} and used by the "
                    f"later loop {later_globals[arg.obj]!r}: the reduction over ranks must finish in between")
    return None


def _demand_before(loop, depth: int, demand: dict) -> dict:
    """The depth each dat must be valid to before ``loop`` runs at ``depth``."""
    before = dict(demand)
    for arg in loop.args:
        if arg.is_global:
            continue
        if arg.access is Access.WRITE and not arg.indirect:
            before[arg.obj] = 0  # every element the later loops need is overwritten
    for arg in loop.args:
        if arg.is_global or not arg.access.reads_old_value:
            continue
        need = max(1, depth) if arg.indirect else depth
        before[arg.obj] = max(before.get(arg.obj, 0), need)
    return before


def core_thresholds(loops, depths, required: dict) -> tuple:
    """Per loop, the level an owned element must exceed to run while the exchange is in flight.

    ``W[D]`` / ``R[D]``: the highest level of ``D`` that an earlier loop writes / reads after
    the exchange (``0`` is the halo, which is arriving for dats in ``required``).
    """
    written = {obj: 0 for obj, depth in required.items() if depth > 0}
    read: dict[int, int] = {}
    thresholds = []
    for loop, depth in zip(loops, depths):
        t = 0
        for arg in loop.args:
            if arg.is_global:
                continue
            w, r, hop = written.get(arg.obj, -1), read.get(arg.obj, -1), int(arg.indirect)
            if arg.access.reads_old_value:
                t = max(t, w + hop)
            if arg.access.writes:
                t = max(t, max(w, r) + hop)
        thresholds.append(t)
        for arg in loop.args:
            if arg.is_global:
                continue
            reach = max(t, 1) if arg.indirect and depth >= 1 else t  # exec-halo rows touch level-1 targets
            if arg.access.writes:
                written[arg.obj] = max(written.get(arg.obj, -1), reach)
            if arg.access is not Access.WRITE:
                read[arg.obj] = max(read.get(arg.obj, -1), reach)
    return tuple(thresholds)


def validity_after(loop: LoopSig, depth: int, valid: dict, covered) -> dict:
    """Valid depths of the dats after ``loop`` ran at ``depth`` (with everything it reads valid
    as deep as it needs). ``covered(e)`` is the loop's set's :meth:`SetLayout.covered`.

    Written through a map: complete for targets of data layer ``< depth``, where the old
    values were valid. Written directly: valid to ``covered(depth)`` (``WRITE``), or there
    and where the old values were valid (``RW``, ``INC``).

    >>> from meshchain.core.access import Access
    >>> inc = LoopSig("inc", 0, (ArgSig(0, False, True, Access.INC, 1),))
    >>> validity_after(inc, 2, {0: 3}, lambda e: e)
    {0: 1}
    """
    produced: dict[int, int] = {}
    for arg in loop.args:
        if arg.is_global or not arg.access.writes:
            continue
        old = valid.get(arg.obj, 0)
        if arg.indirect:
            depth_now = min(old, depth - 1)
        elif arg.access is Access.WRITE:
            depth_now = covered(depth)
        else:
            depth_now = min(old, covered(depth))
        produced[arg.obj] = min(produced.get(arg.obj, depth_now), depth_now)
    return {**valid, **produced}
