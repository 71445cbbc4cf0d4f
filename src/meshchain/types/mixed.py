"""Mixed spaces: several sets, dats and maps used as one (PyOP2's ``MixedSet``, ``MixedDat``,
``MixedMap``), for block systems such as Stokes or coupled fields.

A :class:`MixedSet` is a tuple of sets; a :class:`MixedDat` one dat per component set; a
:class:`MixedMap` one map per component, every one from the same source set. In a loop,
``mixed_dat(mode, mixed_map)`` hands the kernel *one flat view*: the values of component 0
(``arity_0 * dim_0`` of them, row by row), then those of component 1, and so on, as PyOP2
does; ``mixed_dat(mode)`` over a set that every component lives on hands it the rows of the
components one after the other (``dim_0 + dim_1 + ...`` values). Such a loop runs as a loop
over the components (:mod:`meshchain.ir.mixed`), so chains, communication avoidance,
tiling, capture and every backend apply unchanged.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> cells, nodes, faces = mc.Set(2, "cells"), mc.Set(3, "nodes"), mc.Set(2, "faces")
>>> c2n = mc.Map(cells, nodes, 2, [[0, 1], [1, 2]], "c2n")
>>> c2f = mc.Map(cells, faces, 1, [[0], [1]], "c2f")
>>> space = mc.MixedSet([nodes, faces], "space")
>>> u = mc.MixedDat(space, (1, 2), None, "u")
>>> @mc.kernel
... def spread(v):
...     for k in range(4):          # two nodes (dim 1), then one face (dim 2)
...         v[k] += 1.0 + k
>>> mc.par_loop(spread, cells, u(mc.INC, mc.MixedMap([c2n, c2f], "c2nf")))
>>> [part.data.ravel().tolist() for part in u.split]
[[1.0, 3.0, 2.0], [3.0, 4.0, 3.0, 4.0]]
"""

from __future__ import annotations

import math

import numpy as np

from ..core.access import DAT_MODES, Access
from ..core.errors import AccessModeError, DataShapeError, MapError, SetMismatchError
from ._checks import check_name
from .data import Dat
from .maps import Map
from .sets import Set

__all__ = ["MixedSet", "MixedDat", "MixedMap", "MixedArg"]

MIXED_MODES = (Access.READ, Access.WRITE, Access.RW, Access.INC)
"""The modes of a mixed argument (MIN and MAX into a flat view of several dats are not defined)."""


def _components(items, kind: str, owner: str, name: str) -> tuple:
    try:
        parts = tuple(items)
    except TypeError:
        parts = ()
    if not parts or not all(isinstance(p, kind) for p in parts):
        raise DataShapeError(f"{owner} {name!r}: pass a non-empty sequence of meshchain.{kind.__name__}, "
                             f"got {items!r}.")
    return parts


class MixedSet:
    """Several sets taken together, as the rows (or columns) of a block system.

    Parameters
    ----------
    sets : sequence of Set
        The components, in order (a set may appear more than once: Taylor-Hood velocity
        components both on the nodes, say).
    name : str, optional

    Examples
    --------
    >>> import meshchain as mc
    >>> nodes, cells = mc.Set(4, "nodes"), mc.Set(2, "cells")
    >>> s = mc.MixedSet([nodes, cells], "s")
    >>> len(s), s.sizes, [c.name for c in s]
    (2, (4, 2), ['nodes', 'cells'])
    """

    def __init__(self, sets, name=None):
        self.name = check_name(name, "mixed_set")
        self.split = _components(sets, Set, "MixedSet", self.name)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The components' global sizes."""
        return tuple(s.size for s in self.split)

    def __len__(self) -> int:
        return len(self.split)

    def __iter__(self):
        return iter(self.split)

    def __getitem__(self, i) -> Set:
        return self.split[i]

    def __repr__(self) -> str:
        return f"MixedSet([{', '.join(s.name for s in self.split)}], {self.name!r})"


