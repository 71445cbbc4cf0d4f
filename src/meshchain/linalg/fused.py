"""Fused vector operations of the Krylov methods: each does an iteration's AXPYs in one
compiled pass over this rank's owned values (every vector read once), applies a pointwise
preconditioner (``dinv``: the inverse diagonal, or ones) and sums the iteration's dot
products into ``out`` (combined over ranks in one reduction by the caller). The CG family's
updates (:func:`cg_update`, :func:`pipecg_update`, :func:`gropp_update`,
:func:`gropp_direction`, :func:`pipecr_update`) and GMRES's Gram-Schmidt sums make their sums
in read-only passes that may be reassociated (SIMD lanes: :data:`_reassociated`); the other
sums run in order, as running sums.

Every dot product of a solve is computed here, never by NumPy's ``np.dot``: that calls the
BLAS library, whose own threads (OpenBLAS starts one per core) then compete with Numba's for
the cores: with no thread variables set, a CG iteration on 2 ranks of 20 000 unknowns took
25.3 ms against 0.60 ms with compiled dot products (``benchmarks/krylov.py``;
``tests/test_layering.py`` keeps BLAS calls out of the solver's packages).

Examples
--------
>>> import numpy as np
>>> x, p, r, w, z = np.zeros(2), np.ones(2), np.full(2, 2.0), np.ones(2), np.zeros(2)
>>> out = np.zeros(2)
>>> cg_update(0.5, p, w, x, r, np.full(2, 0.5), z, out)
>>> x.tolist(), r.tolist(), z.tolist(), out.tolist()
([0.5, 0.5], [1.5, 1.5], [0.75, 0.75], [2.25, 1.125])
"""

from __future__ import annotations

import numba
import numpy as _np

__all__ = ["residual", "scale", "aypx", "dot", "dot_pairs", "cg_update", "cg1_update", "pipecg_start", "pipecg_update",
           "gropp_update", "gropp_direction", "pipecr_update", "copy", "scal", "axpy", "waxpy", "lincomb",
           "dot_two", "waxpy_dots", "pipebicgstab_sums", "mdot", "maxpy"]

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def residual(b, ax, r):
    """``r = b - ax`` (``r`` may be ``ax``)."""
    for i in range(len(r)):
        r[i] = b[i] - ax[i]


@_jit
def scale(dinv, src, dst):
    """``dst = dinv * src``: a pointwise preconditioner."""
    for i in range(len(dst)):
        dst[i] = dinv[i] * src[i]


@_jit
def aypx(beta, z, p):
    """``p = z + beta * p``."""
    for i in range(len(p)):
        p[i] = z[i] + beta * p[i]


@_jit
def dot(a, b):
    """``(a, b)``: this rank's part of a dot product."""
    s = 0.0
    for i in range(len(a)):
        s += a[i] * b[i]
    return s


@_jit
def dot_pairs(a, b, c, d, e, f, out):
    """``out = [(a, b), (c, d), (e, f)]`` in one pass (pass the same arrays to repeat)."""
    s0 = s1 = s2 = 0.0
    for i in range(len(a)):
        s0 += a[i] * b[i]
        s1 += c[i] * d[i]
        s2 += e[i] * f[i]
    out[0], out[1], out[2] = s0, s1, s2


@_jit
def cg_update(alpha, p, w, x, r, dinv, z, out):
    """``x += alpha p; r -= alpha w; z = dinv r``; ``out = [(r, z), (z, z)]``: the updates in
    one strict pass, then the two sums in a read-only pass that may be reassociated (SIMD lanes,
    :func:`_cg_sums`; see :func:`pipecg_update`). Timed alone on the Intel Xeon VM (µs): 1.8 →
    1.4 at 729 rows, 5.0 → 3.6 at 2197, 35.8 → 20.8 at 19 683."""
    for i in range(len(x)):
        x[i] += alpha * p[i]
        ri = r[i] - alpha * w[i]
        r[i] = ri
        z[i] = dinv[i] * ri
    _cg_sums(r, z, out)


