"""C types of the CUDA translator: scalars, and views (pointers with a shape).

Scalars are spelled as their C names. Arithmetic follows Numba's rules for the
kernels' subset: integers are ``long long`` (int64) unless they come from int32
data, floats are ``double`` unless both sides are ``float`` (float32), and mixing
an integer with a float32 gives a double (as NumPy does). Unsigned data (uint32,
uint64) is read as such; arithmetic on it gives ``long long`` (as Numba types it:
the same bits, modulo 2^64), while ``min``/``max`` and comparisons follow NumPy's
promotion (:func:`promote`: of a uint64 and a signed integer, a double).

Examples
--------
>>> from meshchain.backends.cuda.types import join, c_type
>>> join("long long", "float"), join("float", "float"), c_type("<i4")
('double', 'float', 'int')
"""

from __future__ import annotations

from ...core.errors import CompilationError

from dataclasses import dataclass

import numpy as np

__all__ = ["View", "c_type", "join", "promote", "is_int", "is_unsigned", "is_float", "BOOL", "INT", "DOUBLE",
           "UINT32", "UINT64", "literal"]

BOOL, INT32, INT, FLOAT, DOUBLE = "bool", "int", "long long", "float", "double"
UINT32, UINT64 = "unsigned int", "unsigned long long"
_C_TYPES = {"f8": DOUBLE, "f4": FLOAT, "i4": INT32, "i8": INT, "u4": UINT32, "u8": UINT64}


@dataclass(frozen=True)
class View:
    """An array seen through a pointer: a kernel argument, a row of one, or a local array.

    ``shape`` is row-major; ``const`` marks a READ argument (writing to it is an error).
    """

    ctype: str
    shape: tuple
    const: bool = False

    @property
    def size(self) -> int:
        size = 1
        for n in self.shape:
            size *= n
        return size

    def pointer(self) -> str:
        return f"{'const ' if self.const else ''}{self.ctype}*"


def c_type(dtype) -> str:
    """The C scalar type holding values of the NumPy ``dtype`` (float64, float32, int32, int64,
    uint32, uint64)."""
    key = np.dtype(dtype).str[1:]
    if key not in _C_TYPES:
        raise CompilationError(f"dtype {np.dtype(dtype)} has no CUDA type in meshchain: the GPU backends take "
                               f"float64, float32, int32, int64, uint32 and uint64 data")
    return _C_TYPES[key]


def is_int(t) -> bool:
    return t in (BOOL, INT32, INT, UINT32, UINT64)


def is_unsigned(t) -> bool:
    return t in (UINT32, UINT64)


def is_float(t) -> bool:
    return t in (FLOAT, DOUBLE)


def join(a, b):
    """The type of a binary arithmetic result (or of a variable assigned both); None is unknown."""
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, View) or isinstance(b, View):
        raise CompilationError("arrays do not combine with arithmetic")
    if is_unsigned(a) or is_unsigned(b):
        return INT if is_int(a) and is_int(b) else DOUBLE  # Numba's arithmetic on unsigned values: int64
    if a == b:
        return INT if a == BOOL else a
    if is_int(a) and is_int(b):
        return INT32 if {a, b} <= {BOOL, INT32} else INT
    return DOUBLE  # float64 with anything, float32 with an integer (as in NumPy)


def promote(a, b):
    """The type ``min``/``max`` and comparisons work in: :func:`join`, except that unsigned
    values keep their type among themselves and meet signed ones as NumPy has them meet (a
    uint32 and a signed integer: ``long long``; a uint64 and a signed integer: ``double``).

    >>> promote(UINT64, UINT64), promote(UINT32, INT), promote(UINT64, INT), promote(UINT32, UINT64)
    ('unsigned long long', 'long long', 'double', 'unsigned long long')
    """
    if not (is_unsigned(a) or is_unsigned(b)) or a is None or b is None:
        return join(a, b)
    if a == b:
        return a
    mine, other = (a, b) if is_unsigned(a) else (b, a)
    if not is_int(other):
        return DOUBLE
    if other == BOOL:
        return mine
    if is_unsigned(other):
        return UINT64
    return DOUBLE if mine == UINT64 else INT


def literal(value, ctype: str) -> str:
    """A C literal of ``value`` for a constant of type ``ctype``."""
    if ctype == BOOL:
        return "true" if value else "false"
    if is_int(ctype):
        suffix = {INT: "LL", UINT32: "U", UINT64: "ULL"}.get(ctype, "")
        return f"{int(value)}{suffix}"
    number = float(value)
    if number != number:
        return "mc_nan()"
    if number in (float("inf"), float("-inf")):
        return "mc_inf()" if number > 0 else "(-mc_inf())"
    text = repr(number)
    if "e" not in text and "." not in text:
        text += ".0"
    return text + ("f" if ctype == FLOAT else "")


def scalar_type(value) -> str:
    """The C type of a Python/NumPy number."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, np.generic):
        return c_type(value.dtype) if value.dtype.kind in "if" else INT
    return INT if isinstance(value, int) else DOUBLE
