"""CA-CG (``method="ca-cg"``): ``s`` iterations per halo exchange and per reduction, CG's own
iterates; and what it shares with the block s-step CG (:mod:`.blockcg`, ``method="sstep-cg"``).

Classical CG exchanges a halo and reduces at least once per iteration; pipelining hides a
reduction's latency but sends as many messages. Hoemmen's and Carson's CA-CG (the s-step CG
of Chronopoulos and Gear on coordinates) runs ``s`` iterations from

* one matrix powers exchange (:meth:`~meshchain.Mat.powers`, :mod:`meshchain.engine.powers`):
  the basis ``Y = [P, R]`` of ``s + 1`` vectors ``ρ_j(Â) p`` and ``s`` vectors ``ρ_j(Â) r``,
  one message per neighbour for all of them;
* one block reduction: the Gram matrices ``G = Yᵀ Y`` and ``Yᵀ W Y`` (``W``: what the
  convergence norm weighs the residual with), in one ``Allreduce``;

after which the ``s`` iterations update the coordinates of ``x``, ``r`` and ``p`` in the
basis (vectors of ``2s + 1`` numbers: no communication), using ``Â Y = Y B`` for the
basis-change matrix ``B``; then ``x``, ``r`` and ``p`` are formed from the basis. Its
residual norm is known at every iteration, and its iterations are CG's; it pays for that
with ``2s - 1`` products per ``s`` iterations (the block form: ``s``) and a Gram matrix of
``2s + 1`` vectors.

**Basis.** ``ρ_{j+1}(z) = (z - θ_j) ρ_j(z)``. The monomial basis (``θ = 0``,
``basis="monomial"``) loses rank for ``s`` beyond a few; the default Newton basis takes its
shifts ``θ`` from Ritz values of the operator, from a few classical CG iterations at the
start (``s`` iterations, which count: they make progress), in Leja order. The shifts are
kept with the matrix: a later solve with the same values (no assembly since), scaling and
``s`` starts with the s-step iterations at once.

**Preconditioning.** ``pc="jacobi"`` runs CA-CG on the symmetrically scaled system
``Â = D^-1/2 A D^-1/2`` (``x = D^-1/2 x̂``): the same iterates as Jacobi-preconditioned CG in
exact arithmetic, with the matrix powers kernel scaling as it multiplies. The convergence
test is the other methods' (``||B r|| <= max(rtol ||B r0||, atol)``), its norm taken from the
weighted Gram matrix.

**Accuracy.** The residual the coordinates carry drifts from the true one. When it meets the
tolerance, the true residual is computed; where it does not, it replaces the recursive one
(Carson and Demmel's residual replacement) and the method goes on; so it does after
:data:`PATIENCE` outer iterations without a new smallest residual (a basis that lost rank
stops making progress), but there the directions go on where the true residual agrees with
the recursive one (within :data:`ACCURATE`: the plateau is CG's own); a replacement that does
not lower the residual ends the solve as ``stagnated``. A curvature ``(p, Â p) <= 0`` in the
coordinates restarts the basis from the true residual; twice in a row ends the solve as
``breakdown``. At exit ``||b - A x||`` is computed, as for every method.

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
>>> info = mc.solve(A, x, b, method="ca-cg", s=4, rtol=1e-10)
>>> info.converged, info.true_residual < 1e-8
(True, True)
"""

from __future__ import annotations

import math
import numbers
import time

import numba
import numpy as np

from ..core.errors import SolverError
from ..types import Mat
from .fused import dot
from .info import SolveInfo
from .operators import found_kept, kept_for
from .eigen import leja, tridiagonal_eigenvalues
from .recovery import FALSE_CONVERGENCE_FACTOR, ROUNDING_LEVEL
from .scaled import ScaledRun, check_matrix, enter, leave, work_dats

__all__ = ["solve_cacg", "drive", "CGRun", "BASES", "DEFAULT_STEPS", "MAX_STEPS", "leja", "basis_change", "tridiagonal_eigenvalues"]