@_jit
def cg1_update(alpha, beta, z, s, p, w, x, r, dinv):
    """Chronopoulos/Gear: ``p = z + beta p; w = s + beta w; x += alpha p; r -= alpha w;
    z = dinv r`` (``s = A z`` before, ``w = A p`` kept by recurrence)."""
    for i in range(len(x)):
        pi = z[i] + beta * p[i]
        wi = s[i] + beta * w[i]
        p[i], w[i] = pi, wi
        x[i] += alpha * pi
        ri = r[i] - alpha * wi
        r[i] = ri
        z[i] = dinv[i] * ri


@_jit
def pipecg_start(r, u, w, x, dinv, m, out):
    """Pipelined CG's first dots and ``m = dinv w``: ``out`` as :func:`pipecg_update`'s."""
    out[:] = 0.0
    for i in range(len(x)):
        ui, wi = u[i], w[i]
        out[0] += r[i] * ui
        out[1] += wi * ui
        out[2] += ui * ui
        out[3] += wi * wi
        out[4] += x[i] * x[i]
        m[i] = dinv[i] * wi


@_jit
def pipecg_update(alpha, beta, n, m, u, w, z, q, p, s, x, r, dinv, out):
    """Ghysels-Vanroose: ``z = n + beta z; q = m + beta q; p = u + beta p; s = w + beta s;
    x += alpha p; u -= alpha q; w -= alpha z; r -= alpha s; m = dinv w``.

    ``out`` gets the next iteration's ``(r, u), (w, u), (u, u)`` and, for residual
    replacement, ``(w, w), (x, x), (s, s), (z, z), (p, p), (q, q)`` and the ``(m, m)`` of the
    ``m`` used here.

    Three passes: ``(m, m)`` (:func:`_sum_of_squares`), the updates in one strict pass
    (:func:`_pipecg_vectors`: the same bits as each update alone), then the nine sums in one
    read-only pass (:func:`_pipecg_sums`). The sums may be reassociated (Numba's ``fastmath``
    ``reassoc`` flag alone), so they run in SIMD lanes. Nine running sums made in the
    updates' pass kept it scalar and bound by its adds. Timed alone on the Intel Xeon VM
    (µs): 8.2 → 4.9 at 729 rows, 21.1 → 10.5 at 2197, 168 → 84 at 19 683, 1990 → 1460 at
    200 000. The sums differ from running sums in their last bits (1e-15 to 4e-14
    relative). The Python loop and the compiled iterations both call this function, so their
    bits stay equal."""
    mm = _sum_of_squares(m)
    _pipecg_vectors(alpha, beta, n, m, u, w, z, q, p, s, x, r, dinv)
    _pipecg_sums(u, w, z, q, p, s, x, r, out)
    out[9] = mm


@_jit
def _pipecg_vectors(alpha, beta, n, m, u, w, z, q, p, s, x, r, dinv):
    """:func:`pipecg_update`'s updates, in one pass."""
    for i in range(len(x)):
        mi = m[i]
        zi = n[i] + beta * z[i]
        qi = mi + beta * q[i]
        pi = u[i] + beta * p[i]
        si = w[i] + beta * s[i]
        z[i], q[i], p[i], s[i] = zi, qi, pi, si
        xi = x[i] + alpha * pi
        ui = u[i] - alpha * qi
        wi = w[i] - alpha * zi
        ri = r[i] - alpha * si
        x[i], u[i], w[i], r[i] = xi, ui, wi, ri
        m[i] = dinv[i] * wi


_reassociated = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
"""Sums that may be reassociated (vectorised); no other fast-math flag, so each product and
update keeps its IEEE rounding."""


@_reassociated
def _cg_sums(r, z, out):
    """``out[:2] = (r, z), (z, z)``, reassociated."""
    rz = zz = 0.0
    for i in range(len(r)):
        ri, zi = r[i], z[i]
        rz += ri * zi
        zz += zi * zi
    out[0], out[1] = rz, zz


@_reassociated
def _reassociated_dot(a, b):
    """``(a, b)``, reassociated: :func:`dot`'s loop under other flags. (One body for both, made
    by a factory, would give both dispatchers one disk-cache entry, keyed by the function's
    name and line, and so one of them the other's machine code.)"""
    total = 0.0
    for i in range(len(a)):
        total += a[i] * b[i]
    return total


