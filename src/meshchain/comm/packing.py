"""Compiled packing of halo rows: every row of every dat for every neighbour in one call.

A halo exchange copies rows of several dats into one message buffer per direction. The
dats are viewed as 2-D arrays of 32-bit words (every supported dtype is 4 or 8 bytes, so
a row is a whole number of words); a *row table* lists, for each row to copy, the dat
(an index into the tuple of views), the row, and the word offset in the buffer.
:func:`pack` and :func:`unpack` walk that table once, in compiled code: one call per
exchange and direction, whatever the number of dats, layers and neighbours.

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
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["pack", "unpack", "row_table", "word_view", "WORD"]

WORD = np.dtype(np.uint32)


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
