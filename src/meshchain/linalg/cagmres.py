"""CA-GMRES: restarted GMRES with ``s`` Arnoldi columns per halo exchange and per reduction.

GMRES exchanges a halo once and reduces two to four times per iteration (a Gram-Schmidt
step and a norm). Hoemmen's communication-avoiding GMRES (CA-GMRES(s, m), thesis 2010,
ch. 3) builds each block of ``s`` basis vectors

* with one matrix powers exchange (:meth:`~meshchain.Mat.powers`,
  :mod:`meshchain.engine.powers`): ``W_i = (Â - θ_i) W_{i-1} + γ_i W_{i-2}`` from the
  block's first vector ``W_0 = q_j``, one message per neighbour for all ``s``;
* and orthogonalises it with one reduction: the dots of the new vectors with the basis
  ``Q`` and with each other (``C = Qᵀ W``, ``G = Wᵀ W``), one ``Allreduce``; the block is
  ``W - Q C`` made orthonormal by the Cholesky factor ``R`` of ``G - Cᵀ C`` (block classical
  Gram-Schmidt with a Pythagorean Cholesky QR). Where a new direction is less than
  :data:`REFINE` of its vector's length (the dots would have cancelled), the block is
  projected a second time and factored from dots of the projected vectors (a second
  reduction, as PETSc's ``refine_ifneeded``); a vector still dependent on those before it
  ends the block there (all vectors dependent: the Krylov space holds the solution).

The Hessenberg matrix comes from ``Â W_{0..s-1} = W_{0..s} B`` (``B``: the basis change,
shifts on the diagonal, ones below, ``-γ`` above) and ``W = [Q, Q_new] T`` (``T`` from ``C``
and ``R``): its new columns are ``(T B - H T_top) T_bot^-1``, small dense work. The least
squares problem is the GMRES one (Givens rotations), so every column is an iteration with
its residual estimate, tested as GMRES tests it; a cycle ends after ``restart`` columns,
the solution is updated from the basis, and the next cycle starts from the true residual,
whose norm replaces the estimate.

**Basis.** The default Newton basis takes its shifts from the Ritz values of the first
``s`` Arnoldi columns (one exchange and one reduction each; they count as iterations):
eigenvalues of the small Hessenberg matrix (:func:`~.eigen.hessenberg_eigenvalues`) in
modified Leja order, a complex pair ``a ± bi`` as the real steps ``(a, 0), (a, b²)``
(:func:`~.eigen.newton_steps`). ``basis="monomial"`` (all shifts 0) loses rank for ``s``
beyond a few.

**Preconditioning.** ``pc="jacobi"`` runs on the symmetrically scaled system ``Â = D^-1/2 A
D^-1/2`` (PETSc's ``-ksp_pc_side symmetric``), so the norm GMRES minimises and tests is
``||D^-1/2 r||`` (``||r||`` without a preconditioner): ``SolveInfo.residual_history`` and
``true_residual_preconditioned`` are in that norm.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.apps import advection_diffusion as ad
>>> from meshchain.meshes import structured_tris
>>> problem = ad.declare(structured_tris(8, 8), peclet=10.0)  # nonsymmetric: upwinded advection
>>> info = ad.solve(problem, method="ca-gmres", s=4, rtol=1e-10)
>>> info.converged, info.true_residual_preconditioned <= 1e-9 * info.residual_history[0]
(True, True)
"""

from __future__ import annotations

import math
import time
import warnings

import numba
import numpy as np

from ..core.errors import MeshchainWarning
from .eigen import hessenberg_eigenvalues, newton_steps
from .fused import dot
from .info import SolveInfo
from .nonsymmetric import ESTIMATE_DRIFT, _LeastSquares
from .recovery import FALSE_CONVERGENCE_FACTOR
from .scaled import ScaledRun, enter, leave, work_dats

__all__ = ["solve_cagmres", "LOSS_LIMIT", "DEPENDENT"]

