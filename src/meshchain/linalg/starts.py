"""The starts of CG, Chronopoulos/Gear CG, pipelined CG, pipelined CR and Gropp's CG in one
compiled call each, on one process and on several ranks.

Each method's Python start (:mod:`.krylov`) multiplies two or three vectors by the matrix,
each product with a halo exchange on several ranks, and then sums dot products over the ranks.
Driven from Python, every rank waits for the other ranks' Python between those steps. Here the
steps run in one compiled call (MPI called by address, :mod:`meshchain.comm.by_address`), with
the passes, exchanges and sums the Python steps make, in the same order: the same bits. Each
function returns the MPI error code (0 on one process) and leaves its sums over ranks in
``total``; Python then tests the first norm, which sets the solve's target, as before.

Every function takes the matrix (``indptr, split, indices, values, halo``), then
``distributed, functions, handles`` (one process: False and arrays that are not used), the
vectors it multiplies with their halo rows (``x_all`` first: the solution), the owned vectors
it reads or writes (and pipelined CG's and CR's ``out``, their sums on this rank), the
preconditioner's compiled form (:func:`.compiled.precondition`), ``total`` and the halo
exchange's arrays (``exchange``, :meth:`.solve.SolveRun.products_and_sums`). The owned rows of a
vector with its halo rows are its first ``len(r)`` values.

Examples
--------
>>> import numpy as np
>>> from meshchain.linalg.precond import Pointwise
>>> indptr, split = np.array([0, 1, 2], np.uint32), np.array([1, 2], np.uint32)
>>> indices, values = np.array([0, 1], np.uint32), np.array([2.0, 4.0])
>>> x, z, b = np.zeros(2), np.zeros(2), np.array([2.0, 4.0])
>>> r, s, w, total = np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(3)
>>> nothing = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int32),
...            np.zeros(1, np.uint8))
>>> cg1_begin(indptr, split, indices, values, False, False, np.zeros(4, np.int64), np.zeros(3, np.int64), x, z, b, r,
...           s, w, Pointwise(np.array([0.5, 0.25])).compiled, total, nothing)
0
>>> total.tolist()  # (r, z), (z, A z), (z, z) with r = b and z = b / diag(A)
[6.0, 6.0, 2.0]
"""

from __future__ import annotations

import numba
import numpy as np

from .compiled import _product, _started, _summed, _waited, cg1_product_sums, precondition
from .fused import dot, dot_pairs, pipecg_start, residual