BASES = ("newton", "monomial")
DEFAULT_STEPS = 4
MAX_STEPS = 16
STAGNATION = 0.9  # a residual replacement must lower the true residual below this fraction of the last one
PATIENCE = 4  # outer iterations without a new smallest residual before the true residual is looked at
ACCURATE = 1.1
"""A true residual no more than this times the recursive one, looked at after outer iterations
without progress, says the recursive residual was right: the plateau is the method's own (CG's
residual norm need not fall, and on a P1 Poisson problem with a random right-hand side rose
for 60 iterations), so the directions go on; a replacement that restarted them there threw the
Krylov space away, and the solve stagnated where CG converges. Not at the attainable accuracy
(a true residual below :data:`~meshchain.linalg.recovery.ROUNDING_LEVEL` of the first): there
the plateau is rounding's, and the replacements that find no progress end the solve as
stagnated (``rtol=1e-20``: after 6808 iterations when they did not)."""
RESTART_DROP = 1e-5
"""An outer iteration of CA-CG whose residual fell below this fraction of the one it started from
starts the next one's directions from the residual. The coordinate iterations compute
``(r, r)`` from the Gram matrix with errors of about ``ε`` times the basis's squared norms, so
after a ``δ``-fold fall their ``β`` is off by about ``ε / δ²`` (2e-6 here): the old direction
is no longer conjugate to anything, and carrying it on made the residual creep (an exhausted
Krylov space, 9 unknowns on 3 ranks: 46 iterations to CG's 9; restarted, 12)."""

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
SHIFTS = "s-step Newton shifts"  # the session's solver cache, per matrix: (jacobi, s) -> (values stamp, shifts)


_fast = numba.njit(cache=True, nogil=True, fastmath=True)  # sums may be reordered (vectorised): not bit-exact


@_fast
def _gram(Y, w, G, Gw, weighted):
    """``G = Y Yᵀ`` and, when ``weighted``, ``Gw = Y diag(w) Yᵀ`` (else ``Gw`` is left as it
    is), for the basis vectors in the rows of ``Y``: ``(m + 1) m / 2`` dot products, vectorised."""
    m, n = Y.shape
    for a in range(m):
        ya = Y[a]
        for c in range(a, m):
            yc = Y[c]
            plain = 0.0
            if weighted:  # both sums in one pass over the two vectors and the weights
                heavy = 0.0
                for i in range(n):
                    product = ya[i] * yc[i]
                    plain += product
                    heavy += product * w[i]
                Gw[a, c] = heavy
                Gw[c, a] = heavy
            else:
                for i in range(n):
                    plain += ya[i] * yc[i]
            G[a, c] = plain
            G[c, a] = plain


@_jit
def _combine(Y, x, r, p, X, R, P):
    """``X += Yᵀ x``, ``R = Yᵀ r``, ``P = Yᵀ p``: the vectors from their coordinates."""
    m, n = Y.shape
    R[:n] = 0.0
    P[:n] = 0.0
    for a in range(m):
        ya = Y[a]
        xa, ra, pa = x[a], r[a], p[a]
        for i in range(n):
            X[i] += xa * ya[i]
            R[i] += ra * ya[i]
            P[i] += pa * ya[i]


@_jit
def _inner(gram, weighted, B, steps, budget, target):
    """Up to ``min(steps, budget)`` CG iterations on coordinates in the basis: ``(x, r, p, norms,
    outcome)`` with ``norms`` the ``||B r||`` of each iteration done and ``outcome`` 0 (all
    done), 1 (the tolerance ``target`` met) or 2 (a curvature ``<= 0``)."""
    m = gram.shape[0]
    x, r, p = np.zeros(m), np.zeros(m), np.zeros(m)
    p[0] = 1.0
    r[steps + 1] = 1.0
    norms = np.zeros(steps)
    rr = _quadratic(r, gram, r)
    for j in range(min(steps, budget)):
        bp = _times(B, p)
        pap = _quadratic(p, gram, bp)
        if not pap > 0 or not rr > 0:
            return x, r, p, norms[:j], 2
        alpha = rr / pap
        for a in range(m):
            x[a] += alpha * p[a]
            r[a] -= alpha * bp[a]
        rr_new = _quadratic(r, gram, r)
        beta = rr_new / rr
        for a in range(m):
            p[a] = r[a] + beta * p[a]
        rr = rr_new
        norms[j] = np.sqrt(max(_quadratic(r, weighted, r), 0.0))
        if norms[j] <= target:
            return x, r, p, norms[:j + 1], 1
    return x, r, p, norms[:min(steps, budget)], 0


