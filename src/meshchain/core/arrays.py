"""Integer array helpers that the set-up paths call many times on large arrays.

:func:`unique_integers` gives ``np.unique``'s result for integer arrays. NumPy 2.4's
``np.unique`` of an integer array without counts goes through a hash table and was slower
than sorting here: 27-35 ms for 200 000 values among 36 000 (sorting 11.8 ms, marking them
in an array as long as their span 1.7 ms; AMD EPYC), 620 ms for a million among 200 000.
Building the halo layers of a mesh calls it hundreds of times on such arrays.
"""

from __future__ import annotations

import numpy as np

from .errors import InternalError

__all__ = ["unique_integers"]

SPAN_PER_VALUE = 4
"""Values whose span is at most this many times their number (plus :data:`SMALL_SPAN`) are
marked in a boolean array over the span; others are sorted."""

SMALL_SPAN = 1 << 16


def unique_integers(values, *, return_inverse: bool = False):
    """The sorted distinct values of the integer array ``values`` (flattened), as
    ``np.unique(values)`` gives them (the same dtype); with ``return_inverse``, also the
    position of each value among them (``np.unique(values.ravel(), return_inverse=True)``).

    Examples
    --------
    >>> unique_integers(np.array([5, -2, 5, 9, -2]))
    array([-2,  5,  9])
    >>> unique_integers(np.array([[3, 1], [1, 3]], dtype=np.int32), return_inverse=True)
    (array([1, 3], dtype=int32), array([1, 0, 0, 1]))
    """
    flat = np.asarray(values).ravel()
    if flat.dtype.kind not in "iu":
        raise InternalError(f"unique_integers: an integer array, got dtype {flat.dtype}")
    if flat.size == 0:
        empty = flat[:0].copy()
        return (empty, np.zeros(0, dtype=np.intp)) if return_inverse else empty
    low = flat.min()
    span = int(flat.max()) - int(low) + 1
    if span <= SPAN_PER_VALUE * flat.size + SMALL_SPAN:
        wide = np.uint64 if flat.dtype.kind == "u" else np.int64  # (no wrap-around in a narrow dtype)
        offsets = (flat.astype(wide, copy=False) - wide(low)).astype(np.intp, copy=False)
        seen = np.zeros(span, dtype=bool)
        seen[offsets] = True
        found = np.flatnonzero(seen)
        distinct = (found.astype(wide) + wide(low)).astype(flat.dtype, copy=False)
        if not return_inverse:
            return distinct
        place = np.empty(span, dtype=np.intp)
        place[found] = np.arange(len(found), dtype=np.intp)
        return distinct, place[offsets]
    if not return_inverse:
        ordered = np.sort(flat)
        return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]
    order = np.argsort(flat, kind="stable")
    ordered = flat[order]
    starts = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    inverse = np.empty(flat.size, dtype=np.intp)
    inverse[order] = np.cumsum(starts) - 1
    return ordered[starts], inverse
