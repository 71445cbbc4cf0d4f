"""Structured grids on several ranks: their block decomposition and their loops' maps.

On one process a grid loop runs as written (generated code finds every point by index
arithmetic) on backends that can (``Backend.grid_arithmetic``); the others (cupy) get it
lowered as below, on one process too. On several ranks each grid is cut into blocks and
laid out with ghost layers by index arithmetic (:mod:`meshchain.partition.grid_layout`),
and each interior gets a box map to its grid (every point to the grid points at most its width
away). A loop over a grid's interior is then *lowered* (:meth:`GridLowering.lowered`): a direct grid dat is
reached through the box map's first column (the point itself) and a stencil through the
columns of its offsets, so chains, communication-avoiding execution, the inspector, the
exchanges, the model and every backend treat it as a loop over a mesh. The lowered loop
reads an index per stencil point (what a mesh loop does); its kernel and results are the same.

Most of it does not: a block's middle runs by index arithmetic (:meth:`GridLowering.arithmetic`).
The layout keeps the owned points far from the partition boundary first, row-major
(:func:`meshchain.partition.grid_layout.level_cap`): the grid's middle is a box at the start of
its dats' rows, and the interior's middle a box at the start of its rows whose stencil points
all lie in the grid's. Those rows run the loop as written, with the geometry of the two boxes
in the generated code (:attr:`meshchain.ir.loop.ArgSpec.grid`); the rest (a few lines along the
partition boundary and the ghosts) runs lowered. Both boxes are checked on each rank from the
layout itself, so the arithmetic part is right whatever the levels are.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ..core.errors import ConfigurationError, DeclarationError
from ..ir.loop import make_loop
from ..partition.grid_layout import GridParts
from ..partition.grids import box_offsets, box_targets, checked_blocks
from ..types import Arg, Grid, GridInterior
from ..types.maps import ColumnsMap, undeclared_map

__all__ = ["ArithmeticPart", "GridLowering", "is_grid_set", "middle_box", "refuse_grids"]


def is_grid_set(s) -> bool:
    return isinstance(s, (Grid, GridInterior))


def refuse_grids(sets, what: str) -> None:
    """Raise where an operation cannot keep the grids' block decomposition."""
    grids = [s.name for s in sets if isinstance(s, Grid)]
    if grids:
        raise ConfigurationError(f"{what} moves mesh elements to new owners, but structured grid(s) "
                                 f"{', '.join(map(repr, grids))} keep their block decomposition; it applies to "
                                 f"programs without grids.")


class ArithmeticPart(NamedTuple):
    """The part of a lowered grid loop that runs by index arithmetic on this rank: its first
    ``count`` iterations, as ``loop`` (the loop as written, with this rank's geometry)."""

    loop: object
    count: int


def middle_box(layout, shape, *, shift: int = 0):
    """``(lo, hi, count)``: the box (grid coordinates, ``hi`` excluded) of a set's first owned
    elements on this rank, those at its top level, when they fill it in row-major order;
    None otherwise. ``shape`` is the set's shape, ``shift`` its distance from the grid's side."""
    if layout.n_owned == 0:
        return None
    count = int(np.count_nonzero(layout.levels == layout.levels[0]))  # levels do not increase
    ids = layout.global_ids[:count]
    coords = np.stack(np.unravel_index(ids, shape), axis=1) + shift
    lo, hi = coords.min(axis=0), coords.max(axis=0) + 1
    if int(np.prod(hi - lo)) != count or np.any(np.diff(ids) <= 0):
        return None
    return lo, hi, count