LOSS_LIMIT = 1e-6
"""The estimated loss of orthogonality of the basis above which a block is projected again."""
EPSILON = np.finfo(float).eps
PIVOT_FLOOR = 1e3 * EPSILON
"""A pivot² of the first factorisation below this fraction of its vector's squared length
is cancellation: the projected vectors' own dots are taken (a second reduction)."""
DEPENDENT = 1e-6
PASSES = 3  # projections of a block at most
"""After the second projection, a vector whose new direction is shorter than this fraction
of the projected vector is taken as dependent on those before it: the block ends there."""
STAGNATION = 0.9  # a cycle whose estimate met the tolerance must lower the true residual below this fraction

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_fast = numba.njit(cache=True, nogil=True, fastmath=True)  # sums may be reordered (vectorised): not bit-exact


@_fast
def _dots(Q, k, W, t, out):
    """``out = [C, G]``: ``C[a, c] = Q[a] · W[c]`` (``k x t``) then ``G[c, d] = W[c] · W[d]``
    (``t x t``), flattened: one buffer for one reduction."""
    n = W.shape[1]
    for a in range(k):
        qa = Q[a]
        for c in range(t):
            wc = W[c]
            total = 0.0
            for i in range(n):
                total += qa[i] * wc[i]
            out[a * t + c] = total
    base = k * t
    for c in range(t):
        wc = W[c]
        for d in range(c, t):
            wd = W[d]
            total = 0.0
            for i in range(n):
                total += wc[i] * wd[i]
            out[base + c * t + d] = total
            out[base + d * t + c] = total


@_jit
def _project(Q, k, W, t, C):
    """``W[c] -= sum_a C[a, c] Q[a]`` for the first ``t`` rows of ``W``."""
    n = W.shape[1]
    for c in range(t):
        wc = W[c]
        for a in range(k):
            coefficient = C[a, c]
            qa = Q[a]
            for i in range(n):
                wc[i] -= coefficient * qa[i]


@_jit
def _triangular(W, t, R, out):
    """``out`` with ``out R = W`` on the first ``t`` rows (``R`` upper triangular)."""
    n = W.shape[1]
    for c in range(t):
        oc = out[c]
        for i in range(n):
            oc[i] = W[c, i]
        for a in range(c):
            coefficient = R[a, c]
            oa = out[a]
            for i in range(n):
                oc[i] -= coefficient * oa[i]
        pivot = 1.0 / R[c, c]
        for i in range(n):
            oc[i] *= pivot


@_jit
def _cholesky(G, C, k, t, fraction):
    """``(R, good)``: the Cholesky factor of ``G - Cᵀ C`` (``C`` of ``k`` rows), up to the first
    column whose pivot² is at most ``fraction`` times its diagonal entry of ``G``: ``good``
    columns are factored."""
    R = np.zeros((t, t))
    for c in range(t):
        for a in range(c + 1):
            total = G[a, c]
            for e in range(k):
                total -= C[e, a] * C[e, c]
            for e in range(a):
                total -= R[e, a] * R[e, c]
            if a < c:
                R[a, c] = total / R[a, a]
            elif not total > fraction * G[c, c]:
                return R, c
            else:
                R[c, c] = math.sqrt(total)
    return R, t


def _squared_condition(G, R, good: int) -> float:
    """``κ²`` of a block whose Gram matrix ``G`` factored into ``R``, estimated as its largest
    squared length over its smallest squared new direction: the factor by which the
    Pythagorean Cholesky QR multiplies the loss of orthogonality of the basis it projects on
    (and the rounding error ``ε``) in the new vectors. The diagonal underestimates ``κ²``:
    a first projection's estimate is this times the block's size squared (measured: above
    the loss seen on nonsymmetric P1 problems, s = 2..8); a projection of vectors already
    orthonormalised has ``κ`` near 1."""
    if good == 0:
        return 1.0
    return max(G[c, c] for c in range(good)) / min(R[c, c] * R[c, c] for c in range(good))


@_jit
def _departure(D, first):
    """``max |D - I|`` for the dots ``D[a, c] = q_a · q_(first + c)``."""
    worst = 0.0
    for a in range(D.shape[0]):
        for c in range(D.shape[1]):
            value = D[a, c] - (1.0 if a == first + c else 0.0)
            worst = max(worst, abs(value))
    return worst


