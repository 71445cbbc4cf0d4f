"""Sets: the mesh entities that loops iterate over and data lives on."""

from __future__ import annotations

from ..core import context
from ._checks import check_count, check_name, next_uid

__all__ = ["Set"]


class Set:
    """A set of mesh entities (nodes, edges, cells, ...).

    Parameters
    ----------
    size : int
        Number of elements (``>= 0``), in global numbering.
    name : str, optional
        Name used in messages and statistics.

    Examples
    --------
    >>> import meshchain as mc
    >>> cells = mc.Set(4, "cells")
    >>> cells.size, cells.name, cells.n_owned
    (4, 'cells', 4)
    """

    __slots__ = ("size", "name", "uid", "__weakref__")

    def __init__(self, size, name=None):
        self.size = check_count(size, f"Set {name or ''} size".replace("  ", " "), minimum=0)
        self.uid = next_uid()
        self.name = check_name(name, f"set{self.uid}")
        context.current().declare_set(self)

    @property
    def n_owned(self) -> int:
        """Elements this rank owns (all of them on one process)."""
        return context.current().n_owned(self)

    def __repr__(self) -> str:
        return f"Set({self.size}, {self.name!r})"