class MixedMap:
    """One map per component of a mixed space, every one from the same source set.

    ``mixed_dat(mode, mixed_map)`` reaches component ``i`` of the dat through ``maps[i]``;
    the kernel's flat view holds ``arity_i * dim_i`` values per component, in order.

    Parameters
    ----------
    maps : sequence of Map
    name : str, optional

    Examples
    --------
    >>> import meshchain as mc
    >>> cells, nodes = mc.Set(1, "cells"), mc.Set(3, "nodes")
    >>> c2n = mc.Map(cells, nodes, 3, [[0, 1, 2]], "c2n")
    >>> c2c = mc.Map(cells, cells, 1, [[0]], "c2c")
    >>> m = mc.MixedMap([c2n, c2c], "m")
    >>> m.arities, m.arity, m.source.name
    ((3, 1), 4, 'cells')
    """

    def __init__(self, maps, name=None):
        self.name = check_name(name, "mixed_map")
        try:
            self.split = _components(maps, Map, "MixedMap", self.name)
        except DataShapeError as exc:
            raise MapError(str(exc)) from None
        sources = {m.source for m in self.split}
        if len(sources) != 1:
            raise MapError(f"MixedMap {self.name!r}: every component map must start from one set (the loop's), "
                           f"got {sorted({m.source.name for m in self.split})}.")
        self.source = self.split[0].source

    @property
    def arities(self) -> tuple[int, ...]:
        return tuple(m.arity for m in self.split)

    @property
    def arity(self) -> int:
        """The sum of the components' arities."""
        return sum(self.arities)

    @property
    def targets(self) -> tuple[Set, ...]:
        return tuple(m.target for m in self.split)

    def __len__(self) -> int:
        return len(self.split)

    def __repr__(self) -> str:
        return f"MixedMap([{', '.join(m.name for m in self.split)}], {self.name!r})"


class MixedArg:
    """A mixed loop argument, ``mixed_dat(mode)`` or ``mixed_dat(mode, mixed_map)``.

    The kernel receives one flat view of :attr:`size` values: each component's view
    (``(dim_i,)`` direct, ``(arity_i, dim_i)`` through a map) flattened, in order.
    """

    __slots__ = ("data", "access", "map")

    def __init__(self, data: "MixedDat", access: Access, map: MixedMap | None):  # noqa: A002
        self.data, self.access, self.map = data, access, map

    def parts(self) -> tuple:
        """The component arguments (meshchain.Arg), in order."""
        if self.map is None:
            return tuple(d(self.access) for d in self.data.split)
        return tuple(d(self.access, m) for d, m in zip(self.data.split, self.map.split))

    @property
    def view_shape(self) -> tuple[int]:
        """The shape of the kernel's flat view."""
        return (self.size,)

    @property
    def size(self) -> int:
        arities = (1,) * len(self.data.split) if self.map is None else self.map.arities
        return sum(a * d for a, d in zip(arities, self.data.dims))

    def __repr__(self) -> str:
        path = "" if self.map is None else f", {self.map.name}"
        return f"{self.data.name}({self.access!r}{path})"


