"""Compiled sparse-matrix kernels on compressed sparse rows (CSR) whose rows are split in
two: the entries ``indptr[r]:split[r]`` (columns this rank owns) and ``split[r]:indptr[r+1]``
(halo columns). :func:`csr_owned` runs while the halo values travel, :func:`csr_halo` after.
The preconditioners work on the owned block alone: :func:`owned_block` copies it out,
:func:`ilu0` / :func:`ilu0_solve` factor and apply its ILU(0), :func:`gauss_seidel_factors` gives
a symmetric Gauss-Seidel sweep as factors of the same layout (:func:`split_factors`,
:func:`ilu_apply`).

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
import numpy as np

from ..comm.by_address import finish_exchange, progress_all, start_exchange

__all__ = ["csr_owned", "csr_halo", "csr_product_dot", "csr_product_dots", "csr_product_scaled_dots", "csr_rows",
           "csr_sequence", "csr_spans", "sequence_on_ranks", "add_scaled",
           "scaled_values", "largest_row_sum", "same_values", "scatter_add", "scatter_set", "gauss_seidel_factors",
           "owned_block", "ilu0", "ilu0_solve", "split_factors", "ilu_apply"]

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_inline = numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")  # inlined in Numba's IR


@_jit
def csr_owned(indptr, split, indices, values, x, y):
    """``y[r] = sum of values[k] * x[indices[k]]`` over the owned-column entries of row ``r``.

    Unsigned ``indices`` are fastest (no negative-index wraparound test per entry)."""
    for r in range(len(split)):
        y[r] = _running_sum(0.0, indptr[r], split[r], indices, values, x)


@_inline
def _running_sum(total, k, end, indices, values, x):
    """``total`` with ``values[k] * x[indices[k]]`` added one by one for ``k`` up to ``end``."""
    while k < end:
        total += values[k] * x[indices[k]]
        k += 1
    return total


@_inline
def _product_row(indptr, split, indices, values, halo, x, y, r):
    """Row ``r`` of ``y = A x``, stored in ``y[r]`` and returned: without ``halo`` its
    owned-column entries as :func:`csr_owned` sums them; with ``halo`` its halo-column entries
    added to the ``y[r]`` that :func:`csr_owned` made, as :func:`csr_halo` adds them."""
    if halo:
        total = _running_sum(y[r], split[r], indptr[r + 1], indices, values, x)
    else:
        total = _running_sum(0.0, indptr[r], split[r], indices, values, x)
    y[r] = total
    return total


@_jit
def csr_product_dot(indptr, split, indices, values, halo, x, y):
    """The product's last pass as :func:`csr_product_dots` makes it, and ``(x, y)`` over this
    rank's rows (returned, the bits of :func:`~meshchain.linalg.fused.dot` after the product):
    CG's ``(p, A p)``.

    >>> indptr, split = np.array([0, 2, 3]), np.array([2, 3])
    >>> y = np.zeros(2)
    >>> csr_product_dot(indptr, split, np.array([0, 1, 1]), np.array([2.0, 1.0, 3.0]), False, np.ones(2), y), y.tolist()
    (6.0, [3.0, 3.0])
    """
    xy = 0.0
    for r in range(len(split)):
        total = _product_row(indptr, split, indices, values, halo, x, y, r)
        xy += x[r] * total
    return xy


@_jit
def csr_product_dots(indptr, split, indices, values, halo, x, y, a, out):
    """The product's last pass, ``y = A x`` (without ``halo``: the owned-column entries, as
    :func:`csr_owned`; with ``halo``: the halo-column entries added to what :func:`csr_owned`
    made, ``x`` holding the received halo rows, as :func:`csr_halo`), and in the same pass over
    the rows ``out = [(a, x), (x, y), (x, x)]`` over this rank's rows: the bits of the product
    followed by :func:`~meshchain.linalg.fused.dot_pairs` (each sum runs over the rows in
    order), without a second pass whose running sums wait on one another (Chronopoulos/Gear's
    ``(z, A z)``, ``(r, z)`` and ``(z, z)``).

    >>> indptr, split = np.array([0, 2, 3]), np.array([1, 3])
    >>> indices, values = np.array([0, 2, 1]), np.array([2.0, 1.0, 3.0])
    >>> x, y, out = np.array([1.0, 1.0, 10.0]), np.zeros(2), np.zeros(3)
    >>> csr_owned(indptr, split, indices, values, x, y)
    >>> csr_product_dots(indptr, split, indices, values, True, x, y, np.array([2.0, 0.0]), out)
    >>> y.tolist(), out.tolist()
    ([12.0, 3.0], [2.0, 15.0, 2.0])
    """
    ax = xy = xx = 0.0
    for r in range(len(split)):
        total = _product_row(indptr, split, indices, values, halo, x, y, r)
        xr = x[r]
        ax += a[r] * xr
        xy += xr * total
        xx += xr * xr
    out[0], out[1], out[2] = ax, xy, xx


@_jit
def csr_halo(indptr, split, indices, values, x, y):
    """``y[r] += values[k] * x[indices[k]]`` for the halo-column entries of row ``r``, added to
    ``y[r]`` one by one: after :func:`csr_owned`, each row's entries in one running sum, as
    PETSc's MPIAIJ product adds its off-diagonal block (a sum of the halo entries added at the
    end rounds differently, and Krylov methods that amplify rounding then part from PETSc's
    iterations)."""
    for r in range(len(split)):
        y[r] = _running_sum(y[r], split[r], indptr[r + 1], indices, values, x)


@_jit
def csr_product_scaled_dots(indptr, split, indices, values, halo, x, y, scale, v, a, out):
    """The product's last pass as :func:`csr_product_dots` makes it, ``v = scale y`` (a
    pointwise preconditioner, as :func:`~meshchain.linalg.fused.scale`) and ``out = [(a, v),
    (v, v)]`` over this rank's rows, in the same pass: the bits of the three passes one after
    another (BiCGStab's ``B A p`` with ``(B A p, r~)``, and ``B A s`` with its two sums).

    >>> indptr, split = np.array([0, 2, 3]), np.array([2, 3])
    >>> y, v, out = np.zeros(2), np.zeros(2), np.zeros(2)
    >>> csr_product_scaled_dots(indptr, split, np.array([0, 1, 1]), np.array([2.0, 1.0, 3.0]), False, np.ones(2), y,
    ...                         np.array([0.5, 2.0]), v, np.array([1.0, 1.0]), out)
    >>> y.tolist(), v.tolist(), out.tolist()
    ([3.0, 3.0], [1.5, 6.0], [7.5, 38.25])
    """
    av = vv = 0.0
    for r in range(len(split)):
        vr = scale[r] * _product_row(indptr, split, indices, values, halo, x, y, r)
        v[r] = vr
        av += a[r] * vr
        vv += vr * vr
    out[0], out[1] = av, vv


@_jit
def csr_rows(indptr, indices, values, targets, count, x, y, shift):
    """``y[t] = sum - shift x[t]`` with ``t = targets[r]``, for rows ``r < count``, where
    ``sum`` is the row's running sum of ``values[k] x[j]`` over its entries (owned-column ones
    first, then the halo's): ``(A - shift I) x`` on a prefix of the rows. With ``shift = 0`` the
    bits of :func:`csr_owned` then :func:`csr_halo` (subtracting 0 changes no bit). The matrix
    powers kernel's product; unsigned indices run fastest.

    >>> indptr = np.array([0, 2, 3])
    >>> indices, values = np.array([0, 2, 1]), np.array([2.0, 1.0, 3.0])
    >>> x, y = np.array([1.0, 1.0, 10.0]), np.zeros(3)
    >>> csr_rows(indptr, indices, values, np.array([2, 0]), 2, x, y, 0.0); y.tolist()
    [3.0, 0.0, 12.0]
    >>> csr_rows(indptr, indices, values, np.array([2, 0]), 2, x, y, 1.0); y.tolist()
    [2.0, 0.0, 2.0]
    """
    _shifted_rows(indptr, indices, values, targets, 0, count, x, y, shift)


@_jit
def _shifted_rows(indptr, indices, values, targets, first, end, x, y, shift):
    """:func:`csr_rows` on rows ``first..end - 1``: what every matrix powers product runs."""
    for r in range(first, end):
        total = 0.0
        k, stop = indptr[r], indptr[r + 1]
        while k < stop:
            total += values[k] * x[indices[k]]
            k += 1
        t = targets[r]
        y[t] = total - shift * x[t]


@_jit
def csr_sequence(indptr, indices, values, targets, counts, shifts, Y):
    """``Y[k] = (A - shifts[k-1] I) Y[k-1]`` on the rows ``r < counts[k-1]`` (row ``r``
    writes ``Y[k, targets[r]]``), ``k = 1..len(counts)``: a matrix powers sequence in one
    call, each product the bits of :func:`csr_rows` (every row's running sum in order).

    Not vectorised on purpose: with sums allowed to be reordered (``fastmath``) LLVM
    vectorises each row's sum with gathers, and on rows of a few entries (13 on average for
    P1 on tetrahedra) that ran 1.3x slower than the running sum (17.2 against 13.1 µs a
    product of 2197 rows and 29 053 entries, AMD EPYC; PETSc's ``MatMult`` 15.0).

    >>> indptr, indices, values = np.array([0, 2, 3]), np.array([0, 1, 1]), np.array([2.0, 1.0, 3.0])
    >>> Y = np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    >>> csr_sequence(indptr, indices, values, np.array([0, 1]), np.array([2, 2]), np.array([0.0, 1.0]), Y)
    >>> Y.tolist()
    [[1.0, 1.0], [3.0, 3.0], [6.0, 6.0]]
    """
    for k in range(1, len(counts) + 1):
        _shifted_rows(indptr, indices, values, targets, 0, counts[k - 1], Y[k - 1], Y[k], shifts[k - 1])


@_jit
def csr_spans(indptr, indices, values, targets, spans, x, y, shift):
    """:func:`csr_sequence`'s product on the rows of ``spans`` only (``(first, end)`` pairs,
    flat: rows ``first..end - 1`` of each): ``y[t] = (A x)[t] - shift x[t]`` for ``t =
    targets[r]``. Runs of rows, not a list: each run's entries are read in order.

    >>> y = np.zeros(3)
    >>> csr_spans(np.array([0, 2, 3, 4]), np.array([0, 1, 1, 2]), np.array([2.0, 1.0, 3.0, 4.0]),
    ...           np.array([0, 1, 2]), np.array([1, 3]), np.array([1.0, 1.0, 1.0]), y, 0.0); y.tolist()
    [0.0, 3.0, 4.0]
    """
    for q in range(0, len(spans), 2):
        _shifted_rows(indptr, indices, values, targets, spans[q], spans[q + 1], x, y, shift)


@_jit
def sequence_on_ranks(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr, indices,
                      values, targets, spans, at, shifts, Y):
    """:func:`csr_sequence` of ``x`` on several ranks with its halo exchange, in one call
    (``functions``: the MPI library's addresses, :func:`meshchain.comm.compiled.addresses`;
    the exchange: :class:`meshchain.comm.compiled.CompiledExchange`'s arrays): ``Y[0] = x``,
    the exchange of ``x`` started, every product's rows that need no received value (``spans``
    between ``at[2k]`` and ``at[2k + 1]``: :func:`meshchain.engine.powers.rows_before_arrival`)
    computed while its messages travel (``MPI_Testall`` after each product, so that a library
    moving messages only inside MPI calls moves them meanwhile), then the received rows into
    ``x`` and ``Y[0]`` and the rest of every product. Each product has the bits of
    :func:`csr_sequence`'s. Returns the MPI error code."""
    Y[0, :len(x)] = x  # the owned rows; the halo rows are stale until the messages arrive
    error = start_exchange(functions, x, send_at, send, requests)
    steps = (len(at) - 1) // 2
    for k in range(steps):  # what needs no received value, product by product, the messages moved between
        csr_spans(indptr, indices, values, targets, spans[at[2 * k]:at[2 * k + 1]], Y[k], Y[k + 1], shifts[k])
        error = error or progress_all(functions, requests, flag, statuses)
    error = error or finish_exchange(functions, x, receive_at, receive, requests, statuses)
    for k in range(len(receive_at)):
        Y[0, receive_at[k]] = x[receive_at[k]]
    for k in range(steps):
        csr_spans(indptr, indices, values, targets, spans[at[2 * k + 1]:at[2 * k + 2]], Y[k], Y[k + 1], shifts[k])
    return error


@_jit
def add_scaled(targets, count, source, factor, y):
    """``y[t] += factor source[t]`` for ``t = targets[r]``, ``r < count`` (the rows
    :func:`csr_rows` wrote).

    >>> y = np.ones(3); add_scaled(np.array([2, 0]), 2, np.array([1.0, 2.0, 3.0]), 0.5, y); y.tolist()
    [1.5, 1.0, 2.5]
    """
    for r in range(count):
        t = targets[r]
        y[t] += factor * source[t]


@_jit
def scaled_values(indptr, indices, values, targets, scale, out):
    """``out[k] = scale[t] values[k] scale[j]`` for entry ``k`` of row ``r`` (``t = targets[r]``,
    ``j`` its column): the rows of ``S A S`` for a diagonal ``S``.

    >>> out = np.zeros(3)
    >>> scaled_values(np.array([0, 2, 3]), np.array([0, 2, 1]), np.array([2.0, 1.0, 3.0]), np.array([2, 0]),
    ...               np.array([1.0, 2.0, 3.0]), out); out.tolist()
    [6.0, 9.0, 6.0]
    """
    for r in range(len(indptr) - 1):
        row = scale[targets[r]]
        for k in range(indptr[r], indptr[r + 1]):
            out[k] = row * values[k] * scale[indices[k]]


@_jit
def largest_row_sum(indptr, values):
    """The largest sum of absolute values over the rows of a CSR matrix (0.0 without rows; NaN
    where a row's is): its infinity norm.

    >>> largest_row_sum(np.array([0, 2, 3]), np.array([2.0, -3.0, 4.0]))
    5.0
    """
    largest = 0.0
    for r in range(len(indptr) - 1):
        total = 0.0
        for k in range(indptr[r], indptr[r + 1]):
            total += abs(values[k])
        if total != total:
            return total
        if total > largest:
            largest = total
    return largest


@_jit
def same_values(a, b):
    """Whether the 1-D arrays ``a`` and ``b`` hold equal values (``np.array_equal``: a NaN
    equals nothing), compiled: a check before every matrix powers run costs no NumPy call.

    >>> same_values(np.array([1.0, 2.0]), np.array([1.0, 2.0])), same_values(np.array([np.nan]), np.array([np.nan]))
    (True, False)
    """
    if len(a) != len(b):
        return False
    for i in range(len(a)):
        if a[i] != b[i]:
            return False
    return True


@_jit
def gauss_seidel_factors(indptr, indices, values):
    """The factors of one symmetric Gauss-Seidel sweep, ``M = (D + L) D^-1 (D + U)``, on a
    square CSR matrix whose rows have sorted columns, in place in ``values``: ``L D^-1``
    (unit diagonal, not stored) strictly below the diagonal, ``D + U`` on and above it, as
    :func:`ilu0` leaves its factors (so :func:`split_factors` and :func:`ilu_apply` apply
    ``M^-1``: forward ``(D + L) t = r``, then backward ``(D + U) z = D t``). Returns every
    row's diagonal position (-1: none stored; nothing is scaled by it).

    >>> indptr, indices = np.array([0, 2, 4]), np.array([0, 1, 0, 1])
    >>> values = np.array([2.0, -1.0, -1.0, 4.0])
    >>> gauss_seidel_factors(indptr, indices, values).tolist(), values.tolist()
    ([0, 3], [2.0, -1.0, -0.5, 4.0])
    """
    n = len(indptr) - 1
    diagonal = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        for k in range(indptr[i], indptr[i + 1]):
            if indices[k] == i:
                diagonal[i] = k
    for i in range(n):
        for k in range(indptr[i], indptr[i + 1]):
            j = indices[k]
            if j < i and diagonal[j] >= 0:
                values[k] /= values[diagonal[j]]
    return diagonal


@_jit
def owned_block(indptr, split, indices, values):
    """The owned block of the split CSR (its owned-column entries only) as plain CSR:
    ``(indptr, indices, values)``, copies."""
    n = len(split)
    block_ptr = np.zeros(n + 1, dtype=np.int64)
    for r in range(n):
        block_ptr[r + 1] = block_ptr[r] + (split[r] - indptr[r])
    block_indices = np.empty(block_ptr[n], dtype=np.int64)
    block_values = np.empty(block_ptr[n])
    for r in range(n):
        k = block_ptr[r]
        for m in range(indptr[r], split[r]):
            block_indices[k] = indices[m]
            block_values[k] = values[m]
            k += 1
    return block_ptr, block_indices, block_values


@_jit
def ilu0(indptr, indices, values, zero_pivot):
    """ILU(0) of a square CSR matrix whose rows have sorted columns, in place in ``values``
    (natural ordering, no fill: ``L`` (unit diagonal, not stored) strictly below the
    diagonal, ``U`` on and above it, both on the matrix's pattern).

    Returns ``(diagonal, row)``: the position of every row's diagonal entry, and the first
    row whose pivot is zero (missing, not finite, or ``|pivot| <= zero_pivot * rs`` with
    ``rs`` the row's absolute sum before factoring, as PETSc's zero-pivot test), or -1."""
    n = len(indptr) - 1
    diagonal = np.full(n, -1, dtype=np.int64)
    marker = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        start, end = indptr[i], indptr[i + 1]
        rs = 0.0
        for k in range(start, end):
            marker[indices[k]] = k
            rs += abs(values[k])
        k = start
        while k < end and indices[k] < i:
            j = indices[k]
            factor = values[k] / values[diagonal[j]]
            values[k] = factor
            for m in range(diagonal[j] + 1, indptr[j + 1]):
                p = marker[indices[m]]
                if p >= 0:
                    values[p] -= factor * values[m]
            k += 1
        for m in range(start, end):
            marker[indices[m]] = -1
        if k < end and indices[k] == i:
            diagonal[i] = k
        pivot = values[k] if diagonal[i] >= 0 else 0.0
        if not (abs(pivot) > zero_pivot * rs) or not np.isfinite(pivot):
            return diagonal, i
    return diagonal, -1


@_jit
def ilu0_solve(indptr, indices, values, diagonal, inverse, r, z):
    """``z = (L U)^-1 r`` with the factors :func:`ilu0` left in ``values``: ``L y = r``
    forward, then ``U z = y`` backward (``z`` holds ``y`` in between); ``inverse``: the
    inverted pivots (a multiplication in the dependent chain, not a division)."""
    n = len(diagonal)
    for i in range(n):
        s = r[i]
        for k in range(indptr[i], diagonal[i]):
            s -= values[k] * z[indices[k]]
        z[i] = s
    for i in range(n - 1, -1, -1):
        s = z[i]
        for k in range(diagonal[i] + 1, indptr[i + 1]):
            s -= values[k] * z[indices[k]]
        z[i] = s * inverse[i]


@_jit
def split_factors(indptr, indices, values, diagonal):
    """The factors :func:`ilu0` left, laid out for :func:`ilu_apply`: ``L``'s rows in order
    and ``U``'s strictly upper rows last row first, each contiguous in the order the
    solves read them (``(l_ptr, l_indices, l_values, u_ptr, u_indices, u_values)``)."""
    n = len(diagonal)
    l_ptr = np.zeros(n + 1, dtype=indptr.dtype)
    u_ptr = np.zeros(n + 1, dtype=indptr.dtype)
    for i in range(n):
        l_ptr[i + 1] = l_ptr[i] + (diagonal[i] - indptr[i])
        row = n - 1 - i
        u_ptr[i + 1] = u_ptr[i] + (indptr[row + 1] - diagonal[row] - 1)
    l_indices, l_values = np.empty(l_ptr[n], dtype=indices.dtype), np.empty(l_ptr[n])
    u_indices, u_values = np.empty(u_ptr[n], dtype=indices.dtype), np.empty(u_ptr[n])
    for i in range(n):
        k = l_ptr[i]
        for m in range(indptr[i], diagonal[i]):
            l_indices[k], l_values[k] = indices[m], values[m]
            k += 1
        row = n - 1 - i
        k = u_ptr[i]
        for m in range(diagonal[row] + 1, indptr[row + 1]):
            u_indices[k], u_values[k] = indices[m], values[m]
            k += 1
    return l_ptr, l_indices, l_values, u_ptr, u_indices, u_values


@_jit
def ilu_apply(l_ptr, l_indices, l_values, u_ptr, u_indices, u_values, inverse, r, z):
    """``z = (L U)^-1 r`` from :func:`split_factors`' layout: ``L y = r`` forward, ``U z =
    y`` backward (``inverse``: the inverted pivots)."""
    n = len(inverse)
    for i in range(n):
        s = r[i]
        for k in range(l_ptr[i], l_ptr[i + 1]):
            s -= l_values[k] * z[l_indices[k]]
        z[i] = s
    for j in range(n):
        i = n - 1 - j
        s = z[i]
        for k in range(u_ptr[j], u_ptr[j + 1]):
            s -= u_values[k] * z[u_indices[k]]
        z[i] = s * inverse[i]


@_jit
def scatter_add(target, positions, source, picks):
    """``target[positions[k]] += source[picks[k]]`` for every ``k``, in order."""
    for k in range(len(positions)):
        target[positions[k]] += source[picks[k]]


@_jit
def scatter_set(target, positions, source, picks):
    """``target[positions[k]] = source[picks[k]]`` for every ``k``, in order (the last write of
    an entry stays)."""
    for k in range(len(positions)):
        target[positions[k]] = source[picks[k]]
