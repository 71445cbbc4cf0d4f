"""Loop arguments: a dat or global paired with an access mode and a path."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.access import Access
from .maps import Map

__all__ = ["Arg", "DIRECT", "INDIRECT", "WHOLE_MAP", "GLOBAL", "STENCIL"]

DIRECT = "direct"        # view (dim,) of the loop element's own row
INDIRECT = "indirect"    # view (dim,) of the row map[e, index]
WHOLE_MAP = "whole_map"  # view (arity, dim) of the rows map[e, :]
GLOBAL = "global"        # view (dim,) of a global
STENCIL = "stencil"      # view (len(offsets), dim) of grid points around the loop's point


@dataclass(frozen=True, eq=False)
class Arg:
    """One argument of a parallel loop, built by ``dat(mode, path)`` or ``glob(mode)``.

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
    """

    data: object
    access: Access
    map: Map | None = None
    index: int | None = None
    stencil: object = None

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
