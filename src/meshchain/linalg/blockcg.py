"""s-step CG in block form (``method="sstep-cg"``): ``s`` iterations from ``s`` products, one
halo exchange and one reduction.

Chronopoulos and Gear's s-step CG takes, per outer iteration, a block of ``s`` search
directions at once: from the residual ``r`` the matrix powers kernel
(:mod:`meshchain.engine.powers`) builds ``V = [v_0 = r, v_1, ..., v_s]``, ``v_{j+1} = (Â -
θ_j) v_j``, in one exchange ``s`` layers deep; with ``R = [v_0 .. v_{s-1}]`` and ``Â R``
(``Â v_j = v_{j+1} + θ_j v_j``, no product),

* ``P = R + P_old B`` with ``B = -W_old⁻¹ (Â P_old)ᵀ R`` (``P`` ``Â``-conjugate to the last block),
* ``Â P = Â R + Â P_old B`` (no product),
* ``W = Pᵀ Â P = Rᵀ Â R + ((Â P_old)ᵀ R)ᵀ B`` and ``g = Pᵀ r = Rᵀ r``,
* ``x += P a`` and ``r -= Â P a`` with ``W a = g``.

Every number this needs (``Rᵀ V``, ``(Â P_old)ᵀ R`` and the residual's norm) is one
``Allreduce``. In exact arithmetic ``x`` after ``k`` outer iterations is CG's after ``k s``
iterations; the residual's norm is known every ``s`` iterations (the convergence test reads
the Gram matrix of the next outer iteration), so the iterations are CG's rounded up to a
multiple of ``s``. Where the last two norms' ratio predicts the tolerance met, the norm is
reduced alone first (one number), so that the solve's last basis is not built in vain.
Against CA-CG (:mod:`.sstep`, ``method="ca-cg"``, ``2s - 1`` products and a Gram matrix of
``2s + 1`` vectors) it does ``s`` products and two thirds of the dot products per ``s``
iterations (a third of the sums with Jacobi, where CA-CG sums each pair twice). A
matrix-free :class:`~meshchain.LinearOperator` runs each basis as one communication-avoiding
loop chain (:mod:`.freecg`).

**On several ranks** (where compiled code can call the MPI library,
:func:`meshchain.comm.compiled.addresses`) the outer iterations run inside compiled calls,
several per call (:func:`block_iterations`): the basis with its exchange, the block's sums and
their sum over ranks by recursive doubling, the norm's test, the coefficients and the update,
and the test of progress, returning to Python only where Python decides (a norm that meets the
tolerance or rose, a ``W`` not positive definite, no progress for a while, the last block
before ``maxiter``, a residual expected to converge). They call what the Python steps call, in
the same order: the same bits. A solve with a ``monitor``, a matrix-free operator or on one
process runs each outer iteration from Python.

**Basis.** The Newton shifts ``θ`` come from the Ritz values of ``s`` classical CG
iterations at the start (they count), in Leja order; their directions are the block the
first outer iteration makes its own ``Â``-conjugate to. ``basis="monomial"`` takes ``θ = 0``.
The small systems are solved by Cholesky factorisation; a pivot below
:data:`PIVOT` of its diagonal entry (the block's last directions dependent on the others: a
basis losing rank) keeps the leading directions only, so that outer iteration makes fewer
iterations. The block form's attainable accuracy falls as ``s`` grows (its ``W`` is about as
ill-conditioned as the basis squared): after about 16 iterations (at least 2 outer ones)
without the residual falling 10% below its smallest, the true residual replaces it and the
directions start again from it (unless it agrees with the recursive one: then the plateau is
CG's own and the directions go on, :data:`~meshchain.linalg.sstep.ACCURATE`); where that does
not lower the true residual, ``s`` is halved
with a :class:`~meshchain.MeshchainWarning`, down to 1. **Accuracy**, **preconditioning** and the recovery from a non-positive
curvature are CA-CG's (residual replacement, the symmetric Jacobi scaling, a restart from
the true residual; see :mod:`.sstep`). ``SolveInfo.residual_history`` holds one norm per
outer iteration (and the Ritz iterations' own); the monitor is called with the iteration
count of each.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes, edges = mc.Set(30, "nodes"), mc.Set(29, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[i, i + 1] for i in range(29)], "e2n")
>>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
>>> spring = mc.Kernel.from_source("def spring(a):\\n    a[0, 0] += 2.1\\n    a[0, 1] -= 1.0\\n"
...                                "    a[1, 0] -= 1.0\\n    a[1, 1] += 2.1\\n")
>>> mc.par_loop(spring, edges, A(mc.INC, (e2n, e2n)))
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.ones(30), "b")
>>> info = mc.solve(A, x, b, method="sstep-cg", s=4, rtol=1e-10)
>>> info.converged, info.true_residual < 1e-8, len(info.residual_history) < info.iterations
(True, True, True)
"""

from __future__ import annotations

import math
import warnings

import numba
import numpy as np

from ..backends.sparse import sequence_on_ranks
from ..comm.by_address import sum_in_pairs
from ..core.errors import MeshchainWarning, SolverError
from .info import SolveInfo
from .scaled import work_dats
from .sstep import CGRun, _weighted_dot, drive

__all__ = ["solve_block", "PIVOT", "JUMP"]

