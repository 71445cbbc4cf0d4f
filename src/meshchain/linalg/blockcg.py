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

**Basis.** The Newton shifts ``θ`` come from the Ritz values of ``s`` classical CG
iterations at the start (they count), in Leja order; their directions are the block the
first outer iteration makes its own ``Â``-conjugate to. ``basis="monomial"`` takes ``θ = 0``.
The small systems are solved by Cholesky factorisation; a pivot below
:data:`PIVOT` of its diagonal entry (the block's last directions dependent on the others: a
basis losing rank) keeps the leading directions only, so that outer iteration makes fewer
iterations. The block form's attainable accuracy falls as ``s`` grows (its ``W`` is about as
ill-conditioned as the basis squared): after about 16 iterations (at least 2 outer ones)
without the residual falling 10% below its smallest, the true residual replaces it and the
directions start again from it; where that does not lower the true residual, ``s`` is halved
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

from ..core.errors import MeshchainWarning
from .info import SolveInfo
from .scaled import work_dats
from .sstep import CGRun, drive

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


@_fast
def _pair(a, b, n):
    total = 0.0
    for i in range(n):
        total += a[i] * b[i]
    return total


@_fast
def block_sums(Y, m, AQ, count, w, weighted, out):
    """Into ``out``: ``Rᵀ V`` (``m × (m + 1)``, row-major; ``V = Y[:m + 1]``, ``R = Y[:m]``),
    ``(Â P_old)ᵀ R`` (``count × m``; ``Â P_old = AQ[:count]``) and ``v_0ᵀ diag(w) v_0`` (or
    ``v_0ᵀ v_0`` unweighted), over the first ``n = len(w)`` entries of each row: the numbers
    of one outer iteration's reduction."""
    n, width = len(w), m + 1
    for a in range(m):
        for c in range(a, width):
            value = _pair(Y[a], Y[c], n)
            out[a * width + c] = value
            if c < m:
                out[c * width + a] = value
    base = m * width
    for k in range(count):
        for a in range(m):
            out[base + k * m + a] = _pair(AQ[k], Y[a], n)
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
    ``r -= Â P a``, over the first ``n = len(x)`` entries of each row."""
    n = len(x)
    for j in range(kept):
        p, q, y, z, theta = P[j], AQ[j], Y[j], Y[j + 1], shifts[j]
        for i in range(n):
            p[i] = y[i]
            q[i] = z[i] + theta * y[i]
        for k in range(count):
            factor, po, qo = B[k, j], P_old[k], AQ_old[k]
            for i in range(n):
                p[i] += factor * po[i]
                q[i] += factor * qo[i]
        step = a[j]
        for i in range(n):
            x[i] += step * p[i]
            r[i] -= step * q[i]


class _BlockRun(CGRun):
    """One block s-step CG solve: the basis, the last block of directions and ``Â`` times it,
    the factor of its ``W``."""

    progress = 0.9  # a residual not 10% below the smallest so far is no progress

    def __init__(self, engine, A, dats: dict, steps: int, **options):
        super().__init__(engine, A, dats, **options)
        self.steps = steps
        self.blocks = [np.empty((2, steps, self.n)), np.empty((2, steps, self.n))]  # [P, Â P], last and next
        self.factors = [np.zeros((steps, steps)), np.zeros((steps, steps))]
        self.count = 0  # directions in the last block (0: none)
        self.sums = np.empty(steps * (steps + 1) + steps * steps + 1)
        self.small = (np.zeros((steps, steps)), np.zeros((steps, steps)), np.zeros(steps))  # B, W, a
        self.plans, self.Y = {}, None  # the basis: its plan per length, its rows
        self.before, self.last_norm = np.empty((2, self.n)), math.inf  # x and r before the last block

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
        plan = self.plans.get(m)
        if plan is None:  # collective: every rank asks for the same m
            scale = self.dats["scale"] if self.jacobi else None
            plan = self.plans[m] = self.engine.matrices.sequence_plan(self.A, self.dats["r"], m, scale=scale)
            if self.Y is None:
                self.Y = np.empty((self.steps + 1, plan.width))
        plan.run(shifts[:m], self.Y)
        return self.Y

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
        tolerance (nothing updated), ``"curvature"`` when ``W`` was not positive definite."""
        m, v = min(self.steps, self.maxiter - self.iterations), self.v
        if self.fresh_residual and self.expects_convergence():  # the norm alone first: one reduction
            outcome = self.judged(self.norm(v["r"]))
            if outcome is not None:
                return None if outcome == "undone" else outcome
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
        np.copyto(self.before[0], v["x"])
        np.copyto(self.before[1], v["r"])
        B, W, a = self.small
        kept = coefficients(sums, m, self.count, shifts, self.factors[0], B, W, self.factors[1], a)
        if kept == 0:
            return "curvature"
        block_update(Y, shifts, kept, last[0], last[1], self.count, B, a, following[0], following[1], v["x"], v["r"])
        self.exit_norms = None
        self.blocks.reverse()
        self.factors.reverse()
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