@_jit
def _times_upper(M, U):
    """``M U`` for an upper triangular ``U``."""
    out = np.zeros((M.shape[0], U.shape[1]))
    for a in range(M.shape[0]):
        for c in range(U.shape[1]):
            total = 0.0
            for e in range(c + 1):
                total += M[a, e] * U[e, c]
            out[a, c] = total
    return out


@_jit
def _hessenberg_block(H, j, made, C, R, shifts, pulls):
    """Columns ``j .. j + made - 1`` of the Hessenberg matrix ``H`` from a block of ``made``
    vectors made from ``q_j`` (see the module docstring; ``made == 0``: the first vector was
    in the basis, one column with a zero below the diagonal)."""
    if made == 0:
        for a in range(j + 1):
            H[a, j] = C[a, 0]
        H[j, j] += shifts[0]
        H[j + 1, j] = 0.0
        return
    t, size = made, j + 1 + made
    T = np.zeros((size, t + 1))
    T[j, 0] = 1.0
    for i in range(1, t + 1):
        for a in range(j + 1):
            T[a, i] = C[a, i - 1]
        for a in range(t):
            T[j + 1 + a, i] = R[a, i - 1]
    change = np.zeros((t + 1, t))
    for i in range(1, t + 1):
        change[i - 1, i - 1] = shifts[i - 1]
        change[i, i - 1] = 1.0
        if i >= 2:
            change[i - 2, i - 1] = -pulls[i - 1]
    M = np.zeros((size, t))
    for a in range(size):
        for c in range(t):
            total = 0.0
            for e in range(t + 1):
                total += T[a, e] * change[e, c]
            M[a, c] = total
    for a in range(j + 1):  # minus H_old T_top: the old columns' part of A W
        for c in range(t):
            total = 0.0
            for e in range(j):
                total += H[a, e] * T[e, c]
            M[a, c] -= total
    for c in range(t):  # X T_bot = M, T_bot = T[j:j+t, :t] upper triangular
        for a in range(size):
            total = M[a, c]
            for e in range(c):
                total -= H[a, j + e] * T[j + e, c]
            H[a, j + c] = total / T[j + c, c]
    for c in range(t):  # below the subdiagonal: rounding only
        for a in range(j + c + 2, size):
            H[a, j + c] = 0.0


@_jit
def _update(Q, y, x):
    """``x += sum_k y[k] Q[k]``."""
    for k in range(len(y)):
        coefficient = y[k]
        qk = Q[k]
        for i in range(len(x)):
            x[i] += coefficient * qk[i]