JUMP = 100.0
"""A block after which the residual is this many times the one it started from is undone."""

PIVOT = 1e-10
"""A Cholesky pivot of ``W`` below this fraction of its diagonal entry ends the block there.
``W``'s sums carry rounding of about 1e-13 of their size on large ranks, so a smaller pivot
may be noise: where the Krylov space ran out inside a block (9 unknowns on 3 ranks), a pivot
of that size kept a direction made of rounding and the block ended 4 times above the
tolerance (one more block: 16 iterations to CG's 9; with this bound, 9)."""

_jit = numba.njit(cache=True, nogil=True)
_fast = numba.njit(cache=True, nogil=True, fastmath=True)  # sums may be reordered (vectorised): not bit-exact
_strict = numba.njit(cache=True, nogil=True, fastmath=False)  # said, so that a fast-math caller's flag is not taken


SUM_BLOCK = 256
"""Entries per vectorised partial sum of the block's sums, which are then added with Kahan's
compensation (:func:`_tile`)."""


@_strict
def _tile(a0, a1, rows, b0, b1, b2, b3, width, n, out, at, step, stride):
    """``out[at + r step + i stride] = a_rᵀ b_i`` for ``r < rows`` (1 or 2; ``a1`` is not read
    with 1) and ``i < width`` (1 to 4; the ``b_i`` beyond are not read), over the first ``n``
    entries, in one pass: up to eight sums from six vectors read once (against one vector and
    four, before the compensation below: 7.3 → 5.2 µs :func:`block_sums` of ``s = 4`` over 2179
    entries, AMD EPYC).

    Each sum is made of vectorised partial sums over :data:`SUM_BLOCK` entries
    (:func:`_tile_part`), added with Kahan's compensation: a block of ``s = 8`` directions
    depends on the last bits of its sums. With one vectorised running sum per product (4e-13
    relative error on long rows, against 1e-16 this way), the second solve of a Poisson
    problem (the Newton shifts kept from the first; 2 ranks) took 344-392 iterations at
    15 625 unknowns and 112-296 at 39 304, against 104 and 120 this way, where CG takes 76 and
    104. It costs 5.2 → 7.4 µs a block of ``s = 4`` over 2179 entries (15.3 → 22 for ``s = 8``);
    partial sums over 64-1024 entries gave 80-232 iterations, 256 the fewest for its cost.
    ``_strict`` says ``fastmath=False``: called from the fast-math :func:`block_sums`, Numba
    would otherwise compile it with that flag too, and the compensation is optimised away."""
    t0 = t1 = t2 = t3 = t4 = t5 = t6 = t7 = 0.0
    e0 = e1 = e2 = e3 = e4 = e5 = e6 = e7 = 0.0
    for lo in range(0, n, SUM_BLOCK):
        p0, p1, p2, p3, p4, p5, p6, p7 = _tile_part(a0, a1, rows, b0, b1, b2, b3, width, lo, min(lo + SUM_BLOCK, n))
        t0, e0 = _compensated(t0, e0, p0)
        t1, e1 = _compensated(t1, e1, p1)
        t2, e2 = _compensated(t2, e2, p2)
        t3, e3 = _compensated(t3, e3, p3)
        t4, e4 = _compensated(t4, e4, p4)
        t5, e5 = _compensated(t5, e5, p5)
        t6, e6 = _compensated(t6, e6, p6)
        t7, e7 = _compensated(t7, e7, p7)
    _put(out, at, stride, width, t0, t1, t2, t3)
    if rows == 2:
        _put(out, at + step, stride, width, t4, t5, t6, t7)


@_strict
def _compensated(total, error, value):
    """``(total + value, the new error)`` by Kahan's compensated sum (no fast-math: its order kept)."""
    y = value - error
    t = total + y
    return t, (t - total) - y


@_fast
def _tile_part(a0, a1, rows, b0, b1, b2, b3, width, lo, hi):
    """:func:`_tile`'s eight sums over entries ``lo..hi - 1``, one vectorised pass: a loop for
    each shape, so that each keeps its sums in registers (the vectors sliced first: indices
    from 0, so no wraparound test per read, which kept the loop 3.5x slower)."""
    a0, a1, b0, b1, b2, b3 = a0[lo:hi], a1[lo:hi], b0[lo:hi], b1[lo:hi], b2[lo:hi], b3[lo:hi]
    n = len(a0)
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = 0.0
    if rows == 2 and width == 4:
        for i in range(n):
            x0, x1, y0, y1, y2, y3 = a0[i], a1[i], b0[i], b1[i], b2[i], b3[i]
            s00 += x0 * y0
            s01 += x0 * y1
            s02 += x0 * y2
            s03 += x0 * y3
            s10 += x1 * y0
            s11 += x1 * y1
            s12 += x1 * y2
            s13 += x1 * y3
    elif rows == 2 and width == 3:
        for i in range(n):
            x0, x1, y0, y1, y2 = a0[i], a1[i], b0[i], b1[i], b2[i]
            s00 += x0 * y0
            s01 += x0 * y1
            s02 += x0 * y2
            s10 += x1 * y0
            s11 += x1 * y1
            s12 += x1 * y2
    elif rows == 2 and width == 2:
        for i in range(n):
            x0, x1, y0, y1 = a0[i], a1[i], b0[i], b1[i]
            s00 += x0 * y0
            s01 += x0 * y1
            s10 += x1 * y0
            s11 += x1 * y1
    elif rows == 2:
        for i in range(n):
            s00 += a0[i] * b0[i]
            s10 += a1[i] * b0[i]
    elif width == 4:
        for i in range(n):
            x0 = a0[i]
            s00 += x0 * b0[i]
            s01 += x0 * b1[i]
            s02 += x0 * b2[i]
            s03 += x0 * b3[i]
    elif width == 3:
        for i in range(n):
            x0 = a0[i]
            s00 += x0 * b0[i]
            s01 += x0 * b1[i]
            s02 += x0 * b2[i]
    elif width == 2:
        for i in range(n):
            s00 += a0[i] * b0[i]
            s01 += a0[i] * b1[i]
    else:
        for i in range(n):
            s00 += a0[i] * b0[i]
    return s00, s01, s02, s03, s10, s11, s12, s13