@_jit
def _weighted_dot(a, w):
    total = 0.0
    for i in range(len(a)):
        total += a[i] * a[i] * w[i]
    return total


@_jit
def _quadratic(u, M, v):
    """``uᵀ M v`` for a small dense ``M`` (no BLAS: it would start its threads beside Numba's)."""
    total = 0.0
    for a in range(len(u)):
        if u[a] != 0.0:
            row = 0.0
            for c in range(len(v)):
                row += M[a, c] * v[c]
            total += u[a] * row
    return total


@_jit
def _times(M, v):
    """``M v`` for a small dense ``M``."""
    out = np.zeros(M.shape[0])
    for a in range(M.shape[0]):
        for c in range(M.shape[1]):
            out[a] += M[a, c] * v[c]
    return out


def basis_change(shifts, steps: int) -> np.ndarray:
    """``B`` with ``Â Y = Y B`` on the columns the iterations use, for ``Y = [P, R]`` of
    ``steps + 1`` and ``steps`` Newton vectors with ``shifts`` (``Â ρ_j = ρ_{j+1} + θ_j ρ_j``).

    >>> basis_change([0.5, 0.25], 2).tolist()[:3]
    [[0.5, 0.0, 0.0, 0.0, 0.0], [1.0, 0.25, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]]
    """
    m = 2 * steps + 1
    B = np.zeros((m, m))
    for start, count in ((0, steps + 1), (steps + 1, steps)):
        for j in range(count - 1):
            B[start + j, start + j] = shifts[j]
            B[start + j + 1, start + j] = 1.0
    return B


