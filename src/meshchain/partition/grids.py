"""Structured grids on several ranks: block decompositions and the box maps halos grow by.

A :class:`~meshchain.types.Grid` is cut into ``px x py (x pz)`` blocks (:func:`choose_blocks`
picks the factors of the rank count that cut the fewest grid points' links, or takes them
given); each rank owns one block. A grid interior ``g.interior(w)``
gets a *box map* to its grid, every point to the ``(2w + 1)^d`` grid points at most ``w``
away along each axis, its own point first (:func:`box_offsets`, :func:`box_targets`): every
stencil a loop over the interior may use is a choice of its columns (the halo layers are
built by :mod:`.grid_layout`).

Examples
--------
>>> from meshchain.partition.grids import choose_blocks, box_offsets
>>> choose_blocks((100, 100), 4), choose_blocks((400, 50), 4), choose_blocks((8, 8, 8), 8)
((2, 2), (4, 1), (2, 2, 2))
>>> box_offsets(1, 2)[:3]
[(0, 0), (-1, -1), (-1, 0)]
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..core.errors import ConfigurationError

__all__ = ["choose_blocks", "checked_blocks", "box_offsets", "box_targets"]


def _factorisations(n: int, parts: int):
    """Every ordered tuple of ``parts`` positive integers whose product is ``n``."""
    if parts == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in _factorisations(n // first, parts - 1):
                yield (first,) + rest


def _cut_links(shape: tuple, blocks: tuple) -> int:
    """Grid points on the block faces: ``sum_a (p_a - 1) * prod(n_b, b != a)``."""
    return sum((p - 1) * math.prod(shape) // n for n, p in zip(shape, blocks))


def choose_blocks(shape: tuple, nranks: int) -> tuple:
    """The block counts per axis (product ``nranks``) with the smallest cut surface.

    Ties go to the most even blocks. Every block must hold at least one grid line per axis.
    """
    fitting = [b for b in _factorisations(nranks, len(shape)) if all(p <= n for p, n in zip(b, shape))]
    if not fitting:
        raise ConfigurationError(f"a grid of shape {shape} cannot be cut into {nranks} blocks of at least one point "
                                 f"each; run on fewer ranks or make the grid larger.")
    return min(fitting, key=lambda b: (_cut_links(shape, b), max(n / p for n, p in zip(shape, b))))


def checked_blocks(grid, blocks, nranks: int) -> tuple:
    """``blocks`` for ``grid`` on ``nranks`` ranks (chosen when None), checked."""
    if blocks is None:
        return choose_blocks(grid.shape, nranks)
    try:
        given = tuple(int(p) for p in blocks)
    except (TypeError, ValueError):
        given = ()
    if len(given) != len(grid.shape) or math.prod(given) != nranks or any(p < 1 for p in given):
        raise ConfigurationError(f"partition blocks={blocks!r} for grid {grid.name!r} (shape {grid.shape}): give "
                                 f"{len(grid.shape)} positive block counts whose product is the rank count {nranks}.")
    if any(p > n for p, n in zip(given, grid.shape)):
        raise ConfigurationError(f"partition blocks={given} for grid {grid.name!r} (shape {grid.shape}): a block "
                                 f"count exceeds the grid's extent, so some rank would own no point.")
    return given


def box_offsets(width: int, ndim: int) -> list:
    """The ``(2 width + 1)^ndim`` offsets of a box, the zero offset first, then row-major."""
    others = [o for o in itertools.product(range(-width, width + 1), repeat=ndim) if any(o)]
    return [(0,) * ndim] + others


def box_targets(interior, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of ``interior``'s box map: global ids of the grid points around each of
    those interior points, in :func:`box_offsets` order."""
    grid, width = interior.grid, interior.width
    offsets = np.array(box_offsets(width, len(grid.shape)), dtype=np.int64)
    points = np.stack(np.unravel_index(np.asarray(ids, dtype=np.int64), interior.shape), axis=1) + width
    around = points[:, None, :] + offsets[None, :, :]
    return np.ravel_multi_index(tuple(np.moveaxis(around, -1, 0)), grid.shape).astype(np.int64)