__all__ = ["cg_begin", "cg1_begin", "pipecg_begin", "pipecr_begin", "groppcg_begin"]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _residual(indptr, split, indices, values, halo, distributed, functions, handles, x_all, spare, b, r, u, pc,
              exchange):
    """Every start's first steps: ``spare = A x``, ``r = b - spare``, ``u = B r``. The MPI error
    code."""
    error = _product(distributed, functions, handles, indptr, split, indices, values, halo, x_all, spare, exchange)
    residual(b, spare, r)
    precondition(pc, r, u)
    return error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pipelined_products(indptr, split, indices, values, halo, distributed, functions, handles, x_all, u_all, b, r, w,
                        n, pc, exchange):
    """Pipelined CG's and CR's first steps: ``n = A x``, ``r = b - n``, ``u = B r``, ``w = A u``.
    The MPI error code."""
    error = _residual(indptr, split, indices, values, halo, distributed, functions, handles, x_all, n, b, r,
                      u_all[:len(r)], pc, exchange)
    return error or _product(distributed, functions, handles, indptr, split, indices, values, halo, u_all, w, exchange)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg_begin(indptr, split, indices, values, halo, distributed, functions, handles, x_all, b, r, z, p, w, pc, total,
             exchange):
    """:func:`.krylov.cg`'s start: ``w = A x``, ``r = b - w``, ``z = B r``, ``p = z`` and
    ``total = [(r, z), (z, z)]`` summed over ranks."""
    error = _residual(indptr, split, indices, values, halo, distributed, functions, handles, x_all, w, b, r, z, pc,
                      exchange)
    if error:
        return error
    out = np.empty(3)
    dot_pairs(r, z, z, z, z, z, out)
    p[:] = z
    return _summed(distributed, functions, handles, out[:2].copy(), total)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg1_begin(indptr, split, indices, values, halo, distributed, functions, handles, x_all, z_all, b, r, s, w, pc,
              total, exchange):
    """:func:`.krylov.cg1`'s start and its iteration 0's product and sum: ``w = A x``,
    ``r = b - w``, ``z = B r``, ``s = A z`` and ``total = [(r, z), (z, s), (z, z)]`` summed over
    ranks (:func:`.compiled.cg1_product_sums`)."""
    error = _residual(indptr, split, indices, values, halo, distributed, functions, handles, x_all, w, b, r,
                      z_all[:len(r)], pc, exchange)
    if error:
        return error
    return cg1_product_sums(distributed, functions, handles, indptr, split, indices, values, halo, z_all, s, r,
                            np.zeros(3), total, exchange)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pipecg_begin(indptr, split, indices, values, halo, distributed, functions, handles, x_all, u_all, m_all, b, r, w,
                 n, out, pc, total, exchange):
    """:func:`.krylov.pipecg`'s start and the top of its iteration 0: ``n = A x``, ``r = b - n``,
    ``u = B r``, ``w = A u``, ``m = B w`` and ``out`` (:func:`~.fused.pipecg_start`), then
    ``out`` summed over ranks (``MPI_Iallreduce``; with ``(b, b)`` after it where ``total`` has
    room for it: the residual replacement's bounds) while ``n = A m`` is computed."""
    length = len(r)
    x, u, m = x_all[:length], u_all[:length], m_all[:length]
    error = _pipelined_products(indptr, split, indices, values, halo, distributed, functions, handles, x_all, u_all,
                                b, r, w, n, pc, exchange)
    if error:
        return error
    pipecg_start(r, u, w, x, pc[0], m, out)
    mine = np.empty(len(total))
    mine[:len(out)] = out
    if len(total) > len(out):
        mine[len(out)] = dot(b, b)
    return _sum_during_product(indptr, split, indices, values, halo, distributed, functions, handles, mine, total,
                               m_all, n, exchange)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pipecr_begin(indptr, split, indices, values, halo, distributed, functions, handles, x_all, u_all, m_all, b, r, w,
                 n, out, pc, total, exchange):
    """:func:`.krylov.pipecr`'s start and the top of its iteration 0: ``n = A x``, ``r = b - n``,
    ``u = B r``, ``w = A u``, ``m = B w``, ``out = [(w, u), (m, w), (u, u)]``, then ``out``
    summed over ranks (``MPI_Iallreduce``) while ``n = A m`` is computed."""
    u, m = u_all[:len(r)], m_all[:len(r)]
    error = _pipelined_products(indptr, split, indices, values, halo, distributed, functions, handles, x_all, u_all,
                                b, r, w, n, pc, exchange)
    if error:
        return error
    precondition(pc, w, m)
    dot_pairs(w, u, m, w, u, u, out)
    return _sum_during_product(indptr, split, indices, values, halo, distributed, functions, handles, out.copy(),
                               total, m_all, n, exchange)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def groppcg_begin(indptr, split, indices, values, halo, distributed, functions, handles, x_all, p_all, b, r, z, s, q,
                  w, pc, total, exchange):
    """:func:`.krylov.groppcg`'s start: ``w = A x``, ``r = b - w``, ``z = B r``, ``p = z``,
    ``s = A p``, ``total = [(r, z), (z, z), (p, s)]`` summed over ranks, then ``q = B s``."""
    p = p_all[:len(r)]
    error = _residual(indptr, split, indices, values, halo, distributed, functions, handles, x_all, w, b, r, z, pc,
                      exchange)
    if error:
        return error
    p[:] = z
    error = _product(distributed, functions, handles, indptr, split, indices, values, halo, p_all, s, exchange)
    if error:
        return error
    out = np.empty(3)
    dot_pairs(r, z, z, z, p, s, out)
    error = _summed(distributed, functions, handles, out, total)
    precondition(pc, s, q)
    return error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _sum_during_product(indptr, split, indices, values, halo, distributed, functions, handles, mine, total, m_all, n,
                        exchange):
    """``total = mine`` summed over ranks (started, then waited for) while ``n = A m`` is
    computed. The MPI error code (a sum started is always waited for)."""
    request, status = np.zeros(1, np.int32), np.zeros(64, np.uint8)
    error = _started(distributed, functions, handles, mine, total, request)
    if error:
        return error
    product = _product(distributed, functions, handles, indptr, split, indices, values, halo, m_all, n, exchange)
    waited = _waited(distributed, functions, request, status)
    return product or waited
