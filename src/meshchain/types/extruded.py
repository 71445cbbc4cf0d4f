"""Extruded sets: columns of layers over an unstructured base set, PyOP2's ``ExtrudedSet``.

An :class:`ExtrudedSet` stacks ``layers`` elements over every element of a base set: the
prisms (or hexahedra) of a mesh extruded from a triangle (or quadrilateral) mesh, or the
vertex levels of its columns. Its elements are numbered **column by column**: element
``c * layers + l`` is layer ``l`` (counted from the bottom) of column ``c``, so a dat on it
has shape ``(base.size * layers, dim)`` with each column's rows contiguous.

A map from an extruded set is declared as PyOP2 declares it: the rows of the **bottom
layer**, one per base element, and an ``offset`` per map column; layer ``l`` of column ``c``
points at ``values[c] + l * offset``::

    cells = mc.ExtrudedSet(triangles, layers, "cells")            # layers prisms per column
    nodes = mc.ExtrudedSet(vertices, layers + 1, "nodes")         # layers + 1 vertex levels
    bottom = [[3 * n0, ...]]  # vertex v's level j is node v * (layers + 1) + j
    c2n = mc.Map(cells, nodes, 6, bottom_rows, "c2n", offset=[1] * 6)

Loops run over every layer (the default), or over one **region** (``region=`` of
``mc.par_loop``; PyOP2's ``iteration_region``):

* ``mc.ON_BOTTOM`` / ``mc.ON_TOP``: the bottom / top layer of every column
  (:attr:`ExtrudedSet.bottom`, :attr:`ExtrudedSet.top`, subsets of the extruded set);
* ``mc.ON_INTERIOR_FACETS``: the horizontal facets between adjacent layers, facet ``l`` of a
  column lying between its layers ``l`` and ``l + 1`` (:attr:`ExtrudedSet.interior_facets`).
  A whole-map argument ``dat(mode, m)`` through an extruded map then sees ``2 * arity`` rows,
  those of the layer below and then those of the layer above (PyOP2's convention);
  ``dat(mode, m[i])`` and direct arguments see the layer below, and ``m.facets[arity + i]``
  reaches column ``i`` of the layer above.

Everything else about an extruded set is that of a set of ``base.size * layers`` elements:
loops chain, run communication-avoiding and tile over it, on every backend and any number of
ranks.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> base = mc.Set(2, "base")
>>> cells = mc.ExtrudedSet(base, 3, "cells")
>>> levels = mc.ExtrudedSet(base, 4, "levels")
>>> c2l = mc.Map(cells, levels, 2, [[0, 1], [4, 5]], "c2l", offset=[1, 1])
>>> c2l.values[:4].tolist()
[[0, 1], [1, 2], [2, 3], [4, 5]]
>>> h = mc.Dat(levels, 1, np.arange(8.0), "h")
>>> thickness = mc.Dat(cells, 1, None, "thickness")
>>> @mc.kernel
... def difference(t, z):
...     t[0] = z[1, 0] - z[0, 0]
>>> mc.par_loop(difference, cells, thickness(mc.WRITE), h(mc.READ, c2l))
>>> thickness.data[:, 0].tolist()
[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
>>> jump = mc.Dat(cells, 1, None, "jump")
>>> @mc.kernel
... def across(j, t):
...     j[0] = t[1, 0] + t[3, 0]  # the upper point of the layer below and of the layer above
>>> mc.par_loop(across, cells, jump(mc.WRITE), h(mc.READ, c2l), region=mc.ON_INTERIOR_FACETS)
>>> jump.data[:, 0].tolist()
[3.0, 5.0, 0.0, 11.0, 13.0, 0.0]
"""

from __future__ import annotations

import numpy as np

from ..core.errors import DeclarationError
from ._checks import check_count
from .maps import ExtrudedMap
from .sets import Set
from .subsets import Subset

__all__ = ["ExtrudedSet", "ALL", "ON_BOTTOM", "ON_TOP", "ON_INTERIOR_FACETS", "in_region"]

ALL = "all"
ON_BOTTOM = "bottom"
ON_TOP = "top"
ON_INTERIOR_FACETS = "interior_facets"
REGIONS = (ALL, ON_BOTTOM, ON_TOP, ON_INTERIOR_FACETS)