class CGRun(ScaledRun):
    """What both s-step CG methods do on the scaled system: the norm of the convergence test,
    residual replacement, the classical CG iterations whose Ritz values give the Newton shifts."""

    fresh_residual = False  # the block form: r changed and its norm is not recorded yet
    residual_plan = None  # the product of the true residual (a sequence plan, made at first use)
    progress = 1.0  # a new smallest residual is below this fraction of the last one
    exit_norms = None  # (||b - A x||, ||B (b - A x)||) of the last replacement while x has not changed since

    def patience(self) -> int:
        """Outer iterations without a new smallest residual before the true one is looked at."""
        return PATIENCE

    def outers(self, shifts: np.ndarray, best: float, idle: int, recent: float = math.inf):
        """Outer iterations in one compiled call where a method has them (see
        :meth:`meshchain.linalg.blockcg._BlockRun.outers`; ``recent``: a norm :meth:`outer`
        tested since the last test of progress); None: :meth:`outer` makes each."""
        return None

    def norm(self, residual: np.ndarray) -> float:
        """``||B r||`` of a scaled residual ``r̂`` (``B r = D^-1/2 r̂`` with Jacobi), summed over ranks."""
        local = _weighted_dot(residual, self.v["weight"])
        return math.sqrt(max(float(self.total(np.array([local]))[0]), 0.0))

    def replace_residual(self) -> float:
        """``r̂ = b̂ - Â x̂``: the true residual replaces the recursive one; its norm ``||B r||``
        (``= ||D^-1 (b - A x)||`` with Jacobi). The same reduction sums ``||b - A x||²``
        (``r = S^-1 r̂``): the true residual at exit when ``x`` does not change again."""
        self.residual("r")
        self.fresh_residual = False
        r = self.v["r"]
        sums = self.total(np.array([_weighted_dot(r, self.v["weight"]), _weighted_dot(r, self.unweight)]))
        weighted, plain = (math.sqrt(max(float(value), 0.0)) for value in sums)
        self.exit_norms = (plain, weighted)
        return weighted

    def start(self) -> float:
        """The first residual ``r̂ = b̂ - Â x̂`` into ``r`` and ``p``; its norm ``||B r||``. With
        ``x = 0`` on every rank (the usual start; one reduction, which also sums ``||B b||``,
        tells) ``r̂ = b̂``: no exchange, no product, the same bits."""
        v = self.v
        sums = self.total(np.array([_weighted_dot(v["b"], v["weight"]), float(np.any(v["x"]))]))
        if sums[1] == 0.0:
            np.copyto(v["r"], v["b"])
            self.fresh("r")
            norm = math.sqrt(max(float(sums[0]), 0.0))
        else:
            self.residual("r")
            norm = self.norm(v["r"])
        np.copyto(v["p"], v["r"])
        self.fresh("p")
        return norm

    def residual(self, into: str) -> None:
        """``into = b̂ - Â x̂`` (one exchange of ``x̂``; a sequence plan of one product, kept)."""
        self.product_plan().run(np.zeros(1), self.product)
        np.subtract(self.v["b"], self.product[1, :self.n], out=self.v[into])
        self.residual_made(into)

    def residual_made(self, into: str) -> None:
        """After ``into = b̂ - Â x̂`` was made (here or in a caller's compiled call): its halo is
        stale, and the exit norms of the last replacement no longer hold."""
        self.fresh(into)
        self.exit_norms = None

    def product_plan(self):
        """The sequence plan of ``Â x̂`` into ``self.product[1]`` (made at first use: collective)."""
        if self.residual_plan is None:
            scale = self.dats["scale"] if self.jacobi else None
            self.residual_plan = self.engine.matrices.sequence_plan(self.A, self.dats["x"], 1, scale=scale)
            self.product = np.empty((2, self.residual_plan.width))
        return self.residual_plan

    def compiled_product(self):
        """``(plan, arguments)`` of :meth:`residual`'s product as one compiled call that a
        caller makes itself (:meth:`~meshchain.engine.powers.SequencePlan.compiled_arguments`),
        or None where it is not one."""
        plan = self.product_plan()
        arguments = plan.compiled_arguments(np.zeros(1), self.product)
        return None if arguments is None else (plan, arguments)

    def prepare(self, steps: int) -> None:
        """Before the solve's vectors are viewed: the halo layers and rows of ``steps``
        products (collective; every dat's storage may move)."""
        for count in {1, steps}:
            self.engine.matrices.prepare_products(self.A, count)

    def stamp(self):
        """What changes with the operator's values (the Newton shifts are kept under it), or
        None (never kept)."""
        return self.engine.matrices.values_stamp(self.A)

    def multiply(self, x, y) -> None:
        """``y = A x`` for the user's dats (the true residual at exit)."""
        self.A.mult(x, y)

    def restart_directions(self) -> None:
        """The search directions start again from the residual."""
        np.copyto(self.v["p"], self.v["r"])
        self.fresh("p")

    def settle(self) -> str | None:
        """At ``maxiter``: ``"converged"`` when a residual not yet tested meets the tolerance."""
        return None

    def replaced(self) -> None:
        """The true residual replaced the recursive one: the directions start again from it.
        A replacement follows a recursive residual that met the tolerance when the true one did
        not, or no progress for a while: the last direction was made from the recursive
        residual, and kept it took the true one from 4e-11 up to 4e-6 (stagnated; an exhausted
        Krylov space, 9 unknowns on 2 ranks)."""
        self.restart_directions()

    def fewer_steps(self, true: float, last_true: float) -> bool:
        """After a residual replacement that did not lower the residual: whether the run goes
        on with a smaller ``s`` (else the solve ends as stagnated)."""
        return False

    def direction_taken(self, pap: float) -> None:
        """A Ritz iteration steps along ``p`` (``t = Â p``, ``pap = pᵀ Â p``)."""

    def ritz_values(self, count: int) -> tuple[np.ndarray, bool]:
        """``count`` classical CG iterations (they advance ``x``, ``r``, ``p``): the Ritz values
        of their Lanczos matrix, and whether the tolerance was met."""
        v = self.v
        alphas, betas = [], []
        rr = float(self.total(np.array([dot(v["r"], v["r"])]))[0])
        for _ in range(count):
            if self.iterations >= self.maxiter or rr == 0.0:
                break
            self.products([("p", ["t"], None)])
            pap = float(self.total(np.array([dot(v["p"], v["t"])]))[0])
            if not pap > 0:
                break
            alpha = rr / pap
            self.direction_taken(pap)
            self.exit_norms = None
            v["x"] += alpha * v["p"]
            v["r"] -= alpha * v["t"]
            sums = self.total(np.array([dot(v["r"], v["r"]), _weighted_dot(v["r"], v["weight"])]))
            self.iterations += 1
            alphas.append(alpha)
            beta = float(sums[0]) / rr
            rr = float(sums[0])
            v["p"] *= beta
            v["p"] += v["r"]
            betas.append(beta)
            for name in ("x", "r", "p"):
                self.fresh(name)
            if self.tested(math.sqrt(max(float(sums[1]), 0.0))):
                return np.zeros(0), True
        return _lanczos_eigenvalues(alphas, betas), False


