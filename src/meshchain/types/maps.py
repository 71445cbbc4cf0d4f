"""Maps: connectivity from one set to another."""

from __future__ import annotations

import numpy as np

from ..core import context
from ..core.errors import MapError
from ._checks import check_count, check_name, next_uid
from .layers import bottom_rows, checked_offset, facet_rows, layered
from .sets import Set

__all__ = ["Map", "ExtrudedMap", "MapIndex", "ColumnsMap", "ComposedMap", "composed_rows", "undeclared_map", "checked_values"]


class Map:
    """Connectivity: each element of ``source`` points at ``arity`` elements of ``target``.

    Parameters
    ----------
    source, target : Set
        The sets the map goes from and to.
    arity : int
        Number of target elements per source element (``>= 1``).
    values : array_like of int, shape (source.size, arity)
        Target indices in global numbering, each in ``[0, target.size)``.
    name : str, optional
        Name used in messages and statistics.
    offset : array_like of int, keyword-only
        For a map from an :class:`~meshchain.types.extruded.ExtrudedSet`: ``values`` are then
        the bottom layer's rows (one per base element) and layer ``l`` points at
        ``values + l * offset`` (PyOP2's convention; the map is an
        :class:`~meshchain.types.extruded.ExtrudedMap`).

    Examples
    --------
    >>> import meshchain as mc
    >>> nodes, edges = mc.Set(3, "nodes"), mc.Set(2, "edges")
    >>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2]], "e2n")
    >>> e2n[1].index, e2n.values[1].tolist()
    (1, [1, 2])
    """

    __slots__ = ("source", "target", "arity", "name", "uid", "_indices", "__weakref__")

    def __new__(cls, *args, offset=None, **kwargs):
        if offset is not None and cls is Map:  # PyOP2's spelling of an extruded map
            cls = ExtrudedMap
        return object.__new__(cls)

    def __init__(self, source, target, arity, values, name=None, *, offset=None):  # noqa: ARG002 (__new__ reads it)
        self.name = check_name(name, "map")
        for role, s in (("source", source), ("target", target)):
            if not isinstance(s, Set):
                raise MapError(f"Map {self.name!r}: {role} must be a meshchain.Set, got {type(s).__name__}.")
        self.source, self.target = source, target
        self.arity = check_count(arity, f"Map {self.name!r} arity", minimum=1, error=MapError)
        self._indices = tuple(MapIndex(self, i) for i in range(self.arity))
        self.uid = next_uid()
        context.current().declare_map(self, values)

    @property
    def values(self):
        """The target indices in this rank's local numbering (global numbering on one process),
        read-only; ``None`` on several ranks until ``mc.partition``."""
        return context.current().map_values(self)

    def __getitem__(self, index) -> "MapIndex":
        try:
            if index >= 0 and type(index) is int:  # the usual case first: a plain int in range
                return self._indices[index]
        except (IndexError, TypeError):
            pass
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise MapError(f"Map {self.name!r}: index must be an int in [0, {self.arity}), got {index!r}.")
        if not 0 <= index < self.arity:
            raise MapError(
                f"Map {self.name!r} has arity {self.arity}: index {index} is out of range; "
                f"use {self.name}[0] ... {self.name}[{self.arity - 1}]."
            )
        return self._indices[int(index)]

    def __repr__(self) -> str:
        return f"Map({self.source.name} -> {self.target.name}, arity={self.arity}, {self.name!r})"


class ExtrudedMap(Map):
    """A map from an :class:`ExtrudedSet` given by its bottom layer and a per-column offset;
    made by ``mc.Map(source, target, arity, values, name, offset=...)``.

    Attributes
    ----------
    offset : tuple of int
        How far each column's target moves up per layer.
    facets : Map
        The map of the interior facets: row ``c * layers + l`` holds the targets of layers
        ``l`` and ``l + 1`` (``2 * arity`` columns); a loop over ``source.interior_facets``
        uses it (top-layer rows repeat their own layer, and no facet loop reads them).
    """

    __slots__ = ("offset", "facets")

    def __init__(self, source, target, arity, values, name=None, *, offset=None):
        if getattr(source, "layers", None) is None:  # not an ExtrudedSet (which builds on this module)
            raise MapError(f"Map {name!r}: offset= is for maps from an ExtrudedSet (it says how far each column's "
                           f"target moves per layer); {getattr(source, 'name', source)!r} is not one.")
        arity = check_count(arity, f"Map {name!r} arity", minimum=1, error=MapError)
        self.offset = checked_offset(offset, arity, name)
        bottom = bottom_rows(values, source, arity, name)
        super().__init__(source, target, arity, layered(bottom, self.offset, source.layers), name)
        self.facets = Map(source, target, 2 * arity, facet_rows(bottom, self.offset, source.layers),
                          f"{self.name}.facets")


def undeclared_map(source, target, arity: int, name: str) -> Map:
    """A :class:`Map` the library makes itself (a grid interior's box of neighbours): not
    declared to the session, whose values the caller registers."""
    m = Map.__new__(Map)
    m.name, m.source, m.target, m.arity = name, source, target, arity
    m._indices = tuple(MapIndex(m, i) for i in range(arity))
    m.uid = next_uid()
    return m