@_fast
def _put(out, at, stride, width, s0, s1, s2, s3):
    """``out[at + i stride] = s_i`` for ``i < width``."""
    out[at] = s0
    if width > 1:
        out[at + stride] = s1
    if width > 2:
        out[at + 2 * stride] = s2
    if width > 3:
        out[at + 3 * stride] = s3


@_fast
def block_sums(Y, m, AQ, count, w, weighted, out):
    """Into ``out``: ``Rᵀ V`` (``m × (m + 1)``, row-major; ``V = Y[:m + 1]``, ``R = Y[:m]``),
    ``(Â P_old)ᵀ R`` (``count × m``; ``Â P_old = AQ[:count]``) and ``v_0ᵀ diag(w) v_0`` (or
    ``v_0ᵀ v_0`` unweighted), over the first ``n = len(w)`` entries of each row: the numbers
    of one outer iteration's reduction. Two rows of ``R`` at a time against up to four others
    in one pass (:func:`_tile`; of ``Rᵀ V`` the upper triangle, and the entry below the
    diagonal of each pair of rows, then mirrored)."""
    n, width = len(w), m + 1
    for a in range(0, m, 2):
        rows, c = min(2, m - a), a
        while c < width:  # Y[a], Y[a + 1] against Y[c .. c + 3]
            k = min(4, width - c)
            _tile(Y[a], Y[a + rows - 1], rows, Y[c], Y[min(c + 1, m)], Y[min(c + 2, m)], Y[min(c + 3, m)], k, n, out,
                  a * width + c, width, 1)
            c += k
    for a in range(m):
        for c in range(a + 1, m):
            out[c * width + a] = out[a * width + c]
    base, last = m * width, max(count - 1, 0)
    for a in range(0, m, 2):  # AQ[k]ᵀ Y[a] into out[base + k m + a]
        rows, k = min(2, m - a), 0
        while k < count:
            q = min(4, count - k)
            _tile(Y[a], Y[a + rows - 1], rows, AQ[k], AQ[min(k + 1, last)], AQ[min(k + 2, last)], AQ[min(k + 3, last)],
                  q, n, out, base + k * m + a, 1, m)
            k += q
    if weighted:
        y, total = Y[0], 0.0
        for i in range(n):
            total += y[i] * y[i] * w[i]
        out[base + count * m] = total
    else:
        out[base + count * m] = out[0]


@_jit
def cholesky(W, m, L):
    """``L Lᵀ = W[:k, :k]`` for the largest ``k <= m`` whose pivots are at least :data:`PIVOT`
    of their diagonal entries; returns ``k``."""
    for j in range(m):
        d = W[j, j]
        for k in range(j):
            d -= L[j, k] * L[j, k]
        if not d > PIVOT * abs(W[j, j]):
            return j
        L[j, j] = math.sqrt(d)
        for i in range(j + 1, m):
            e = W[i, j]
            for k in range(j):
                e -= L[i, k] * L[j, k]
            L[i, j] = e / L[j, j]
    return m


@_jit
def cholesky_solve(L, m, b):
    """``b = (L Lᵀ)⁻¹ b`` on the first ``m`` entries."""
    for i in range(m):
        for k in range(i):
            b[i] -= L[i, k] * b[k]
        b[i] /= L[i, i]
    for i in range(m - 1, -1, -1):
        for k in range(i + 1, m):
            b[i] -= L[k, i] * b[k]
        b[i] /= L[i, i]


@_jit
def coefficients(sums, m, count, shifts, old, B, W, L, a):
    """From one reduction's ``sums`` (:func:`block_sums`): ``B`` (``count × m``), ``W``, its
    factor ``L`` and ``a``; returns the directions kept (0: ``W`` not positive definite)."""
    width = m + 1
    for i in range(m):
        for j in range(m):
            W[i, j] = 0.5 * (sums[i * width + j + 1] + shifts[j] * sums[i * width + j]
                             + sums[j * width + i + 1] + shifts[i] * sums[j * width + i])
    column = np.empty(count)
    for j in range(m):
        for k in range(count):
            column[k] = -sums[m * width + k * m + j]
        cholesky_solve(old, count, column)
        for k in range(count):
            B[k, j] = column[k]
    for i in range(m):  # + ((Â P_old)ᵀ R)ᵀ B, symmetrised
        for j in range(i, m):
            extra = 0.0
            for k in range(count):
                extra += 0.5 * (sums[m * width + k * m + i] * B[k, j] + sums[m * width + k * m + j] * B[k, i])
            W[i, j] += extra
            if j > i:
                W[j, i] = W[i, j]
    kept = cholesky(W, m, L)
    for j in range(kept):
        a[j] = sums[j * width]  # g = Rᵀ r
    cholesky_solve(L, kept, a)
    return kept


