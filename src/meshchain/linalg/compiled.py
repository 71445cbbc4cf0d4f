"""Krylov iterations inside one compiled call: CG on one process, an assembled matrix and a
pointwise preconditioner.

On one process nothing between two iterations needs Python: no halo exchange, no
reduction over ranks. :func:`cg_iterations` runs the iterations of :func:`.krylov.cg` in
compiled code, calling the very passes the Python loop calls (:mod:`.fused` and the CSR
product of :mod:`meshchain.backends.sparse`) in the same order, so its iterates, residual
norms and stopping iteration are the same bits. It stops at the first iteration whose
outcome Python decides (a norm test that is met or fails, a non-positive curvature) or
after ``len(history)`` iterations, and says which; :func:`.krylov.cg` turns that into the
same reason the Python loop gives. A solve with a ``monitor`` (a Python callback per
iteration), on several ranks or with a matrix-free operator or a non-pointwise
preconditioner runs the Python loop.

Examples
--------
>>> import numpy as np
>>> indptr, split = np.array([0, 1, 2], np.uint32), np.array([1, 2], np.uint32)
>>> indices, values = np.array([0, 1], np.uint32), np.array([2.0, 4.0])
>>> x, r, z, p, w = np.zeros(2), np.array([2.0, 4.0]), np.array([1.0, 1.0]), np.array([1.0, 1.0]), np.zeros(2)
>>> dinv, history = np.array([0.5, 0.25]), np.zeros(8)
>>> cg_iterations(indptr, split, indices, values, False, x, r, z, p, w, dinv, 6.0, 0.0, 0, 100, history)
(1, 1, 0.0, 2)
>>> x.tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..backends.sparse import csr_halo, csr_owned
from .fused import aypx, cg_update, dot

__all__ = ["cg_iterations", "GOING", "NORM", "CURVATURE", "BREAKDOWN"]

GOING, NORM, CURVATURE, BREAKDOWN = 0, 1, 2, 3
"""Why :func:`cg_iterations` returned: its history is full (iterate on), the norm test
decided, ``(p, A p)`` is not a positive finite number, ``(r, B r)`` is not."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg_iterations(indptr, split, indices, values, halo, x, r, z, p, w, dinv, rz, target, i, maxiter, history):
    """Iterations ``i + 1, ...`` of preconditioned CG from ``rz = (r, z)`` and ``p``:
    ``(iteration, why, value, reductions)``, the norms tested written to ``history`` (one per
    iteration). ``why`` is one of :data:`GOING` (``value``: ``(r, z)`` to go on from),
    :data:`NORM` (``value``: the norm, which met the target, is not finite or reached
    ``maxiter``), :data:`CURVATURE` (``value``: ``(p, A p)``) or :data:`BREAKDOWN` (``value``:
    ``(r, B r)``). ``halo``: whether the matrix has halo columns."""
    out = np.zeros(3)
    reductions = 0
    for k in range(len(history)):
        csr_owned(indptr, split, indices, values, p, w)
        if halo:
            csr_halo(indptr, split, indices, values, p, w)
        pw = dot(p, w)
        reductions += 1
        if not (math.isfinite(pw) and pw > 0.0):
            return i, CURVATURE, pw, reductions
        cg_update(rz / pw, p, w, x, r, dinv, z, out)
        reductions += 1
        rz_new, zz = out[0], out[1]
        i += 1
        norm = math.sqrt(max(zz, 0.0))
        history[k] = norm
        if not math.isfinite(norm) or norm <= target or i >= maxiter:
            return i, NORM, norm, reductions
        if not (math.isfinite(rz_new) and rz_new > 0.0):
            return i, BREAKDOWN, rz_new, reductions
        aypx(rz_new / rz, z, p)
        rz = rz_new
    return i, GOING, rz, reductions
