"""Krylov iterations inside one compiled call: CG, Chronopoulos/Gear CG, BiCGStab, pipelined
BiCGStab and GMRES cycles with an assembled matrix and a pointwise preconditioner (the
nonsymmetric methods also with ILU(0), ``"bjacobi-ilu"``: :func:`precondition`).

Nothing between two CG iterations needs Python. :func:`cg_iterations` (one process) and
:func:`cg_iterations_on_ranks` (several: the halo exchange of ``p`` and the two sums over
ranks called from compiled code by address, :mod:`meshchain.comm.by_address`) run the iterations of
:func:`.krylov.cg`; :func:`cg1_iterations` and :func:`cg1_iterations_on_ranks` those of
:func:`.krylov.cg1` (one sum per iteration), calling the very passes the Python loop calls (:mod:`.fused` and the
CSR product of :mod:`meshchain.backends.sparse`) and the same MPI operations in the same
order, so its iterates, residual norms and stopping iteration are the same bits. (The dot
products that follow the product, CG's ``(p, A p)`` and Chronopoulos/Gear's three sums, are
made in the product's own pass over the rows, :func:`~meshchain.backends.sparse.csr_product_dot`
and :func:`~meshchain.backends.sparse.csr_product_dots`: each sum still runs over the rows in
order, so its bits are those of the separate pass, and its adds no longer wait on one another
in a pass of their own: 6.9 → 6.0-6.4 µs a CG iteration on 729 unknowns);
:func:`bicgstab_iterations`, :func:`pipebicgstab_iterations` and :func:`gmres_cycle` those of
:func:`.nonsymmetric.bicgstab`, :func:`.nonsymmetric.pipebicgstab` and one restart cycle of
:func:`.nonsymmetric.gmres`, on one process and on several. All of them call MPI by address, so they
are cached on disk like the one-process functions. They stop
at the first iteration whose outcome Python decides (a norm test that is met or fails, a
non-positive curvature) or after ``len(history)`` iterations, and say which;
:func:`.krylov.cg` turns that into the same reason the Python loop gives. A solve with a
``monitor`` (a Python callback per iteration), a matrix-free operator, another
preconditioner, or on several ranks with an MPI library compiled code cannot call runs the
Python loop. Inside compiled calls the time waited in reductions is not measured
(``SolveInfo.time_reduction_wait`` stays 0).

Examples
--------
>>> import numpy as np
>>> indptr, split = np.array([0, 1, 2], np.uint32), np.array([1, 2], np.uint32)
>>> indices, values = np.array([0, 1], np.uint32), np.array([2.0, 4.0])
>>> x, r, z, p, w = np.zeros(2), np.array([2.0, 4.0]), np.array([1.0, 1.0]), np.array([1.0, 1.0]), np.zeros(2)
>>> from meshchain.linalg.precond import Pointwise
>>> jacobi, history = Pointwise(np.array([0.5, 0.25])).compiled, np.zeros(8)
>>> cg_iterations(indptr, split, indices, values, False, x, r, z, p, w, jacobi, np.array([6.0]), 0.0, 0, 100, history)
(1, 1, 0.0, 2, 1)
>>> x.tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import math

import numba
import numpy as np

from ..backends.sparse import (csr_halo, csr_owned, csr_product_dot, csr_product_dots, csr_product_scaled_dots,
                               ilu_apply)
from ..backends.vector_table import vector_at
from ..comm.by_address import finish_exchange, start_allreduce, start_exchange, sum_all, wait_one
from .fused import (_axpy4, _dot4, aypx, axpy, cg1_update, cg_update, copy, dot, dot_pairs, dot_two, gropp_direction,
                    gropp_update, lincomb, pipebicgstab_sums, pipecg_update, pipecr_update, residual, scal, scale,
                    waxpy, waxpy_dots)
from .replacement import EPS, TOL

__all__ = ["true_residual_sums", "product_on_ranks", "cg_iterations", "cg_iterations_on_ranks",
           "cg1_iterations", "cg1_iterations_on_ranks",
           "bicgstab_iterations", "gmres_cycle", "givens_norm", "HAPPY_TOLERANCE", "pipebicgstab_iterations", "REPLACE",
           "pipegmres_cycle",
           "pipecg_iterations", "pipecr_iterations", "groppcg_iterations", "bounds_after_update", "BOUNDS",
           "STALLED", "STALL_ITERATIONS", "STALL_PROGRESS", "stalled",
           "GOING", "NORM", "CURVATURE", "BREAKDOWN", "COMMUNICATION", "RHO", "DENOMINATOR", "STALLED_T", "STALLED_S"]

GOING, NORM, CURVATURE, BREAKDOWN = 0, 1, 2, 3
"""Why :func:`cg_iterations` returned: its history is full (iterate on), the norm test
decided, ``(p, A p)`` is not a positive finite number, ``(r, B r)`` is not."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _outcome(i, zz, rz, target, maxiter):
    """``(norm, why, value)`` after iteration ``i``: the norm tested (``sqrt(zz)``), and
    :data:`NORM` when it decides, :data:`BREAKDOWN` when ``rz = (r, B r)`` is not a positive
    finite number, else :data:`GOING`."""
    norm = math.sqrt(max(zz, 0.0))
    if not math.isfinite(norm) or norm <= target or i >= maxiter:
        return norm, NORM, norm
    if not (math.isfinite(rz) and rz > 0.0):
        return norm, BREAKDOWN, rz
    return norm, GOING, 0.0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def true_residual_sums(indptr, split, indices, values, halo, x, b, r, z, pc, out):
    """The true residual at a solve's exit on one process in one call, with the bits of
    :meth:`.solve.SolveRun.true_residual`'s Python steps: ``r = A x``, ``r = b - r``,
    ``z = B r`` (``pc``: a preconditioner's ``compiled`` form, :func:`precondition`),
    ``out = [(r, r), (z, z)]``."""
    csr_owned(indptr, split, indices, values, x, r)
    if halo:
        csr_halo(indptr, split, indices, values, x, r)
    _residual_sums(b, r, z, pc, out)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _residual_sums(b, r, z, pc, out):
    """What the true residual does after ``r = A x``: ``r = b - r``, ``z = B r``,
    ``out = [(r, r), (z, z)]``."""
    residual(b, r, r)
    precondition(pc, r, z)
    out[0] = dot(r, r)
    out[1] = dot(z, z)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def true_residual_sums_on_ranks(indptr, split, indices, values, halo, distributed, functions, handles, x_all, b, r, z,
                                pc, total, exchange):
    """:func:`true_residual_sums` on several ranks (collective), with the bits of
    :meth:`.solve.SolveRun.true_residual`'s Python steps there: ``r = A x`` (``x_all``: ``x``
    with its halo rows, exchanged while the owned rows are computed), ``r = b - r``, ``z = B r``
    and ``total = [(r, r), (z, z)]`` summed over ranks as :meth:`.solve.SolveRun.reduce` sums.
    The arguments of :mod:`.starts`' functions (:meth:`.solve.SolveRun.products_and_sums`). The MPI
    error code."""
    error = _product(distributed, functions, handles, indptr, split, indices, values, halo, x_all, r, exchange)
    if error:
        return error
    mine = np.empty(2)
    _residual_sums(b, r, z, pc, mine)
    return _summed(distributed, functions, handles, mine, total)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg_iterations(indptr, split, indices, values, halo, x, r, z, p, w, pc, state, target, i, maxiter, history):
    """Iterations ``i + 1, ...`` of preconditioned CG from ``state = [(r, z)]`` and ``p``:
    ``(iteration, why, value, reductions, norms written)``, the norms tested written to
    ``history`` (one per iteration). ``why`` is one of :data:`GOING` (``state`` holds the
    ``(r, z)`` to go on from), :data:`NORM` (``value``: the norm, which met the target, is not
    finite or reached ``maxiter``), :data:`CURVATURE` (``value``: ``(p, A p)``) or
    :data:`BREAKDOWN` (``value``: ``(r, B r)``). ``halo``: whether the matrix has halo columns.
    ``pc``: the preconditioner's ``compiled`` form (:func:`precondition`): pointwise, fused
    into the update, or ILU(0), applied after it as the Python loop does."""
    no_rows, no_handles = np.zeros(0, np.int64), np.zeros(0, np.int32)
    return _cg(indptr, split, indices, values, halo, x, r, z, p, w, pc, state, target, i, maxiter, history, False,
               p, no_rows, x[:0], no_rows, x[:0], no_handles, np.zeros(0, np.uint8), no_rows, no_rows)