class GridLowering:
    """How one session runs its grid loops through maps: the box maps and the stencils'
    column maps it made, and on several ranks each lowered loop's arithmetic part
    (``arithmetic_parts``: a cache of the session's registry, cleared when the layout changes)."""

    def __init__(self, declarations, arithmetic_parts):
        self.declarations = declarations  # its map_rows are the layout's values on one process
        self.boxes: dict = {}  # interior -> its box map
        self.columns: dict = {}  # (iteration set uid, offsets) -> ColumnsMap
        self.arithmetic_parts = arithmetic_parts  # lowered loop -> (interior layout, grid layout, ArithmeticPart or None)

    def lowered(self, loop, *, exclusive=None):
        """``loop`` (over a grid or its interior, checked) with its grid dats reached through
        maps; ``exclusive`` as in :func:`~meshchain.ir.loop.make_loop`."""
        lowered = make_loop(loop.kernel, loop.iterset, self.lowered_args(loop.iterset, loop.args), loop.name,
                            exclusive=exclusive)
        return dataclasses.replace(lowered, written=loop)

    def arithmetic(self, loop, layout) -> ArithmeticPart | None:
        """The part of lowered ``loop`` that runs by index arithmetic with ``layout`` (the
        session's :class:`~meshchain.partition.layout.MeshLayout`), or None."""
        if loop.written is None or not isinstance(loop.iterset, GridInterior):
            return None
        inner, outer = layout.of(loop.iterset), layout.of(loop.iterset.grid)
        found = self.arithmetic_parts.get(loop)
        if found is None or found[0] is not inner or found[1] is not outer:
            found = self.arithmetic_parts[loop] = (inner, outer, _arithmetic_part(loop, inner, outer))
        return found[2]

    def _box(self, interior):
        """``interior``'s box map; on one process made on first use, with its values."""
        box = self.boxes.get(interior)
        if box is None:
            box = self._new_box(interior)
            rows = box_targets(interior, np.arange(interior.size))
            self.declarations.map_rows[box.uid] = rows.astype(np.int32 if interior.grid.size < 2**31 else np.int64)
        return box

    def _new_box(self, interior):
        arity = (2 * interior.width + 1) ** len(interior.grid.shape)
        box = self.boxes[interior] = undeclared_map(interior, interior.grid, arity, f"{interior.name}.box")
        return box

    def parts(self, sets, maps, blocks, nranks: int) -> GridParts:
        """The grids among ``sets`` with their block counts (``blocks``, or chosen) and every
        interior's box map; refuses declared maps to or from a grid (every rank alike)."""
        linked = [m.name for m in maps if is_grid_set(m.source) or is_grid_set(m.target)]
        if linked:
            raise DeclarationError(f"map(s) {', '.join(map(repr, linked))} connect a structured grid to other sets; "
                                   f"on several ranks grids are laid out by their blocks and take no maps (loops "
                                   f"over grids read them through stencils).")
        for interior in (s for s in sets if isinstance(s, GridInterior) and s not in self.boxes):
            self._new_box(interior)
        grids = {s: checked_blocks(s, blocks, nranks) for s in sets if isinstance(s, Grid)}
        return GridParts(grids, {i: m for i, m in self.boxes.items() if i.grid in grids})

    def lowered_args(self, iterset, args) -> tuple:
        """``args`` of a (checked) loop over ``iterset`` with grid dats reached through maps."""
        if not is_grid_set(iterset):
            return args
        return tuple(self._lowered(iterset, arg) for arg in args)

    def _lowered(self, iterset, arg) -> Arg:
        if arg.data.is_global or (arg.stencil is None and not isinstance(iterset, GridInterior)):
            return arg
        if arg.stencil is None:
            return Arg(arg.data, arg.access, self._columns_map(iterset, ((0,) * len(iterset.grid.shape),), "self"), 0)
        return Arg(arg.data, arg.access, self._columns_map(iterset, arg.stencil.offsets, arg.stencil.name), None)

    def _columns_map(self, iterset, offsets: tuple, name: str) -> ColumnsMap:
        """The map from ``iterset`` to its grid through ``offsets`` (made once per offsets)."""
        key = (iterset.uid, offsets)
        found = self.columns.get(key)
        if found is None:
            if isinstance(iterset, GridInterior):
                column = {o: c for c, o in enumerate(box_offsets(iterset.width, len(offsets[0])))}
                found = ColumnsMap(iterset, iterset.grid, self._box(iterset), [column[o] for o in offsets],
                                   f"{iterset.name}.{name}")
            else:  # a loop over the grid itself: a stencil of zero offsets only (checked), the identity
                found = ColumnsMap(iterset, iterset, None, [0] * len(offsets), f"{iterset.name}.{name}")
            self.columns[key] = found
        return found


def _arithmetic_part(lowered, inner, outer) -> ArithmeticPart | None:
    """:meth:`GridLowering.arithmetic` of ``lowered`` from the interior's and the grid's layouts."""
    written = lowered.written
    interior = written.iterset
    grid, width = interior.grid, interior.width
    boxes = middle_box(outer, grid.shape), middle_box(inner, interior.shape, shift=width)
    if boxes[0] is None or boxes[1] is None:
        return None
    (glo, ghi, _), (ilo, ihi, count) = boxes
    if np.any(ilo - width < glo) or np.any(ihi + width > ghi):
        return None
    geometry = (tuple(int(n) for n in ghi - glo), tuple(int(c) for c in ilo - glo), tuple(int(n) for n in ihi - ilo))
    loop = make_loop(written.kernel, interior, written.args, written.name, geometry=geometry)
    return ArithmeticPart(dataclasses.replace(loop, origin=lowered), count)