class MixedDat:
    """One dat per component of a :class:`MixedSet` (or a sequence of existing dats).

    Parameters
    ----------
    space : MixedSet or sequence of Dat
        The components' sets; or the dats themselves (PyOP2's ``MixedDat([d0, d1])``), which
        are then shared, not copied.
    dims : int or sequence of int, optional
        Values per element, for all components or one per component (only with a MixedSet).
    data : sequence of array_like, or one flat array_like, optional
        One array per component; or every component's values, component after component
        (``sizes[i] * dims[i]`` each). ``None`` gives zeros.
    name : str, optional
        Component ``i`` is named ``f"{name}[{i}]"``.
    dtype : numpy dtype, keyword-only
        One dtype for every component.

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> space = mc.MixedSet([mc.Set(2, "a"), mc.Set(1, "b")], "space")
    >>> x = mc.MixedDat(space, (2, 1), np.arange(5.0), "x")
    >>> [d.data.tolist() for d in x.split]
    [[[0.0, 1.0], [2.0, 3.0]], [[4.0]]]
    >>> y = mc.MixedDat(space, (2, 1), None, "y")
    >>> y.axpy(2.0, x); float(y.inner(x))
    60.0
    """

    is_global = False

    def __init__(self, space, dims=1, data=None, name=None, *, dtype=None):
        self.name = check_name(name, "mixed_dat")
        if isinstance(space, MixedSet):
            self.split = self._declare(space, dims, data, dtype)
            self.dataset = space
        else:
            self.split = _components(space, Dat, "MixedDat", self.name)
            if data is not None or dims != 1 or dtype is not None:
                raise DataShapeError(f"MixedDat {self.name!r}: made of existing dats, it takes no dims, data or "
                                     f"dtype (they are the dats').")
            self.dataset = MixedSet([d.dataset for d in self.split], f"{self.name}.dataset")
        dtypes = {d.dtype for d in self.split}
        if len(dtypes) != 1:
            raise DataShapeError(f"MixedDat {self.name!r}: every component must have one dtype, got "
                                 f"{sorted(str(t) for t in dtypes)}.")
        self.dtype = dtypes.pop()

    def _declare(self, space: MixedSet, dims, data, dtype) -> tuple:
        n = len(space)
        dims = (dims,) * n if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool) else tuple(dims)
        if len(dims) != n:
            raise DataShapeError(f"MixedDat {self.name!r}: {len(dims)} dims for {n} component sets.")
        values = self._split_data(space, dims, data)
        return tuple(Dat(s, d, v, f"{self.name}[{i}]", dtype=dtype)
                     for i, (s, d, v) in enumerate(zip(space.split, dims, values)))

    def _split_data(self, space: MixedSet, dims, data) -> list:
        n = len(space)
        if data is None:
            return [None] * n
        if isinstance(data, (list, tuple)) and len(data) == n and all(np.ndim(v) >= 1 for v in data):
            return list(data)
        flat = np.asarray(data)
        counts = [s.size * d for s, d in zip(space.split, dims)]
        if flat.ndim != 1 or flat.size != sum(counts):
            raise DataShapeError(f"MixedDat {self.name!r}: pass one array per component ({n}), or one flat array of "
                                 f"{sum(counts)} values (component after component), got shape {flat.shape}.")
        bounds = np.cumsum([0, *counts])
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(d.dim for d in self.split)

    def __call__(self, access, path=None) -> MixedArg:
        """``mixed_dat(mode)`` (every component on the loop's set) or ``mixed_dat(mode, mixed_map)``."""
        owner = f"MixedDat {self.name!r}"
        if not isinstance(access, Access) or access not in DAT_MODES:
            raise AccessModeError(f"{owner}: access must be one of mc.READ, mc.WRITE, mc.RW, mc.INC, got {access!r}.")
        if access not in MIXED_MODES:
            raise AccessModeError(f"{owner}: a mixed argument takes READ, WRITE, RW or INC, got {access.value}; "
                                  f"reduce each component with its own argument (x.split[i]).")
        if path is None:
            return MixedArg(self, access, None)
        if not isinstance(path, MixedMap):
            raise SetMismatchError(f"{owner}: the path of a mixed argument must be a meshchain.MixedMap, got "
                                   f"{type(path).__name__}.")
        if len(path) != len(self.split) or any(m.target is not d.dataset for m, d in zip(path.split, self.split)):
            raise SetMismatchError(f"{owner}: MixedMap {path.name!r} points to "
                                   f"{[s.name for s in path.targets]}, but the components live on "
                                   f"{[d.dataset.name for d in self.split]}.")
        return MixedArg(self, access, path)

    # --- values and arithmetic, component by component (collective where the components' are) ----

    @property
    def data(self) -> tuple:
        """The components' :attr:`Dat.data <meshchain.Dat.data>`, a tuple (collective)."""
        return tuple(d.data for d in self.split)

    @property
    def data_ro(self) -> tuple:
        return tuple(d.data_ro for d in self.split)

    def gather(self):
        """The components' global arrays on rank 0 (a tuple), ``None`` on the other ranks."""
        parts = [d.gather() for d in self.split]
        return None if parts[0] is None else tuple(parts)

    def zero(self) -> None:
        for d in self.split:
            d.zero()

    def copy(self, other: "MixedDat") -> None:
        """Copy into ``other`` (PyOP2's direction)."""
        for a, b in zip(self.split, self._matching(other, "copy").split):
            a.copy(b)

    def axpy(self, a, y: "MixedDat") -> None:
        for x, z in zip(self.split, self._matching(y, "axpy").split):
            x.axpy(a, z)

    def inner(self, other: "MixedDat"):
        """The sum of the components' inner products (collective)."""
        return sum(a.inner(b) for a, b in zip(self.split, self._matching(other, "inner").split))

    @property
    def norm(self) -> float:
        return math.sqrt(self.inner(self))

    def _matching(self, other, what: str) -> "MixedDat":
        if not isinstance(other, MixedDat) or len(other.split) != len(self.split) or any(
                a.dataset is not b.dataset or a.dim != b.dim for a, b in zip(self.split, other.split)):
            raise SetMismatchError(f"MixedDat {self.name!r}.{what}: the other operand must be a MixedDat on the same "
                                   f"component sets with the same dims, got {other!r}.")
        return other

    def _apply(self, op: str, other) -> "MixedDat":
        if isinstance(other, MixedDat):
            for a, b in zip(self.split, self._matching(other, op).split):
                getattr(a, op)(b)
        else:
            for a in self.split:
                getattr(a, op)(other)
        return self

    def __iadd__(self, other):
        return self._apply("__iadd__", other)

    def __isub__(self, other):
        return self._apply("__isub__", other)

    def __imul__(self, other):
        return self._apply("__imul__", other)

    def __itruediv__(self, other):
        return self._apply("__itruediv__", other)

    def __repr__(self) -> str:
        return f"MixedDat([{', '.join(d.name for d in self.split)}], {self.name!r})"
