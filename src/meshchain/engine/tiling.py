"""Sparse-tiled phases (``loop_chain(..., tile_size=N)``).

A phase of a plan (a whole chain on one process; on several ranks the core and the rest
of each communication-avoiding segment) is cut into groups that can be tiled, each group
is inspected once (:func:`meshchain.inspector.tiling.tile_chain`, cached by its
signature) and run by the backend tile by tile, in one prepared call. A phase of loops over
one structured grid (on one process) is one wavefront instead
(:func:`meshchain.inspector.wavefront.wavefront_plan`): tiles of whole slabs, run in order.

A group ends before a loop that reads a global an earlier loop of the group reduces:
tiles defer reductions to the end of the group, so the read would see the old value.
That split, and every refusal, is a diagnostic (``[tiling-split]``, ``[tiling-refused]``)
in ``mc.stats().chains[name].diagnostics`` and a warning.

Examples
--------
A loop that reads a global the previous loop of the group reduces starts a new group:

>>> import meshchain as mc
>>> from meshchain.backends.base import PhaseRun
>>> cells = mc.Set(3, "cells")
>>> q, total = mc.Dat(cells, 1, None, "q"), mc.Global(1, 0.0, "total")
>>> add = mc.Kernel.from_source("def add(a, t):\\n    t[0] += a[0]\\n")
>>> use = mc.Kernel.from_source("def use(a, t):\\n    a[0] = t[0]\\n")
>>> from meshchain.ir.loop import make_loop
>>> loops = [make_loop(add, cells, (q(mc.READ), total(mc.INC))), make_loop(use, cells, (q(mc.WRITE), total(mc.READ)))]
>>> [[run.loop.name for run in group] for group in _groups([PhaseRun(loop, 0, 3, (), (), {}) for loop in loops])]
[['add'], ['use']]
"""

from __future__ import annotations

import time
import warnings
from typing import NamedTuple

import numpy as np

from ..core.access import Access
from ..core.errors import MeshchainWarning
from ..types import Grid
from ..types.args import DIRECT, STENCIL
from ..inspector.tiling import chain_footprints, tile_chain
from ..inspector.wavefront import SlabLoop, wavefront_plan
from .accounting import add_tile_inspection, diagnose

__all__ = ["Tiling", "TiledPhase", "tiled_phase", "refuse_tiling"]


class Tiling(NamedTuple):
    """How one chain's phases are tiled: ``tile_size`` seed iterations per tile, for the chain
    called ``name``."""

    tile_size: int
    name: str


class TiledPhase(NamedTuple):
    """A prepared tiled phase: its call, its groups' tile plans."""

    call: object
    plans: tuple


def tiled_phase(session, runs, tiling: Tiling, report) -> TiledPhase | None:
    """The runs of one phase, tiled (None when no run has iterations, or when the backend
    cannot tile: then the caller runs them untiled; the refusal is diagnosed here)."""
    runs = [run for run in runs if run.end > run.start]
    if not runs:
        return None
    backend = session.backend
    if not backend.can_tile:
        refuse_tiling(session, tiling, f"the {backend.name} backend cannot run tiles; the chain runs untiled")
        return None
    if any(s.kind == STENCIL or s.grid for run in runs for s in run.loop.specs):
        return _wavefront(session, runs, tiling, report)
    groups = _groups(runs)
    if len(groups) > 1:
        _diagnose(session, tiling, f"[tiling-split] loop chain {tiling.name!r} runs as {len(groups)} tiled groups: "
                                   f"{'; '.join(_split_reasons(groups))}")
    plans = tuple(_plan(session, group, tiling) for group in groups)
    calls = [backend.tiled(plan, group, report) for plan, group in zip(plans, groups)]
    if len(calls) == 1:
        return TiledPhase(calls[0], plans)

    def call():
        for one in calls:
            one()

    return TiledPhase(call, plans)


def _wavefront(session, runs, tiling: Tiling, report) -> TiledPhase | None:
    """A phase of loops over one grid's interior run as a wavefront
    (:mod:`meshchain.inspector.wavefront`): tiles of whole slabs, ``tile_size`` iterations of
    the first loop rounded to whole slabs (at least one), one after another; None (refused,
    diagnosed) where the phase is not such a chain, on several ranks, and where loops run on
    several threads (untiled they use them all: two 2000 x 2000 sweeps on 2 threads took 0.77x
    the wavefront's time on one)."""
    threads = session.backend.threads_in_use()
    if session.distributed:
        loops, why = None, "grid chains are tiled on one process only"
    elif threads > 1:  # its tiles run one after another: untiled, the chain's loops run on every thread
        loops, why = None, f"a grid chain's wavefront runs on one thread, and loops here run on {threads}"
    else:
        loops, why = _slab_loops(runs)
    if loops is None:
        refuse_tiling(session, tiling, f"{why}; the chain runs untiled")
        return None
    # the plan depends on the loops' ranges and on which of them share a dat, not on which dats: kept by
    # that, it holds no user object and serves new dats declared alike (a temporary per step)
    key = ("wavefront", tiling.tile_size, tuple((loop.start, loop.end, loop.per_slab, loop.first_slab,
                                                 tuple(sorted(loop.reads.items())), tuple(sorted(loop.writes)))
                                                for loop in loops))
    plan = session.tile_plans.get(key)
    if plan is None:
        began = time.perf_counter()
        slabs = max(1, round(tiling.tile_size / loops[0].per_slab))
        plan = session.tile_plans[key] = wavefront_plan(loops, slabs_per_tile=slabs)
        add_tile_inspection(session.recorder, tiling.name, time.perf_counter() - began)
    return TiledPhase(session.backend.tiled(plan, runs, report), (plan,))