class _CACGRun(CGRun):
    """One CA-CG solve: the scaled system's run, its basis and Gram matrices."""

    def __init__(self, engine, A, dats: dict, steps: int, **options):
        super().__init__(engine, A, dats, **options)
        self.steps = steps
        self.Y = np.empty((2 * steps + 1, self.n))
        self.G = np.empty((2, 2 * steps + 1, 2 * steps + 1))

    def outer(self, shifts: np.ndarray) -> str | None:
        """One outer iteration: basis, Gram matrices, up to ``s`` iterations in coordinates, then
        ``x``, ``r``, ``p`` formed. ``"converged"`` when the recursive residual met the
        tolerance, ``"curvature"`` when a curvature came out ``<= 0``, else None."""
        s, v = self.steps, self.v
        np.copyto(v["P0"], v["p"])
        np.copyto(v["R0"], v["r"])
        self.fresh("P0")
        self.fresh("R0")
        self.products([("P0", [f"P{j}" for j in range(1, s + 1)], shifts[:s]),
                       ("R0", [f"R{j}" for j in range(1, s)], shifts[:s - 1])])
        Y = self.Y
        for j in range(s + 1):
            Y[j] = v[f"P{j}"]
        for j in range(s):
            Y[s + 1 + j] = v[f"R{j}"]
        G = self.G
        _gram(Y, v["weight"], G[0], G[1], self.jacobi)
        self.total(G.reshape(-1) if self.jacobi else G[0].reshape(-1))
        if not self.jacobi:
            G[1] = G[0]  # unweighted: the norm is the plain one
        x, r, p, norms, code = _inner(G[0], G[1], basis_change(shifts, s), s, self.maxiter - self.iterations,
                                      self.target)
        outcome = {0: None, 1: "converged", 2: "curvature"}[code]
        started = self.history[-1]
        for norm in norms:
            self.iterations += 1
            self.tested(float(norm))
        _combine(Y, x, r, p, v["x"], v["r"], v["p"])
        self.exit_norms = None
        for name in ("x", "r", "p"):
            self.fresh(name)
        if outcome is None and len(norms) and norms[-1] < RESTART_DROP * started:
            self.restart_directions()
        return outcome


def _lanczos_eigenvalues(alphas, betas) -> np.ndarray:
    """Eigenvalues of the Lanczos tridiagonal matrix of CG's coefficients."""
    k = len(alphas)
    if k == 0:
        return np.zeros(0)
    diagonal = np.array([1.0 / alphas[j] + (betas[j - 1] / alphas[j - 1] if j else 0.0) for j in range(k)])
    off = np.array([math.sqrt(max(betas[j], 0.0)) / alphas[j] for j in range(k - 1)] or [0.0])
    return tridiagonal_eigenvalues(diagonal, off)


