"""Sparse-tiled execution of a chain phase (``loop_chain(..., tile_size=N)``).

A phase is a list of ``(loop, start, end, record, targets)`` items run in order: a whole
chain on one process; on several ranks the core phase (run while the grouped exchange
is in flight) and the rest (after it) of each communication-avoiding segment. The phase
is cut into groups that can be tiled, each group is inspected once
(:func:`meshchain.inspector.tiling.tile_chain`, cached by its signature) and run by the
backend tile by tile.

A group ends before a loop that reads a global an earlier loop of the group reduces:
tiles defer reductions to the end of the group, so the read would see the old value.
That split, and every refusal, is a diagnostic (``[tiling-split]``, ``[tiling-refused]``)
in ``mc.stats().chains[name].diagnostics`` and a warning.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

from ..core.access import Access
from ..core.errors import MeshchainWarning
from ..inspector.tiling import chain_footprints, tile_chain

__all__ = ["Tiling", "run_tiled", "refuse_tiling"]

_CACHE_LIMIT = 256


@dataclass(frozen=True)
class Tiling:
    """How one chain's phases are tiled: ``tile_size`` seed iterations per tile; the chain's
    name and :class:`~meshchain.core.stats.ChainStats` for statistics and diagnostics."""

    tile_size: int
    name: str
    chain: object


def run_tiled(runtime, items, tiling: Tiling) -> None:
    """Run ``(loop, start, end, record, targets)`` items, in order, tiled."""
    items = [item for item in items if item[2] > item[1]]
    if not items:
        return
    if not runtime.backend.can_tile:
        refuse_tiling(runtime, tiling, f"the {runtime.backend.name} backend cannot run tiles; the chain runs untiled")
        runtime.run_ranges(items)
        return
    groups = _groups(items)
    if len(groups) > 1:
        _diagnose(runtime, tiling, f"[tiling-split] loop chain {tiling.name!r} runs as {len(groups)} tiled groups: "
                                   f"{'; '.join(_split_reasons(groups))}")
    for group in groups:
        plan = _plan(runtime, group, tiling)
        runtime.backend.run_tiled(plan, [(loop, record, targets) for loop, _, _, record, targets in group])
        chain = tiling.chain
        chain.tiled_groups += 1
        chain.tiles = max(chain.tiles, plan.ntiles)
        chain.tile_colours = max(chain.tile_colours, plan.ncolours)
        for loop, start, end, record, _ in group:
            record.colours = max(record.colours, plan.ncolours)


def refuse_tiling(runtime, tiling: Tiling, why: str) -> None:
    """Record (and warn, once per chain and reason) that a chain runs untiled."""
    _diagnose(runtime, tiling, f"[tiling-refused] loop chain {tiling.name!r} (tile_size={tiling.tile_size}): {why}")


def _diagnose(runtime, tiling: Tiling, message: str) -> None:
    tiling.chain.tile_size = tiling.tile_size
    if tiling.chain.diagnose(message) and (not runtime.distributed or runtime.comm.rank == 0):
        warnings.warn(MeshchainWarning(message), stacklevel=4)


def _groups(items) -> list:
    """Cut items where a loop reads a global that an earlier loop of its group reduces."""
    groups, reduced = [[]], set()
    for item in items:
        loop = item[0]
        if any(a.data.is_global and a.access is Access.READ and id(a.data) in reduced for a in loop.args):
            groups.append([])
            reduced = set()
        groups[-1].append(item)
        reduced.update(id(a.data) for a in loop.args if a.data.is_global and a.access.writes)
    return groups


def _split_reasons(groups) -> list[str]:
    reasons = []
    for before, after in zip(groups, groups[1:]):
        loop = after[0][0]
        reduced = {id(a.data) for item in before for a in item[0].args if a.data.is_global and a.access.writes}
        names = [a.data.name for a in loop.args if a.access is Access.READ and id(a.data) in reduced]
        reasons.append(f"loop {loop.name!r} reads global {names[0]!r}, reduced earlier in the group (tiles reduce at "
                       f"the end of a group)")
    return list(dict.fromkeys(reasons))


def _plan(runtime, group, tiling: Tiling):
    key = (tiling.tile_size, tuple(_item_key(loop, start, end) for loop, start, end, _, _ in group))
    cached = runtime.tile_plans.get(key)
    if cached is not None:
        return cached[0]
    began = time.perf_counter()
    loops, nkeys = chain_footprints([(loop, start, end) for loop, start, end, _, _ in group])
    plan = tile_chain(loops, nkeys=nkeys, tile_size=tiling.tile_size)
    if len(runtime.tile_plans) >= _CACHE_LIMIT:
        runtime.tile_plans.clear()
    runtime.tile_plans[key] = (plan, [item[0] for item in group])  # the loops keep the key's ids alive
    elapsed = time.perf_counter() - began
    tiling.chain.time_tile_inspect += elapsed
    tiling.chain.tile_inspections += 1
    return plan


def _item_key(loop, start: int, end: int) -> tuple:
    return (id(loop.iterset), start, end,
            tuple((id(a.data), id(a.map), a.index, a.access, len(a.data._host)) for a in loop.args))
