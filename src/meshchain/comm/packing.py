"""Compiled packing of halo rows: every row of every dat for every neighbour in one call.

A halo exchange copies rows of several dats into one message buffer per direction. The
dats are viewed as 2-D arrays of 32-bit words (every supported dtype is 4 or 8 bytes, so
a row is a whole number of words); a *row table* lists, for each row to copy, the dat
(an index into the tuple of views), the row, and the word offset in the buffer.
:func:`pack` and :func:`unpack` walk that table once, in compiled code: one call per
exchange and direction, whatever the number of dats, layers and neighbours.

Reverse exchanges (halo contributions sent back to their owners) combine the received
values into the owned rows in the dat's own dtype: :func:`combine` (through :data:`COMBINE`,
one call per op) walks a row table like :func:`unpack` but reads each value's words
into a small scratch array whose view in the dat's dtype gives the value (so a value may
sit at any word offset of the buffer) and combines it with the row's current value, in
table order. The views of one call must share one dtype (one call per dtype in an
exchange); ``"replace"`` needs no arithmetic and is :func:`unpack` itself.

Examples
--------
>>> import numpy as np
>>> from meshchain.comm.packing import pack, unpack, row_table, word_view
>>> a = np.arange(6.0).reshape(3, 2)                  # 2 float64 per row: 4 words
>>> b = np.arange(3, dtype=np.int32).reshape(3, 1)    # 1 word per row
>>> views = (word_view(a), word_view(b))
>>> table, words = row_table([(0, np.array([2, 0])), (1, np.array([1]))], [4, 1])
>>> buffer = np.zeros(words, dtype=np.uint32)
>>> pack(buffer, views, table)
>>> buffer[:8].view(np.float64).tolist(), int(buffer[8])
([4.0, 5.0, 0.0, 1.0], 1)
>>> unpack(buffer, views, np.array([[0, 1, 0]]))      # row 2's values into row 1 of a
>>> a[1].tolist()
[4.0, 5.0]

Combining adds (or takes the minimum, the maximum of) the received values, in the dat's dtype:

>>> typed = (typed_view(a),)
>>> words, values = scratch(a.dtype)
>>> COMBINE["sum"](buffer, typed, np.array([[0, 0, 0]]), words, values)   # row 2's values into row 0
>>> a[0].tolist()
[4.0, 6.0]
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..core.errors import ConfigurationError

__all__ = ["pack", "unpack", "row_table", "word_view", "WORD", "OPS", "check_op", "typed_view", "scratch",
           "combine", "COMBINE"]

WORD = np.dtype(np.uint32)

OPS = ("sum", "min", "max", "replace")
"""How a reverse exchange combines halo contributions into the owned rows."""


def word_view(array: np.ndarray) -> np.ndarray:
    """``array`` (C-contiguous, rows first) as a 2-D array of 32-bit words, one row per row."""
    rows, items = array.shape[0], int(np.prod(array.shape[1:], dtype=np.int64))
    width = array.dtype.itemsize * items // WORD.itemsize
    return array.reshape(rows, items).view(WORD).reshape(rows, width)


def row_table(pieces, widths) -> tuple[np.ndarray, int]:
    """The row table of ``pieces`` laid out one after another.

    ``pieces`` is a sequence of ``(view, rows)``: an index into the tuple of views and the
    rows to copy, in buffer order; ``widths[view]`` is that view's words per row. Returns
    ``(table, words)``: the table (int64, one ``(view, row, offset)`` per row) and the
    buffer length in words.
    """
    parts, offset = [], 0
    for view, rows in pieces:
        rows = np.asarray(rows, dtype=np.int64)
        part = np.empty((rows.size, 3), dtype=np.int64)
        part[:, 0], part[:, 1] = view, rows
        part[:, 2] = offset + widths[view] * np.arange(rows.size, dtype=np.int64)
        parts.append(part)
        offset += widths[view] * rows.size
    table = np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)
    return np.ascontiguousarray(table), offset


@njit(cache=True, nogil=True)
def pack(buffer, views, table):  # pragma: no cover - compiled
    """Copy the rows listed in ``table`` from ``views`` into ``buffer``."""
    for k in range(table.shape[0]):
        view = views[table[k, 0]]
        row, offset = table[k, 1], table[k, 2]
        for w in range(view.shape[1]):
            buffer[offset + w] = view[row, w]


@njit(cache=True, nogil=True)
def unpack(buffer, views, table):  # pragma: no cover - compiled
    """Copy ``buffer`` back into the rows listed in ``table``."""
    for k in range(table.shape[0]):
        view = views[table[k, 0]]
        row, offset = table[k, 1], table[k, 2]
        for w in range(view.shape[1]):
            view[row, w] = buffer[offset + w]


def check_op(op, dtypes=()) -> str:
    """``op`` if it is one of :data:`OPS` and applies to every dtype in ``dtypes``; else
    :class:`~meshchain.core.errors.ConfigurationError` naming the problem and the choices.

    ``"sum"`` needs numbers of 4 or 8 bytes (integers, floats, complex64); ``"min"`` and
    ``"max"`` integers or floats; ``"replace"`` copies the words and takes anything.

    >>> check_op("max", [np.dtype(np.float32)])
    'max'
    >>> check_op("mean")
    Traceback (most recent call last):
    ...
    meshchain.core.errors.ConfigurationError: unknown reduction 'mean' for a reverse halo exchange: choose one of 'sum', 'min', 'max', 'replace'
    """
    if not isinstance(op, str) or op not in OPS:
        raise ConfigurationError(f"unknown reduction {op!r} for a reverse halo exchange: choose one of "
                                 + ", ".join(repr(o) for o in OPS))
    if op == "replace":
        return op
    kinds = "iuf" if op in ("min", "max") else "iufc"
    for dtype in dtypes:
        dtype = np.dtype(dtype)
        if dtype.kind not in kinds or dtype.itemsize not in (4, 8):
            raise ConfigurationError(f"a reverse halo exchange cannot {op} values of dtype {dtype}: {op!r} needs "
                                     f"{'integers or floats' if op != 'sum' else 'numbers'} of 4 or 8 bytes "
                                     f"('replace' takes any dtype)")
    return op


def typed_view(array: np.ndarray) -> np.ndarray:
    """``array`` (C-contiguous, rows first) as a 2-D array in its own dtype, one row per row."""
    rows, items = array.shape[0], int(np.prod(array.shape[1:], dtype=np.int64))
    return array.reshape(rows, items)


def scratch(dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(words, values)``: the words of one value of ``dtype`` (4 or 8 bytes) and their view
    as that value, for the combining functions."""
    dtype = np.dtype(dtype)
    words = np.zeros(dtype.itemsize // WORD.itemsize, dtype=WORD)
    return words, words.view(dtype)


@njit(cache=True, nogil=True)
def combine(buffer, views, table, words, values, op):  # pragma: no cover - compiled
    """Combine the values in ``buffer`` into the rows listed in ``table`` (in the views'
    dtype): ``op`` 0 adds, 1 keeps the smaller, 2 the larger."""
    step = words.shape[0]
    for k in range(table.shape[0]):
        view = views[table[k, 0]]
        row, offset = table[k, 1], table[k, 2]
        for j in range(view.shape[1]):
            for w in range(step):
                words[w] = buffer[offset + j * step + w]
            value = values[0]
            if op == 0:
                view[row, j] = view[row, j] + value
            elif op == 1:
                if value < view[row, j]:
                    view[row, j] = value
            elif value > view[row, j]:
                view[row, j] = value


def _combining(code: int):
    def call(buffer, views, table, words, values):
        combine(buffer, views, table, words, values, code)

    return call


COMBINE = {name: _combining(code) for code, name in enumerate(("sum", "min", "max"))}
"""The combining call of each op but ``"replace"`` (which is :func:`unpack`)."""
"""The combining function of each arithmetic op (``"replace"`` is :func:`unpack`)."""
