"""The block distribution: rank ``r`` holds rows ``offsets[r]:offsets[r + 1]`` of a global array.

Declarations on several ranks are kept in this distribution until the mesh is
partitioned (and the partitioners work on it): it needs no communication to say who
holds a row.
"""

from __future__ import annotations

import operator

import numpy as np

from ..core.errors import DeclarationError

__all__ = ["block_offsets", "block_owner"]


def block_offsets(n: int, nparts: int) -> np.ndarray:
    """Offsets of the block distribution of ``n`` elements over ``nparts`` parts.

    Part ``p`` holds ``[offsets[p], offsets[p + 1])``; the first ``n % nparts``
    parts get one element more than the others.

    Parameters
    ----------
    n : int
        Number of elements, ``>= 0``.
    nparts : int
        Number of parts, ``>= 1``.

    Returns
    -------
    numpy.ndarray
        int64 array of length ``nparts + 1``, starting at 0 and ending at ``n``.

    Raises
    ------
    DeclarationError
        If ``n`` is negative or ``nparts`` is not positive (or either is not an
        integer).

    Examples
    --------
    >>> block_offsets(10, 3)
    array([ 0,  4,  7, 10])
    >>> block_offsets(2, 4)
    array([0, 1, 2, 2, 2])
    """
    n = as_integer(n, "block_offsets: n")
    nparts = as_integer(nparts, "block_offsets: nparts")
    if n < 0:
        raise DeclarationError(f"block_offsets: n={n} is negative; pass the number of elements (>= 0).")
    if nparts < 1:
        raise DeclarationError(f"block_offsets: nparts={nparts} must be at least 1; pass a positive part count.")
    base, extra = divmod(n, nparts)
    sizes = np.full(nparts, base, dtype=np.int64)
    sizes[:extra] += 1
    offsets = np.zeros(nparts + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def block_owner(offsets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rank holding each global id in a block distribution with ``offsets``.

    >>> block_owner(block_offsets(10, 3), np.array([0, 4, 9])).tolist()
    [0, 1, 2]
    """
    return (np.searchsorted(offsets, ids, side="right") - 1).astype(np.int64)


def as_integer(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise DeclarationError(f"{what} must be an integer, got the boolean {value!r}; pass an int.")
    try:
        return operator.index(value)
    except TypeError:
        raise DeclarationError(f"{what} must be an integer, got {type(value).__name__} {value!r}; pass an int.") from None
