"""Structured grids: sets with a shape, their interiors and stencils.

A :class:`Grid` is a set of ``nx * ny`` (or ``nx * ny * nz``) points in row-major order;
dats on it are ordinary dats (``data`` may also be given as ``(nx, ny, dim)``). A loop over
the grid, or over ``grid.interior(width)`` (the points at least ``width`` away from every
side), reads neighbours through a :class:`Stencil`: ``u(mc.READ, stencil)`` gives the
kernel a view of shape ``(len(offsets), dim)``. Generated code finds every point by index
arithmetic: no index arrays are read. Writes are direct (owner computes).

Examples
--------
>>> import numpy as np, meshchain as mc
>>> g = mc.Grid((4, 5), "g")
>>> u = mc.Dat(g, 1, np.arange(20.0).reshape(4, 5), "u")
>>> v = mc.Dat(g, 1, None, "v")
>>> star = mc.Stencil([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], "star")
>>> @mc.kernel
... def average(s, out):
...     out[0] = 0.2 * (s[0, 0] + s[1, 0] + s[2, 0] + s[3, 0] + s[4, 0])
>>> mc.par_loop(average, g.interior(1), u(mc.READ, star), v(mc.WRITE))
>>> v.data[:, 0].reshape(4, 5)[1:3, 1:4].tolist()
[[6.0, 7.0, 8.0], [11.0, 12.0, 13.0]]
"""

from __future__ import annotations

import math
import numbers

from ..core.errors import DeclarationError
from ._checks import check_name
from .sets import Set

__all__ = ["Grid", "GridInterior", "Stencil"]


def _shape(shape, what: str) -> tuple:
    try:
        dims = tuple(shape)
    except TypeError:
        dims = ()
    if len(dims) not in (2, 3) or any(type(n) is not int and not hasattr(n, "__index__") for n in dims):
        raise DeclarationError(f"{what}: the shape must be 2 or 3 integers, got {shape!r}.")
    dims = tuple(int(n) for n in dims)
    if any(n < 1 for n in dims):
        raise DeclarationError(f"{what}: every extent must be at least 1, got {dims}.")
    return dims


class Grid(Set):
    """A structured grid of ``prod(shape)`` points, row-major (the last index fastest).

    Parameters
    ----------
    shape : tuple of 2 or 3 int
    name : str, optional
    """

    __slots__ = ("shape", "_interiors")

    def __init__(self, shape, name=None):
        dims = _shape(shape, f"Grid {name or ''}".rstrip())
        self.shape, self._interiors = dims, {}
        super().__init__(math.prod(dims), name)

    def interior(self, width: int = 1) -> "GridInterior":
        """The points at least ``width`` away from every side (the same object for a width)."""
        if type(width) is not int or width < 0:
            raise DeclarationError(f"Grid {self.name!r}.interior: width must be an integer >= 0, got {width!r}.")
        if width not in self._interiors:
            self._interiors[width] = GridInterior(self, width)
        return self._interiors[width]

    def __repr__(self) -> str:
        return f"Grid({self.shape}, {self.name!r})"


class GridInterior(Set):
    """``grid.interior(width)``: a set to iterate over whose elements are grid points;
    dats on the grid are read and written directly, stencils reach up to ``width``."""

    __slots__ = ("grid", "width", "shape")

    def __init__(self, grid: Grid, width: int):
        self.grid, self.width = grid, width
        self.shape = tuple(max(n - 2 * width, 0) for n in grid.shape)
        super().__init__(math.prod(self.shape), f"{grid.name}.interior({width})")

    def __repr__(self) -> str:
        return f"GridInterior({self.grid.name!r}, width={self.width})"


def _integer(value) -> int | None:
    """``value`` if it is an integer (a Python or NumPy one, not a bool); else None (a float
    offset such as 0.5 is refused, never truncated)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


class Stencil:
    """Integer offsets to neighbouring grid points, e.g. ``[(0, 0), (-1, 0), (1, 0)]``.

    Row ``k`` of a stencil argument's view is the point at ``offsets[k]`` from the loop's point.
    """

    __slots__ = ("offsets", "name", "reach", "__weakref__")

    def __init__(self, offsets, name=None):
        self.name = check_name(name, "stencil")
        try:
            points = tuple(tuple(_integer(c) for c in point) for point in offsets)
        except (TypeError, ValueError):
            points = ()
        if (not points or len({len(p) for p in points}) != 1 or len(points[0]) not in (2, 3)
                or any(c is None for p in points for c in p)):
            raise DeclarationError(f"Stencil {self.name!r}: offsets must be a non-empty list of 2- or 3-integer "
                                   f"tuples of one length, got {offsets!r}.")
        self.offsets = points
        self.reach = tuple(max(abs(p[d]) for p in points) for d in range(len(points[0])))

    @property
    def ndim(self) -> int:
        return len(self.offsets[0])

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        return f"Stencil({list(self.offsets)}, {self.name!r})"