@_reassociated
def _pipecr_sums(u, w, m, out):
    """``out[:3] = (w, u), (m, w), (u, u)``, reassociated."""
    wu = mw = uu = 0.0
    for i in range(len(u)):
        ui, wi = u[i], w[i]
        wu += wi * ui
        mw += m[i] * wi
        uu += ui * ui
    out[0], out[1], out[2] = wu, mw, uu


@_reassociated
def _sum_of_squares(m):
    """``(m, m)``, reassociated."""
    total = 0.0
    for i in range(len(m)):
        total += m[i] * m[i]
    return total


@_reassociated
def _pipecg_sums(u, w, z, q, p, s, x, r, out):
    """``out[:9] = (r, u), (w, u), (u, u), (w, w), (x, x), (s, s), (z, z), (p, p), (q, q)`` in
    one read-only pass, reassociated."""
    ru = wu = uu = ww = xx = ss = zz = pp = qq = 0.0
    for i in range(len(x)):
        ri, ui, wi, xi, si, zi, pi, qi = r[i], u[i], w[i], x[i], s[i], z[i], p[i], q[i]
        ru += ri * ui
        wu += wi * ui
        uu += ui * ui
        ww += wi * wi
        xx += xi * xi
        ss += si * si
        zz += zi * zi
        pp += pi * pi
        qq += qi * qi
    out[0], out[1], out[2], out[3], out[4] = ru, wu, uu, ww, xx
    out[5], out[6], out[7], out[8] = ss, zz, pp, qq


@_jit
def gropp_update(alpha, p, s, q, x, r, z, out):
    """Gropp's CG: ``x += alpha p; r -= alpha s; z -= alpha q`` (``q = B s``);
    ``out = [(r, z), (z, z)]`` (in a read-only reassociated pass, as :func:`cg_update`'s)."""
    for i in range(len(x)):
        x[i] += alpha * p[i]
        r[i] -= alpha * s[i]
        z[i] -= alpha * q[i]
    _cg_sums(r, z, out)


@_jit
def gropp_direction(beta, z, w, p, s, out):
    """Gropp's CG: ``p = z + beta p; s = w + beta s`` (``w = A z``); ``out[0] = (p, s)`` (in a
    read-only reassociated pass)."""
    for i in range(len(p)):
        p[i] = z[i] + beta * p[i]
        s[i] = w[i] + beta * s[i]
    out[0] = _reassociated_dot(p, s)


@_jit
def pipecr_update(alpha, beta, n, m, u, w, z, q, p, x, dinv, out):
    """Pipelined CR: ``z = n + beta z; q = m + beta q; p = u + beta p; x += alpha p;
    u -= alpha q; w -= alpha z; m = dinv w`` in one strict pass; ``out`` = the next
    ``(w, u), (m, w), (u, u)`` in a read-only reassociated pass (as :func:`pipecg_update`'s)."""
    for i in range(len(x)):
        zi = n[i] + beta * z[i]
        qi = m[i] + beta * q[i]
        pi = u[i] + beta * p[i]
        z[i], q[i], p[i] = zi, qi, pi
        x[i] += alpha * pi
        ui = u[i] - alpha * qi
        wi = w[i] - alpha * zi
        u[i], w[i], m[i] = ui, wi, dinv[i] * wi
    _pipecr_sums(u, w, m, out)


# --- the nonsymmetric methods' passes (:mod:`.nonsymmetric`) ------------------------------------


@_jit
def copy(src, dst):
    """``dst = src``."""
    for i in range(len(dst)):
        dst[i] = src[i]


@_jit
def scal(alpha, x):
    """``x *= alpha``."""
    for i in range(len(x)):
        x[i] *= alpha


@_jit
def axpy(alpha, x, y):
    """``y += alpha x``."""
    for i in range(len(y)):
        y[i] += alpha * x[i]


@_jit
def waxpy(w, alpha, x, y):
    """``w = alpha x + y`` (``w`` may be ``x`` or ``y``)."""
    for i in range(len(w)):
        w[i] = alpha * x[i] + y[i]