def check_options(A, pc, steps, basis, method: str) -> int | str:
    """``steps`` as an int (or ``"auto"``) after checking the s-step options (the same on
    every rank)."""
    check_matrix(A, pc, method)
    if basis not in BASES:
        raise SolverError(f"solve: unknown s-step basis {basis!r}; choose one of {', '.join(map(repr, BASES))}.")
    if steps is None:
        steps = DEFAULT_STEPS
    if steps == "auto":
        if not isinstance(A, Mat):
            raise SolverError(f"solve: s='auto' measures the costs of an assembled mc.Mat; give s for "
                              f"{type(A).__name__} {A.name!r} (1 to {MAX_STEPS}; 4 by default).")
        return "auto"
    if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
        raise SolverError(f"solve: s must be an integer from 1 to {MAX_STEPS} (iterations per exchange and "
                          f"reduction) or 'auto', got {steps!r}.")
    return int(steps)


def _work(engine, A, steps: int) -> dict:
    names = ["x", "b", "r", "p", "t", "scale", "weight", *[f"P{j}" for j in range(steps + 1)],
             *[f"R{j}" for j in range(steps)]]
    return work_dats(engine, A, "ca-cg", steps, names)


def solve_cacg(engine, A, x, b, *, steps, basis, pc, rtol, atol, maxiter, monitor) -> SolveInfo:
    """``mc.solve(A, x, b, method="ca-cg")`` (see the module docstring; collective)."""
    run = _CACGRun(engine, A, _work(engine, A, steps), steps, jacobi=pc == "jacobi", rtol=rtol, atol=atol,
               maxiter=maxiter, monitor=monitor)
    return drive(run, A, x, b, steps=steps, basis=basis, pc=pc, method="ca-cg")


def drive(run: CGRun, A, x, b, *, steps: int, basis: str, pc, method: str) -> SolveInfo:
    """An s-step CG solve with ``run``'s outer iterations: the scaled system set up, the Ritz
    iterations for the Newton shifts, outer iterations with residual replacement, recovery and
    the true residual at exit (collective)."""
    engine, v, maxiter = run.engine, run.v, run.maxiter
    run.prepare(steps)  # halo layers and halo rows now: the iterations exchange vectors only
    run.views()
    enter(engine, A, x, b, run)
    np.multiply(v["scale"], v["scale"], out=v["weight"])  # ||B r||² = r̂ᵀ D^-1 r̂ with Jacobi
    run.unweight = 1.0 / v["weight"]  # ||b - A x||² = r̂ᵀ D r̂
    began = time.perf_counter()
    reason = None
    if run.tested(run.start()):
        reason = "converged"
    shifts = np.zeros(steps)
    if reason is None and basis == "newton":
        stamp = run.stamp()
        shifts = _known_shifts(engine, A, run.jacobi, steps, stamp)
        if shifts is None:
            ritz, met = run.ritz_values(steps)
            reason = "converged" if met else None
            shifts = leja(ritz, steps)
            if not met and stamp is not None:
                kept_for(engine, SHIFTS, A)[(run.jacobi, steps)] = (stamp, shifts)
    reason, replacements = _iterate(run, shifts, reason, maxiter)
    if reason.startswith("diverged: maxiter") and basis == "monomial":
        reason += (f"; the monomial basis of s = {steps} steps may have lost rank (the residual fell only "
                   f"{run.history[-1] / run.history[0]:.1e}-fold): try basis='newton' or a smaller s")
    stopped = time.perf_counter()
    leave(engine, x, run)
    if reason == "converged" and run.exit_norms is not None:  # the last replacement's: x has not changed since
        true, true_preconditioned = run.exit_norms
    else:
        true, true_preconditioned = _true_residual(engine, A, x, b, run)
    return SolveInfo(iterations=run.iterations, converged=reason == "converged", reason=reason,
                     residual_history=run.history, true_residual=true, true_residual_preconditioned=true_preconditioned,
                     time_per_iteration=(stopped - began) / max(run.iterations, 1), time_reduction_wait=0.0,
                     reductions=run.reductions, replacements=replacements, method=method, pc=pc,
                     restarts=0)


