"""Dat arithmetic as lazy loops: PyOP2's ``x += y``, ``x.axpy(a, y)``, ``x.inner(y)``...

Each operation records one direct ``par_loop`` over the dat's set, with a kernel made
once per operation and dim, so it joins the trace like any loop: it runs when forced,
inside loop chains (communication-avoiding on several ranks) and captured steps. A
scalar operand is a one-value :class:`~meshchain.types.Global` read by the loop, and
:func:`inner` reduces into one and returns its value: the same on every rank (summed over
the owned rows), so it forces what is pending and is collective, like reading any Global.
Those Globals are the session's own: one per purpose and dtype is kept and given the new
value while no pending loop, open chain block or step being captured may use it (then
the loop is the one made last time, with its plan: nothing is found by structure or
rebound); otherwise a new one is made, and kept from then on unless a step is being
captured (the step's replays read the value it was made with).

Operations (``x`` the dat whose method is called; every operand on the same set, of the
same dim; an integer dat takes integer operands only and no division):

=====================  ==============================  =============================
``x.zero()``           x <- 0                          ``dat_zero``
``x.copy(y)``          y <- x (PyOP2's direction)      ``dat_copy``
``x.axpy(a, y)``       x <- x + a y                    ``dat_axpy``
``x += y``, ``-=``,    x <- x op y (a dat or a         ``dat_iadd``, ``dat_isub``,
``*=``, ``/=``         scalar)                         ``dat_imul``, ``dat_idiv``
``x + y``, ...         a new dat                       the same, into the new dat
``x.inner(y)``         sum of x * y over every row     ``dat_inner``
``x.norm``             sqrt(x.inner(x))                ``dat_inner``
=====================  ==============================  =============================

Examples
--------
>>> import numpy as np, meshchain as mc
>>> s = mc.Set(3, "s")
>>> x = mc.Dat(s, 2, np.arange(6.0), "x")
>>> y = mc.Dat(s, 2, np.ones(6), "y")
>>> x += y
>>> x.axpy(2.0, y)
>>> x.data_ro.ravel().tolist(), x.inner(y), round((x * 0.5).norm, 6)
([3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 33.0, 7.053368)
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..core.access import Access
from ..core.errors import DataShapeError, SetMismatchError
from ..ir.kernel import Kernel
from ..types import Dat, Global
from ..types._checks import scalar_storage

__all__ = ["Arithmetic", "BODIES"]

_INT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.float64)

#: Per operation: the kernel's parameters and the statement run for each component ``i``.
BODIES = {
    "zero": (("x",), "x[i] = 0"),
    "copy": (("x", "y"), "y[i] = x[i]"),
    "axpy": (("x", "a", "y"), "x[i] += a[0] * y[i]"),
    "iadd": (("x", "y"), "x[i] += y[i]"),
    "isub": (("x", "y"), "x[i] -= y[i]"),
    "imul": (("x", "y"), "x[i] *= y[i]"),
    "idiv": (("x", "y"), "x[i] /= y[i]"),
    "iadd_scalar": (("x", "a"), "x[i] += a[0]"),
    "isub_scalar": (("x", "a"), "x[i] -= a[0]"),
    "imul_scalar": (("x", "a"), "x[i] *= a[0]"),
    "idiv_scalar": (("x", "a"), "x[i] /= a[0]"),
    "inner": (("x", "y", "s"), "s[0] += x[i] * y[i]"),
}


class Arithmetic:
    """The session's dat arithmetic: ``record(kernel, iterset, args, name)`` records a loop,
    ``value(glob)`` reads a Global (forcing)."""

    def __init__(self, record, value, *, set_value=None, in_use=None):
        self._record, self._value = record, value
        self._set_value, self._in_use = set_value, in_use  # without them every scalar is a new Global
        self._kernels: dict = {}
        self._kept: dict = {}  # (purpose, dtype) -> the one-value Global given the next value of that kind

    def kernel(self, op: str, dim: int) -> Kernel:
        """The kernel of ``op`` for dats of ``dim`` components (made once)."""
        found = self._kernels.get((op, dim))
        if found is None:
            params, statement = _body(op)
            source = f"def dat_{op}({', '.join(params)}):\n    for i in range({dim}):\n        {statement}\n"
            found = self._kernels[(op, dim)] = Kernel.from_source(source, name=f"dat_{op}")
        return found

    def apply(self, op: str, x: Dat, other=None) -> None:
        """``x <- x op other`` (``op``: ``"iadd"``, ``"isub"``, ``"imul"`` or ``"idiv"``), other a
        dat or a scalar."""
        if isinstance(other, Dat):
            _check_alike(x, other, op)
            if op == "idiv":
                _refuse_integer_division(x)
            if other is x:  # x += x: one argument (an object written is passed once)
                self._loop(f"{op}_self", x, x(Access.RW))
            else:
                self._loop(op, x, x(Access.RW), other(Access.READ))
            return
        scalar = self._scalar(x, other, op)
        self._loop(f"{op}_scalar", x, x(Access.RW), scalar(Access.READ))

    def zero(self, x: Dat) -> None:
        self._loop("zero", x, x(Access.WRITE))

    def copy(self, x: Dat, y: Dat) -> None:
        """``y <- x``."""
        _check_alike(x, y, "copy")
        if y is not x:
            self._loop("copy", x, x(Access.READ), y(Access.WRITE))

    def axpy(self, x: Dat, a, y: Dat) -> None:
        """``x <- x + a y``."""
        if not isinstance(y, Dat):
            raise DataShapeError(f"Dat {x.name!r}: axpy(a, y) needs y a Dat, got {type(y).__name__}.")
        _check_alike(x, y, "axpy")
        scalar = self._scalar(x, a, "axpy")
        if y is x:
            self._loop("axpy_self", x, x(Access.RW), scalar(Access.READ))
        else:
            self._loop("axpy", x, x(Access.RW), scalar(Access.READ), y(Access.READ))

    def inner_product(self, x: Dat, y: Dat):
        """``sum(x * y)`` over every owned row and component (collective on several ranks)."""
        if not isinstance(y, Dat):
            raise DataShapeError(f"Dat {x.name!r}: inner(y) needs y a Dat, got {type(y).__name__}.")
        _check_alike(x, y, "inner")
        kind = x.dtype if x.dtype == y.dtype else np.result_type(x.dtype, y.dtype)
        total = self.one_value("inner", 0, _INT64) if kind.kind in "iu" else self.one_value("inner", 0.0, _FLOAT64)
        self._loop("inner", x, x(Access.READ), y(Access.READ), total(Access.INC))
        value = self._value(total)[0]
        return int(value) if total.dtype.kind in "iu" else float(value)

    def norm(self, x: Dat) -> float:
        """``sqrt(inner(x, x))``; an integer dat's squares are summed as float64, as NumPy's
        ``linalg.norm`` does (an int64 sum of squares wraps: 4e9 squared, and ``math.sqrt`` then
        raised ValueError)."""
        if x.dtype.kind in "iu":
            as_float = Dat(x.dataset, x.dim, None, f"{x.name}_float", dtype=np.float64)
            self._loop("copy", x, x(Access.READ), as_float(Access.WRITE))
            x = as_float
        return math.sqrt(self.inner_product(x, x))

    def result(self, x: Dat, op: str, other) -> Dat:
        """A new dat ``x op other`` (``op`` as in :meth:`apply`)."""
        dtype = x.dtype
        if isinstance(other, Dat):
            dtype = np.result_type(x.dtype, other.dtype)
        elif isinstance(other, numbers.Real) and not isinstance(other, numbers.Integral) and dtype.kind in "iu":
            dtype = np.dtype(np.float64)  # an integer dat times 0.5 is a float dat, as in NumPy
        if op == "idiv" and dtype.kind in "iu":
            dtype = np.dtype(np.float64)
        if not isinstance(other, Dat) and dtype == x.dtype:
            _checked_scalar(x, other, op)  # refused naming x, not the result dat
        out = Dat(x.dataset, x.dim, None, f"{x.name}_{op[1:]}", dtype=dtype)
        self._loop("copy", x, x(Access.READ), out(Access.WRITE))
        self.apply(op, out, other)
        return out

    def one_value(self, purpose: str, value, dtype: np.dtype) -> Global:
        """A one-value Global of ``dtype`` holding ``value``: the one kept for ``purpose`` when
        nothing pending may use it and ``value`` needs no checks beyond the quick ones, else a
        new one (see the module docstring)."""
        key = (purpose, dtype)
        kept = self._kept.get(key)
        if kept is not None and not self._in_use(kept) and scalar_storage(1, value, dtype) is not None:
            self._set_value(kept, value)
            return kept
        made = Global(1, value, purpose, dtype=dtype)
        if self._in_use is not None and not self._in_use(made):  # not one a step being captured makes: its
            self._kept[key] = made  # replays read the value it was made with
        return made

    def _scalar(self, x: Dat, value, op: str) -> Global:
        """``value`` as a one-value Global of ``x``'s dtype (refused where it would truncate: a
        float into an integer dat unless whole)."""
        _checked_scalar(x, value, op)
        return self.one_value("scalar", value, x.dtype)

    def _loop(self, op: str, x: Dat, *args) -> None:
        self._record(self.kernel(op, x.dim), x.dataset, args, f"dat_{op}")


def _body(op: str) -> tuple:
    """``(params, statement)`` of ``op``; ``<op>_self``: the same with ``y`` the dat ``x`` itself."""
    if op.endswith("_self"):
        params, statement = BODIES[op[: -len("_self")]]
        return tuple(p for p in params if p != "y"), statement.replace("y[", "x[")
    return BODIES[op]


def _check_alike(x: Dat, y, op: str) -> None:
    if not isinstance(y, Dat):
        raise DataShapeError(f"Dat {x.name!r}: {op} needs a Dat operand, got {type(y).__name__}.")
    if y.dataset is not x.dataset:
        raise SetMismatchError(f"Dat {x.name!r} lives on {x.dataset.name!r} but {y.name!r} on {y.dataset.name!r}; "
                               f"{op} takes dats of one set.")
    if y.dim != x.dim:
        raise DataShapeError(f"Dat {x.name!r} has dim {x.dim} but {y.name!r} has dim {y.dim}; {op} takes dats of "
                             f"one dim.")
    if x.dtype.kind in "iu" and y.dtype.kind == "f" and op not in ("inner", "copy"):
        raise DataShapeError(f"Dat {x.name!r} holds {x.dtype}: {op} with {y.name!r} ({y.dtype}) would truncate; "
                             f"use a float dat.")
    if op == "copy" and y.dtype.kind in "iu" and x.dtype.kind == "f":
        raise DataShapeError(f"Dat {y.name!r} holds {y.dtype}: copying {x.name!r} ({x.dtype}) into it would "
                             f"truncate; use a float dat.")


def _refuse_integer_division(x: Dat) -> None:
    if x.dtype.kind in "iu":
        raise DataShapeError(f"Dat {x.name!r} holds {x.dtype}: dividing it in place would truncate; divide a float "
                             f"dat (x / y makes one).")


def _checked_scalar(x: Dat, value, op: str) -> None:
    """Refuse ``value`` as a scalar operand of ``op`` on ``x`` unless it is a real number (and
    ``x`` a float dat for a division)."""
    kind = type(value)
    if kind is not float and kind is not int and (isinstance(value, (bool, np.bool_))
                                                  or not isinstance(value, (numbers.Real, np.number))):
        raise DataShapeError(f"Dat {x.name!r}: {op} takes a Dat or a real number, got {value!r}.")
    if op in ("idiv", "idiv_scalar"):
        _refuse_integer_division(x)
    if x.dtype.kind in "iu":
        bounds = np.iinfo(x.dtype)
        if not bounds.min <= value <= bounds.max:  # (not the internal Global's "values do not fit")
            spelled = {"imul": "x * a (or -x)", "iadd": "x + a", "isub": "x - a", "axpy": "x.axpy(a, y)"}.get(op, op)
            raise DataShapeError(f"Dat {x.name!r} holds {x.dtype}, which cannot hold a = {value!r} in {spelled}; "
                                 f"use a dat of a signed or a float dtype.")