@_jit
def block_update(Y, shifts, kept, P_old, AQ_old, count, B, a, P, AQ, x, r):
    """``P = R + P_old B``, ``Â P = Â R + Â P_old B`` (``kept`` columns), ``x += P a``,
    ``r -= Â P a``, over the first ``n = len(x)`` entries of each row.

    Each entry of column ``j`` is made in this order: ``p = y_j``, ``q = y_{j+1} + θ_j y_j``,
    then ``p += B[k, j] p_old_k`` and ``q += B[k, j] q_old_k`` for ``k = 0, 1, ...``, then
    ``x += a_j p`` and ``r -= a_j q``. The old directions are added four at a time in one pass
    (:func:`_four_directions`: the first pass also makes ``p`` and ``q``, the last one also
    updates ``x`` and ``r``), the rest two and then one at a time, so that ``p`` and ``q`` are
    read and written once per four old directions, not once per direction (22 → 11 µs a block
    for ``s = 4`` over 2179 entries, 60 → 34 for ``s = 8``; AMD EPYC): the same bits as one
    pass per operation (``tests/test_sstep.py``)."""
    whole = count - count % 4  # old directions taken four at a time; the rest two, then one at a time
    for j in range(kept):
        p, q, y, z, theta, step = P[j], AQ[j], Y[j], Y[j + 1], shifts[j], a[j]
        if whole == 0:
            _directions_begun(p, q, y, z, theta, len(x))
        for k in range(0, whole, 4):
            _four_directions(p, q, y, z, theta, B[k:k + 4, j], P_old[k:k + 4], AQ_old[k:k + 4], k == 0,
                             k + 4 == count, step, x, r)
        for k in range(whole, count - 1, 2):
            _two_directions(p, q, B[k, j], B[k + 1, j], P_old[k], P_old[k + 1], AQ_old[k], AQ_old[k + 1], len(x))
        if (count - whole) % 2:
            _one_direction(p, q, B[count - 1, j], P_old[count - 1], AQ_old[count - 1], len(x))
        if whole != count or count == 0:
            _stepped(x, r, step, p, q)


@_jit
def _directions_begun(p, q, y, z, theta, n):
    """``p = y``, ``q = z + θ y`` (over the first ``n`` entries)."""
    for i in range(n):
        p[i] = y[i]
        q[i] = z[i] + theta * y[i]


@_jit
def _one_direction(p, q, factor, po, qo, n):
    """``p += factor po``, ``q += factor qo`` (over the first ``n`` entries)."""
    for i in range(n):
        p[i] += factor * po[i]
        q[i] += factor * qo[i]


@_jit
def _two_directions(p, q, f0, f1, p0, p1, q0, q1, n):
    """``p += f0 p0``, then ``+= f1 p1``; ``q`` alike (one pass over the first ``n`` entries)."""
    for i in range(n):
        p[i] = (p[i] + f0 * p0[i]) + f1 * p1[i]
        q[i] = (q[i] + f0 * q0[i]) + f1 * q1[i]


@_jit
def _stepped(x, r, step, p, q):
    """``x += step p``, ``r -= step q``."""
    for i in range(len(x)):
        x[i] += step * p[i]
        r[i] -= step * q[i]


@_jit
def _four_directions(p, q, y, z, theta, f, po, qo, first, last, step, x, r):
    """Four old directions (``f``: their factors, ``po``, ``qo``: their rows) added to ``p`` and
    ``q`` in one pass; ``first``: ``p`` and ``q`` made from ``y`` and ``z`` in it
    (:func:`_directions_begun`), ``last``: ``x`` and ``r`` updated in it (:func:`_stepped`). Each
    entry's operations in :func:`block_update`'s order; a loop for each case, so that each is
    vectorised."""
    f0, f1, f2, f3 = f[0], f[1], f[2], f[3]
    p0, p1, p2, p3, q0, q1, q2, q3 = po[0], po[1], po[2], po[3], qo[0], qo[1], qo[2], qo[3]
    n = len(x)
    if first and last:
        for i in range(n):
            u, v = y[i], z[i] + theta * y[i]
            u, v = ((((u + f0 * p0[i]) + f1 * p1[i]) + f2 * p2[i]) + f3 * p3[i],
                    (((v + f0 * q0[i]) + f1 * q1[i]) + f2 * q2[i]) + f3 * q3[i])
            p[i], q[i] = u, v
            x[i] += step * u
            r[i] -= step * v
    elif first:
        for i in range(n):
            u, v = y[i], z[i] + theta * y[i]
            p[i] = (((u + f0 * p0[i]) + f1 * p1[i]) + f2 * p2[i]) + f3 * p3[i]
            q[i] = (((v + f0 * q0[i]) + f1 * q1[i]) + f2 * q2[i]) + f3 * q3[i]
    elif last:
        for i in range(n):
            u = (((p[i] + f0 * p0[i]) + f1 * p1[i]) + f2 * p2[i]) + f3 * p3[i]
            v = (((q[i] + f0 * q0[i]) + f1 * q1[i]) + f2 * q2[i]) + f3 * q3[i]
            p[i], q[i] = u, v
            x[i] += step * u
            r[i] -= step * v
    else:
        for i in range(n):
            p[i] = (((p[i] + f0 * p0[i]) + f1 * p1[i]) + f2 * p2[i]) + f3 * p3[i]
            q[i] = (((q[i] + f0 * q0[i]) + f1 * q1[i]) + f2 * q2[i]) + f3 * q3[i]


