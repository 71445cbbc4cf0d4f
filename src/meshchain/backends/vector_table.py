"""A list of float64 vectors passed to compiled code as one int64 array of their addresses.

A tuple of arrays is a different Numba type for every length: GMRES's basis of ``restart + 1``
vectors would compile its cycle again for every restart length (about a minute at
``restart=200``). :func:`vector_table` takes the addresses of the vectors instead, and compiled
code reads vector ``k`` with :func:`vector_at` (a view, no copy), so one compiled function
serves every length. The caller keeps the vectors alive while compiled code uses the table.

Examples
--------
>>> import numba
>>> import numpy as np
>>> vectors = [np.arange(3.0), np.ones(3)]
>>> @numba.njit
... def total(table, length):
...     return sum([vector_at(table, k, length).sum() for k in range(len(table))])
>>> total(vector_table(vectors, 3), 3)
6.0
>>> vector_table([np.arange(3)], 3)
Traceback (most recent call last):
...
meshchain.core.errors.InternalError: vector_table: vector 0 is int64 of shape (3,), not float64 C-contiguous with at least 3 entries
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

from ..core.errors import InternalError

__all__ = ["vector_table", "vector_at"]


def vector_table(vectors, length: int) -> np.ndarray:
    """The addresses of ``vectors`` (each float64, C-contiguous, at least ``length`` entries)
    as an int64 array for :func:`vector_at`."""
    for k, vector in enumerate(vectors):
        if vector.dtype != np.float64 or not vector.flags.c_contiguous or vector.size < length:
            raise InternalError(f"vector_table: vector {k} is {vector.dtype} of shape {vector.shape}, not float64 "
                                f"C-contiguous with at least {length} entries")
    return np.array([vector.ctypes.data for vector in vectors], np.int64)


@intrinsic
def _float64_pointer(typingctx, address):
    """``(double *) address``."""
    pointer = types.CPointer(types.float64)

    def codegen(context, builder, signature, args):
        integer = context.cast(builder, args[0], signature.args[0], types.intp)
        return builder.inttoptr(integer, context.get_value_type(pointer))

    return pointer(address), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def vector_at(table, k, length):
    """Vector ``k`` of :func:`vector_table`'s ``table``: its first ``length`` entries, a view."""
    return numba.carray(_float64_pointer(table[k]), length)
