"""Eigenvalues of the small matrices the s-step Krylov methods take their shifts from, and
the order the shifts are used in, compiled and without LAPACK (whose BLAS threads would
compete with Numba's: see :mod:`meshchain.linalg.fused`).

* :func:`tridiagonal_eigenvalues`: a symmetric tridiagonal matrix (CG's Lanczos matrix), by
  bisection on Sturm counts;
* :func:`hessenberg_eigenvalues`: an upper Hessenberg matrix (GMRES's Arnoldi matrix), by
  the Francis double-shift QR algorithm (real arithmetic; complex pairs as ``(re, ±im)``);
* :func:`leja` orders real shifts, :func:`newton_steps` complex ones (conjugate pairs side
  by side, each pair as two real steps of a three-term recurrence).

Examples
--------
>>> import numpy as np
>>> re, im = hessenberg_eigenvalues(np.array([[0.0, -1.0], [1.0, 0.0]]))
>>> sorted(zip(re.round(12).tolist(), im.round(12).tolist()))
[(0.0, -1.0), (0.0, 1.0)]
>>> newton_steps(re, im, 2)[0].round(12).tolist(), newton_steps(re, im, 2)[1].round(12).tolist()
([0.0, 0.0], [0.0, 1.0])
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["tridiagonal_eigenvalues", "hessenberg_eigenvalues", "leja", "newton_steps"]

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")

REAL = 1e-10
"""A Ritz value whose imaginary part is below this fraction of its modulus is taken as real."""


@_jit
def _below(diagonal, off, value):
    """How many eigenvalues of the symmetric tridiagonal matrix lie below ``value`` (Sturm)."""
    count = 0
    d = 1.0
    for i in range(len(diagonal)):
        e = off[i - 1] * off[i - 1] if i else 0.0
        d = diagonal[i] - value - (e / d if i else 0.0)
        if d == 0.0:
            d = -1e-300
        if d < 0.0:
            count += 1
    return count


@_jit
def tridiagonal_eigenvalues(diagonal, off):
    """Eigenvalues of the symmetric tridiagonal matrix (``diagonal``, ``off``) in increasing
    order, by bisection on Sturm counts (no LAPACK).

    >>> tridiagonal_eigenvalues(np.array([2.0, 2.0]), np.array([1.0])).round(12).tolist()
    [1.0, 3.0]
    """
    n = len(diagonal)
    radius = 0.0
    for i in range(n):
        r = abs(off[i - 1]) if i else 0.0
        if i < n - 1:
            r += abs(off[i])
        radius = max(radius, abs(diagonal[i]) + r)
    out = np.empty(n)
    for k in range(n):
        lo, hi = -radius - 1.0, radius + 1.0
        for _ in range(200):
            middle = 0.5 * (lo + hi)
            if middle == lo or middle == hi:
                break
            if _below(diagonal, off, middle) > k:
                hi = middle
            else:
                lo = middle
        out[k] = 0.5 * (lo + hi)
    return out


@_jit
def _sign(a, b):
    return abs(a) if b >= 0.0 else -abs(a)


@_jit
def hessenberg_eigenvalues(H):
    """``(re, im)``: the eigenvalues of the upper Hessenberg matrix ``H`` (entries below the
    subdiagonal ignored), by the Francis double-shift QR algorithm with deflation (as in
    EISPACK's ``hqr``); a complex pair comes as two entries ``(re, im)`` and ``(re, -im)``.
    An eigenvalue the iteration does not isolate in 60 sweeps is given as the diagonal
    entry it stopped at (the shifts only need to be near the spectrum)."""
    n = H.shape[0]
    a = np.zeros((n + 1, n + 1))  # 1-based, as the algorithm is usually written
    for i in range(n):
        for j in range(max(i - 1, 0), n):
            a[i + 1, j + 1] = H[i, j]
    re, im = np.zeros(n + 1), np.zeros(n + 1)
    norm = 0.0
    for i in range(1, n + 1):
        for j in range(max(i - 1, 1), n + 1):
            norm += abs(a[i, j])
    nn, t = n, 0.0
    x = y = z = w = p = q = r = s = 0.0
    while nn >= 1:
        its = 0
        while True:
            low = 1
            for m in range(nn, 1, -1):  # a negligible subdiagonal entry splits the matrix
                s = abs(a[m - 1, m - 1]) + abs(a[m, m])
                if s == 0.0:
                    s = norm
                if abs(a[m, m - 1]) + s == s:
                    a[m, m - 1] = 0.0
                    low = m
                    break
            x = a[nn, nn]
            if low == nn:  # one root found
                re[nn], im[nn] = x + t, 0.0
                nn -= 1
                break
            y = a[nn - 1, nn - 1]
            w = a[nn, nn - 1] * a[nn - 1, nn]
            if low == nn - 1:  # two roots found
                p = 0.5 * (y - x)
                q = p * p + w
                z = math.sqrt(abs(q))
                x += t
                if q >= 0.0:
                    z = p + _sign(z, p)
                    re[nn - 1] = re[nn] = x + z
                    if z != 0.0:
                        re[nn] = x - w / z
                    im[nn - 1] = im[nn] = 0.0
                else:
                    re[nn - 1] = re[nn] = x + p
                    im[nn - 1], im[nn] = -z, z
                nn -= 2
                break
            if its == 60:  # give up on this block: its diagonal entries stand for its roots
                for i in range(low, nn + 1):
                    re[i], im[i] = a[i, i] + t, 0.0
                nn = low - 1
                break
            if its == 10 or its == 20:  # exceptional shift
                t += x
                for i in range(1, nn + 1):
                    a[i, i] -= x
                s = abs(a[nn, nn - 1]) + abs(a[nn - 1, nn - 2])
                x = y = 0.75 * s
                w = -0.4375 * s * s
            its += 1
            m = nn - 2
            while m >= low:  # two consecutive small subdiagonal entries
                z = a[m, m]
                r = x - z
                s = y - z
                p = (r * s - w) / a[m + 1, m] + a[m, m + 1]
                q = a[m + 1, m + 1] - z - r - s
                r = a[m + 2, m + 1]
                s = abs(p) + abs(q) + abs(r)
                p /= s
                q /= s
                r /= s
                if m == low:
                    break
                u = abs(a[m, m - 1]) * (abs(q) + abs(r))
                v = abs(p) * (abs(a[m - 1, m - 1]) + abs(z) + abs(a[m + 1, m + 1]))
                if u + v == v:
                    break
                m -= 1
            for i in range(m + 2, nn + 1):
                a[i, i - 2] = 0.0
                if i != m + 2:
                    a[i, i - 3] = 0.0
            for k in range(m, nn):  # the double QR step on rows low..nn, columns m..nn
                if k != m:
                    p = a[k, k - 1]
                    q = a[k + 1, k - 1]
                    r = a[k + 2, k - 1] if k != nn - 1 else 0.0
                    x = abs(p) + abs(q) + abs(r)
                    if x != 0.0:
                        p /= x
                        q /= x
                        r /= x
                s = _sign(math.sqrt(p * p + q * q + r * r), p)
                if s != 0.0:
                    if k == m:
                        if low != m:
                            a[k, k - 1] = -a[k, k - 1]
                    else:
                        a[k, k - 1] = -s * x
                    p += s
                    x = p / s
                    y = q / s
                    z = r / s
                    q /= p
                    r /= p
                    for j in range(k, nn + 1):
                        p = a[k, j] + q * a[k + 1, j]
                        if k != nn - 1:
                            p += r * a[k + 2, j]
                            a[k + 2, j] -= p * z
                        a[k + 1, j] -= p * y
                        a[k, j] -= p * x
                    for i in range(low, min(nn, k + 3) + 1):
                        p = x * a[i, k] + y * a[i, k + 1]
                        if k != nn - 1:
                            p += z * a[i, k + 2]
                            a[i, k + 2] -= p * r
                        a[i, k + 1] -= p * q
                        a[i, k] -= p
    return re[1:], im[1:]


def leja(values, count: int) -> np.ndarray:
    """``count`` shifts from ``values`` (Ritz values) in Leja order: the largest first, then
    each the farthest (by the product of distances) from those before; values are reused
    cyclically when fewer than ``count``.

    >>> leja([1.0, 2.0, 3.0, 4.0], 4).tolist()
    [4.0, 1.0, 2.0, 3.0]
    """
    pool = [float(v) for v in values]
    if not pool:
        return np.zeros(count)
    chosen: list[float] = []
    while len(chosen) < count:
        left = [v for v in pool if v not in chosen] or pool
        if not chosen:
            pick = max(left, key=abs)
        else:
            pick = max(left, key=lambda v: math.prod(abs(v - c) for c in chosen[-len(pool):]))
        chosen.append(pick)
    return np.array(chosen)


def newton_steps(re, im, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``(shifts, pulls)`` of ``count`` steps of the real Newton basis ``v_{k+1} = (A -
    shifts[k]) v_k + pulls[k] v_{k-1}`` from complex Ritz values (``re``, ``im``): the values
    in modified Leja order (Bai, Hu and Reichel: a complex value is followed by its
    conjugate); a real value ``θ`` is one step ``(θ, 0)``, a pair ``a ± bi`` two steps
    ``(a, 0), (a, b²)``, whose product is ``(A - λ)(A - λ̄)``; a pair that does not fit in
    the last step gives its real part. Values are reused cyclically when fewer than ``count``.

    >>> s, p = newton_steps([2.0, 1.0, 1.0], [0.0, 1.0, -1.0], 3); s.tolist(), p.tolist()
    ([2.0, 1.0, 1.0], [0.0, 0.0, 1.0])
    """
    values = [complex(a, b if abs(b) > REAL * math.hypot(a, b) else 0.0) for a, b in zip(re, im)]
    shifts, pulls = np.zeros(count), np.zeros(count)
    if not values:
        return shifts, pulls
    upper = [v for v in values if v.imag >= 0.0]  # one of each conjugate pair
    chosen: list[complex] = []
    k = 0
    while k < count:
        left = [v for v in upper if v not in chosen] or upper
        if not chosen:
            pick = max(left, key=abs)
        else:
            recent = chosen[-len(upper):]
            pick = max(left, key=lambda v: math.prod(abs(v - c) * (abs(v - c.conjugate()) if c.imag else 1.0)
                                                     for c in recent))
        chosen.append(pick)
        shifts[k] = pick.real
        if pick.imag and k + 1 < count:
            shifts[k + 1], pulls[k + 1] = pick.real, pick.imag * pick.imag
            k += 1
        k += 1
    return shifts, pulls