@_jit
def block_advance(Y, shifts, sums, m, old, B, W, L, a, P_old, AQ_old, count, P, AQ, x, r, before):
    """After a block's reduction, in one call: ``x`` and ``r`` kept in ``before``, the
    :func:`coefficients` (``W``'s factor into ``L``) and, if some direction is kept,
    :func:`block_update`; returns the directions kept (0: ``W`` not positive definite)."""
    n = len(x)
    for i in range(n):
        before[0, i] = x[i]
        before[1, i] = r[i]
    kept = coefficients(sums, m, count, shifts, old, B, W, L, a)
    if kept:
        block_update(Y, shifts, kept, P_old, AQ_old, count, B, a, P, AQ, x, r)
    return kept


@_jit
def summed_basis(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr, indices, values,
                 targets, spans, at, shifts, Y, m, AQ, count, w, weighted, used, sums, other, pair_requests, phases,
                 pair_statuses):
    """The basis (:func:`~meshchain.backends.sparse.sequence_on_ranks`: the matrix powers
    products with their exchange; ``functions``: the MPI library's addresses), the block's sums
    and their sum over ranks in one compiled call. The sums are those :func:`block_sums` writes
    into ``sums[:used]``; the rest of ``sums`` is zeroed, and the whole of it summed
    (:func:`~meshchain.comm.by_address.sum_in_pairs` with
    :class:`~meshchain.comm.compiled.CompiledPairwiseSum`'s requests: the bits of
    :func:`~meshchain.comm.pairwise.pairwise_sum` on the first ``used``). Returns the MPI error
    codes of the exchange and of the sum."""
    error = sequence_on_ranks(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr,
                              indices, values, targets, spans, at, shifts, Y)
    if error:
        return error, 0
    block_sums(Y, m, AQ, count, w, weighted, sums[:used])
    sums[used:] = 0.0
    return 0, sum_in_pairs(functions, sums, other, pair_requests, phases, pair_statuses)


@_jit
def true_residual_sums(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr, indices,
                       values, targets, spans, at, shifts, Y, b, t, r, weight, unweight, sums):
    """What :meth:`_BlockRun.expected_norm` computes before its reduction, in one compiled
    call (``functions``: the MPI library's addresses): ``Y[1] = Â x̂`` with its exchange
    (:func:`~meshchain.backends.sparse.sequence_on_ranks`, a plan of one product), ``t = b̂ -
    Y[1]`` on the owned rows, and ``sums`` = (``r``'s and ``t``'s weighted squared norms, ``t``'s
    with ``unweight``), the bits of the same steps from Python. Returns the exchange's MPI error code."""
    error = sequence_on_ranks(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr,
                              indices, values, targets, spans, at, shifts, Y)
    for i in range(len(t)):
        t[i] = b[i] - Y[1, i]
    sums[0] = _weighted_dot(r, weight)
    sums[1] = _weighted_dot(t, weight)
    sums[2] = _weighted_dot(t, unweight)
    return error


NEXT, JUDGE, CURVATURE, IDLE, FAILED = 0, 1, 2, 3, 4
"""Why :func:`block_iterations` returned: the next outer iteration is Python's (its basis
would pass ``maxiter``, or the residual is expected to meet the tolerance: its norm is reduced
first, with the true residual's), a norm is for Python to judge (it met the tolerance, or the block is undone), the
last block's ``W`` was not positive definite, no progress for the patience's outer iterations,
an MPI call failed."""

# the places in the arrays of numbers and counts block_iterations reads and updates
_TARGET, _LAST_NORM, _BEST, _NORM, _H1, _H2, _PENDING = range(7)
_COUNT, _ITERATIONS, _IDLE, _LAST, _FRESH, _APPENDED, _REDUCTIONS, _UPDATED, _EXCHANGED, _ERROR, _SUM_ERROR = range(11)


