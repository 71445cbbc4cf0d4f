"""Sets: the mesh entities that loops iterate over and data lives on."""

from __future__ import annotations

import itertools

from ._checks import check_count, check_name

__all__ = ["Set"]


def _register(obj, agreed) -> None:
    """On several ranks: check that ``agreed`` is the same everywhere and record ``obj``."""
    from ..engine.session import get_runtime

    runtime = get_runtime()
    if runtime.distributed:
        if runtime.partitioned:
            from ..comm.collectives import raise_together
            from ..core.errors import DeclarationError

            raise_together(runtime.comm, DeclarationError(
                f"Set {agreed[1]!r} is declared after mc.partition; declare every set and map before partitioning."))
        runtime.declare(obj, agreed)

_counter = itertools.count()


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
    >>> cells.size, cells.name
    (4, 'cells')
    """

    __slots__ = ("size", "name", "_uid", "_layout", "__weakref__")

    def __init__(self, size, name=None):
        self.size = check_count(size, f"Set {name or ''} size".replace("  ", " "), minimum=0)
        self._uid = next(_counter)
        self.name = check_name(name, f"set{self._uid}")
        self._layout = None  # SetLayout once the mesh is partitioned over several ranks
        _register(self, (self.size, self.name))

    @property
    def n_owned(self) -> int:
        """Elements this rank owns (all of them on one process)."""
        return self.size if self._layout is None else self._layout.n_owned

    def __repr__(self) -> str:
        return f"Set({self.size}, {self.name!r})"
