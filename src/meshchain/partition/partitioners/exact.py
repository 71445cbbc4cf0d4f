"""Exact, order-independent reductions and the eigen solver of :func:`~.rib.rib` (see the
package docstring: why the result does not depend on the number of ranks).

Examples
--------
>>> import numpy as np
>>> from meshchain.partition.partitioners.exact import _order_keys
>>> np.argsort(_order_keys(np.array([2.0, -1.0, 0.0, -0.0]))).tolist()
[1, 2, 3, 0]
"""

from __future__ import annotations

import numpy as np

from ...comm.reductions import max_everywhere, sum_everywhere
from ...core.errors import DeclarationError


# Limb width of the exact accumulator, rows summed between carry normalisations,
# digit width of the radix selection and the cap on Jacobi sweeps.
_LIMB = 32
_LIMB_MASK = (1 << _LIMB) - 1
_CHUNK_ROWS = 1 << 14
_DIGIT = 8
_RADIX = 1 << _DIGIT
_JACOBI_SWEEPS = 60


# --------------------------------------------------------------- exact reductions


def _exact_group_sums(values: np.ndarray, group: np.ndarray, ngroups: int, comm):
    """Exact sums of the columns of ``values`` per group, over all ranks.

    Returns ``(limbs, exponent)``, or ``None`` on every rank if some value on
    some rank is not finite. ``limbs`` is an int64 array of shape
    ``(ngroups * k, nlimbs)`` (rows ordered by ``(group, column)``), in canonical
    form -- every limb but the last in ``[0, 2**32)`` -- and the exact sum of column
    ``j`` of group ``g`` is ``sum(limbs[g * k + j, i] * 2**(exponent + 32 * i))``.
    The limbs do not depend on the order of the rows nor on how they are
    distributed over the ranks.
    """
    n, k = values.shape
    # IEEE decomposition without frexp: value = (-1)**negative * mant * 2**q exactly.
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    field = (bits >> 52) & 0x7FF
    mant = (bits & ((1 << 52) - 1)) | ((field > 0).astype(np.int64) << 52)
    q = np.maximum(field, 1) - 1075
    big = 1 << 40
    bounds = np.array([-big, -big, 0], dtype=np.int64)
    if n:
        present = mant != 0
        bounds[0] = -np.where(present, q, big).min()
        bounds[1] = np.where(present, q, -big).max()
        bounds[2] = (field == 0x7FF).any()
    max_everywhere(comm, bounds)
    if bounds[2]:
        return None
    if bounds[1] == -big:  # every value on every rank is zero
        return np.zeros((ngroups * k, 1), dtype=np.int64), 0
    qmin, qmax = int(-bounds[0]), int(bounds[1])
    # Limbs 0 .. nlimbs-1 weigh 2**(qmin + 32 j); the top ones are headroom.
    nlimbs = (qmax - qmin) // _LIMB + 4
    acc = np.zeros((ngroups * k, nlimbs), dtype=np.int64)
    flat = acc.reshape(-1)
    cols = np.arange(k, dtype=np.int64)
    for start in range(0, n, _CHUNK_ROWS):
        stop = min(n, start + _CHUNK_ROWS)
        mc = mant[start:stop]
        shift = np.maximum(q[start:stop] - qmin, 0)  # zeros (q = -1074) clamp to 0
        off = shift & (_LIMB - 1)
        t0 = (mc & _LIMB_MASK) << off  # < 2**63
        t1 = (mc >> _LIMB) << off  # < 2**52
        c0 = t0 & _LIMB_MASK
        c1 = (t0 >> _LIMB) + (t1 & _LIMB_MASK)
        c2 = t1 >> _LIMB
        sign = (bits[start:stop] >> 63) | 1  # -1 or +1
        c0 *= sign
        c1 *= sign
        c2 *= sign
        row = ((group[start:stop, None].astype(np.int64) * k + cols) * nlimbs + (shift >> 5)).ravel()
        np.add.at(flat, row, c0.ravel())
        np.add.at(flat, row + 1, c1.ravel())
        np.add.at(flat, row + 2, c2.ravel())
        _normalise_limbs(acc)
    sum_everywhere(comm, flat)
    _normalise_limbs(acc)
    return acc, qmin


def _limbs_to_int(limbs: np.ndarray) -> list[int]:
    """Python ints ``sum(limbs[r, i] * 2**(32 i))`` of canonical limb rows (for checks)."""
    low = np.ascontiguousarray(limbs[:, :-1]).astype("<u4")
    top = _LIMB * (limbs.shape[1] - 1)
    return [int.from_bytes(low[r].tobytes(), "little") + (int(limbs[r, -1]) << top) for r in range(len(limbs))]