@_jit
def block_iterations(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr, indices,
                     values, targets, spans, at, shifts, Y, other, pair_requests, phases, pair_statuses, steps, stack,
                     factor_stack, B, W, a, w, weighted, sums, xv, rv, before, jump, progress, patience, maxiter,
                     numbers, counts, history):
    """Outer iterations of :class:`_BlockRun` on several ranks in one compiled call
    (``functions``: the MPI library's addresses): each as :meth:`_BlockRun.outer` makes it
    (:func:`summed_basis`, the norm judged, :func:`block_advance`) with
    :func:`meshchain.linalg.sstep._iterate`'s test of progress after it, until something is
    for Python to do (:data:`NEXT` and the rest).
    ``numbers`` (float64: the target, the last block's starting norm, the smallest norm so far,
    the norm to judge, the history's last two, a norm Python tested since the last test of
    progress, counted in the next one) and ``counts`` (int64: the block's directions,
    the iterations, the outer iterations without progress, which block is the last, whether the
    residual is fresh, then what it did: norms appended to ``history``, reductions, blocks
    updated, whether the basis's exchange came last, MPI errors) are read and updated in place."""
    m = steps
    while True:
        count, last = counts[_COUNT], counts[_LAST]
        fresh = counts[_FRESH] != 0
        if counts[_ITERATIONS] + m > maxiter:
            return NEXT
        h1, h2 = numbers[_H1], numbers[_H2]
        if fresh and h2 > 0 and h1 * h1 / h2 <= numbers[_TARGET]:  # h2 is NaN with one norm so far
            return NEXT
        used = m * (m + 1) + count * m + 1
        error, summed = summed_basis(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr,
                                     indices, values, targets, spans, at, shifts, Y, m, stack[last, 1], count, w,
                                     weighted, used, sums, other, pair_requests, phases, pair_statuses)
        counts[_EXCHANGED] = 1
        if error or summed:
            counts[_ERROR], counts[_SUM_ERROR] = error, summed
            return FAILED
        counts[_REDUCTIONS] += 1
        recent = numbers[_PENDING]  # a norm Python tested since the last test of progress (or inf)
        if fresh:
            norm = math.sqrt(max(sums[used - 1], 0.0))
            if (count and norm > jump * numbers[_LAST_NORM]) or norm <= numbers[_TARGET]:
                numbers[_NORM] = norm
                return JUDGE
            counts[_FRESH] = 0
            history[counts[_APPENDED]] = norm
            counts[_APPENDED] += 1
            numbers[_H2], numbers[_H1] = h1, norm
            recent = min(recent, norm)
        numbers[_LAST_NORM] = numbers[_H1]
        kept = block_advance(Y, shifts, sums, m, factor_stack[last], B, W, factor_stack[1 - last], a,
                             stack[last, 0], stack[last, 1], count, stack[1 - last, 0], stack[1 - last, 1], xv, rv,
                             before)
        if kept == 0:
            return CURVATURE
        counts[_LAST], counts[_COUNT] = 1 - last, kept
        counts[_ITERATIONS] += kept
        counts[_FRESH], counts[_UPDATED], counts[_EXCHANGED] = 1, counts[_UPDATED] + 1, 0
        numbers[_PENDING] = math.inf
        if recent < progress * numbers[_BEST]:
            numbers[_BEST], counts[_IDLE] = recent, 0
        else:
            counts[_IDLE] += 1
        if counts[_IDLE] >= patience:
            counts[_IDLE] = 0
            return IDLE


