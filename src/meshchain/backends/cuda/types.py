"""C types of the CUDA translator: scalars, and views (pointers with a shape).

Scalars are spelled as their C names. Arithmetic follows Numba's rules for the
kernels' subset: integers are ``long long`` (int64) unless they come from int32
data, floats are ``double`` unless both sides are ``float`` (float32), and mixing
an integer with a float32 gives a double (as NumPy does).

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

__all__ = ["View", "c_type", "join", "is_int", "is_float", "BOOL", "INT", "DOUBLE", "literal"]

BOOL, INT32, INT, FLOAT, DOUBLE = "bool", "int", "long long", "float", "double"
_C_TYPES = {"f8": DOUBLE, "f4": FLOAT, "i4": INT32, "i8": INT}
_RANK = {BOOL: 0, INT32: 1, INT: 2, FLOAT: 3, DOUBLE: 4}


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
    """The C scalar type holding values of the NumPy ``dtype`` (float64, float32, int32, int64)."""
    key = np.dtype(dtype).str[1:]
    if key not in _C_TYPES:
        raise CompilationError(f"dtype {np.dtype(dtype)} has no CUDA type in meshchain: the GPU backends take "
                               f"float64, float32, int32 and int64 data (unsigned dats run on the numba and "
                               f"reference backends)")
    return _C_TYPES[key]


def is_int(t) -> bool:
    return t in (BOOL, INT32, INT)


def is_float(t) -> bool:
    return t in (FLOAT, DOUBLE)


def join(a, b):
    """The type of a binary arithmetic result (or of a variable assigned both); None is unknown."""
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, View) or isinstance(b, View):
        raise CompilationError("arrays do not combine with arithmetic")
    if a == b:
        return INT if a == BOOL else a
    if is_int(a) and is_int(b):
        return INT32 if {a, b} <= {BOOL, INT32} else INT
    return DOUBLE  # float64 with anything, float32 with an integer (as in NumPy)


def literal(value, ctype: str) -> str:
    """A C literal of ``value`` for a constant of type ``ctype``."""
    if ctype == BOOL:
        return "true" if value else "false"
    if is_int(ctype):
        return f"{int(value)}LL" if ctype == INT else str(int(value))
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