def _normalise_limbs(acc: np.ndarray) -> None:
    """Carry so every limb but the top one lies in ``[0, 2**32)`` (value unchanged)."""
    for j in range(acc.shape[1] - 1):
        carry = acc[:, j] >> _LIMB  # floor division, also for negative limbs
        acc[:, j] -= carry << _LIMB
        acc[:, j + 1] += carry


def _exact_means(values, group, ngroups, counts, comm, what: str) -> np.ndarray:
    """Per-group column means of ``values``, independent of the distribution.

    The sums are exact (:func:`_exact_group_sums`); each is converted to float64 by
    adding its limbs from the most significant down (a fixed sequence of IEEE
    operations on identical integers, accurate to a few ulps) and divided by the
    group's element count.
    """
    k = values.shape[1]
    reduced = _exact_group_sums(values, group, ngroups, comm)
    out = np.full((ngroups, k), np.inf)
    if reduced is not None:
        limbs, exponent = reduced
        total = np.zeros(len(limbs), dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(limbs.shape[1] - 1, -1, -1):
                total = total + np.ldexp(limbs[:, i].astype(np.float64), exponent + _LIMB * i)
        n = np.asarray(counts, dtype=np.float64)
        out = np.where(n[:, None] > 0, total.reshape(ngroups, k) / np.maximum(n, 1.0)[:, None], 0.0)
    if not np.isfinite(out).all():
        # Identical on every rank (computed from reduced data): raising is collective.
        raise DeclarationError(
            f"rib: the {what} overflows float64; the coordinates are too large in magnitude. "
            "Rescale the coordinates (for example to the unit box) before partitioning."
        )
    return out


# ------------------------------------------------------------------ eigen solver


def _principal_axes(cov: np.ndarray) -> np.ndarray:
    """Unit eigenvector of the largest eigenvalue of each symmetric ``cov[g]``.

    Vectorised cyclic Jacobi using only elementwise IEEE operations, so the result
    is bitwise reproducible on any CPU and independent of the batch. The sign is
    chosen so that the component of largest magnitude (first one on ties) is
    positive.
    """
    a = np.array(cov, dtype=np.float64, copy=True)
    ng, d, _ = a.shape
    v = np.zeros_like(a)
    v[:, np.arange(d), np.arange(d)] = 1.0
    pairs = [(p, r) for p in range(d) for r in range(p + 1, d)]
    tiny = 2.0**-70
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(_JACOBI_SWEEPS):
            rotated = False
            for p, r in pairs:
                apq = a[:, p, r]
                app = a[:, p, p]
                aqq = a[:, r, r]
                active = np.abs(apq) > tiny * (np.abs(app) + np.abs(aqq))
                if not active.any():
                    continue
                rotated = True
                safe = np.where(active, apq, 1.0)
                tau = (aqq - app) / (2.0 * safe)
                root = np.sqrt(1.0 + tau * tau)
                t = np.where(tau >= 0.0, 1.0 / (tau + root), -1.0 / (root - tau))
                t = np.where(np.isfinite(t), t, 0.0)  # |tau| so large that tau*tau overflows
                c = 1.0 / np.sqrt(1.0 + t * t)
                s = t * c
                c = np.where(active, c, 1.0)[:, None]
                s = np.where(active, s, 0.0)[:, None]
                # A <- A J, then A <- J^T A, V <- V J with J = [[c, s], [-s, c]] at (p, r).
                colp, colr = a[:, :, p].copy(), a[:, :, r].copy()
                a[:, :, p] = c * colp - s * colr
                a[:, :, r] = s * colp + c * colr
                rowp, rowr = a[:, p, :].copy(), a[:, r, :].copy()
                a[:, p, :] = c * rowp - s * rowr
                a[:, r, :] = s * rowp + c * rowr
                a[:, p, r] = np.where(active, 0.0, a[:, p, r])
                a[:, r, p] = np.where(active, 0.0, a[:, r, p])
                vp, vr = v[:, :, p].copy(), v[:, :, r].copy()
                v[:, :, p] = c * vp - s * vr
                v[:, :, r] = s * vp + c * vr
            if not rotated:
                break
    best = np.argmax(a[:, np.arange(d), np.arange(d)], axis=1)
    axes = v[np.arange(ng), :, best]
    lead = np.argmax(np.abs(axes), axis=1)
    flip = axes[np.arange(ng), lead] < 0.0
    axes[flip] = -axes[flip]
    return axes + 0.0


def _order_keys(x: np.ndarray) -> np.ndarray:
    """uint64 keys with the same order as the float64 ``x`` (-0.0 taken as +0.0)."""
    bits = np.ascontiguousarray(x + 0.0).view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint64(1 << 63))