@_jit
def waxpy_dots(w, alpha, x, y, c, out):
    """:func:`waxpy` (``w = alpha x + y``) and ``out = [(w, w), (w, c)]`` in the same pass: the
    bits of :func:`waxpy` then :func:`dot_two` (BiCGStab's new residual, its norm and ``rho``).

    >>> import numpy as np
    >>> w, out = np.zeros(2), np.zeros(2)
    >>> waxpy_dots(w, 2.0, np.array([1.0, 2.0]), np.array([1.0, 0.0]), np.array([1.0, 1.0]), out)
    >>> w.tolist(), out.tolist()
    ([3.0, 4.0], [25.0, 7.0])
    """
    ww = wc = 0.0
    for i in range(len(w)):
        wi = alpha * x[i] + y[i]
        w[i] = wi
        ww += wi * wi
        wc += wi * c[i]
    out[0], out[1] = ww, wc


@_jit
def lincomb(alpha, x, beta, y, gamma, z):
    """``z = alpha x + beta y + gamma z``."""
    for i in range(len(z)):
        z[i] = alpha * x[i] + beta * y[i] + gamma * z[i]


@_jit
def dot_two(a, b, c, d, out):
    """``out = [(a, b), (c, d)]`` in one pass."""
    s0 = s1 = 0.0
    for i in range(len(a)):
        s0 += a[i] * b[i]
        s1 += c[i] * d[i]
    out[0], out[1] = s0, s1


@_jit
def pipebicgstab_sums(r, s, w, z, rp, out):
    """``out = [(r, r), (r, rp), (s, rp), (w, rp), (z, rp)]`` in one pass: pipelined
    BiCGStab's five sums, each over the entries in order (the bits of five :func:`dot` calls,
    without five passes whose running sums each wait on their last add).

    >>> import numpy as np
    >>> out, r, z = np.zeros(5), np.array([1.0, 2.0]), np.array([0.0, 3.0])
    >>> pipebicgstab_sums(r, np.ones(2), np.zeros(2), z, np.array([2.0, 1.0]), out)
    >>> out.tolist()
    [5.0, 4.0, 3.0, 0.0, 3.0]
    """
    s0 = s1 = s2 = s3 = s4 = 0.0
    for i in range(len(r)):
        ri, pi = r[i], rp[i]
        s0 += ri * ri
        s1 += ri * pi
        s2 += s[i] * pi
        s3 += w[i] * pi
        s4 += z[i] * pi
    out[0], out[1], out[2], out[3], out[4] = s0, s1, s2, s3, s4


@_reassociated
def _dot4(a0, a1, a2, a3, w, out, at):
    """``out[at:at + 4] = [(a_k, w)]`` in one pass, reassociated (SIMD lanes; GMRES's
    Gram-Schmidt sums, :func:`mdot`)."""
    s0 = s1 = s2 = s3 = 0.0
    for i in range(len(w)):
        wi = w[i]
        s0 += a0[i] * wi
        s1 += a1[i] * wi
        s2 += a2[i] * wi
        s3 += a3[i] * wi
    out[at], out[at + 1], out[at + 2], out[at + 3] = s0, s1, s2, s3


@_jit
def _axpy4(c0, c1, c2, c3, a0, a1, a2, a3, w):
    """``w += sum_k c_k a_k`` in one pass."""
    for i in range(len(w)):
        w[i] += c0 * a0[i] + c1 * a1[i] + c2 * a2[i] + c3 * a3[i]


def mdot(vectors: list, w, out) -> None:
    """``out[k] = (vectors[k], w)``, four vectors per pass over ``w`` (PETSc's VecMDot)."""
    n = len(vectors)
    padded = list(vectors) + [w] * (-n % 4)
    sums = _np.empty(len(padded))
    for k in range(0, len(padded), 4):
        _dot4(padded[k], padded[k + 1], padded[k + 2], padded[k + 3], w, sums, k)
    out[:n] = sums[:n]


def maxpy(coefficients, vectors: list, w) -> None:
    """``w += sum_k coefficients[k] vectors[k]``, four vectors per pass (PETSc's VecMAXPY)."""
    n = len(vectors)
    for k in range(0, n, 4):
        c = [float(coefficients[j]) if j < n else 0.0 for j in range(k, k + 4)]
        a = [vectors[j] if j < n else vectors[k] for j in range(k, k + 4)]
        _axpy4(c[0], c[1], c[2], c[3], a[0], a[1], a[2], a[3], w)