class ExtrudedSet(Set):
    """``layers`` elements over each element of ``base``, numbered column by column.

    Parameters
    ----------
    base : Set
        The unstructured set the columns stand on (a plain set: not a subset, a grid or an
        extruded set).
    layers : int
        Elements per column (``>= 1``): cells per column for cells, vertex levels (cells + 1)
        for the vertices of the columns.
    name : str, optional

    Attributes
    ----------
    base, layers
    bottom, top : Subset
        The bottom and top layer of every column (element ``c`` of either is column ``c``'s).
    interior_facets : Subset
        The layers that have a layer above (``layers - 1`` per column, none for one layer):
        element ``c * (layers - 1) + l`` stands for the facet between layers ``l`` and ``l + 1``
        of column ``c``.

    Examples
    --------
    >>> import meshchain as mc
    >>> cells = mc.ExtrudedSet(mc.Set(3, "tri"), 4, "cells")
    >>> cells.size, cells.layers, cells.top.indices.tolist(), cells.interior_facets.size
    (12, 4, [3, 7, 11], 9)
    """

    __slots__ = ("base", "layers", "bottom", "top", "interior_facets")

    def __init__(self, base, layers, name=None):
        if not isinstance(base, Set) or isinstance(base, (ExtrudedSet, Subset)) or hasattr(base, "shape"):
            what = type(base).__name__ if not isinstance(base, Set) else repr(base)
            raise DeclarationError(f"ExtrudedSet {name!r}: the base must be a plain meshchain.Set (not a subset, grid "
                                   f"or extruded set), got {what}.")
        self.layers = check_count(layers, f"ExtrudedSet {name!r} layers", minimum=1)
        self.base = base
        super().__init__(base.size * self.layers, name)
        columns = np.arange(base.size, dtype=np.int64) * self.layers
        self.bottom = Subset(self, columns, f"{self.name}.bottom")
        self.top = Subset(self, columns + (self.layers - 1), f"{self.name}.top")
        below = (columns[:, None] + np.arange(self.layers - 1)).reshape(-1)
        self.interior_facets = Subset(self, below, f"{self.name}.interior_facets")

    def __repr__(self) -> str:
        return f"ExtrudedSet({self.base.name!r}, layers={self.layers}, {self.name!r})"


def in_region(iterset, args, region):
    """The iteration set and arguments of a loop over ``region`` of ``iterset`` (``mc.par_loop``'s
    ``region=``): ``iterset`` itself for :data:`ALL`, else the region's subset, with whole-map
    arguments through extruded maps turned into their facet maps on interior facets.

    >>> import meshchain as mc
    >>> cells = mc.ExtrudedSet(mc.Set(2, "tri"), 3, "cells")
    >>> in_region(cells, [], mc.ON_TOP)[0].name
    'cells.top'
    """
    if region is None or region == ALL:
        return iterset, args
    if region not in REGIONS:
        raise DeclarationError(f"region={region!r} is not one of mc.ALL, mc.ON_BOTTOM, mc.ON_TOP, "
                               f"mc.ON_INTERIOR_FACETS ({', '.join(map(repr, REGIONS))}).")
    if not isinstance(iterset, ExtrudedSet):
        raise DeclarationError(f"region={region!r} needs a loop over an mc.ExtrudedSet; {iterset.name!r} is "
                               f"{type(iterset).__name__}.")
    if region == ON_BOTTOM:
        return iterset.bottom, args
    if region == ON_TOP:
        return iterset.top, args
    return iterset.interior_facets, [_facet_arg(a, iterset) for a in args]


def _facet_arg(arg, iterset):
    m = getattr(arg, "map", None)
    if m is None or arg.index is not None:
        return arg
    if isinstance(m, ExtrudedMap) and m.source is iterset:
        return arg.data(arg.access, m.facets)
    if m.source is iterset:
        raise DeclarationError(f"{arg!r}: on interior facets a whole-map argument needs a map declared with "
                               f"offset= (the layer above follows from it); {m.name!r} has none.")
    return arg
