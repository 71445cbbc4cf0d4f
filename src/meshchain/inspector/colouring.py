"""Block colouring: the shared-memory execution plan of one loop.

The iteration range is cut into fixed-size blocks. Blocks that write (through maps)
to a common element get different colours; blocks of one colour run on threads at
once, colours one after another. The plan depends only on the mesh and the block
size, never on the thread count, so results are the same bits for any thread count.

Examples
--------
>>> import numpy as np
>>> from meshchain.inspector.colouring import colour_blocks
>>> touch = np.array([[0], [0], [1], [1]])          # iterations 0,1 hit key 0; 2,3 hit key 1
>>> plan = colour_blocks(0, 4, block_size=1, touch=touch, nkeys=2)
>>> plan.ncolours, plan.block_order.tolist()
(2, [0, 2, 1, 3])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["BlockColouring", "colour_blocks", "touched_keys"]


@dataclass(frozen=True)
class BlockColouring:
    """Blocks of ``[start, end)``, their colours and the order to run them in.

    Attributes
    ----------
    block_starts : ndarray of int64, shape (nblocks + 1,)
        Block ``b`` covers iterations ``[block_starts[b], block_starts[b + 1])``.
    block_order : ndarray of int64, shape (nblocks,)
        Blocks sorted by colour (stable).
    colour_offsets : ndarray of int64, shape (ncolours + 1,)
        Colour ``c`` is ``block_order[colour_offsets[c]:colour_offsets[c + 1]]``.
    block_colours : ndarray of int32, shape (nblocks,)
    """

    start: int
    end: int
    block_starts: np.ndarray
    block_order: np.ndarray
    colour_offsets: np.ndarray
    block_colours: np.ndarray

    @property
    def nblocks(self) -> int:
        return len(self.block_order)

    @property
    def ncolours(self) -> int:
        return len(self.colour_offsets) - 1


def touched_keys(start: int, end: int, writes) -> tuple[np.ndarray, int]:
    """Keys of the elements each iteration writes through maps.

    ``writes`` is a sequence of ``(values, index, target, rows)``: a map's values (local
    numbering), the column (``None``: every column), a key of its target set and the
    target's number of rows here. Elements of different target sets get disjoint key
    ranges. Returns ``(touch, nkeys)`` with ``touch`` of shape ``(end - start, ncolumns)``.

    >>> touch, nkeys = touched_keys(0, 2, [(np.array([[0, 1], [1, 2]]), 1, "nodes", 3)])
    >>> touch.tolist(), nkeys
    ([[1], [2]], 3)
    """
    bases, columns, nkeys = {}, [], 0
    for values, index, target, rows in writes:
        if target not in bases:
            bases[target] = nkeys
            nkeys += rows
        values = values[start:end]
        picked = values if index is None else values[:, index : index + 1]
        columns.append(picked.astype(np.int64) + bases[target])
    if not columns:
        return np.zeros((end - start, 0), dtype=np.int64), 0
    return np.ascontiguousarray(np.hstack(columns)), nkeys


def colour_blocks(start: int, end: int, *, block_size: int, touch: np.ndarray, nkeys: int) -> BlockColouring:
    """Cut ``[start, end)`` into blocks and colour them so same-colour blocks never share a key."""
    block_starts = np.arange(start, end, block_size, dtype=np.int64)
    block_starts = np.append(block_starts, np.int64(end)) if end > start else np.array([start], dtype=np.int64)
    if touch.shape[1] == 0 or end == start:
        colours = np.zeros(len(block_starts) - 1, dtype=np.int32)
    else:
        colours = _greedy_colours(block_starts - start, touch, nkeys)
    order = np.argsort(colours, kind="stable").astype(np.int64)
    counts = np.bincount(colours, minlength=1) if len(colours) else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return BlockColouring(start, end, block_starts, order, offsets, colours)


@njit(cache=True, nogil=True)
def _greedy_colours(block_starts, touch, nkeys):  # pragma: no cover - compiled
    nblocks = len(block_starts) - 1
    colours = np.full(nblocks, -1, dtype=np.int32)
    used_by = np.zeros(nkeys, dtype=np.uint64)
    one = np.uint64(1)
    full = ~np.uint64(0)
    base, remaining = 0, nblocks
    while remaining > 0:
        used_by[:] = 0
        for b in range(nblocks):
            if colours[b] >= 0:
                continue
            used = np.uint64(0)
            for e in range(block_starts[b], block_starts[b + 1]):
                for j in range(touch.shape[1]):
                    used |= used_by[touch[e, j]]
            if used == full:
                continue
            c = 0
            while (used >> np.uint64(c)) & one:
                c += 1
            colours[b] = base + c
            bit = one << np.uint64(c)
            for e in range(block_starts[b], block_starts[b + 1]):
                for j in range(touch.shape[1]):
                    used_by[touch[e, j]] |= bit
            remaining -= 1
        base += 64
    return colours
