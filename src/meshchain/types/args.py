"""Loop arguments: a dat or global paired with an access mode and a path."""

from __future__ import annotations


from ..core.access import Access
from .maps import Map

__all__ = ["Arg", "ShapeKey", "DIRECT", "INDIRECT", "WHOLE_MAP", "GLOBAL", "STENCIL"]

DIRECT = "direct"        # view (dim,) of the loop element's own row
INDIRECT = "indirect"    # view (dim,) of the row map[e, index]
WHOLE_MAP = "whole_map"  # view (arity, dim) of the rows map[e, :]
GLOBAL = "global"        # view (dim,) of a global
STENCIL = "stencil"      # view (len(offsets), dim) of grid points around the loop's point


class ShapeKey:
    """A structure (a tuple) as a dictionary key whose hash is computed once."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple):
        self.key, self._hash = key, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (type(other) is ShapeKey and self._hash == other._hash and self.key == other.key)

    def __repr__(self) -> str:
        return f"ShapeKey({self.key!r})"


class Arg:
    """One argument of a parallel loop, built by ``dat(mode, path)`` or ``glob(mode)``.

    An object keeps its arguments weakly (``dat(mode)`` hands out the same one again while it
    lives), so an object and its arguments form no reference cycle: a temporary dat goes as
    soon as nothing holds it, not at the next garbage collection.

    Attributes
    ----------
    data : Dat or Global
    access : Access
    map : Map or None
        The map the dat is reached through (``None`` for direct dats and globals).
    index : int or None
        The map column for a per-index argument, ``None`` for a whole-map argument.
    stencil : Stencil or None
        The stencil of a grid dat read around the loop's point.
    shape : ShapeKey
        What a loop's checks and plans depend on besides the object itself: its kind, set,
        dim, dtype, the path and the mode (equal for a new object declared alike).
    """

    __slots__ = ("data", "access", "map", "index", "stencil", "shape", "__weakref__")

    def __init__(self, data, access: Access, map: Map | None = None, index: int | None = None,  # noqa: A002
                 stencil=None):
        self.data = data
        self.access, self.map, self.index, self.stencil = access, map, index, stencil
        dataset = None if data.is_global else data.dataset
        self.shape = ShapeKey((data.is_global, dataset, data.dim, data.dtype, map, index, access, stencil))

    @property
    def kind(self) -> str:
        """One of ``"direct"``, ``"indirect"``, ``"whole_map"``, ``"global"``."""
        if self.data.is_global:
            return GLOBAL
        if self.stencil is not None:
            return STENCIL
        if self.map is None:
            return DIRECT
        return WHOLE_MAP if self.index is None else INDIRECT

    @property
    def view_shape(self) -> tuple[int, ...]:
        """The shape of the view the kernel receives for this argument."""
        if self.kind == WHOLE_MAP:
            return (self.map.arity, self.data.dim)
        if self.stencil is not None:
            return (len(self.stencil), self.data.dim)
        return (self.data.dim,)

    def __repr__(self) -> str:
        path = "" if self.map is None else (f", {self.map.name}" if self.index is None else f", {self.map.name}[{self.index}]")
        if self.stencil is not None:
            path = f", {self.stencil.name}"
        return f"{self.data.name}({self.access!r}{path})"
