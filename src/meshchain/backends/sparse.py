"""Compiled sparse-matrix kernels on compressed sparse rows (CSR) whose rows are split in
two: the entries ``indptr[r]:split[r]`` (columns this rank owns) and ``split[r]:indptr[r+1]``
(halo columns). :func:`csr_owned` runs while the halo values travel, :func:`csr_halo` after.

Examples
--------
>>> import numpy as np
>>> indptr, split = np.array([0, 2, 3]), np.array([1, 3])
>>> indices, values = np.array([0, 2, 1]), np.array([2.0, 1.0, 3.0])
>>> x, y = np.array([1.0, 1.0, 10.0]), np.zeros(2)
>>> csr_owned(indptr, split, indices, values, x, y); y.tolist()
[2.0, 3.0]
>>> csr_halo(indptr, split, indices, values, x, y); y.tolist()
[12.0, 3.0]
"""

from __future__ import annotations

import numba

__all__ = ["csr_owned", "csr_halo", "symmetric_gauss_seidel", "scatter_add"]

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def csr_owned(indptr, split, indices, values, x, y):
    """``y[r] = sum of values[k] * x[indices[k]]`` over the owned-column entries of row ``r``.

    Unsigned ``indices`` are fastest (no negative-index wraparound test per entry)."""
    for r in range(len(split)):
        total = 0.0
        k, end = indptr[r], split[r]
        while k < end:
            total += values[k] * x[indices[k]]
            k += 1
        y[r] = total


@_jit
def csr_halo(indptr, split, indices, values, x, y):
    """``y[r] += sum of values[k] * x[indices[k]]`` over the halo-column entries of row ``r``."""
    for r in range(len(split)):
        total = 0.0
        k, end = split[r], indptr[r + 1]
        while k < end:
            total += values[k] * x[indices[k]]
            k += 1
        y[r] += total


@_jit
def symmetric_gauss_seidel(indptr, split, indices, values, diag, r, z):
    """One symmetric Gauss-Seidel sweep for ``D_L z = r`` on the owned block (halo columns
    ignored): forward ``(D + L) t = r``, then backward ``(D + U) z = D t``. Symmetric
    positive definite when the owned block is."""
    n = len(split)
    for i in range(n):
        s = r[i]
        for k in range(indptr[i], split[i]):
            j = indices[k]
            if j < i:
                s -= values[k] * z[j]
        z[i] = s / diag[i]
    for i in range(n - 1, -1, -1):
        s = 0.0
        for k in range(indptr[i], split[i]):
            j = indices[k]
            if j > i:
                s += values[k] * z[j]
        z[i] -= s / diag[i]


@_jit
def scatter_add(target, positions, source, picks):
    """``target[positions[k]] += source[picks[k]]`` for every ``k``, in order."""
    for k in range(len(positions)):
        target[positions[k]] += source[picks[k]]