def _slab_loops(runs):
    """``(loops, None)``: each run as a :class:`~meshchain.inspector.wavefront.SlabLoop`, or
    ``(None, why)`` where the runs are not all loops over the interior of one grid that read
    globals only, read dats directly or through stencils and write them directly."""
    loops, shapes, slots = [], set(), {}
    for run in runs:
        reads, writes = {}, set()
        geometry = None
        for arg, spec in zip(run.loop.args, run.loop.specs):
            if arg.data.is_global:
                if arg.access is not Access.READ:
                    return None, (f"loop {run.loop.name!r} reduces into global {arg.data.name!r} (a grid chain is "
                                  f"tiled as a wavefront only without reductions)")
                continue
            geometry = spec.grid or _whole_grid(run.loop.iterset, spec)
            if not geometry:
                return None, f"loop {run.loop.name!r} reaches dat {arg.data.name!r} through a map or off the grid"
            key = slots.setdefault(id(arg.data), len(slots))  # the dat's number in the chain, by first use
            if arg.access is not Access.WRITE:
                reach = arg.stencil.reach[0] if spec.kind == STENCIL else 0
                reads[key] = max(reads.get(key, 0), reach)
            if arg.access.writes:
                if spec.kind == STENCIL:
                    return None, f"loop {run.loop.name!r} writes dat {arg.data.name!r} through a stencil"
                writes.add(key)
        if geometry is None:
            return None, f"loop {run.loop.name!r} reads no grid dat"
        shape, corner, inner = geometry
        shapes.add(shape)
        loops.append(SlabLoop(run.start, run.end, int(np.prod(inner[1:], dtype=np.int64)), corner[0], reads,
                              frozenset(writes)))
    if len(shapes) > 1:
        return None, "its loops run over grids of different shapes"
    return loops, None


def _whole_grid(iterset, spec) -> tuple:
    """The geometry of a direct argument of a loop over a whole grid (every point: the interior
    of width 0), else ``()``."""
    if spec.kind != DIRECT or not isinstance(iterset, Grid):
        return ()
    return iterset.shape, (0,) * len(iterset.shape), iterset.shape


def refuse_tiling(session, tiling: Tiling, why: str) -> None:
    """Record (and warn, once per chain and reason) that a chain runs untiled."""
    _diagnose(session, tiling, f"[tiling-refused] loop chain {tiling.name!r} (tile_size={tiling.tile_size}): {why}")


def _diagnose(session, tiling: Tiling, message: str) -> None:
    if diagnose(session.recorder, tiling.name, message, tile_size=tiling.tile_size) and session.rank == 0:
        warnings.warn(MeshchainWarning(message), stacklevel=2)


def _groups(runs) -> list:
    """Cut runs where a loop reads a global that an earlier loop of its group reduces."""
    groups, reduced = [[]], set()
    for run in runs:
        loop = run.loop
        if any(a.data.is_global and a.access is Access.READ and id(a.data) in reduced for a in loop.args):
            groups.append([])
            reduced = set()
        groups[-1].append(run)
        reduced.update(id(a.data) for a in loop.args if a.data.is_global and a.access.writes)
    return groups


def _split_reasons(groups) -> list[str]:
    reasons = []
    for before, after in zip(groups, groups[1:]):
        loop = after[0].loop
        reduced = {id(a.data) for run in before for a in run.loop.args if a.data.is_global and a.access.writes}
        names = [a.data.name for a in loop.args if a.access is Access.READ and id(a.data) in reduced]
        reasons.append(f"loop {loop.name!r} reads global {names[0]!r}, reduced earlier in the group (tiles reduce at "
                       f"the end of a group)")
    return list(dict.fromkeys(reasons))


def _plan(session, group, tiling: Tiling):
    layout = session.layout
    key = (tiling.tile_size, tuple(_run_key(run) for run in group))
    cached = session.tile_plans.get(key)
    if cached is not None:
        return cached[0]
    began = time.perf_counter()
    loops, nkeys = chain_footprints([(run.loop, run.start, run.end) for run in group],
                                    values=layout.values, rows=lambda s: len(layout.of(s).global_ids))
    plan = tile_chain(loops, nkeys=nkeys, tile_size=tiling.tile_size)
    session.tile_plans[key] = (plan, [run.loop for run in group])  # the loops keep the key's objects alive
    add_tile_inspection(session.recorder, tiling.name, time.perf_counter() - began)
    return plan


def _run_key(run) -> tuple:
    loop = run.loop
    return (loop.iterset.uid, run.start, run.end,
            tuple((a.data.uid, None if a.map is None else a.map.uid, a.index, a.access) for a in loop.args))