class _BlockRun(CGRun):
    """One block s-step CG solve: the basis, the last block of directions and ``Â`` times it,
    the factor of its ``W``."""

    progress = 0.9  # a residual not 10% below the smallest so far is no progress

    def __init__(self, engine, A, dats: dict, steps: int, **options):
        super().__init__(engine, A, dats, **options)
        self.steps = steps
        self.stack = np.empty((2, 2, steps, self.n))  # two blocks [P, Â P]: the last one is stack[self.last]
        self.factor_stack = np.zeros((2, steps, steps))  # the factors of their W, alike
        self.last = 0
        self.count = 0  # directions in the last block (0: none)
        self.sums = np.empty(steps * (steps + 1) + steps * steps + 1)
        self.small = (np.zeros((steps, steps)), np.zeros((steps, steps)), np.zeros(steps))  # B, W, a
        self.plans, self.Y = {}, None  # the basis: its plan per length, its rows
        self.pairs = None  # the block reduction from compiled code (several ranks), made at first use
        self.before, self.last_norm = np.empty((2, self.n)), math.inf  # x and r before the last block
        self.true_ready = None  # (||B r||, ||b - A x||) of the true residual in t, for replace_residual

    @property
    def blocks(self) -> tuple:
        """``([P, Â P] of the last block, room for the next)``."""
        return self.stack[self.last], self.stack[1 - self.last]

    @property
    def factors(self) -> tuple:
        """``(the factor of the last block's W, room for the next)``."""
        return self.factor_stack[self.last], self.factor_stack[1 - self.last]

    def expected_norm(self) -> float:
        """The norm of the residual its rate says converged (:meth:`expects_convergence`),
        reduced before a basis is built for it, and in the same reduction the norms of the true
        residual ``b̂ - Â x̂`` (made into ``t``), which :meth:`replace_residual` then takes: at
        convergence one reduction fewer, for a product that is made in vain where the rate
        was wrong."""
        v = self.v
        r, t, weight = v["r"], v["t"], v["weight"]
        sums, compiled = np.empty(3), self.compiled_product()
        if compiled is None:
            self.residual("t")
            sums[:] = _weighted_dot(r, weight), _weighted_dot(t, weight), _weighted_dot(t, self.unweight)
        else:  # the product with its exchange, the residual and its sums in one compiled call: the same bits
            plan, arguments = compiled
            plan.exchanged(true_residual_sums(*arguments, v["b"], t, r, weight, self.unweight, sums))
            self.residual_made("t")
        norm, weighted, plain = (math.sqrt(max(float(value), 0.0)) for value in self.total(sums))
        self.true_ready = (weighted, plain)
        return norm

    def replace_residual(self) -> float:
        """:meth:`CGRun.replace_residual`, with the true residual :meth:`expected_norm` made
        where it was made just before (``x`` unchanged since): the same bits, no reduction."""
        ready, self.true_ready = self.true_ready, None
        if ready is None:
            return super().replace_residual()
        np.copyto(self.v["r"], self.v["t"])
        self.fresh("r")
        self.fresh_residual = False
        weighted, plain = ready
        self.exit_norms = (plain, weighted)
        return weighted

    def expects_convergence(self) -> bool:
        """Whether the residual after the last block meets the tolerance if it fell as much as
        over the block before (then its norm is tested before a basis is built for it)."""
        h = self.history
        return len(h) >= 2 and h[-2] > 0 and h[-1] * h[-1] / h[-2] <= self.target

    def judged(self, norm: float) -> str | None:
        """The residual after the last block has norm ``norm``: ``"undone"`` (it rose
        :data:`JUMP`-fold: the block is undone), ``"converged"`` or None (go on)."""
        self.fresh_residual = False
        if self.count and norm > JUMP * self.last_norm:
            self.undo()
            return "undone"
        return "converged" if self.tested(norm, self.iterations) else None

    def undo(self) -> None:
        """The last block raised the residual it started from :data:`JUMP`-fold (its
        directions' conjugacy to the block before was lost, as happens near the attainable
        accuracy): ``x`` and ``r`` go back to before it, and the next block starts without
        the last one."""
        self.exit_norms = None
        np.copyto(self.v["x"], self.before[0])
        np.copyto(self.v["r"], self.before[1])
        self.fresh("x")
        self.fresh("r")
        self.iterations -= self.count
        self.count = 0

    def basis(self, m: int, shifts: np.ndarray) -> np.ndarray:
        """``V = [r, (Â - θ_0) r, ...]`` of ``m + 1`` vectors (rows; one exchange of ``r``)."""
        self.basis_plan(m).run(shifts[:m], self.Y)
        return self.Y

    def basis_plan(self, m: int):
        """The sequence plan of a basis of ``m + 1`` vectors (made at first use: collective,
        every rank asks for the same ``m``), and the basis's rows ``self.Y``."""
        plan = self.plans.get(m)
        if plan is None:
            scale = self.dats["scale"] if self.jacobi else None
            plan = self.plans[m] = self.engine.matrices.sequence_plan(self.A, self.dats["r"], m, scale=scale)
            if self.Y is None:
                self.Y = np.empty((self.steps + 1, plan.width))
        return plan

    def outers(self, shifts: np.ndarray, best: float, idle: int, recent: float = math.inf):
        """Outer iterations on several ranks in one compiled call (:func:`block_iterations`:
        the bits of :meth:`outer` called from Python and of its test of progress; ``recent``: a
        norm :meth:`outer` tested since the last test of progress, which the first block's test
        of progress counts), until one is for Python: ``(outcome, best, idle, completed)``, the
        outcome of the last outer iteration as :meth:`outer` gives it (``"next"``: not made,
        :meth:`outer` makes it; ``"idle"``: no progress for the patience's outer iterations),
        the test of progress's smallest norm and count, and how many outer iterations
        completed. None where this
        cannot be (one process, a monitor to call for each norm, the basis's exchange not made
        from compiled code, a basis shorter than ``s`` before ``maxiter``)."""
        m = self.steps
        if (self.comm is None or self.comm.size == 1 or self.monitor is not None or self.target is None
                or self.iterations + m > self.maxiter):
            return None
        plan = self.basis_plan(m)
        arguments = plan.compiled_arguments(shifts[:m], self.Y)
        if arguments is None:
            return None
        pairs = self._pairs()
        history = self.history
        numbers = np.array([self.target, self.last_norm, best, 0.0, history[-1],
                            history[-2] if len(history) >= 2 else math.nan, recent])
        counts = np.array([self.count, self.iterations, idle, self.last, int(self.fresh_residual), 0, 0, 0, 0, 0, 0],
                          dtype=np.int64)
        appended = np.empty((self.maxiter - self.iterations) // m + 1)
        B, W, a = self.small
        why = block_iterations(*arguments, pairs.other, pairs.requests, pairs.phases, pairs.statuses, m, self.stack,
                               self.factor_stack, B, W, a, self.v["weight"], self.jacobi, self.sums, self.v["x"],
                               self.v["r"], self.before, JUMP, self.progress, self.patience(), self.maxiter, numbers,
                               counts, appended)
        history.extend(appended[:counts[_APPENDED]].tolist())
        self.reductions += int(counts[_REDUCTIONS])
        self.count, self.iterations, self.last = int(counts[_COUNT]), int(counts[_ITERATIONS]), int(counts[_LAST])
        self.fresh_residual, self.last_norm = bool(counts[_FRESH]), float(numbers[_LAST_NORM])
        if counts[_UPDATED]:
            self.exit_norms = None
            self.fresh("x")
        if counts[_EXCHANGED]:
            plan.exchanged(int(counts[_ERROR]))
        elif counts[_UPDATED]:
            self.fresh("r")
        if why == FAILED:
            self._sum_failed(int(counts[_SUM_ERROR]))
        best, idle, completed = float(numbers[_BEST]), int(counts[_IDLE]), int(counts[_UPDATED])
        if why == JUDGE:
            outcome = self.judged(float(numbers[_NORM]))
            return None if outcome == "undone" else outcome, best, idle, completed
        return {NEXT: "next", CURVATURE: "curvature", IDLE: "idle"}[why], best, idle, completed

    def _pairs(self):
        """The block's sum over ranks from compiled code (the session keeps one per length:
        its buffer becomes ``self.sums``)."""
        if self.pairs is None:
            self.pairs = self.engine.matrices.pairwise_sum(len(self.sums))
            self.sums = self.pairs.values
        return self.pairs

    def _sum_failed(self, code: int) -> None:
        from ..comm.compiled import abort_on_error

        abort_on_error(self.comm, "the block's sum over ranks inside a compiled call", code, SolverError)

    def patience(self) -> int:
        """About 16 iterations without progress (at least 2 outer iterations)."""
        return max(2, -(-16 // self.steps))

    def restart_directions(self) -> None:
        self.count = 0

    def replaced(self) -> None:
        """The directions start again from the true residual: the last block's conjugacy is
        what a block form loses first."""
        self.count = 0

    def fewer_steps(self, true: float, last_true: float) -> bool:
        """Halve ``s`` (the shifts' Leja order makes their first half a Leja sequence too) and
        start the directions again, and say so; at ``s = 1`` the solve ends as stagnated."""
        if self.steps == 1:
            return False
        before, self.steps, self.count = self.steps, self.steps // 2, 0
        warnings.warn(MeshchainWarning(
            f"solve: method='sstep-cg' with s={before}: a residual replacement did not lower the true residual "
            f"({true:.3e}, the last one {last_true:.3e}): the block's basis is too ill-conditioned for this "
            f"tolerance; going on with s={self.steps}."), stacklevel=2)
        return True

    def direction_taken(self, pap: float) -> None:
        """The Ritz iterations' directions (``Â``-conjugate) are the first block's last block."""
        if self.count == 0:
            self.factors[0].fill(0.0)
        last, k = self.blocks[0], self.count
        np.copyto(last[0][k], self.v["p"])
        np.copyto(last[1][k], self.v["t"])
        self.factors[0][k, k] = math.sqrt(pap)
        self.count += 1

    def settle(self) -> str | None:
        if not self.fresh_residual:
            return None
        self.fresh_residual = False
        return "converged" if self.tested(self.norm(self.v["r"]), self.iterations) else None

    def outer(self, shifts: np.ndarray) -> str | None:
        """One outer iteration: basis, one reduction, then ``x`` and ``r`` updated by a block of
        up to ``s`` directions. ``"converged"`` when the residual it started from met the
        tolerance (nothing updated), ``"curvature"`` when ``W`` was not positive definite,
        ``"tested"`` when the residual its rate expected to converge (:meth:`expected_norm`) did
        not: its norm is recorded, and the block is made by the next call (:meth:`outers` or
        this one), which :func:`~meshchain.linalg.sstep._iterate` counts as one step with the test."""
        m, v = min(self.steps, self.maxiter - self.iterations), self.v
        if self.fresh_residual and self.expects_convergence():  # the norm first, without a basis: one reduction
            outcome = self.judged(self.expected_norm())
            if outcome != "converged":
                self.true_ready = None
            if outcome is not None:
                return None if outcome == "undone" else outcome
            return "tested"  # the block is the next call's (compiled where it can be): the same bits
        Y = self.basis(m, shifts)
        last, following = self.blocks
        sums = self.sums[:m * (m + 1) + self.count * m + 1]
        block_sums(Y, m, last[1], self.count, v["weight"], self.jacobi, sums)
        self.total(sums)
        if self.fresh_residual:
            outcome = self.judged(math.sqrt(max(float(sums[-1]), 0.0)))
            if outcome is not None:
                return None if outcome == "undone" else outcome
        self.last_norm = self.history[-1]  # the residual this block starts from
        B, W, a = self.small
        kept = block_advance(Y, shifts, sums, m, self.factors[0], B, W, self.factors[1], a, last[0], last[1],
                             self.count, following[0], following[1], v["x"], v["r"], self.before)
        if kept == 0:
            return "curvature"
        self.exit_norms = None
        self.last = 1 - self.last
        self.count = kept
        self.iterations += kept
        self.fresh("x")
        self.fresh("r")
        self.fresh_residual = True
        return None


def solve_block(engine, A, x, b, *, steps, basis, pc, rtol, atol, maxiter, monitor) -> SolveInfo:
    """``mc.solve(A, x, b, method="sstep-cg")`` with an assembled ``A`` (see the module
    docstring; collective)."""
    names = ["x", "b", "r", "p", "t", "scale", "weight"]
    run = _BlockRun(engine, A, work_dats(engine, A, "sstep-cg", 0, names), steps, jacobi=pc == "jacobi",
                    rtol=rtol, atol=atol, maxiter=maxiter, monitor=monitor)
    return drive(run, A, x, b, steps=steps, basis=basis, pc=pc, method="sstep-cg")
