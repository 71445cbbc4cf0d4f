"""The bytes a loop must move, read off its access descriptors (OP2's measure).

The achieved bandwidth of a loop (``mc.stats(summary=True)``) is these bytes over its
time. As OP2 counts them (its generated code adds them to ``OP_kernels[i].transfer``):

* a dat accessed directly: its rows of the iterations, once when read, twice otherwise
  (a write first reads the cache line: write-allocate; an increment reads and writes);
* a dat accessed through a map: its rows the iterations can reach (all its rows on this
  rank, or iterations times the map's arity where fewer: a loop over a few boundary edges
  does not move a whole field), once (only the first argument of that dat counts), twice
  unless read only; plus the map's columns per iteration (4 or 8 bytes each, once per map);
* a stencil argument: like a direct one (neighbouring points come from cache);
* globals: nothing.

Examples
--------
>>> import meshchain as mc
>>> cells, nodes = mc.Set(10, "cells"), mc.Set(4, "nodes")
>>> c2n = mc.Map(cells, nodes, 2, [[i % 4, (i + 1) % 4] for i in range(10)], "c2n")
>>> x = mc.Dat(nodes, 2, None, "x")
>>> area = mc.Dat(cells, 1, None, "area")
>>> k = mc.Kernel.from_source("def k(a, b, c):\\n    c[0] = a[0] + b[0]\\n")
>>> from meshchain.ir.loop import make_loop
>>> loop = make_loop(k, cells, (x(mc.READ, c2n[0]), x(mc.READ, c2n[1]), area(mc.WRITE)))
>>> moved_bytes(loop, 10, rows={x: 4}.get)   # x: 4 rows * 16 B; c2n: 10 * 2 * 4 B; area: 2 * 10 * 8 B
304
"""

from __future__ import annotations

import numpy as np

from ..core.access import Access

__all__ = ["moved_bytes"]


def moved_bytes(loop, iterations: int, *, rows, map_itemsize=None) -> int:
    """The bytes ``iterations`` iterations of ``loop`` move (see the module docstring);
    ``rows(dat)``: the dat's rows on this rank; ``map_itemsize(map)``: bytes per map entry (default 4)."""
    total, seen_data, seen_maps = 0, set(), set()
    for arg, spec in zip(loop.args, loop.specs):
        if spec.kind == "global":
            continue
        row = spec.dim * np.dtype(spec.dtype).itemsize
        times = 1 if arg.access is Access.READ else 2
        if arg.map is None:
            total += iterations * row * times
            continue
        if spec.slot not in seen_data:
            seen_data.add(spec.slot)
            total += min(int(rows(arg.data)), iterations * arg.map.arity) * row * times
        if spec.map_slot not in seen_maps:
            seen_maps.add(spec.map_slot)
            total += iterations * arg.map.arity * (4 if map_itemsize is None else map_itemsize(arg.map))
    return int(total)
