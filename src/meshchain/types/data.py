"""Dats (data on a set) and Globals (small arrays shared by all elements)."""

from __future__ import annotations

import weakref

import numpy as np

from ..core import context
from ..core.access import DAT_MODES, GLOBAL_MODES, Access
from ..core.errors import AccessModeError, DataShapeError, SetMismatchError
from ._checks import as_storage, check_count, check_name, next_uid, resolve_dtype, scalar_storage
from .args import Arg
from .maps import Map, MapIndex
from .grid import Grid, Stencil
from .sets import Set

__all__ = ["Dat", "Global"]

_FLOAT64 = np.dtype(np.float64)


def _check_access(access, owner: str, allowed, advice: str) -> Access:
    if not isinstance(access, Access):
        raise AccessModeError(f"{owner}: access must be one of mc.READ, mc.WRITE, mc.RW, mc.INC, mc.MIN, mc.MAX, got {access!r}.")
    if access not in allowed:
        raise AccessModeError(f"{owner}: access {access.value} is not allowed; {advice}")
    return access


def _grid_rows(data, shape: tuple, dim: int):
    """Grid-shaped ``data`` (``shape + (dim,)``, or ``shape`` for dim 1) as rows; else as given."""
    array = np.asarray(data)
    if array.shape == shape + (dim,) or (dim == 1 and array.shape == shape):
        return array.reshape(-1, dim)
    return data