class ColumnsMap(Map):
    """A map the library derives from another on each rank: columns ``columns`` of ``base``
    (or, with ``base`` None, ``len(columns)`` copies of the identity on ``source``). Its local
    values follow from ``base``'s local values, so it needs no collective step and can be made
    after ``mc.partition``; structured-grid loops on several ranks read stencils through them.
    """

    __slots__ = ("base", "columns")

    def __init__(self, source, target, base, columns, name):
        self.base, self.columns = base, tuple(int(c) for c in columns)
        self.name, self.source, self.target, self.arity = name, source, target, len(self.columns)
        self._indices = tuple(MapIndex(self, i) for i in range(self.arity))
        self.uid = next_uid()

    def local_values(self, base_values, n_source: int) -> np.ndarray:
        """The values on this rank from ``base``'s (``n_source`` local source elements)."""
        if self.base is None:
            values = np.repeat(np.arange(n_source, dtype=np.int64)[:, None], self.arity, axis=1)
        else:
            values = base_values[:, list(self.columns)]
        values = np.ascontiguousarray(values, dtype=np.int32 if n_source < np.iinfo(np.int32).max else np.int64)
        values.flags.writeable = False
        return values


class ComposedMap(Map):
    """A map the library composes for loops over a :class:`~meshchain.types.subsets.Subset`:
    ``parts`` followed from the subset (its injection, those of the subsets between it and an
    ancestor, then optionally a map from that ancestor). Every part but the last has arity 1.
    Its values are made from the parts' (:func:`composed_rows`): on several ranks when the mesh
    is partitioned, so its rows take part in the halo layers as a declared map's do; it is not
    declared (checkpoints and ownership ignore it).
    """

    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = tuple(parts)
        first, last = self.parts[0], self.parts[-1]
        self.name = "(" + " o ".join(m.name for m in reversed(self.parts)) + ")"
        self.source, self.target, self.arity = first.source, last.target, last.arity
        self._indices = tuple(MapIndex(self, i) for i in range(self.arity))
        self.uid = next_uid()


def composed_rows(parts, rows_of, ids=None) -> np.ndarray:
    """The rows of the composition of ``parts`` (see :class:`ComposedMap`): ``rows_of(m, ids)``
    gives map ``m``'s rows at source ids ``ids`` (all of them when None), in global numbering.

    >>> import numpy as np
    >>> table = {"inj": np.array([[2], [0]]), "c2n": np.array([[0, 1], [1, 2], [2, 3]])}
    >>> composed_rows(["inj", "c2n"], lambda m, ids: table[m] if ids is None else table[m][ids]).tolist()
    [[2, 3], [0, 1]]
    """
    rows = None
    for m in parts:
        rows = rows_of(m, ids)
        ids = np.asarray(rows, dtype=np.int64)[:, 0]
    return np.asarray(rows, dtype=np.int64)


class MapIndex:
    """One column of a map, ``map[i]``: an argument through it sees one target element."""

    __slots__ = ("map", "index")

    def __init__(self, map_: Map, index: int):
        self.map = map_
        self.index = index

    def __repr__(self) -> str:
        return f"{self.map.name}[{self.index}]"


def checked_values(values, source: Set, target: Set, arity: int, name: str, *, rows=None) -> np.ndarray:
    expected = (source.size if rows is None else rows, arity)
    if values is None:
        raise MapError(f"Map {name!r}: values are missing; pass an integer array of shape {expected}.")
    array = np.asarray(values)
    if array.size == 0 and expected[0] == 0:
        array = array.reshape(0, arity).astype(np.int64)
    flat = array.ndim == 1 and array.size == expected[0] * arity  # OP2's C API and PyOP2 take them flat
    if array.shape != expected and not flat:
        raise MapError(
            f"Map {name!r} ({source.name} -> {target.name}, arity {arity}): values have shape {array.shape}, "
            f"expected {expected} (or {expected[0] * arity} values flat); pass one row of {arity} target indices "
            f"per element of {source.name!r}."
        )
    if array.dtype.kind == "f" and array.size and np.all(np.isfinite(array)) and np.all(array == np.trunc(array)):
        array = array.astype(np.int64)  # whole numbers given as floats: converted, as PyOP2 does
    if array.dtype.kind not in "iu":
        raise MapError(
            f"Map {name!r}: values must be integers, got dtype {array.dtype}"
            f"{' with values that are not whole numbers' if array.dtype.kind == 'f' else ''}; convert with "
            f".astype(np.int64)."
        )
    array = array.reshape(expected)
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0:
            row = int(np.argwhere(array < 0)[0][0])
            raise MapError(
                f"Map {name!r}: value {low} is negative (row {row}); map values are 0-based indices into "
                f"{target.name!r} (size {target.size}) — convert 1-based data with values - 1."
            )
        if high >= target.size:
            row = int(np.argwhere(array >= target.size)[0][0])
            raise MapError(
                f"Map {name!r}: value {high} at row {row} is out of range for target set {target.name!r} "
                f"of size {target.size}; values must lie in [0, {target.size})."
            )
    dtype = np.int32 if target.size <= np.iinfo(np.int32).max else np.int64
    stored = np.ascontiguousarray(array, dtype=dtype)
    stored = stored.copy() if stored is array or np.shares_memory(stored, array) else stored
    stored.flags.writeable = False
    return stored