COMMUNICATION = 4
"""Why :func:`cg_iterations_on_ranks` returned: an MPI call failed (``value``: its error code)."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg_iterations_on_ranks(indptr, split, indices, values, halo, x, r, z, p, w, pc, state, target, i, maxiter,
                           history, p_all, send_at, send, receive_at, receive, requests, statuses, functions, handles):
    """:func:`cg_iterations` on several ranks (collective): before each product the halo of
    ``p`` is exchanged (``exchange``: a :class:`~meshchain.comm.compiled.CompiledExchange`'s
    arrays, the owned rows computed while the messages travel) and the two dot products of an
    iteration are summed over ranks, as the Python loop's blocking sums do. The same
    arguments as :func:`cg_iterations` with ``p_all`` (``p`` with its halo rows), the
    exchange's arrays (``send_at, send, receive_at, receive, requests, statuses``), then
    ``functions`` and ``handles`` (:func:`~meshchain.comm.compiled.addresses`,
    :func:`~meshchain.comm.compiled.handles`) at the end: MPI called by address
    (:mod:`meshchain.comm.by_address`), so it is cached on disk like :func:`cg_iterations`."""
    return _cg(indptr, split, indices, values, halo, x, r, z, p, w, pc, state, target, i, maxiter, history, True,
               p_all, send_at, send, receive_at, receive, requests, statuses, functions, handles)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def product_on_ranks(indptr, split, indices, values, halo, x_all, y, send_at, send, receive_at, receive, requests,
                     statuses, functions):
    """``y = A x`` and ``(x, A x)`` on several ranks, the halo of ``x`` exchanged while the
    owned rows are computed (the bits of :func:`~meshchain.backends.sparse.csr_product_dot`):
    ``(the rank's sum, MPI error code)``."""
    error = start_exchange(functions, x_all, send_at, send, requests)
    if halo:
        csr_owned(indptr, split, indices, values, x_all, y)
        if not error:
            error = finish_exchange(functions, x_all, receive_at, receive, requests, statuses)
        return csr_product_dot(indptr, split, indices, values, True, x_all, y), error
    mine = csr_product_dot(indptr, split, indices, values, False, x_all, y)  # while the messages travel
    if not error:
        error = finish_exchange(functions, x_all, receive_at, receive, requests, statuses)
    return mine, error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _cg(indptr, split, indices, values, halo, x, r, z, p, w, pc, state, target, i, maxiter, history, distributed,
        p_all, send_at, send, receive_at, receive, requests, statuses, functions, handles):
    """The iterations of :func:`cg_iterations` (``distributed`` False) and
    :func:`cg_iterations_on_ranks` (True: the arguments after it are used)."""
    out, mine, total = np.zeros(3), np.zeros(2), np.zeros(2)
    dinv, factored = pc[0], len(pc[7]) > 0
    for k in range(len(history)):
        if distributed:
            mine[0], error = product_on_ranks(indptr, split, indices, values, halo, p_all, w, send_at, send,
                                              receive_at, receive, requests, statuses, functions)
            if not error:
                error = sum_all(functions, mine[:1], total[:1], handles)
            if error:
                return i, COMMUNICATION, float(error), 2 * k + 1, k
            pw = total[0]
        else:
            if halo:
                csr_owned(indptr, split, indices, values, p, w)
            pw = csr_product_dot(indptr, split, indices, values, halo, p, w)  # the bits of the product, then dot(p, w)
        if not (math.isfinite(pw) and pw > 0.0):
            return i, CURVATURE, pw, 2 * k + 1, k
        cg_update(state[0] / pw, p, w, x, r, dinv, z, out)
        if factored:
            precondition(pc, r, z)
            dot_pairs(r, z, z, z, z, z, out)
        if distributed:
            mine[0], mine[1] = out[0], out[1]
            error = sum_all(functions, mine, total, handles)
            if error:
                return i, COMMUNICATION, float(error), 2 * k + 2, k
        else:
            total[0], total[1] = out[0], out[1]
        i += 1
        history[k], why, value = _outcome(i, total[1], total[0], target, maxiter)
        if why != GOING:
            return i, why, value, 2 * k + 2, k + 1
        aypx(total[0] / state[0], z, p)
        state[0] = total[0]
    return i, GOING, 0.0, 2 * len(history), len(history)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _cg1_step(i, total, state, target, maxiter):
    """:func:`.krylov.cg1`'s decisions after iteration ``i``'s reduction ``total = [gamma,
    delta, zz]``: ``(norm, why, value, beta)``; on :data:`GOING` ``state = [alpha, gamma_old]``
    holds the new step length and ``gamma``."""
    gamma, delta = total[0], total[1]
    norm = math.sqrt(max(total[2], 0.0))
    if not math.isfinite(norm) or norm <= target or i >= maxiter:
        return norm, NORM, norm, 0.0
    beta = gamma / state[1]
    denominator = delta - beta / state[0] * gamma
    if not (math.isfinite(denominator) and denominator > 0.0):
        return norm, CURVATURE, denominator, beta
    if not (math.isfinite(gamma) and gamma > 0.0):
        return norm, BREAKDOWN, gamma, beta
    state[0], state[1] = gamma / denominator, gamma
    return norm, GOING, 0.0, beta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg1_iterations(indptr, split, indices, values, halo, x, r, z, s, p, w, dinv, state, target, i, maxiter, history):
    """Iterations ``i, i + 1, ...`` (``i >= 1``) of :func:`.krylov.cg1` (Chronopoulos/Gear) from
    ``state = [alpha, gamma_old]``: ``(iteration, why, value, reductions, norms written to
    history)``, ``why`` and ``value`` as :func:`cg_iterations`'s (:data:`CURVATURE`: the step's
    denominator)."""
    no_rows = np.zeros(0, np.int64)
    return _cg1(indptr, split, indices, values, halo, x, r, z, s, p, w, dinv, state, target, i, maxiter, history,
                False, z, no_rows, x[:0], no_rows, x[:0], np.zeros(0, np.int32), np.zeros(0, np.uint8), no_rows,
                no_rows)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg1_iterations_on_ranks(indptr, split, indices, values, halo, x, r, z, s, p, w, dinv, state, target, i, maxiter,
                            history, z_all, send_at, send, receive_at, receive, requests, statuses, functions, handles):
    """:func:`cg1_iterations` on several ranks (collective), as :func:`cg_iterations_on_ranks`
    is :func:`cg_iterations`'s: ``z`` with its halo rows, the exchange's arrays, the MPI
    functions' addresses and the handles after :func:`cg1_iterations`'s arguments."""
    return _cg1(indptr, split, indices, values, halo, x, r, z, s, p, w, dinv, state, target, i, maxiter, history,
                True, z_all, send_at, send, receive_at, receive, requests, statuses, functions, handles)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _cg1(indptr, split, indices, values, halo, x, r, z, s, p, w, dinv, state, target, i, maxiter, history,
         distributed, z_all, send_at, send, receive_at, receive, requests, statuses, functions, handles):
    """The iterations of :func:`cg1_iterations` (``distributed`` False) and
    :func:`cg1_iterations_on_ranks` (True: the arguments after it are used)."""
    out, total = np.zeros(3), np.zeros(3)
    exchange = (send_at, send, receive_at, receive, requests, statuses)
    for k in range(len(history)):
        error = cg1_product_sums(distributed, functions, handles, indptr, split, indices, values, halo, z_all, s, r,
                                 out, total, exchange)
        if error:
            return i, COMMUNICATION, float(error), k + 1, k
        history[k], why, value, beta = _cg1_step(i, total, state, target, maxiter)
        if why != GOING:
            return i, why, value, k + 1, k + 1
        cg1_update(state[0], beta, z, s, p, w, x, r, dinv)
        i += 1
    return i, GOING, 0.0, len(history), len(history)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def cg1_product_sums(distributed, functions, handles, indptr, split, indices, values, halo, z_all, s, r, out, total,
                     exchange):
    """Chronopoulos/Gear CG's product and sums: ``s = A z`` (``z_all``: ``z`` with its halo rows,
    exchanged first on several ranks while the owned rows, or with no halo column all of them,
    are computed) and ``total = [(r, z), (z, s), (z, z)]`` summed over ranks, made in the
    product's pass (:func:`~meshchain.backends.sparse.csr_product_dots`, the bits of
    ``dot_pairs(r, z, z, s, z, z)``; ``out``: this rank's). The MPI error code."""
    if not distributed:
        if halo:
            csr_owned(indptr, split, indices, values, z_all, s)
        csr_product_dots(indptr, split, indices, values, halo, z_all, s, r, total)
        return 0
    send_at, send, receive_at, receive, requests, statuses = exchange
    error = start_exchange(functions, z_all, send_at, send, requests)
    if halo:
        csr_owned(indptr, split, indices, values, z_all, s)
        if not error:
            error = finish_exchange(functions, z_all, receive_at, receive, requests, statuses)
        csr_product_dots(indptr, split, indices, values, True, z_all, s, r, out)
    else:  # no halo column: the product while the messages travel
        csr_product_dots(indptr, split, indices, values, False, z_all, s, r, out)
        if not error:
            error = finish_exchange(functions, z_all, receive_at, receive, requests, statuses)
    return error or sum_all(functions, out, total, handles)


# --- BiCGStab ---------------------------------------------------------------------------------------

RHO, DENOMINATOR, STALLED_T, STALLED_S = 5, 6, 7, 8
"""Why :func:`bicgstab_iterations` returned, besides :data:`GOING`, :data:`NORM` and
:data:`COMMUNICATION`: ``(r, r~)`` is zero (``value``: it), ``(B A p, r~)`` is, ``(t, t)``
is (``omega`` cannot be formed; ``value``: it) or ``(s, t)`` is (``value``: it)."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def precondition(pc, source, target):
    """``target = B source`` in the nonsymmetric methods and CG: ``pc`` is a preconditioner's
    ``compiled`` form (:mod:`.precond`), ``(dinv, l_ptr, l_indices, l_values, u_ptr, u_indices,
    u_values, inverse)``: with no ``inverse`` pointwise (``dinv``), else the triangular solves of
    :func:`~meshchain.backends.sparse.ilu_apply` (what ``"bjacobi-ilu"`` and ``"sgs"`` apply in
    Python)."""
    dinv, l_ptr, l_indices, l_values, u_ptr, u_indices, u_values, inverse = pc
    if len(inverse) == 0:
        scale(dinv, source, target)
    else:
        ilu_apply(l_ptr, l_indices, l_values, u_ptr, u_indices, u_values, inverse, source, target)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _product(distributed, functions, handles, indptr, split, indices, values, halo, source_all, target, exchange):
    """``target = A source``, ``source_all`` the source vector with its halo rows (exchanged first
    on several ranks while the owned rows are computed); the MPI error code."""
    send_at, send, receive_at, receive, requests, statuses = exchange
    error = 0
    if distributed:
        error = start_exchange(functions, source_all, send_at, send, requests)
    csr_owned(indptr, split, indices, values, source_all, target)
    if distributed:
        error = error or finish_exchange(functions, source_all, receive_at, receive, requests, statuses)
    if halo:
        csr_halo(indptr, split, indices, values, source_all, target)
    return error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _product_and_sums(distributed, functions, handles, indptr, split, indices, values, halo, source_all, target,
                      exchange, pc, v, a, out, both):
    """``target = A source`` as :func:`_product` makes it, ``v = B target`` (:func:`precondition`)
    and ``out = [(a, v), (v, v)]`` over this rank's rows (without ``both``, ``out[0]`` alone
    is wanted): with a pointwise ``B`` in the product's last pass
    (:func:`~meshchain.backends.sparse.csr_product_scaled_dots`, the same bits), else pass after
    pass. The MPI error code."""
    if len(pc[7]) != 0:  # ILU(0): its triangular solves need the whole product first
        error = _product(distributed, functions, handles, indptr, split, indices, values, halo, source_all, target,
                         exchange)
        precondition(pc, target, v)
        if both:
            dot_two(a, v, v, v, out)
        else:
            out[0] = dot(a, v)
        return error
    send_at, send, receive_at, receive, requests, statuses = exchange
    error = 0
    if distributed:
        error = start_exchange(functions, source_all, send_at, send, requests)
    if halo:  # the owned columns while the messages travel, the halo's after them
        csr_owned(indptr, split, indices, values, source_all, target)
        if distributed:
            error = error or finish_exchange(functions, source_all, receive_at, receive, requests, statuses)
        csr_product_scaled_dots(indptr, split, indices, values, True, source_all, target, pc[0], v, a, out)
    else:  # no halo column: all of it while the messages travel
        csr_product_scaled_dots(indptr, split, indices, values, False, source_all, target, pc[0], v, a, out)
        if distributed:
            error = error or finish_exchange(functions, source_all, receive_at, receive, requests, statuses)
    return error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _summed(distributed, functions, handles, mine, total):
    """``total = mine`` summed over ranks (one process: copied); the MPI error code."""
    if not distributed:
        total[:] = mine
        return 0
    return sum_all(functions, mine, total, handles)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def bicgstab_iterations(indptr, split, indices, values, halo, x, r, rp, p, v, s, t, z, pc, state, target, dtol, i,
                        maxiter, history, distributed, p_all, s_all, exchange, functions, handles):
    """Iterations ``i + 1, ...`` of :func:`.nonsymmetric.bicgstab` with a pointwise
    preconditioner (``pc``: :func:`precondition`'s) from ``state = [rho, rho_old, alpha, omega_old]`` at the top of its
    loop: ``(iteration, why, value, reductions, norms written to history)``. The same bits,
    sums (each over ranks with the Python loop's counts: 1, 2, 2 values) and decisions as the
    Python loop (its sums made in the passes that make their operands: :func:`_product_and_sums`,
    :func:`.fused.waxpy_dots`): :data:`NORM` when the norm tested (``value``) met the target, is not finite,
    grew beyond ``dtol`` or reached ``maxiter``; :data:`RHO`, :data:`DENOMINATOR`,
    :data:`STALLED_T` or :data:`STALLED_S` where the loop breaks down or stalls (before ``x``
    moves: ``state[2]`` holds that iteration's ``alpha``); :data:`GOING` when ``history`` is
    full (``state`` holds the loop's state). On several ranks (``distributed``) the operator's
    input (``p_all``, ``s_all``: ``p`` and ``s`` with their halo rows) is exchanged through
    ``exchange`` (``send_at, send, receive_at, receive, requests, statuses``) and the sums go
    through :func:`~meshchain.comm.by_address.sum_all`, by address (``functions``, ``handles``:
    :mod:`meshchain.comm.by_address`)."""
    rho, rho_old, alpha, omega_old = state[0], state[1], state[2], state[3]
    one, two, out = np.zeros(1), np.zeros(2), np.zeros(2)
    done = 0
    for k in range(len(history)):
        if rho == 0.0:
            return i, RHO, rho, done, k
        beta = (rho / rho_old) * (alpha / omega_old)
        lincomb(1.0, r, -omega_old * beta, v, beta, p)
        error = _product_and_sums(distributed, functions, handles, indptr, split, indices, values, halo, p_all, z,
                                  exchange, pc, v, rp, out, False)  # out[0]: the bits of dot(v, rp)
        error = error or _summed(distributed, functions, handles, out[:1], one)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, k
        d1 = one[0]
        if d1 == 0.0:
            return i, DENOMINATOR, d1, done, k
        alpha = rho / d1
        waxpy(s, -alpha, v, r)
        error = _product_and_sums(distributed, functions, handles, indptr, split, indices, values, halo, s_all, z,
                                  exchange, pc, t, s, out, True)  # the bits of dot_two(s, t, t, t)
        error = error or _summed(distributed, functions, handles, out, two)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, k
        st, tt = two[0], two[1]
        if tt == 0.0 or st == 0.0:
            state[2] = alpha
            return i, STALLED_T if tt == 0.0 else STALLED_S, tt if tt == 0.0 else st, done, k
        omega = st / tt
        axpy(alpha, p, x)
        axpy(omega, s, x)
        waxpy_dots(r, -omega, t, s, rp, out)  # the bits of waxpy(r, -omega, t, s), dot_two(r, r, r, rp)
        rho_old, omega_old = rho, omega
        error = _summed(distributed, functions, handles, out, two)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, k
        rr, rho = two[0], two[1]
        i += 1
        norm = math.sqrt(max(rr, 0.0))
        history[k] = norm
        state[0], state[1], state[2], state[3] = rho, rho_old, alpha, omega_old
        if not math.isfinite(norm) or norm <= target or norm > dtol or i >= maxiter:
            return i, NORM, norm, done, k + 1
    return i, GOING, 0.0, done, len(history)


# --- GMRES ------------------------------------------------------------------------------------------

HAPPY_TOLERANCE = 1e-30
"""PETSc's ``haptol``: a new Hessenberg entry below ``min(haptol, |h / g|)`` is a happy
breakdown (the Krylov space holds the solution)."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def givens_norm(a, b):
    """``hypot(a, b)`` as the C library computes it: GMRES's rotations take it from here in their
    Python loop and in :func:`gmres_cycle` alike (Python's ``math.hypot`` rounds differently)."""
    return math.hypot(a, b)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _mdot_first(vectors, length, n, w, sums, out):
    """``out[k] = (vectors[k], w)`` for ``k < n`` (``vectors``: a :func:`.vector_table` of
    vectors of ``length``), four vectors per pass as :func:`.fused.mdot` (the list padded with
    ``w``), ``sums`` a scratch of ``n`` rounded up to 4."""
    padded = (n + 3) // 4 * 4
    for k in range(0, padded, 4):
        a0 = vector_at(vectors, k, length) if k < n else w
        a1 = vector_at(vectors, k + 1, length) if k + 1 < n else w
        a2 = vector_at(vectors, k + 2, length) if k + 2 < n else w
        a3 = vector_at(vectors, k + 3, length) if k + 3 < n else w
        _dot4(a0, a1, a2, a3, w, sums, k)
    for k in range(n):
        out[k] = sums[k]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _maxpy_first(coefficients, vectors, length, n, w):
    """``w += sum_{k < n} coefficients[k] vectors[k]`` (``vectors``: a :func:`.vector_table` of
    vectors of ``length``), four vectors per pass as :func:`.fused.maxpy`."""
    for k in range(0, n, 4):
        c0 = coefficients[k]
        c1 = coefficients[k + 1] if k + 1 < n else 0.0
        c2 = coefficients[k + 2] if k + 2 < n else 0.0
        c3 = coefficients[k + 3] if k + 3 < n else 0.0
        a0 = vector_at(vectors, k, length)
        a1 = vector_at(vectors, k + 1, length) if k + 1 < n else a0
        a2 = vector_at(vectors, k + 2, length) if k + 2 < n else a0
        a3 = vector_at(vectors, k + 3, length) if k + 3 < n else a0
        _axpy4(c0, c1, c2, c3, a0, a1, a2, a3, w)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _project_out(distributed, functions, handles, basis, length, n, new, sums, mine, h):
    """Classical Gram-Schmidt: ``h = (v_k, new)`` for ``k < n`` summed over ranks, then
    ``new -= sum h_k v_k``; the MPI error code."""
    _mdot_first(basis, length, n, new, sums, mine)
    error = _summed(distributed, functions, handles, mine[:n], h[:n])
    for k in range(n):
        mine[k] = -h[k]
    _maxpy_first(mine, basis, length, n, new)
    return error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _norm(distributed, functions, handles, new, one, total):
    one[0] = dot(new, new)
    error = _summed(distributed, functions, handles, one, total)
    return math.sqrt(max(total[0], 0.0)), error


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rotated(column, n, g, j, cosines, sines, rotated, columns):
    """Add Hessenberg column ``column[:n]`` (``n = j + 2`` entries) to the Givens-rotated
    least-squares problem ``(g, cosines, sines, columns)`` of :class:`.nonsymmetric._LeastSquares`;
    returns the residual estimate ``|g[j + 1]|``."""
    for k in range(n):
        rotated[k] = column[k]
    for k in range(j):
        c, s = cosines[k], sines[k]
        rotated[k], rotated[k + 1] = c * rotated[k] + s * rotated[k + 1], -s * rotated[k] + c * rotated[k + 1]
    delta = givens_norm(rotated[j], rotated[j + 1])
    if delta > 0.0:
        c, s = rotated[j] / delta, rotated[j + 1] / delta
    else:
        c, s = 1.0, 0.0
    cosines[j], sines[j] = c, s
    rotated[j] = c * rotated[j] + s * rotated[j + 1]
    g[j + 1] = -s * g[j]
    g[j] = c * g[j]
    for k in range(j + 1):
        columns[k, j] = rotated[k]
    return abs(g[j + 1])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _corrected(basis, length, x, g, columns, added):
    """``x += sum_k y_k v_k`` with ``R y = g`` over the ``added`` columns (back substitution; a
    zero pivot gives a zero entry), as :meth:`.nonsymmetric._LeastSquares.solution` and
    :func:`.nonsymmetric._add_basis`."""
    y = np.zeros(max(added, 1))
    for k in range(added - 1, -1, -1):
        accumulated = 0.0
        for j in range(k + 1, added):
            accumulated += columns[k, j] * y[j]
        pivot = columns[k, k]
        y[k] = (g[k] - accumulated) / pivot if pivot != 0.0 else 0.0
    _maxpy_first(y, basis, length, added, x)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gmres_cycle(indptr, split, indices, values, halo, x, w, basis, owned, rows, pc, beta, target, dtol, i, maxiter,
                history, distributed, exchange, functions, handles):
    """One cycle of :func:`.nonsymmetric.gmres` (restarted, left-preconditioned GMRES, classical
    Gram-Schmidt refined if needed) from the normalised ``basis[0]`` (``beta``: the norm it was
    scaled by), with a preconditioner (``pc``: :func:`precondition`'s): ``(iteration, why, value,
    reductions, norms written to history)`` after ``x`` took the cycle's correction. The same
    passes, sums (over ranks with the Python loop's counts) and decisions as the Python loop:
    :data:`NORM` when an estimate (``value``; 0 at a happy breakdown) met the target, is not
    finite, grew beyond ``dtol`` or reached ``maxiter``, :data:`GOING` when the cycle's
    ``len(basis) - 1`` iterations decided nothing. ``basis``: a :func:`.vector_table` of the
    basis vectors, ``owned`` rows each and ``rows`` with their halo rows, each exchanged before
    it is multiplied on several ranks (``distributed``, as :func:`bicgstab_iterations`)."""
    m = len(basis) - 1
    g = np.zeros(m + 1)
    g[0] = beta
    columns, cosines, sines = np.zeros((m, m)), np.zeros(m), np.zeros(m)
    sums, mine, h, again = np.zeros(m + 4), np.zeros(m + 1), np.zeros(m + 1), np.zeros(m + 1)
    column, rotated = np.zeros(m + 1), np.zeros(m + 1)
    one, total = np.zeros(1), np.zeros(1)
    done, why, value, added = 0, GOING, 0.0, 0
    for j in range(m):
        new, n = vector_at(basis, j + 1, owned), j + 1
        error = _product(distributed, functions, handles, indptr, split, indices, values, halo,
                         vector_at(basis, j, rows), w, exchange)
        precondition(pc, w, new)
        error = error or _project_out(distributed, functions, handles, basis, owned, n, new, sums, mine, h)
        if error:  # no further collective on this rank: the job is aborted
            return i, COMMUNICATION, float(error), done + 1, added
        left, error = _norm(distributed, functions, handles, new, one, total)
        done += 2
        if error:
            return i, COMMUNICATION, float(error), done, added
        squares = 0.0
        for k in range(n):
            squares += h[k] * h[k]
        if left < math.sqrt(squares):
            error = _project_out(distributed, functions, handles, basis, owned, n, new, sums, mine, again)
            if error:
                return i, COMMUNICATION, float(error), done + 1, added
            for k in range(n):
                h[k] = h[k] + again[k]
            left, error = _norm(distributed, functions, handles, new, one, total)
            done += 2
            if error:
                return i, COMMUNICATION, float(error), done, added
        happy = left == 0.0 or (g[j] != 0.0 and left < min(abs(left / g[j]), HAPPY_TOLERANCE))
        for k in range(n):
            column[k] = h[k]
        column[n] = left
        estimate = _rotated(column, n + 1, g, j, cosines, sines, rotated, columns)
        added = n
        i += 1
        norm = 0.0 if happy else estimate
        history[j] = norm
        if not math.isfinite(norm) or norm <= target or norm > dtol or i >= maxiter:
            why, value = NORM, norm
            break
        if happy:  # pragma: no cover - a happy breakdown's 0 always meets the target
            break
        scal(1.0 / left, new)
    _corrected(basis, owned, x, g, columns, added)
    return i, why, value, done, added


# --- pipelined BiCGStab -------------------------------------------------------------------------------

REPLACE = 9
"""Why :func:`pipebicgstab_iterations` returned: iteration ``i`` is one whose residual PETSc
recomputes (Python does it, then tests the norm ``state`` holds)."""

STALLED = 10
"""Why :func:`groppcg_iterations` returned: its residual norm made no new low
(:data:`STALL_PROGRESS` times the smallest) for :data:`STALL_ITERATIONS` iterations while the
smallest was below the rounding level (``value``: the norm). Its recursive norm stalls there
above a tolerance it cannot attain, where the other methods' recurrences fall below it and are
caught as false convergence: Python restarts it (:mod:`.recovery`), and a restart that finds no
progress ends the solve as stagnated, not at ``maxiter``."""

STALL_ITERATIONS = 100
STALL_PROGRESS = 0.9


@numba.njit(cache=True, nogil=True, error_model="numpy")
def stalled(stall, i, norm) -> bool:
    """Whether iteration ``i``'s ``norm`` ends a stall (:data:`STALLED`); ``stall = [smallest,
    its iteration, rounding level]`` is updated with a new low. The Python loop calls it too."""
    if norm < STALL_PROGRESS * stall[0]:
        stall[0], stall[1] = norm, i
        return False
    return stall[0] <= stall[2] and i - stall[1] >= STALL_ITERATIONS


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _started(distributed, functions, handles, mine, total, request):
    """Start ``total = mine`` summed over ranks (one process: copied); the MPI error code."""
    if not distributed:
        total[:] = mine
        return 0
    return start_allreduce(functions, mine, total, handles, request)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _waited(distributed, functions, request, status):
    return wait_one(functions, request, status) if distributed else 0


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _apply_ba(distributed, functions, handles, indptr, split, indices, values, halo, pc, source, preconditioned,
              preconditioned_all, target, exchange):
    """``preconditioned = B source``, ``target = A preconditioned`` (right preconditioning)."""
    precondition(pc, source, preconditioned)
    return _product(distributed, functions, handles, indptr, split, indices, values, halo,
                    preconditioned_all, target, exchange)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _overlapped(distributed, functions, handles, mine, total, request, status, indptr, split, indices, values, halo,
                pc, source, preconditioned, preconditioned_all, target, exchange):
    """Start ``total = mine`` summed over ranks, apply ``B`` then ``A`` (:func:`_apply_ba`) while
    it travels, wait for it: the first MPI error code (a sum started is always waited for)."""
    error = _started(distributed, functions, handles, mine, total, request)
    product = _apply_ba(distributed, functions, handles, indptr, split, indices, values, halo, pc, source,
                        preconditioned, preconditioned_all, target, exchange) if error == 0 else 0
    waited = _waited(distributed, functions, request, status) if error == 0 else 0
    return error or product or waited


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pipebicgstab_iterations(indptr, split, indices, values, halo, x, r, rp, r2, w, w2, t, p2, s, s2, z, z2, v, q, q2, y,
                            pc, state, target, dtol, i, maxiter, history, distributed, z2_all, w2_all, exchange,
                            functions, handles):
    """Iterations ``i + 1, ...`` of :func:`.nonsymmetric.pipebicgstab` (pipelined BiCGStab, right
    preconditioning, ``pc``: :func:`precondition`'s) from ``state = [rho, alpha, beta, omega]`` at the top
    of its loop: ``(iteration, why, value, reductions, norms written to history)``. Each
    iteration's two sums over ranks are ``MPI_Iallreduce`` in flight while ``B`` and ``A`` are
    applied, as in the Python loop; the same passes, sums and decisions. ``why``: :data:`NORM`
    (``value``: the norm tested), :data:`RHO` or :data:`DENOMINATOR` (after the norm test
    passed), :data:`STALLED_T` (``(y, y) = 0``) or :data:`STALLED_S` (``(q, y) = 0``) with
    ``state[1]`` that iteration's ``alpha`` (``x`` unmoved), :data:`REPLACE` (iteration ``i``'s
    residual is to be recomputed; ``state = [rho, rr, beta, omega, denominator]``), :data:`GOING`
    (``history`` full) or :data:`COMMUNICATION`. ``z2_all``, ``w2_all``: the operator's inputs
    with their halo rows (``distributed``: exchanged, as :func:`bicgstab_iterations`)."""
    rho, alpha, beta, omega = state[0], state[1], state[2], state[3]
    two, five, sums2, sums5 = np.zeros(2), np.zeros(5), np.zeros(2), np.zeros(5)
    request, status = np.zeros(1, np.int32), np.zeros(64, np.uint8)
    done = 0
    for k in range(len(history)):
        if i == 0:
            copy(r2, p2)
            copy(w, s)
            copy(w2, s2)
            copy(t, z)
        else:
            lincomb(1.0, r2, -beta * omega, s2, beta, p2)
            lincomb(1.0, w, -beta * omega, z, beta, s)
            lincomb(1.0, w2, -beta * omega, z2, beta, s2)
            lincomb(1.0, t, -beta * omega, v, beta, z)
        waxpy(q, -alpha, s, r)
        waxpy(q2, -alpha, s2, r2)
        waxpy(y, -alpha, z, w)
        dot_two(q, y, y, y, two)  # the bits of dot(q, y), dot(y, y), in one pass
        error = _overlapped(distributed, functions, handles, two, sums2, request, status, indptr, split, indices,
                            values, halo, pc, z, z2, z2_all, v, exchange)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, k
        qy, yy = sums2[0], sums2[1]
        if yy == 0.0 or qy == 0.0:
            state[1] = alpha
            return i, STALLED_T if yy == 0.0 else STALLED_S, yy if yy == 0.0 else qy, done, k
        omega = qy / yy
        rho_old = rho
        axpy(alpha, p2, x)
        axpy(omega, q2, x)
        waxpy(r, -omega, y, q)
        waxpy(r2, -alpha, z2, w2)
        waxpy(r2, -omega, r2, q2)
        waxpy(w, -alpha, v, t)
        waxpy(w, -omega, w, y)
        pipebicgstab_sums(r, s, w, z, rp, five)  # the bits of five dot calls, in one pass
        error = _overlapped(distributed, functions, handles, five, sums5, request, status, indptr, split, indices,
                            values, halo, pc, w, w2, w2_all, t, exchange)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, k
        rr, rho, d1, d2, d3 = sums5[0], sums5[1], sums5[2], sums5[3], sums5[4]
        beta = (rho / rho_old) * (alpha / omega)
        denominator = d2 + beta * d1 - beta * omega * d3
        i += 1
        if i % 100 == 1 and 1 < i < 1002:
            state[0], state[1], state[2], state[3], state[4] = rho, rr, beta, omega, denominator
            return i, REPLACE, 0.0, done, k
        norm = math.sqrt(max(rr, 0.0))
        history[k] = norm
        if not math.isfinite(norm) or norm <= target or norm > dtol or i >= maxiter:
            return i, NORM, norm, done, k + 1
        if rho == 0.0:
            return i, RHO, rho, done, k + 1
        if denominator == 0.0:
            return i, DENOMINATOR, denominator, done, k + 1
        alpha = rho / denominator
        state[0], state[1], state[2], state[3] = rho, alpha, beta, omega
    return i, GOING, 0.0, done, len(history)


# --- p(1)-GMRES ---------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pipegmres_cycle(indptr, split, indices, values, halo, x, w, basis, owned, rows, pc, beta, target, dtol, i, maxiter,
                    history, distributed, exchange, functions, handles):
    """One cycle of :func:`.nonsymmetric.pipegmres` (p(1)-GMRES, left preconditioning, a
    ``pc``: :func:`precondition`'s) from the normalised ``basis[0]``, as :func:`gmres_cycle` is one of GMRES
    (``basis``: ``restart + 2`` slots; each step's ``MPI_Iallreduce`` in flight while the next
    operator and preconditioner are applied, as in the Python loop): ``(iteration, why, value,
    reductions, norms written to history)`` after ``x`` took the cycle's correction."""
    m = len(basis) - 2
    g = np.zeros(m + 2)
    g[0] = beta
    columns, cosines, sines = np.zeros((m + 1, m + 1)), np.zeros(m + 1), np.zeros(m + 1)
    hessenberg = np.zeros((m + 2, m + 2))  # unrotated column k in hessenberg[k, :k + 2]
    column, rotated, coefficients = np.zeros(m + 3), np.zeros(m + 3), np.zeros(m + 3)
    mine, sums, scratch = np.zeros(m + 3), np.zeros(m + 3), np.zeros(m + 6)
    request, status = np.zeros(1, np.int32), np.zeros(64, np.uint8)
    done, why, value, added, count = 0, GOING, 0.0, 0, 0
    for t in range(m + 2):
        error = 0
        if t <= m:
            error = _product(distributed, functions, handles, indptr, split, indices, values, halo,
                             vector_at(basis, t, rows), w, exchange)
            precondition(pc, w, vector_at(basis, t + 1, owned))
        if t > 0:
            waited = _waited(distributed, functions, request, status)  # a sum started is always waited for
            error = error or waited
        if error:
            return i, COMMUNICATION, float(error), done, added
        if t > 0:
            for k in range(t):
                column[k] = sums[count - t + k]
        if t > 1:
            norm = math.sqrt(max(sums[0], 0.0))
            hessenberg[t - 2, t - 1] = norm
            j = t - 2
            happy = norm == 0.0 or (g[j] != 0.0 and norm < min(abs(norm / g[j]), HAPPY_TOLERANCE))
            estimate = _rotated(hessenberg[j], j + 2, g, j, cosines, sines, rotated, columns)
            added = j + 1
            i += 1
            tested = 0.0 if happy else estimate
            history[j] = tested
            if not math.isfinite(tested) or tested <= target or tested > dtol or i >= maxiter:
                why, value = NORM, tested
                break
            if happy or t == m + 1:
                break
            for slot in (t - 1, t, t + 1):
                scal(1.0 / norm, vector_at(basis, slot, owned))
            for k in range(t):
                column[k] /= norm
            column[t - 1] /= norm
        if t > 0:
            for k in range(t):
                coefficients[k] = 0.0
            for k in range(t - 1):
                for l_index in range(k + 2):
                    coefficients[l_index] -= column[k] * hessenberg[k, l_index]
            coefficients[t] = -column[t - 1]
            _maxpy_first(coefficients, basis, owned, t + 1, vector_at(basis, t + 1, owned))
            for k in range(t):
                coefficients[k] = -column[k]
            _maxpy_first(coefficients, basis, owned, t, vector_at(basis, t, owned))
            for k in range(t):
                hessenberg[t - 1, k] = column[k]
            current = vector_at(basis, t, owned)
            mine[0] = dot(current, current)
            _mdot_first(basis, owned, t + 1, vector_at(basis, t + 1, owned), scratch, mine[1:])
            count = t + 2
        else:
            mine[0] = dot(vector_at(basis, 1, owned), vector_at(basis, 0, owned))
            count = 1
        error = _started(distributed, functions, handles, mine[:count], sums[:count], request)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, added
    _corrected(basis, owned, x, g, columns, added)
    return i, why, value, done, added


# --- pipelined CG -------------------------------------------------------------------------------------------

BOUNDS = 12
"""The length of :func:`bounds_after_update`'s state: ``[a, k, b_norm, errr, errrprev, errs, errw,
errz, errncs, errncz, replaced, floor]`` (:class:`~meshchain.linalg.replacement.ReplacementBounds`'s)."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def bounds_after_update(bounds, i, now, before, alpha, beta):
    """:meth:`ReplacementBounds.after_update <meshchain.linalg.replacement.ReplacementBounds.after_update>`
    on its state ``bounds`` (:data:`BOUNDS`), with the norms ``now`` and ``before`` as arrays
    ``[dp, du, dw, dx, ds, dz, dpp, dq, dm]``: the same operations in the same order, the same
    bits. Whether to replace the residual now."""
    a, k, eps = bounds[0], bounds[1], EPS
    alpha, beta = abs(alpha), abs(beta)
    dp, du, dx, ds, dz, dpp, dq, dm = now[0], now[1], now[3], now[4], now[5], now[6], now[7], now[8]
    bp, bu, bw, bx, bs, bz, bpp, bq = before[0], before[1], before[2], before[3], before[4], before[5], before[6], \
        before[7]
    errncr = math.sqrt(a * bx + 2 * a * alpha * dpp + bp + 2 * alpha * ds) * eps
    errncw = math.sqrt(a * bu + 2 * a * alpha * dq + bw + 2 * alpha * dz) * eps
    if i > 1:
        bounds[8] = math.sqrt(a * bu + 2 * a * beta * bpp + bw + 2 * beta * bs) * eps
        bounds[9] = math.sqrt((k + 2) * a * dm + 2 * a * beta * bq + 2 * beta * bz) * eps
    errncs, errncz = bounds[8], bounds[9]
    if i == 1:
        bounds[3] = (math.sqrt((k + 1) * a * bx + bounds[2]) * eps + math.sqrt(alpha * k * a * dpp) * eps + errncr)
        bounds[5] = math.sqrt(k * a * dpp) * eps
        bounds[6] = math.sqrt(k * a * bu) * eps + math.sqrt(alpha * k * a * dq) * eps + errncw
        bounds[7] = math.sqrt(k * a * dq) * eps
    elif bounds[10] != 0.0:
        bounds[4] = bounds[3]
        bounds[3] = math.sqrt((k + 1) * a * dx + bounds[2]) * eps
        bounds[5] = math.sqrt(k * a * dpp) * eps
        bounds[6] = math.sqrt(k * a * du) * eps
        bounds[7] = math.sqrt(k * a * dq) * eps
        bounds[10] = 0.0
    else:
        errs, errw, errz = bounds[5], bounds[6], bounds[7]
        bounds[4] = bounds[3]
        bounds[3] += alpha * beta * errs + alpha * errw + errncr + alpha * errncs
        bounds[5] = errw + beta * errs + errncs
        bounds[6] += alpha * beta * errz + errncw + alpha * errncz
        bounds[7] = beta * errz + errncz
    if i > 1 and bounds[4] <= max(TOL * bp, bounds[11]) and bounds[3] > max(TOL * dp, bounds[11]):
        bounds[10] = 1.0
        return True
    return False


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pipelined_top(distributed, functions, handles, out, total, request, status, indptr, split, indices, values, halo,
                   m_all, n, exchange, history, k, i, gamma_old, alpha, target, maxiter):
    """The top of a single-reduction iteration ``i >= 1`` (the Python loops' ``run.start``,
    ``run.A``, ``run.wait``, ``run.check`` then ``_step_lengths``): ``total = out`` summed over
    ranks while ``n = A m`` is computed, the norm written to ``history[k]``, then ``(why, value,
    alpha, beta)``: :data:`COMMUNICATION` (the first MPI error code; a sum started is always
    waited for), :data:`NORM` when the norm decides, :data:`CURVATURE` (the denominator
    ``delta - beta / alpha gamma``) or :data:`BREAKDOWN` (``gamma``) when not positive, else
    :data:`GOING` with the new step lengths."""
    error = _started(distributed, functions, handles, out, total, request)
    product = _product(distributed, functions, handles, indptr, split, indices, values, halo, m_all, n,
                       exchange) if error == 0 else 0
    waited = _waited(distributed, functions, request, status) if error == 0 else 0
    error = error or product or waited
    if error:
        return COMMUNICATION, float(error), alpha, 0.0
    gamma, delta = total[0], total[1]
    history[k] = norm = math.sqrt(max(total[2], 0.0))
    if not math.isfinite(norm) or norm <= target or i >= maxiter:
        return NORM, norm, alpha, 0.0
    beta = gamma / gamma_old
    denominator = delta - beta / alpha * gamma
    if not (math.isfinite(denominator) and denominator > 0.0):
        return CURVATURE, denominator, alpha, beta
    if not (math.isfinite(gamma) and gamma > 0.0):
        return BREAKDOWN, gamma, alpha, beta
    return GOING, 0.0, gamma / denominator, beta


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pipecg_iterations(indptr, split, indices, values, halo, x, r, u, w, m, n, z, q, p, s, pc, state, out, bounds,
                      before, target, i, maxiter, history, distributed, m_all, exchange, functions, handles):
    """Iterations from the top of :func:`.krylov.pipecg`'s loop at iteration ``i >= 1`` with a
    pointwise preconditioner (``pc``: :func:`precondition`'s), ``state = [alpha, beta,
    gamma_old]`` and ``out`` (the 10 sums of the last update): each sum started
    (``MPI_Iallreduce``) and in flight while ``n = A m`` is computed (``m = B w`` was fused into
    the update), then the step lengths, the update and, with ``bounds[0] >= 0``
    (:func:`bounds_after_update`'s state; ``before``: the norms at the last top), the
    residual-replacement test. ``(iteration, why, value, reductions, norms written to
    history)``: :data:`NORM` (``value``: the norm tested, which decides), :data:`CURVATURE`
    (the step's denominator), :data:`BREAKDOWN` (``(r, B r)``), :data:`REPLACE` (iteration
    ``i - 1`` asks for residual replacement: Python replaces, then calls again) or :data:`GOING`
    (``history`` full). The same passes, sums and decisions as the Python loop, bit for bit."""
    dinv = pc[0]
    alpha, beta, gamma_old = state[0], state[1], state[2]
    total, now = np.zeros(len(out)), np.zeros(9)
    request, status = np.zeros(1, np.int32), np.zeros(64, np.uint8)
    done = 0
    for k in range(len(history)):
        alpha_old, beta_old = alpha, beta
        why, value, alpha, beta = _pipelined_top(distributed, functions, handles, out, total, request, status,
                                                 indptr, split, indices, values, halo, m_all, n, exchange, history,
                                                 k, i, gamma_old, alpha, target, maxiter)
        done += 1
        if why != GOING:
            return i, why, value, done, k + (why != COMMUNICATION)
        gamma_old = total[0]
        pipecg_update(alpha, beta, n, m, u, w, z, q, p, s, x, r, dinv, out)
        replace = False
        if bounds[0] >= 0.0:
            now[0] = now[1] = math.sqrt(max(total[2], 0.0))
            for j in range(7):
                now[2 + j] = math.sqrt(max(total[3 + j], 0.0))
            replace = bounds_after_update(bounds, i, now, before, alpha_old, beta_old)
            before[:] = now
        i += 1
        state[0], state[1], state[2] = alpha, beta, gamma_old
        if replace:
            return i, REPLACE, 0.0, done, k + 1
    return i, GOING, 0.0, done, len(history)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def pipecr_iterations(indptr, split, indices, values, halo, x, u, w, m, n, z, q, p, pc, state, out, target, i,
                      maxiter, history, distributed, m_all, exchange, functions, handles):
    """Iterations from the top of :func:`.krylov.pipecr`'s loop at iteration ``i >= 1`` with a
    pointwise preconditioner, ``state = [alpha, gamma_old]`` and ``out`` (the 3 sums of the
    last update), as :func:`pipecg_iterations` (no residual replacement): the same passes, sums
    and decisions as the Python loop, bit for bit. :data:`CURVATURE`: the step's denominator;
    :data:`BREAKDOWN`: ``(A u, u)``."""
    dinv = pc[0]
    alpha, gamma_old = state[0], state[1]
    total = np.zeros(len(out))
    request, status = np.zeros(1, np.int32), np.zeros(64, np.uint8)
    done = 0
    for k in range(len(history)):
        why, value, alpha, beta = _pipelined_top(distributed, functions, handles, out, total, request, status,
                                                 indptr, split, indices, values, halo, m_all, n, exchange, history,
                                                 k, i, gamma_old, alpha, target, maxiter)
        done += 1
        if why != GOING:
            return i, why, value, done, k + (why != COMMUNICATION)
        gamma_old = total[0]
        pipecr_update(alpha, beta, n, m, u, w, z, q, p, x, dinv, out)
        i += 1
        state[0], state[1] = alpha, gamma_old
    return i, GOING, 0.0, done, len(history)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def groppcg_iterations(indptr, split, indices, values, halo, x, r, z, p, s, q, w, pc, state, stall, out, target, i,
                       maxiter, history, distributed, z_all, exchange, functions, handles):
    """Iterations from the top of :func:`.krylov.groppcg`'s loop at iteration ``i`` (``state =
    [gamma, delta]``, the last ``(r, B r)`` and ``(p, A p)``; ``q = B s`` applied) with any
    compiled preconditioner (``pc``: :func:`precondition`'s): per iteration the update, then
    ``[(r, z), (z, z)]`` summed (``MPI_Iallreduce``) while ``w = A z`` is computed, the direction,
    then ``(p, s)`` summed while ``q = B s`` is applied. ``(iteration, why, value, reductions,
    norms written to history)`` as :func:`pipecg_iterations`; :data:`CURVATURE`: ``(p, A p)``,
    :data:`BREAKDOWN`: ``(r, B r)``, :data:`STALLED` (``stall``: :func:`stalled`'s). The same
    passes, sums and decisions as the Python loop, bit for bit."""
    gamma, delta = state[0], state[1]
    mine, total = np.zeros(2), np.zeros(2)
    request, status = np.zeros(1, np.int32), np.zeros(64, np.uint8)
    done = 0
    for k in range(len(history)):
        if not (math.isfinite(delta) and delta > 0.0):
            return i, CURVATURE, delta, done, k
        gropp_update(gamma / delta, p, s, q, x, r, z, out)
        mine[0], mine[1] = out[0], out[1]
        error = _started(distributed, functions, handles, mine, total, request)
        product = _product(distributed, functions, handles, indptr, split, indices, values, halo, z_all, w,
                           exchange) if error == 0 else 0
        waited = _waited(distributed, functions, request, status) if error == 0 else 0
        done += 1
        error = error or product or waited
        if error:
            return i, COMMUNICATION, float(error), done, k
        gamma_new = total[0]
        i += 1
        history[k] = norm = math.sqrt(max(total[1], 0.0))
        if not math.isfinite(norm) or norm <= target or i >= maxiter:
            return i, NORM, norm, done, k + 1
        if not (math.isfinite(gamma_new) and gamma_new > 0.0):
            return i, BREAKDOWN, gamma_new, done, k + 1
        if stalled(stall, i, norm):
            return i, STALLED, norm, done, k + 1
        gropp_direction(gamma_new / gamma, z, w, p, s, out)
        gamma = gamma_new
        error = _started(distributed, functions, handles, out[:1], total[:1], request)
        if error == 0:
            precondition(pc, s, q)
            error = _waited(distributed, functions, request, status)
        done += 1
        if error:
            return i, COMMUNICATION, float(error), done, k + 1
        delta = total[0]
        state[0], state[1] = gamma, delta
    return i, GOING, 0.0, done, len(history)