def _iterate(run: CGRun, shifts: np.ndarray, reason, maxiter: int) -> tuple:
    """Outer iterations with residual replacement and recovery until a reason to stop:
    ``(reason, replacements)``. An outer iteration that only tested the norm (``"tested"``) and
    the block after it count as one step of the test of progress."""
    replacements, curvatures, last_true = 0, 0, math.inf
    best, idle, mark = math.inf, 0, 0
    tested = False  # the last step tested the norm alone ("tested"): the block it leads to counts with it
    while reason is None:
        if run.iterations >= maxiter:
            outcome = run.settle()
            if outcome is None:
                reason = f"diverged: maxiter {maxiter} reached"
                break
        else:
            recent = min(run.history[mark:], default=math.inf) if tested else math.inf
            quick = run.outers(shifts, best, idle, recent)  # outer iterations in one compiled call, where it can
            if quick is not None:
                outcome, best, idle, completed = quick
                curvatures = 0 if completed else curvatures
                tested = tested and not completed and outcome == "next"
            if quick is None or outcome == "next":
                if quick is not None and run.iterations >= maxiter:
                    continue
                mark = mark if tested else len(run.history)
                outcome = run.outer(shifts)
                tested = outcome == "tested"
                if tested:
                    continue
            else:
                mark = len(run.history)  # (an undone block recorded no norm)
        if outcome is None:
            curvatures = 0
            recent = min(run.history[mark:], default=math.inf)  # this outer iteration's (the start's may lie lower)
            best, idle = (recent, 0) if recent < run.progress * best else (best, idle + 1)
            if idle < run.patience():
                continue
            outcome, idle = "idle", 0  # no new smallest residual for a while: look at the true one
        recursive = run.history[-1]
        true = run.replace_residual()
        if outcome == "curvature":
            run.restart_directions()
            curvatures += 1
            if curvatures > 1:
                reason = "breakdown: the curvature (p, A p) in the s-step coordinates was <= 0 twice in a row"
        elif true <= run.target * (FALSE_CONVERGENCE_FACTOR if outcome == "converged" else 1.0):
            reason = "converged"
        elif outcome == "idle" and true <= ACCURATE * recursive and true > ROUNDING_LEVEL * run.history[0]:
            replacements += 1  # a plateau of CG's own: the recursive residual was right, the directions go on
        else:
            replacements += 1
            run.replaced()
            if true > STAGNATION * last_true and not run.fewer_steps(true, last_true):
                reason = (f"stagnated: the true residual {true:.3e} after a residual replacement did not fall "
                          f"below {STAGNATION} times the last one ({last_true:.3e})"
                          f"{_advice(shifts, run.steps) if outcome == 'idle' else ''}")
        last_true = true
    return reason, replacements


def _advice(shifts: np.ndarray, steps: int) -> str:
    """What a stagnated solve's reason suggests: a basis that lost rank is helped by the Newton
    basis (if the shifts are the monomial basis's zeros) or a smaller ``s`` (if ``steps``, the
    one the solve ended with, is above 1)."""
    tries = ([] if shifts.any() else ["basis='newton'"]) + (["a smaller s"] if steps > 1 else [])
    return "; the s-step basis may have lost rank" + (f": try {' or '.join(tries)}" if tries else "")


def _known_shifts(engine, A, jacobi: bool, steps: int, stamp) -> np.ndarray | None:
    """The Newton shifts an earlier solve found for ``A`` with these values (``stamp``),
    scaling and ``s``."""
    found = None if stamp is None else kept_for(engine, SHIFTS, A).get((jacobi, steps))
    if found is None or found[0] != stamp:
        return None
    found_kept(engine, SHIFTS)
    return found[1]


def _true_residual(engine, A, x, b, run) -> tuple[float, float]:
    """``(||b - A x||, ||B (b - A x)||)`` at exit (``B = D^-1`` with Jacobi: weights ``scale⁴``)."""
    run.multiply(x, run.dats["t"])
    b_values, t_values = (engine.dat_values(d, write=False).reshape(-1)[:run.n] for d in (b, run.dats["t"]))
    r = b_values - t_values
    sums = run.total(np.array([dot(r, r), _weighted_dot(r, run.v["weight"] * run.v["weight"])]))
    return math.sqrt(max(float(sums[0]), 0.0)), math.sqrt(max(float(sums[1]), 0.0))
