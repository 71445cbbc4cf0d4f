"""Halo layers of a structured grid by index arithmetic: ghost regions ``unit`` lines deep.

A mesh's layers are built by hops through its maps (:mod:`.layout`); on a grid that would
make every layer two stencil reaches deep (a loop's halo row reaches one reach further,
and its targets are the next layer's data). Here the region of each rank is computed
directly from its block: a grid point ``d`` lines (Chebyshev distance, corners included)
from the block is in data layer ``ceil(d / unit)``, where ``unit`` is the widest interior
of the grid (1 for a five- or nine-point stencil), and runs from that layer on (a set no
map starts from); an interior point ``d > 0`` lines away runs from exec layer
``ceil(d / unit) + 1``, so everything its box reaches is present. The semantics are those
of :mod:`.layout` (the targets of exec-layer-``k`` rows are in data layers ``<= k``, the
owned rows' in layer 1), so a chain of ``s`` Jacobi sweeps needs ``s`` layers of one line:
PA1's ``s``-deep ghosts. Levels, numbering and exchange lists come from the same code.

Examples
--------
>>> import meshchain as mc
>>> from mpi4py import MPI
>>> g = mc.Grid((4, 6), "g")
>>> layouts, _ = grid_layouts(MPI.COMM_SELF, {g: (1, 1)}, {}, 2)   # one block: no halo
>>> layouts[g].n_owned, len(layouts[g].global_ids), layouts[g].depth
(24, 24, 2)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..comm.blocks import block_offsets
from .grids import box_targets
from .layout import MAX_LEVEL, layouts_of_regions, order_region, to_local

__all__ = ["GridParts", "grid_layouts", "grid_regions", "level_cap"]


def _block_bounds(shape: tuple, blocks: tuple, rank: int):
    index = np.unravel_index(rank, blocks)
    bounds = [block_offsets(n, p) for n, p in zip(shape, blocks)]
    return ([int(b[i]) for b, i in zip(bounds, index)], [int(b[i + 1]) for b, i in zip(bounds, index)], bounds)


def _owners(points: np.ndarray, blocks: tuple, bounds) -> np.ndarray:
    block = [np.searchsorted(b, points[:, a], side="right") - 1 for a, b in enumerate(bounds)]
    return np.ravel_multi_index(tuple(block), blocks).astype(np.int64)


def _region(shape: tuple, lo, hi, reach: int) -> np.ndarray:
    """Grid coordinates of the points at most ``reach`` lines from the box ``[lo, hi)``."""
    axes = [np.arange(max(a - reach, 0), min(b + reach, n)) for a, b, n in zip(lo, hi, shape)]
    return np.stack([c.ravel() for c in np.meshgrid(*axes, indexing="ij")], axis=1).astype(np.int64)


def _distance(points: np.ndarray, lo, hi) -> np.ndarray:
    below = np.maximum(np.asarray(lo)[None, :] - points, 0)
    above = np.maximum(points - (np.asarray(hi)[None, :] - 1), 0)
    return np.maximum(below, above).max(axis=1)


def level_cap(grid, interiors, blocks: tuple, rank: int) -> int:
    """The level from which ``grid``'s owned points on ``rank`` are told apart no further
    (its interiors': one more). They then form the block's middle, a box, row-major, and an
    interior's points at its cap have every stencil point there: the part of a loop that runs
    by index arithmetic on several ranks (:mod:`meshchain.engine.grids`). A level is about two
    stencil widths deep, so the cap is a sixteenth of the block's narrowest extent in stencil
    widths, between 2 and ``MAX_LEVEL - 1``: about an eighth of that extent stays out of the
    middle along each side the block shares with another rank. Deeper levels serve only a
    chain's loops far down: thresholds at or above the cap get no core (on every backend,
    also those that run grid loops wholly through maps).
    """
    unit = max([i.width for i in interiors] + [1])
    lo, hi, _ = _block_bounds(grid.shape, blocks, rank)
    return int(min(MAX_LEVEL - 1, max(2, min(b - a for a, b in zip(lo, hi)) // (16 * unit))))


def grid_regions(comm, grid, interiors: dict, blocks: tuple, depth: int):
    """``provisional`` regions (see :func:`.layout.layouts_of_regions`) of ``grid`` and its
    ``interiors`` (interior -> its box map) on this rank, and the box maps' local rows."""
    unit = max([i.width for i in interiors] + [1])
    lo, hi, bounds = _block_bounds(grid.shape, blocks, comm.rank)
    points = _region(grid.shape, lo, hi, depth * unit)
    layer = -(-_distance(points, lo, hi) // unit)
    points, layer = points[layer <= depth], layer[layer <= depth]
    gids = np.ravel_multi_index(tuple(points.T), grid.shape).astype(np.int64)
    provisional = {grid: order_region(np.stack([gids, layer, layer, _owners(points, blocks, bounds)], axis=1))}
    local_maps = {}
    for interior, box in interiors.items():
        w = interior.width
        inside = np.all((points >= w) & (points < np.asarray(grid.shape) - w), axis=1)
        mine, run = points[inside], np.where(layer[inside] > 0, layer[inside] + 1, 0)
        mine, run = mine[run <= depth], run[run <= depth]
        ids = np.ravel_multi_index(tuple((mine - w).T), interior.shape).astype(np.int64)
        region = order_region(np.stack([ids, run, run, _owners(mine, blocks, bounds)], axis=1))
        provisional[interior] = region
        around = box_targets(interior, region[0])
        local_maps[box] = to_local(around, provisional[grid][0], np.ones(len(region[0]), bool), box)
    return provisional, local_maps


class GridParts(NamedTuple):
    """The structured grids of a program: ``blocks`` (grid -> block counts per axis) and
    ``boxes`` (interior -> its box map)."""

    blocks: dict
    boxes: dict

    def holds(self, s) -> bool:
        return s in self.blocks or s in self.boxes


def grid_layouts(comm, grids: dict, boxes: dict, depth: int):
    """:class:`~.layout.SetLayout` of every grid in ``grids`` (grid -> block counts) and of its
    interiors (``boxes``: interior -> box map), and the box maps' local values (collective)."""
    provisional, local_maps, caps = {}, {}, {}
    if not grids:
        return {}, {}
    for grid, blocks in grids.items():
        interiors = {i: m for i, m in boxes.items() if i.grid is grid}
        regions, maps = grid_regions(comm, grid, interiors, blocks, depth)
        provisional.update(regions)
        local_maps.update(maps)
        caps[grid] = level_cap(grid, interiors, blocks, comm.rank)
        caps.update({i: caps[grid] + 1 for i in interiors})
    return layouts_of_regions(comm, list(provisional), list(local_maps), provisional, local_maps, depth, caps=caps)