class Dat:
    """Data attached to every element of a set: an array of shape ``(set.size, dim)``.

    Parameters
    ----------
    dataset : Set
        The set the data lives on.
    dim : int
        Values per element (``>= 1``).
    data : array_like, optional
        Initial values, shape ``(size, dim)`` (or ``(size,)`` when ``dim == 1``); copied.
        ``None`` gives zeros.
    name : str, optional
    dtype : numpy dtype, keyword-only
        float64 (default), float32, int32 or int64.

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> nodes = mc.Set(3, "nodes")
    >>> x = mc.Dat(nodes, 2, np.arange(6.0).reshape(3, 2), "x")
    >>> x.data[2].tolist()
    [4.0, 5.0]
    """

    is_global = False

    def __init__(self, dataset, dim, data=None, name=None, *, dtype=None):
        self.name = check_name(name, "dat")
        if not isinstance(dataset, Set):
            raise DataShapeError(f"Dat {self.name!r}: dataset must be a meshchain.Set, got {type(dataset).__name__}.")
        self.dataset = dataset
        self.dim = dim if type(dim) is int and dim >= 1 else check_count(dim, f"Dat {self.name!r} dim", minimum=1,
                                                                          error=DataShapeError)
        self.uid = next_uid()
        self._args: dict = {}
        self.dtype = context.current().declare_dat(self, data, dtype)

    def as_rows(self, data):
        """``data`` with a grid's shape (``(nx, ny, dim)``, or ``(nx, ny)`` for dim 1) as rows;
        anything else as given (checked by :meth:`rows`)."""
        if data is not None and isinstance(self.dataset, Grid):
            return _grid_rows(data, self.dataset.shape, self.dim)
        return data

    def rows(self, data, dtype, count: int):
        """``(dtype, array)``: ``data`` checked and copied into ``count`` rows of this dat
        (zeros for ``None``); raises :class:`DataShapeError` naming the dat and the fix."""
        if data is None and dtype is None:  # a temporary: zeros of the default dtype
            return _FLOAT64, np.zeros((count, self.dim))
        what = f"Dat {self.name!r} on {self.dataset.name!r}"
        chosen = resolve_dtype(data, dtype, what)
        if data is None:
            return chosen, np.zeros((count, self.dim), dtype=chosen)
        fix = f"pass one row of {self.dim} values per element of {self.dataset.name!r}."
        if isinstance(self.dataset, Grid):
            data = _grid_rows(data, self.dataset.shape, self.dim)
            fix = (f"pass {self.dataset.shape + (self.dim,)} (or {self.dataset.shape} for dim 1) values, or one row of "
                   f"{self.dim} per point of {self.dataset.name!r} in row-major order.")
        return chosen, as_storage(data, chosen, (count, self.dim), what, fix=fix)

    def __call__(self, access, path=None) -> Arg:
        """Make a loop argument: ``dat(mode)`` (direct), ``dat(mode, map[i])`` or ``dat(mode, map)``."""
        try:
            held = self._args.get(path)  # checked once: the same argument is handed out again while it lives
            held = None if held is None else held.get(access)
        except TypeError:  # not hashable: not a path or mode (_make_arg says so)
            held = None
        arg = None if held is None else held()
        if arg is None:
            arg = self._make_arg(access, path)
            self._args.setdefault(path, {})[access] = weakref.ref(arg)  # weakly: the argument holds this dat
        return arg

    def _make_arg(self, access, path) -> Arg:
        if type(access) is Access and access in DAT_MODES:  # the common arguments: nothing more to check
            if path is None:
                return Arg(self, access)
            if type(path) is MapIndex and path.map.target is self.dataset:
                return Arg(self, access, path.map, path.index)
        owner = f"Dat {self.name!r}"
        access = _check_access(access, owner, DAT_MODES, "dats take READ, WRITE, RW, INC, MIN or MAX.")
        if path is None:
            return Arg(self, access)
        if isinstance(path, Stencil):
            return self._stencil_arg(access, path, owner)
        if isinstance(path, MapIndex):
            map_, index = path.map, path.index
        elif isinstance(path, Map):
            map_, index = path, None
        else:
            raise SetMismatchError(f"{owner}: the path must be a Map, map[i] or a Stencil, got {type(path).__name__}.")
        if map_.target is not self.dataset:
            raise SetMismatchError(
                f"{owner} lives on {self.dataset.name!r} but map {map_.name!r} points to {map_.target.name!r}; "
                f"use a map whose target is {self.dataset.name!r}."
            )
        return Arg(self, access, map_, index)

    def _stencil_arg(self, access, stencil, owner: str) -> Arg:
        if not isinstance(self.dataset, Grid):
            raise SetMismatchError(f"{owner} lives on {self.dataset.name!r}, not on a Grid; stencil "
                                   f"{stencil.name!r} reaches grid points only.")
        if stencil.ndim != len(self.dataset.shape):
            raise SetMismatchError(f"{owner}: stencil {stencil.name!r} has {stencil.ndim}-d offsets but grid "
                                   f"{self.dataset.name!r} is {len(self.dataset.shape)}-d.")
        if access is not Access.READ:
            raise AccessModeError(f"{owner}: stencil arguments are READ only (writes on grids are direct: owner "
                                  f"computes), got {access.value}.")
        return Arg(self, access, stencil=stencil)

    @property
    def data(self) -> np.ndarray:
        """The owned values, shape ``(n_owned, dim)`` in local numbering (all of them on one
        process); forces pending loops. Writable: halo copies are then considered stale.

        On several ranks this is collective — every rank must access ``.data`` of the same dat
        at the same point — because it changes which halos the next loop exchanges. Use
        :attr:`data_ro` to look at the values on some ranks only (e.g. to print on rank 0).
        """
        return context.current().dat_values(self, write=True)

    @property
    def data_ro(self) -> np.ndarray:
        """A read-only view of the owned values; forces pending loops."""
        return context.current().dat_values(self, write=False)

    @property
    def data_with_halos(self) -> np.ndarray:
        """Read-only view of owned and halo values (for debugging; halos may be stale)."""
        return context.current().dat_values(self, write=False, halos=True)

    def gather(self):
        """The global array in the original global numbering on rank 0 (``None`` elsewhere).

        Examples
        --------
        >>> import meshchain as mc
        >>> d = mc.Dat(mc.Set(2, "s"), 1, [3.0, 4.0], "d")
        >>> d.gather().ravel().tolist()
        [3.0, 4.0]
        """
        return context.current().gather(self)

    # --- arithmetic: lazy loops (:mod:`meshchain.engine.arithmetic`) -------------------------------

    def zero(self) -> None:
        """Set every value to 0 (a loop, run when forced)."""
        context.current().arithmetic.zero(self)

    def copy(self, other: "Dat") -> None:
        """Copy this dat's values into ``other`` (PyOP2's direction: ``x.copy(y)`` sets y)."""
        context.current().arithmetic.copy(self, other)

    def axpy(self, a, y: "Dat") -> None:
        """``self <- self + a y`` (``a`` a real number)."""
        context.current().arithmetic.axpy(self, a, y)

    def inner(self, other: "Dat"):
        """The sum of ``self * other`` over every row and component, the same on every rank
        (collective; forces the loops it depends on)."""
        return context.current().arithmetic.inner_product(self, other)

    @property
    def norm(self) -> float:
        """The 2-norm, ``sqrt(self.inner(self))`` (collective)."""
        return context.current().arithmetic.norm(self)

    def __iadd__(self, other):
        context.current().arithmetic.apply("iadd", self, other)
        return self

    def __isub__(self, other):
        context.current().arithmetic.apply("isub", self, other)
        return self

    def __imul__(self, other):
        context.current().arithmetic.apply("imul", self, other)
        return self

    def __itruediv__(self, other):
        context.current().arithmetic.apply("idiv", self, other)
        return self

    def __add__(self, other) -> "Dat":
        return context.current().arithmetic.result(self, "iadd", other)

    def __sub__(self, other) -> "Dat":
        return context.current().arithmetic.result(self, "isub", other)

    def __mul__(self, other) -> "Dat":
        return context.current().arithmetic.result(self, "imul", other)

    def __truediv__(self, other) -> "Dat":
        return context.current().arithmetic.result(self, "idiv", other)

    __radd__ = __add__
    __rmul__ = __mul__

    def __neg__(self) -> "Dat":
        return context.current().arithmetic.result(self, "imul", -1)

    def __repr__(self) -> str:
        return f"Dat({self.dataset.name}, {self.dim}, {self.name!r}, dtype={self.dtype})"