class _CAGMRESRun(ScaledRun):
    """One CA-GMRES solve: the scaled system's run, the basis ``Q`` (owned rows), the shifts."""

    def __init__(self, engine, A, dats: dict, steps: int, restart: int, *, newton: bool, **options):
        super().__init__(engine, A, dats, **options)
        self.steps, self.restart = steps, restart
        self.Q = np.empty((restart + 1, self.n))
        self.W = np.empty((steps, self.n))
        self.shifts, self.pulls = np.zeros(steps), np.zeros(steps)
        self.ritz_wanted, self.ritz = newton, None
        self.block_size = steps  # halved when a cycle's basis loses rank
        self.refinements, self.truncated = 0, 0
        self.loss = EPSILON  # the loss of orthogonality of this cycle's basis: measured, or estimated since
        self.last_block = 0  # vectors the last block added (their dots are measured with the next block's)

    def block(self, j: int, shifts, pulls) -> tuple[int, np.ndarray, np.ndarray]:
        """Basis vectors ``j + 1 ..`` from ``q_j`` (in work vector ``W0``): one exchange, one
        reduction per projection (a second, at most a third, where the first cancelled or the
        estimated loss of orthogonality passes :data:`LOSS_LIMIT`). ``(made, C, R)`` with ``W
        = Q C + Q_new R``; ``Q[j + 1 .. j + made]`` are filled and ``W0`` holds ``q_{j + made}``."""
        t, k = len(shifts), j + 1
        self.products([("W0", [f"W{i}" for i in range(1, t + 1)], shifts, pulls)])
        W, Q, v = self.W, self.Q, self.v
        for i in range(t):
            W[i] = v[f"W{i + 1}"]
        C_total, R_total = np.zeros((k, t)), np.eye(t)  # W = Q C_total + W_now R_total
        for attempt in range(PASSES):
            C, G = self.dots(Q, k, W, t, lagged=0 if attempt else self.last_block)
            _project(Q, k, W, t, C)
            C_total += _times_upper(C, R_total)
            R, good = _cholesky(G, C, k, t, DEPENDENT * DEPENDENT if attempt else PIVOT_FLOOR)
            if good < t and not attempt:  # the dots cancelled: again, from the projected vectors' own
                self.refinements += 1
                continue
            estimate = max(self.loss, EPSILON) * _squared_condition(G, R, good) * (1 if attempt else max(good, 1) ** 2)
            _triangular(W, good, R, W)
            R_total = _times_upper(R, R_total)
            if good < t or estimate <= LOSS_LIMIT or attempt == PASSES - 1:
                self.truncated += good < t
                break
            self.refinements += 1  # project the orthonormalised block again (BCGS2 with CholQR2)
        Q[k:k + good] = W[:good]
        self.last_block = good
        if good:
            np.copyto(v["W0"], Q[j + good])
            self.fresh("W0")
        return good, np.ascontiguousarray(C_total[:, :max(good, 1)]), R_total

    def dots(self, Q, k: int, W, t: int, *, lagged: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(C, G) = (Qᵀ W, Wᵀ W)`` on the first ``k`` and ``t`` vectors, in one reduction;
        with ``lagged``, the same reduction carries the dots of the basis with its last
        ``lagged`` vectors, whose largest departure from ``I`` becomes :attr:`loss` (the
        loss of orthogonality measured, one block late)."""
        size = k * t + t * t
        sums = np.empty(size + (k + lagged) * lagged)
        _dots(Q, k, W, t, sums)
        if lagged:
            _dots(Q, k, Q[k - lagged:k], lagged, sums[size:])  # Q[:k]ᵀ Q[k-lagged:k], then a block already in it
        self.total(sums)
        if lagged:
            self.loss = max(self.loss, _departure(sums[size:size + k * lagged].reshape(k, lagged), k - lagged))
        return sums[:k * t].reshape(k, t), sums[k * t:size].reshape(t, t)

    def cycle(self, beta: float) -> str | None:
        """One cycle from ``q_0`` (in ``W0``, normalised): ``"converged"`` when the estimate met
        the tolerance, ``"happy"`` when the Krylov space holds the solution, else None;
        ``x̂`` is updated."""
        m, s = self.restart, self.block_size
        np.copyto(self.Q[0], self.v["W0"])
        self.loss, self.last_block = EPSILON, 0
        H = self.H = np.zeros((m + 1, m))
        lsq = _LeastSquares(beta, m)
        j, outcome = 0, None
        while j < m and outcome is None and self.iterations < self.maxiter:
            arnoldi = self.ritz_wanted and j < s
            t = 1 if arnoldi else min(s, m - j, self.maxiter - self.iterations)
            shifts, pulls = (np.zeros(1), np.zeros(1)) if arnoldi else (self.shifts[:t], self.pulls[:t])
            made, C, R = self.block(j, shifts, pulls)
            _hessenberg_block(H, j, made, C, R, shifts, pulls)
            for c in range(max(made, 1)):
                self.iterations += 1
                estimate = lsq.add([float(h) for h in H[:j + c + 2, j + c]])
                if self.tested(estimate):
                    outcome = "converged"
                    break
                if made == 0:
                    outcome = "happy"
            j += c + 1
            if self.ritz_wanted and (j >= s or outcome is not None):
                self.newton_shifts(H, j)
        _update(self.Q, np.array(lsq.solution()), self.v["x"])
        self.fresh("x")
        return outcome

    def newton_shifts(self, H, columns: int) -> None:
        """The Newton shifts from the Ritz values of the first ``columns`` Arnoldi columns."""
        self.ritz = hessenberg_eigenvalues(np.ascontiguousarray(H[:columns, :columns]))
        self.shifts, self.pulls = newton_steps(*self.ritz, self.block_size)
        self.ritz_wanted = False

    def smaller_blocks(self, beta: float, last_true: float, estimate: float) -> None:
        """Halve the block size after a cycle whose basis lost rank (its ``estimate`` met the
        tolerance or fell below the true residual ``beta``, which did not fall), and say so."""
        before = self.block_size
        self.block_size = max(1, before // 2)
        if self.ritz is not None:
            self.shifts, self.pulls = newton_steps(*self.ritz, self.block_size)
        warnings.warn(MeshchainWarning(
            f"solve: method='ca-gmres' with s={before}: the basis of a cycle lost rank (its residual estimate fell to "
            f"{estimate:.3e}, the true residual {beta:.3e} did not fall below {STAGNATION} times {last_true:.3e}); "
            f"going on with s={self.block_size}. A Jacobi-scaled or better-conditioned system keeps larger s."),
            stacklevel=2)

    def solve(self) -> str:
        """Cycles until the true residual meets the tolerance: the reason the solve ended."""
        last_true, outcome = math.inf, None
        while True:
            self.residual("W0")
            beta = self.plain_norm("W0")
            estimate = math.inf
            if not self.history:
                met = self.tested(beta)
            else:  # the true residual's norm replaces the estimate of the cycle's last iteration
                estimate, self.history[-1] = self.history[-1], beta
                met = beta <= self.target or (outcome is not None and beta <= FALSE_CONVERGENCE_FACTOR * self.target)
            if met:
                return "converged"
            # an estimate that met the tolerance or fell below the true residual (ESTIMATE_DRIFT) is rounding
            if (outcome is not None or estimate < ESTIMATE_DRIFT * beta) and beta > STAGNATION * last_true:
                if self.block_size == 1:
                    return (f"stagnated: the true residual {beta:.3e} after a cycle whose estimate fell to "
                            f"{estimate:.3e} did not fall below {STAGNATION} times the one before it "
                            f"({last_true:.3e}): the tolerance is below what the method attains on this problem")
                self.smaller_blocks(beta, last_true, estimate)
            if self.iterations >= self.maxiter:
                return f"diverged: maxiter {self.maxiter} reached"
            self.v["W0"] *= 1.0 / beta
            self.fresh("W0")
            outcome = self.cycle(beta)
            last_true = beta


def solve_cagmres(engine, A, x, b, *, steps, restart, basis, pc, rtol, atol, maxiter, monitor) -> SolveInfo:
    """``mc.solve(A, x, b, method="ca-gmres")`` (see the module docstring; collective)."""
    dats = work_dats(engine, A, "ca-gmres", steps, ["x", "b", "t", "scale", *[f"W{i}" for i in range(steps + 1)]])
    for count in {1, steps}:  # halo layers and halo rows now: the iterations exchange vectors only
        engine.matrices.prepare_products(A, count)
    run = _CAGMRESRun(engine, A, dats, steps, restart, newton=basis == "newton", jacobi=pc == "jacobi", rtol=rtol,
               atol=atol, maxiter=maxiter, monitor=monitor)
    enter(engine, A, x, b, run)
    began = time.perf_counter()
    reason = run.solve()
    stopped = time.perf_counter()
    leave(engine, x, run)
    A.mult(x, dats["t"])
    r = engine.dat_values(b, write=False).reshape(-1)[:run.n] - run.v["t"]
    weighted = r * run.v["scale"]
    sums = run.total(np.array([dot(r, r), dot(weighted, weighted)]))
    return SolveInfo(iterations=run.iterations, converged=reason == "converged", reason=reason,
                     residual_history=run.history, true_residual=math.sqrt(max(float(sums[0]), 0.0)),
                     true_residual_preconditioned=math.sqrt(max(float(sums[1]), 0.0)),
                     time_per_iteration=(stopped - began) / max(run.iterations, 1), time_reduction_wait=0.0,
                     reductions=run.reductions, replacements=0, method="ca-gmres", pc=pc, restarts=0)
