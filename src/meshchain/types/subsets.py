"""Subsets: part of a set to iterate over (boundary conditions, marked regions), PyOP2's ``Subset``.

A :class:`Subset` is a set of its own (dats may live on it) whose element ``i`` *is* element
``indices[i]`` of its parent: a loop over it reads and writes the parent's dats directly and
through the maps that start at the parent (or at any set it is a subset of), as a loop over
the parent does for those elements alone. The library reaches them through the subset's
injection map (:attr:`Subset.injection`, arity 1) and maps composed with it, so on several
ranks a subset follows its parent's partition (an element belongs to the rank that owns its
parent element) and communication-avoiding chains, sparse tiling and every backend apply.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes = mc.Set(5, "nodes")
>>> u = mc.Dat(nodes, 1, np.arange(5.0), "u")
>>> ends = mc.Subset(nodes, [4, 0], "ends")
>>> @mc.kernel
... def fix(x):
...     x[0] = -1.0
>>> mc.par_loop(fix, ends, u(mc.WRITE))
>>> u.data[:, 0].tolist(), ends.size, ends.indices.tolist()
([-1.0, 1.0, 2.0, 3.0, -1.0], 2, [4, 0])
"""

from __future__ import annotations

import numpy as np

from ..core.errors import DeclarationError
from .maps import Map
from .sets import Set

__all__ = ["Subset", "ancestors", "ids_in"]


class Subset(Set):
    """Elements ``indices`` of ``parent``, iterated as a set of their own.

    Parameters
    ----------
    parent : Set
        The set it is part of (a :class:`Subset` too: subsets of subsets), not a structured
        grid (whose loops take no maps on several ranks).
    indices : array_like of int, or of bool with ``parent.size`` entries
        Global ids of the parent elements, each once, in the order the subset numbers them; a
        boolean mask selects the elements where it is true. Whole numbers given as floats are
        converted; duplicates, negative or too large ids and fractions raise.
    name : str, optional

    Notes
    -----
    Declare a subset before ``mc.partition``, with the same indices on every rank (as a map's
    values). A loop over it may pass a dat of an ancestor set directly (the element itself),
    through a map from an ancestor (that map's targets of the element), or a dat of the subset.
    """

    __slots__ = ("parent", "indices", "injection")

    def __init__(self, parent, indices, name=None):
        if not isinstance(parent, Set):
            raise DeclarationError(f"Subset {name!r}: the parent must be a meshchain.Set, got {type(parent).__name__}.")
        if hasattr(parent, "shape"):
            raise DeclarationError(f"Subset {name!r}: {parent.name!r} is a structured grid (or its interior), whose "
                                   f"loops read neighbours through stencils and take no maps; use grid.interior(w) "
                                   f"or a Set with maps.")
        chosen = _checked_indices(indices, parent, name)
        self.parent, self.indices = parent, chosen
        super().__init__(len(chosen), name)
        self.injection = Map(self, parent, 1, chosen.reshape(-1, 1), f"{self.name}->{parent.name}")

    def __repr__(self) -> str:
        return f"Subset({self.parent.name!r}, {self.size} elements, {self.name!r})"


def ancestors(s) -> list:
    """The sets ``s`` is a subset of, nearest first (empty for a set that is no subset).

    >>> import meshchain as mc
    >>> cells = mc.Set(4, "cells")
    >>> inner = mc.Subset(cells, [1, 2, 3], "inner")
    >>> [a.name for a in ancestors(mc.Subset(inner, [0], "one"))]
    ['inner', 'cells']
    """
    found = []
    while isinstance(s, Subset):
        s = s.parent
        found.append(s)
    return found


def ids_in(subset, ancestor) -> np.ndarray:
    """The global ids in ``ancestor`` of the elements of ``subset`` (one of its ancestors).

    >>> import meshchain as mc
    >>> cells = mc.Set(5, "cells")
    >>> ids_in(mc.Subset(mc.Subset(cells, [4, 2, 0], "a"), [2, 0], "b"), cells).tolist()
    [0, 4]
    """
    ids, s = subset.indices, subset.parent
    while s is not ancestor:
        if not isinstance(s, Subset):
            raise DeclarationError(f"{subset.name!r} is not a subset of {ancestor.name!r}.")
        ids, s = s.indices[ids], s.parent
    return ids


def _checked_indices(indices, parent: Set, name) -> np.ndarray:
    """``indices`` as read-only int64 global ids of ``parent`` (each once), or a DeclarationError."""
    where = f"Subset {name!r} of {parent.name!r}" if name is not None else f"Subset of {parent.name!r}"
    array = np.asarray(indices)
    if array.dtype == bool:
        if array.shape != (parent.size,):
            raise DeclarationError(f"{where}: a boolean mask needs one entry per element of {parent.name!r} "
                                   f"({parent.size}), got shape {array.shape}.")
        array = np.flatnonzero(array)
    if array.ndim != 1 and not (array.ndim == 2 and array.shape[1:] == (1,)):
        raise DeclarationError(f"{where}: indices must be a flat list of element ids, got shape {array.shape}.")
    array = array.reshape(-1)
    if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.trunc(array)):
        array = array.astype(np.int64)  # whole numbers given as floats, as maps take them
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise DeclarationError(f"{where}: indices must be integers (or a boolean mask), got dtype {array.dtype}.")
    array = array.astype(np.int64)
    bad = np.flatnonzero((array < 0) | (array >= parent.size))
    if bad.size:
        raise DeclarationError(f"{where}: index {int(array[bad[0]])} at position {int(bad[0])} is outside "
                               f"[0, {parent.size}).")
    unique, counts = np.unique(array, return_counts=True)
    if np.any(counts > 1):
        raise DeclarationError(f"{where}: element {int(unique[counts > 1][0])} is listed {int(counts.max())} times; "
                               f"a subset holds each element once (a loop would visit it twice).")
    array.flags.writeable = False
    return array