class Global:
    """A small array shared by every element: read by kernels or reduced into.

    Parameters
    ----------
    dim : int
        Number of values (``>= 1``).
    value : scalar or array_like, optional
        Initial value(s), default 0.
    name : str, optional
    dtype : numpy dtype, keyword-only
        float64 (default for float values), float32, int32 or int64.

    Examples
    --------
    >>> import meshchain as mc
    >>> total = mc.Global(1, 0.0, "total")
    >>> total.value.tolist()
    [0.0]
    """

    is_global = True

    def __init__(self, dim, value=0.0, name=None, *, dtype=None):
        array = None
        if type(dim) is int and dim >= 1 and (name is None or (type(name) is str and name)):
            # the common declaration (a new Global per reduction): a valid scalar needs no more checks
            array = scalar_storage(dim, value, dtype)
        if array is not None:
            self.name, self.dim, self.dtype = name or "global", dim, array.dtype
        else:
            self.name = check_name(name, "global")
            self.dim = check_count(dim, f"Global {self.name!r} dim", minimum=1, error=DataShapeError)
            self.dtype = resolve_dtype(value, dtype, f"Global {self.name!r}")
            array = self.coerce(value)
        self.uid = next_uid()
        self._args: dict = {}
        context.current().declare_global(self, array)

    def coerce(self, value) -> np.ndarray:
        """``value`` (a scalar or ``dim`` values) as a fresh array of this global's dtype."""
        quick = scalar_storage(self.dim, value, self.dtype)  # a scalar that needs no more checks
        if quick is not None:
            return quick
        what = f"Global {self.name!r}"
        array = np.asarray(value)
        if array.ndim == 0:
            array = np.full(self.dim, array)
        return as_storage(array, self.dtype, (self.dim,), what, fix=f"pass a scalar or {self.dim} values.")

    def __call__(self, access, path=None) -> Arg:
        """Make a loop argument: ``glob(mc.READ)`` or a reduction ``INC``/``MIN``/``MAX``."""
        if path is None:
            try:
                held = self._args.get(access)  # weakly held: the argument holds this global
            except TypeError:  # not hashable: not a mode (_make_arg says so)
                held = None
            arg = None if held is None else held()
            if arg is not None:
                return arg
        arg = self._make_arg(access, path)
        self._args[access] = weakref.ref(arg)
        return arg

    def _make_arg(self, access, path) -> Arg:
        if path is None and type(access) is Access and access in GLOBAL_MODES:  # nothing more to check
            return Arg(self, access)
        owner = f"Global {self.name!r}"
        if path is not None:
            raise SetMismatchError(f"{owner}: globals are not reached through maps; call {self.name}(mode) without a map.")
        _check_access(
            access, owner, GLOBAL_MODES,
            "a global is shared by all elements, so it can only be read (READ) or reduced into (INC, MIN, MAX); "
            "to change it, set .value between loops.",
        )
        return Arg(self, access)

    @property
    def value(self) -> np.ndarray:
        """The current value, shape ``(dim,)``, the same on every rank; forces pending loops
        and reductions. It is a read-only copy: ``g.value[0] = 10`` raises (it would change
        nothing); set ``g.value = ...`` (all of it) instead.

        >>> import meshchain as mc
        >>> g = mc.Global(2, 1.0, "g")
        >>> try:
        ...     g.value[0] = 10.0
        ... except ValueError as err:
        ...     print(err)
        assignment destination is read-only
        >>> g.value = [10.0, 1.0]; g.value.tolist()
        [10.0, 1.0]
        """
        return context.current().global_value(self)

    @value.setter
    def value(self, new) -> None:
        """Set the value (every rank must set the same value)."""
        context.current().set_global_value(self, new)

    # --- arithmetic on the value (forces what is pending; every rank must do the same) --------------

    def zero(self) -> None:
        self.value = 0

    def copy(self, other: "Global") -> None:
        """Copy this global's value into ``other``."""
        other.value = self.value

    def axpy(self, a, y: "Global") -> None:
        """``self <- self + a y``."""
        self.value = self.value + a * _global_operand(self, y)

    def inner(self, other: "Global"):
        return (self.value * _global_operand(self, other)).sum().item()

    @property
    def norm(self) -> float:
        return float(np.sqrt(self.inner(self)))

    def __iadd__(self, other):
        self.value = self.value + _global_operand(self, other)
        return self

    def __isub__(self, other):
        self.value = self.value - _global_operand(self, other)
        return self

    def __imul__(self, other):
        self.value = self.value * _global_operand(self, other)
        return self

    def __itruediv__(self, other):
        self.value = self.value / _global_operand(self, other)
        return self

    def _combined(self, values, op: str) -> "Global":
        """A new Global holding ``values`` (NumPy's dtype: an integer global divided is a float one)."""
        values = np.asarray(values)
        return Global(self.dim, values, f"{self.name}_{op}", dtype=values.dtype)

    def __add__(self, other) -> "Global":
        """A new Global ``self + other`` (as for dats: ``g + h``, ``g * a``, ``-g``; every rank the same).

        >>> g = Global(2, [1.0, 2.0], "g")
        >>> (g + g).value.tolist(), (2 * g).value.tolist(), (-g).value.tolist(), (g / 2).value.tolist()
        ([2.0, 4.0], [2.0, 4.0], [-1.0, -2.0], [0.5, 1.0])
        """
        return self._combined(self.value + _global_operand(self, other), "add")

    def __sub__(self, other) -> "Global":
        return self._combined(self.value - _global_operand(self, other), "sub")

    def __mul__(self, other) -> "Global":
        return self._combined(self.value * _global_operand(self, other), "mul")

    def __truediv__(self, other) -> "Global":
        return self._combined(self.value / _global_operand(self, other), "div")

    __radd__ = __add__
    __rmul__ = __mul__

    def __neg__(self) -> "Global":
        return self._combined(-self.value, "neg")

    def __repr__(self) -> str:
        return f"Global({self.dim}, {self.name!r}, dtype={self.dtype})"


def _global_operand(g: Global, other):
    """``other`` (a Global of ``g``'s dim, or a real number) as values to combine with ``g``'s."""
    if isinstance(other, Global):
        if other.dim != g.dim:
            raise DataShapeError(f"Global {g.name!r} has dim {g.dim} but {other.name!r} has dim {other.dim}.")
        return other.value
    if isinstance(other, (bool, np.bool_)) or not isinstance(other, (int, float, np.number)):
        raise DataShapeError(f"Global {g.name!r}: the operand must be a Global or a real number, got {other!r}.")
    return other
