"""Wavefront tiling of a chain of loops over one structured grid.

A chain of loops over a grid's interior (a Jacobi sweep and the sweep back, a smoother
then a residual) touches whole arrays once per loop: on a grid larger than the caches every
loop streams its arrays from memory again. Run as a *wavefront*, the chain walks the grid
once: tile ``t`` runs, for every loop in chain order, the slabs (lines of a 2-D grid, planes
of a 3-D one: the points that share a coordinate along the first, slowest axis) that loop
has reached by then. Loop ``l`` trails the first loop by a *lag* of ``L[l]`` slabs, the least
that keeps every dependence of the untiled order (``r``: how far along the first axis a
loop's stencil reads a dat):

- a loop that reads (reach ``r``) a dat an earlier loop writes runs ``r`` slabs behind it:
  the slabs it reads are written before it reads them;
- a loop that writes a dat an earlier loop reads (reach ``r``) runs ``r`` slabs behind it:
  nothing is overwritten before every read of its old value;
- a loop that writes a dat an earlier loop writes runs no earlier than it.

Inside a tile the loops run in chain order, and each loop's points in their own order, so
every point is computed from the same values by the same arithmetic as untiled: the same
bits. Tiles run one after another (one colour each). Everything here is pure: loop
descriptions in, a :class:`~meshchain.inspector.tiling.TilePlan` out.

Examples
--------
Two five-point sweeps of a 6 x 6 grid's interior (4 lines of 4 points), ``u`` to ``v`` and
back, one line per tile: the second sweep trails the first by one line.

>>> from meshchain.inspector.wavefront import SlabLoop, lags, wavefront_plan
>>> there = SlabLoop(0, 16, per_slab=4, first_slab=1, reads={"u": 1}, writes=frozenset({"v"}))
>>> back = SlabLoop(0, 16, per_slab=4, first_slab=1, reads={"v": 1}, writes=frozenset({"u"}))
>>> lags([there, back])
[0, 1]
>>> plan = wavefront_plan([there, back], slabs_per_tile=1)
>>> plan.ntiles, [(int(lo), int(hi)) for lo, hi in zip(plan.runs[1][1], plan.runs[1][2])]
(5, [(0, 4), (4, 8), (8, 12), (12, 16)])
>>> plan.tiles_of(1).reshape(4, 4)[:, 0].tolist()   # line k of the way back runs in tile k + 1
[1, 2, 3, 4]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tiling import TilePlan

__all__ = ["SlabLoop", "lags", "wavefront_plan"]


@dataclass(frozen=True)
class SlabLoop:
    """One loop of a grid chain as the wavefront sees it.

    Attributes
    ----------
    start, end : int
        The loop runs iterations ``[start, end)``.
    per_slab : int
        Iterations per slab: iteration ``e`` lies in slab ``e // per_slab + first_slab``.
    first_slab : int
        The slab of iteration 0 (the interior's first coordinate along the first axis).
    reads : dict
        Dat key -> how many slabs away (either way) the loop reads it (0: its own points).
    writes : frozenset
        The keys of the dats the loop writes (at its own points).
    """

    start: int
    end: int
    per_slab: int
    first_slab: int
    reads: dict = field(default_factory=dict)
    writes: frozenset = frozenset()

    def slab(self, element: int) -> int:
        return element // self.per_slab + self.first_slab


def lags(loops) -> list[int]:
    """The least lag of each loop behind the first (in slabs) that keeps the dependences of
    the untiled order (see the module notes)."""
    found: list[int] = []
    for j, later in enumerate(loops):
        lag = 0
        for i, earlier in enumerate(loops[:j]):
            behind = [later.reads[key] for key in earlier.writes if key in later.reads]
            behind += [earlier.reads[key] for key in later.writes if key in earlier.reads]
            behind += [0 for key in later.writes if key in earlier.writes]
            if behind:
                lag = max(lag, found[i] + max(behind))
        found.append(lag)
    return found


def wavefront_plan(loops, *, slabs_per_tile: int) -> TilePlan:
    """The wavefront of ``loops`` (:class:`SlabLoop`, in chain order, none empty) in tiles of
    ``slabs_per_tile`` slabs of the first loop, each tile its own colour."""
    behind = lags(loops)
    origin = min(loop.slab(loop.start) + lag for loop, lag in zip(loops, behind))
    ntiles = max((loop.slab(loop.end - 1) + lag - origin) // slabs_per_tile
                 for loop, lag in zip(loops, behind)) + 1
    tiles = np.arange(ntiles + 1, dtype=np.int64)
    starts, iterations, runs = [], [], []
    for loop, lag in zip(loops, behind):
        first_slab_of_tile = tiles * slabs_per_tile + origin - lag
        bounds = np.clip((first_slab_of_tile - loop.first_slab) * loop.per_slab, loop.start, loop.end)
        nonempty = bounds[1:] > bounds[:-1]
        starts.append(bounds - loop.start)
        iterations.append(np.arange(loop.start, loop.end, dtype=np.int64))
        offsets = np.concatenate(([0], np.cumsum(nonempty))).astype(np.int64)
        runs.append((offsets, np.ascontiguousarray(bounds[:-1][nonempty]), np.ascontiguousarray(bounds[1:][nonempty])))
    order = np.arange(ntiles, dtype=np.int64)
    size = slabs_per_tile * loops[0].per_slab
    return TilePlan(size, 0, order, order.copy(), tiles.copy(), tuple(starts), tuple(iterations), tuple(runs), 1)
