"""Automatic residual replacement for pipelined CG (Cools, Yetkin, Agullo, Giraud and
Vanroose, SIMAX 39(1), 2018; the criterion PETSc's KSPPIPECGRR uses).

Pipelined CG updates ``r, u = B r, w = A u, s = A p, q = B s, z = A q`` by recurrences;
each adds a rounding error that the later iterations carry along, so the recursive residual
drifts from ``b - A x`` and the attainable accuracy stalls. The bounds below estimate the gap
in ``r`` from the norms of the vectors (summed in the iteration's single reduction), the
step lengths, ``||A||_inf`` and the most nonzeros per row (the real count: PETSc fixes it at
5). When the estimate crosses ``sqrt(eps)`` times the residual norm, the method replaces the
recursive vectors by explicitly computed ones.

That criterion (PETSc's, ``residual_replacement=True``) keeps the gap small against the residual
at every iteration, for the best attainable accuracy; it replaces while the residual is still
far above a modest tolerance (at ``rtol=1e-8`` on a Poisson problem of 729 unknowns, twice in
23 iterations, with the estimate under 1e-4 of the target: each replacement costs four
products and two preconditioner applications). By default (``residual_replacement=None``) a
replacement is made only where the estimate also exceeds :data:`TARGET_FRACTION` of the
solve's target (:meth:`ReplacementBounds.aim`): where the gap could decide the convergence
test, i.e. where the tolerance is within reach of rounding.

Examples
--------
>>> bounds = ReplacementBounds(norm_inf=8.0, nonzeros=5, size=100, b_norm=1.0)
>>> norms = dict(dp=1.0, du=1.0, dw=1.0, dx=1.0, ds=1.0, dz=1.0, dpp=1.0, dq=1.0, dm=1.0)
>>> bounds.after_update(1, norms, norms, alpha=1.0, beta=0.5)
False
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ReplacementBounds", "TARGET_FRACTION"]

EPS = float(np.finfo(np.float64).eps)
TOL = math.sqrt(EPS)

TARGET_FRACTION = 0.1
"""By default a replacement needs the gap estimate above this fraction of the solve's target
norm too: below it, the recursive residual meeting the target leaves the true one within
``1 + TARGET_FRACTION`` of it (the estimate bounds the gap from above)."""


class ReplacementBounds:
    """The running rounding-error bounds of one pipelined CG solve.

    ``after_update(i, now, before, alpha, beta)`` is called after iteration ``i``'s update
    with the norms at the top of iterations ``i`` (``now``) and ``i - 1`` (``before``) and
    the previous step lengths; it says whether to replace the residual now. ``fraction``: the
    fraction of the solve's target (given by :meth:`aim`) the gap estimate must exceed too
    (0: PETSc's criterion alone).
    """

    def __init__(self, *, norm_inf: float, nonzeros: int, size: int, b_norm: float, fraction: float = 0.0):
        self.a, self.b_norm, self.fraction, self.floor = norm_inf, b_norm, fraction, 0.0
        self.k = nonzeros * math.sqrt(size)  # PETSc's mnz * sqrt(n)
        self.errr = self.errrprev = self.errs = self.errw = self.errz = 0.0
        self.errncs = self.errncz = 0.0
        self.replaced = False

    def aim(self, target: float) -> None:
        """The solve stops at the norm ``target``: no replacement while the gap estimate is at
        most ``fraction * target``."""
        self.floor = self.fraction * target

    def state(self) -> np.ndarray:
        """The bounds as the array :func:`~meshchain.linalg.compiled.bounds_after_update` runs
        on (``[a, k, b_norm, errr, errrprev, errs, errw, errz, errncs, errncz, replaced, floor]``)."""
        return np.array([self.a, self.k, self.b_norm, self.errr, self.errrprev, self.errs, self.errw, self.errz,
                         self.errncs, self.errncz, float(self.replaced), self.floor])

    def after_update(self, i: int, now: dict, before: dict, *, alpha: float, beta: float) -> bool:
        a, k, eps = self.a, self.k, EPS
        alpha, beta = abs(alpha), abs(beta)
        errncr = math.sqrt(a * before["dx"] + 2 * a * alpha * now["dpp"] + before["dp"] + 2 * alpha * now["ds"]) * eps
        errncw = math.sqrt(a * before["du"] + 2 * a * alpha * now["dq"] + before["dw"] + 2 * alpha * now["dz"]) * eps
        if i > 1:
            self.errncs = math.sqrt(a * before["du"] + 2 * a * beta * before["dpp"] + before["dw"]
                                    + 2 * beta * before["ds"]) * eps
            self.errncz = math.sqrt((k + 2) * a * now["dm"] + 2 * a * beta * before["dq"] + 2 * beta * before["dz"]) * eps
        if i == 1:
            self.errr = (math.sqrt((k + 1) * a * before["dx"] + self.b_norm) * eps
                         + math.sqrt(alpha * k * a * now["dpp"]) * eps + errncr)
            self.errs = math.sqrt(k * a * now["dpp"]) * eps
            self.errw = math.sqrt(k * a * before["du"]) * eps + math.sqrt(alpha * k * a * now["dq"]) * eps + errncw
            self.errz = math.sqrt(k * a * now["dq"]) * eps
        elif self.replaced:
            self.errrprev = self.errr
            self.errr = math.sqrt((k + 1) * a * now["dx"] + self.b_norm) * eps
            self.errs = math.sqrt(k * a * now["dpp"]) * eps
            self.errw = math.sqrt(k * a * now["du"]) * eps
            self.errz = math.sqrt(k * a * now["dq"]) * eps
            self.replaced = False
        else:
            self.errrprev = self.errr
            self.errr += alpha * beta * self.errs + alpha * self.errw + errncr + alpha * self.errncs
            self.errs = self.errw + beta * self.errs + self.errncs
            self.errw += alpha * beta * self.errz + errncw + alpha * self.errncz
            self.errz = beta * self.errz + self.errncz
        floor = self.floor
        if i > 1 and self.errrprev <= max(TOL * before["dp"], floor) and self.errr > max(TOL * now["dp"], floor):
            self.replaced = True
            return True
        return False
