"""Krylov methods for nonsymmetric operators, each an iteration over a
:class:`~meshchain.linalg.solve.SolveRun` as in :mod:`.krylov`:

* ``gmres``: restarted GMRES(m) (Saad and Schultz), left-preconditioned (PETSc's KSPGMRES
  default), classical Gram-Schmidt refined once where it lost orthogonality (PETSc's
  ``refine_ifneeded``; its default never refines): two reductions per iteration (four when
  refined), the norm tested ``||B r||`` as estimated by the Givens-rotated least-squares
  problem;
* ``pipegmres``: p(1)-GMRES (Ghysels, Ashby, Meerbergen and Vanroose, SISC 35(1), 2013;
  PETSc's KSPPGMRES): the Gram-Schmidt dots and the norm of one basis vector in one
  ``Iallreduce``, in flight while the next vector's operator and preconditioner are applied;
* ``bicgstab``: van der Vorst's BiCGStab, left-preconditioned (PETSc's KSPBCGS): three
  reductions per iteration (the residual norm summed with the next ``(r, r~)``);
* ``pipebicgstab``: pipelined BiCGStab (Cools and Vanroose, Parallel Computing 65, 2017;
  PETSc's KSPPIPEBCGS), right-preconditioned, so the norm tested is ``||r||``: two
  ``Iallreduce`` per iteration, each in flight while an operator and preconditioner are
  applied; the residual is recomputed every 100 iterations up to 1000, as PETSc does.

With an assembled matrix, ``pc=None`` or ``"jacobi"`` and no monitor, ``gmres`` and
``pipegmres`` (a restart cycle per call), ``bicgstab`` and ``pipebicgstab`` run their iterations
inside compiled calls (:mod:`.compiled`, on several ranks with MPI called from them), the same
bits as these Python loops, which a monitor makes them run.

BiCGStab's breakdowns (a zero ``(r, r~)``, ``(B A p, r~)`` or ``omega``) end a run with
``reason="breakdown: ..."``; :mod:`.recovery` restarts from the current ``x`` while that makes
progress before reporting them. A zero new Hessenberg entry in GMRES is a happy breakdown:
the Krylov space holds the solution. A GMRES cycle whose estimate fell below half the true
residual that the next cycle starts from, where that true residual did not fall below 0.9
times the last cycle's, ends the solve as ``reason="stagnated: ..."`` (a tolerance below the
attainable accuracy: :data:`ESTIMATE_DRIFT`), not at ``maxiter``.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.apps import advection_diffusion as ad
>>> from meshchain.meshes import structured_tris
>>> problem = ad.declare(structured_tris(8, 8), peclet=10.0)  # nonsymmetric: upwinded advection
>>> for method in ("gmres", "pipegmres", "bicgstab", "pipebicgstab"):
...     info = ad.solve(problem, method=method, pc="jacobi", rtol=1e-10)
...     print(method, info.converged, info.true_residual < 1e-8)
gmres True True
pipegmres True True
bicgstab True True
pipebicgstab True True
"""

from __future__ import annotations

import math

import numpy as np

from ..backends.vector_table import vector_table
from .compiled import (COMMUNICATION, DENOMINATOR, HAPPY_TOLERANCE, NORM, REPLACE, RHO, STALLED_S, STALLED_T,
                       bicgstab_iterations, givens_norm, gmres_cycle, pipebicgstab_iterations, pipegmres_cycle)
from .fused import axpy, copy, dot, dot_two, lincomb, maxpy, mdot, residual, scal, waxpy

__all__ = ["NONSYMMETRIC", "nonsymmetric_vectors", "gmres", "pipegmres", "bicgstab", "pipebicgstab",
           "UNPRECONDITIONED_NORM", "ESTIMATE_DRIFT", "CYCLE_PROGRESS", "cycle_stagnated"]

UNPRECONDITIONED_NORM = frozenset({"pipebicgstab"})
"""Methods that test ``||b - A x||`` (right preconditioning) rather than ``||B (b - A x)||``."""

ESTIMATE_DRIFT = 0.5
"""A GMRES cycle whose last residual estimate is below this fraction of the true residual the
next cycle starts from, where that true residual is not :data:`CYCLE_PROGRESS` times below the
last cycle's, ends the solve as stagnated: the estimate is rounding there (the tolerance is
below the attainable accuracy), and restarting again changes nothing (``rtol=1e-20`` on 81
unknowns: estimates of 1e-18 against a true residual of 1e-14, cycle after cycle, to
``maxiter``)."""

CYCLE_PROGRESS = 0.9
"""See :data:`ESTIMATE_DRIFT`."""


def nonsymmetric_vectors(method: str, restart: int) -> tuple[str, ...]:
    """The work vectors of ``method`` (GMRES: its ``restart + 1`` basis vectors, p(1)-GMRES
    one more); the first two are free between runs (:mod:`.recovery`)."""
    basis = tuple(f"v{k}" for k in range(restart + 1))
    return {"gmres": ("r", "z", "w", *basis),
            "pipegmres": ("r", "z", "w", *basis, f"v{restart + 1}"),
            "bicgstab": ("r", "z", "rp", "p", "v", "s", "t"),
            "pipebicgstab": ("r", "q2", "rp", "r2", "w", "w2", "t", "p2", "s", "s2", "z", "z2", "v", "q", "y")}[method]


def _preconditioned_residual(run, into: str, spare: str) -> None:
    """``into = B (b - A x)`` (``spare`` holds ``A x``)."""
    v = run.v
    run.A("x", spare)
    residual(v["b"], v[spare], v[spare])
    run.B(spare, into, fused_done=False)


def _norm(run, name: str) -> float:
    return math.sqrt(max(run.reduce(np.array([dot(run.v[name], run.v[name])]))[0], 0.0))


# --- GMRES ------------------------------------------------------------------------------------------


class _LeastSquares:
    """The Givens-rotated least-squares problem of one GMRES cycle: ``R y = g``."""

    def __init__(self, beta: float, size: int):
        self.g = [beta] + [0.0] * size
        self.columns: list[list[float]] = []
        self.cosines: list[float] = []
        self.sines: list[float] = []

    def add(self, column: list[float]) -> float:
        """Add Hessenberg column ``column`` (``j + 2`` entries); returns the residual estimate."""
        j = len(self.columns)
        h = list(column)
        for k in range(j):
            c, s = self.cosines[k], self.sines[k]
            h[k], h[k + 1] = c * h[k] + s * h[k + 1], -s * h[k] + c * h[k + 1]
        delta = givens_norm(h[j], h[j + 1])  # the C library's hypot, as the compiled cycle's
        c, s = (h[j] / delta, h[j + 1] / delta) if delta > 0.0 else (1.0, 0.0)
        self.cosines.append(c)
        self.sines.append(s)
        h[j] = c * h[j] + s * h[j + 1]
        self.g[j + 1] = -s * self.g[j]
        self.g[j] = c * self.g[j]
        self.columns.append(h[:j + 1])
        return abs(self.g[j + 1])

    def solution(self) -> list[float]:
        """``y`` with ``R y = g`` (back substitution; a zero pivot gives a zero entry, as PETSc)."""
        n = len(self.columns)
        y = [0.0] * n
        for k in range(n - 1, -1, -1):
            accumulated = 0.0  # term by term, as the compiled cycles (Python 3.12's sum() compensates)
            for j in range(k + 1, n):
                accumulated += self.columns[j][k] * y[j]
            total = self.g[k] - accumulated
            pivot = self.columns[k][k]
            y[k] = total / pivot if pivot != 0.0 else 0.0
        return y


def _happy(h_next: float, g_last: float) -> bool:
    """Whether the new Hessenberg entry is a happy breakdown (PETSc's test with ``haptol``)."""
    return h_next == 0.0 or (g_last != 0.0 and h_next < min(abs(h_next / g_last), HAPPY_TOLERANCE))


def _add_basis(run, basis, y) -> None:
    """``x += sum_k y_k v_k`` (left preconditioning: nothing to unwind)."""
    maxpy(y, [run.v[name] for name in basis[:len(y)]], run.v["x"])


def _project_out(run, basis, j: int) -> np.ndarray:
    """Classical Gram-Schmidt: subtract from ``v_{j+1}`` its projections on ``v_0 .. v_j``
    (their dots in one reduction); returns the coefficients."""
    v, new = run.v, run.v[basis[j + 1]]
    vectors = [v[basis[k]] for k in range(j + 1)]
    sums = np.empty(j + 1)
    mdot(vectors, new, sums)
    h = run.reduce(sums)
    maxpy(-h, vectors, new)
    return h


def _orthogonalise(run, basis, j: int) -> tuple[list, float]:
    """Orthogonalise ``v_{j+1}`` against the basis: classical Gram-Schmidt, refined once when
    the vector left is shorter than the projections taken off (PETSc's
    ``-ksp_gmres_cgs_refinement_type refine_ifneeded``). Returns the Hessenberg column
    ``h_{0..j}`` and ``||v_{j+1}||``."""
    h = _project_out(run, basis, j)
    left = _norm(run, basis[j + 1])
    squares = 0.0  # term by term, as the compiled cycle (Python 3.12's sum() compensates)
    for c in h:
        squares += c * c
    if left < math.sqrt(float(squares)):
        h = h + _project_out(run, basis, j)
        left = _norm(run, basis[j + 1])
    return [float(c) for c in h], left


def _restarted(run, cycle, slots: int):
    """The restarts of a GMRES method: each cycle starts from ``v_0 = B (b - A x) / beta``,
    whose norm (the true residual's) replaces the estimate recorded for its iteration, and
    ``cycle(run, basis, beta, i)`` returns ``(iterations, reason)``; ``basis`` names
    ``restart_length + slots`` vectors."""
    i, first, last_true = 0, True, math.inf
    basis = [f"v{k}" for k in range(run.restart_length + slots)]
    while True:
        _preconditioned_residual(run, basis[0], "w")
        beta = _norm(run, basis[0])
        estimate = None if first else run.history[-1]  # the last cycle's last estimate, which beta replaces
        reason = run.check(i, beta) if first else run.check_again(i, beta)
        first = False
        if reason is None and estimate is not None:
            reason = cycle_stagnated(estimate, beta, last_true)
        if reason is not None:
            return i, reason, 0
        last_true = beta
        scal(1.0 / beta, run.v[basis[0]])
        i, reason = cycle(run, basis, beta, i)
        if reason is not None:
            return i, reason, 0


def cycle_stagnated(estimate: float, true: float, last_true: float) -> str | None:
    """Why a restarted GMRES solve ends as stagnated (:data:`ESTIMATE_DRIFT`), or None: the last
    cycle's final ``estimate``, the ``true`` residual the next cycle starts from and the one the
    last cycle started from."""
    if estimate < ESTIMATE_DRIFT * true and true > CYCLE_PROGRESS * last_true:
        return (f"stagnated: the true residual {true:.3e} did not fall below {CYCLE_PROGRESS} times the last "
                f"cycle's ({last_true:.3e}) while that cycle's estimate fell to {estimate:.3e}: the tolerance is "
                f"below what the method attains on this problem in floating point")
    return None


def gmres(run):
    """Restarted, left-preconditioned GMRES with classical Gram-Schmidt refined if needed
    (PETSc's KSPGMRES with ``-ksp_gmres_cgs_refinement_type refine_ifneeded``); each cycle one
    compiled call where the iterations can run inside one (:func:`_restarted_inside`)."""
    if run.inside is None:
        return _restarted(run, _gmres_cycle, 1)
    return _restarted_inside(run, gmres_cycle, 1)


def _restarted_inside(run, cycle, slots: int):
    """:func:`_restarted` with each cycle one call of ``cycle`` (:func:`.compiled.gmres_cycle`
    or :func:`.compiled.pipegmres_cycle`: an assembled matrix, a pointwise preconditioner).
    The basis goes in as a :func:`.vector_table`: one compiled cycle serves every restart length."""
    names = [f"v{k}" for k in range(run.restart_length + slots)]
    try:
        halos = run.inside_halos(tuple(names[:run.restart_length + 1]))  # the vectors the operator multiplies
        multiplied, owned = halos[1], len(run.v["x"])
        rows = len(multiplied[0])  # with the halo rows (one process: the owned ones)
        table = np.concatenate([vector_table(multiplied, rows),
                                vector_table([run.v[name] for name in names[len(multiplied):]], owned)])
        basis = (table, owned, rows)
        return _restarted(run, lambda run, _, beta, i: _cycle_inside(cycle, run, halos, basis, beta, i), slots)
    finally:
        run.inside_done(*names, "w")


def _called_inside(run, iterate, before, state, i: int, history, after):
    """One call of compiled iterations (:mod:`.compiled`): ``iterate(*run.inside, *before, pc,
    state, target, dtol, i, maxiter, history, *after)``, its reductions counted, its undecided
    norms recorded, a failed MPI call reported (the job ends). Returns ``(i, why, value,
    reason)``; ``reason``: :meth:`SolveRun.check`'s, where a norm decided (:data:`.compiled.NORM`)."""
    i, why, value, reductions, written = iterate(*run.inside, *before, run.pc.compiled, state, run.target,
                                                 run.divergence_limit(), i, run.maxiter, history, *after)
    if why == COMMUNICATION:
        run.communication_failed(int(value))
    run.reductions += reductions
    decided = why == NORM  # its norm is recorded by run.check below
    run.history.extend(history[:written - decided].tolist())
    return i, why, value, (run.check(i, value) if decided else None)


def _cycle_inside(cycle, run, halos, basis, beta: float, i: int):
    """One GMRES or p(1)-GMRES cycle as one call of the compiled ``cycle``: the same bits, norms,
    counts and reasons as :func:`_gmres_cycle` or :func:`_pipegmres_cycle`. ``halos``:
    :meth:`SolveRun.inside_halos`'s; ``basis``: ``(table, owned rows, rows with the halo)``."""
    distributed, _, exchange, functions, handles = halos
    before = (run.v["x"], run.v["w"], *basis)
    i, _, _, reason = _called_inside(run, cycle, before, beta, i, np.empty(run.restart_length),
                                     (distributed, exchange, functions, handles))
    return i, reason


def _gmres_cycle(run, basis, beta: float, i: int):
    """One GMRES cycle from the normalised ``v_0``: ``(iterations, reason)``."""
    v, m = run.v, run.restart_length
    lsq = _LeastSquares(beta, m)
    reason = None
    for j in range(m):
        new = v[basis[j + 1]]
        run.A(basis[j], "w")
        run.B("w", basis[j + 1], fused_done=False)
        h, h_next = _orthogonalise(run, basis, j)
        happy = _happy(h_next, lsq.g[j])
        estimate = lsq.add([*h, h_next])
        i += 1
        reason = run.check(i, 0.0 if happy else estimate)
        if reason is not None or happy:
            break
        scal(1.0 / h_next, new)
    _add_basis(run, basis, lsq.solution())
    return i, reason


def pipegmres(run):
    """p(1)-GMRES, left-preconditioned (PETSc's KSPPGMRES): the basis vector ``z_j = B A
    v_{j-1}`` is orthogonalised one iteration late, its dots and norm summed in one
    ``Iallreduce`` that is in flight while ``z_{j+1} = B A z_j`` is computed; the shifted
    basis is corrected with the Hessenberg entries once they arrive."""
    if run.inside is None:
        return _restarted(run, _pipegmres_cycle, 2)
    return _restarted_inside(run, pipegmres_cycle, 2)


def _pipegmres_cycle(run, basis, beta: float, i: int):
    """One cycle of p(1)-GMRES from the normalised ``v_0``: ``(iterations, reason)``.

    Slot ``basis[t]`` first holds ``z_t = B A z_{t-1}``, the operator applied to the previous
    slot before that slot was orthogonalised; at step ``t`` (with ``t`` as PETSc's ``it``)
    the reduction started at step ``t - 1`` arrives: ``||u_{t-1}||`` of the vector
    orthogonalised then, and the dots of ``z_t`` with the basis, taken while ``u_{t-1}`` was
    not yet normalised. Normalising ``u_{t-1}`` completes Hessenberg column ``t - 2`` (an
    iteration); ``z_t`` and ``z_{t+1}`` are rescaled with it, ``z_{t+1}`` is corrected into
    ``B A u_t`` by the Arnoldi relation, ``z_t`` is orthogonalised into ``u_t``, and one
    ``Iallreduce`` of ``||u_t||^2`` and ``z_{t+1}``'s dots starts, in flight while the next
    step applies the operator. In exact arithmetic: classical GMRES's basis and Hessenberg
    matrix, one iteration later."""
    v, m = run.v, run.restart_length
    lsq = _LeastSquares(beta, m)
    hessenberg: list[list[float]] = []  # unrotated columns (the Arnoldi relation)
    reason, handle, column = None, None, []
    for t in range(m + 2):
        if t <= m:
            run.A(basis[t], "w")
            run.B("w", basis[t + 1], fused_done=False)
        if t > 0:
            sums = run.wait(handle)
            column = [float(c) for c in sums[-t:]]  # (z_t, slot_k), k < t
        if t > 1:
            norm = math.sqrt(max(float(sums[0]), 0.0))
            hessenberg[t - 2].append(norm)
            happy = _happy(norm, lsq.g[t - 2])
            estimate = lsq.add(hessenberg[t - 2])
            i += 1
            reason = run.check(i, 0.0 if happy else estimate)
            if reason is not None or happy or t == m + 1:
                break
            _normalised(v, basis, t, norm, column)
        if t > 0:
            _correct_next(v, basis, hessenberg, column, t)
            hessenberg.append(column)
            sums = np.empty(t + 2)
            sums[0] = dot(v[basis[t]], v[basis[t]])
            mdot([v[basis[k]] for k in range(t + 1)], v[basis[t + 1]], sums[1:])
            handle = run.start(sums)
        else:
            handle = run.start(np.array([dot(v[basis[1]], v[basis[0]])]))
    count = len(lsq.columns)
    _add_basis(run, basis[:count], lsq.solution())
    return i, reason


def _normalised(v, basis, t: int, norm: float, column: list) -> None:
    """``u_{t-1}`` normalised into ``v_{t-1}``; ``z_t`` and ``z_{t+1}`` (images of the
    unnormalised ``u_{t-1}``) and ``z_t``'s dots rescaled to match."""
    for slot in (t - 1, t, t + 1):
        scal(1.0 / norm, v[basis[slot]])
    for k in range(t):
        column[k] /= norm
    column[t - 1] /= norm  # (z_t, u_{t-1}): both were unnormalised


def _correct_next(v, basis, hessenberg, column: list, t: int) -> None:
    """``z_{t+1} = B A z_t`` becomes ``B A u_t`` with ``u_t = z_t - sum_k h_k v_k``
    (``column``: the ``h_k``), and ``z_t`` becomes ``u_t``: ``B A v_k`` is ``sum_l H_lk
    v_l`` for the completed columns and ``z_t`` itself for ``k = t - 1``."""
    following, current = v[basis[t + 1]], v[basis[t]]
    coefficients = [0.0] * t  # sum_k column_k H_lk over the completed columns, per basis vector l
    for k in range(t - 1):
        for l_index, h_lk in enumerate(hessenberg[k]):
            coefficients[l_index] -= column[k] * h_lk
    maxpy([*coefficients, -column[t - 1]], [v[basis[k]] for k in range(t)] + [current], following)
    maxpy([-c for c in column], [v[basis[k]] for k in range(t)], current)


# --- BiCGStab ---------------------------------------------------------------------------------------


def _breakdown(what: str, value: float) -> str:
    return f"breakdown: {what} = {value:.3e} (BiCGStab's recurrence cannot continue)"


def bicgstab(run):
    """Left-preconditioned BiCGStab (PETSc's KSPBCGS): ``||B r||`` is tested."""
    v, out = run.v, np.zeros(2)
    _preconditioned_residual(run, "r", "z")
    rr = run.reduce(np.array([dot(v["r"], v["r"])]))[0]
    rho = rr  # (r, r~) with r~ = r
    i = 0
    reason = run.check(i, math.sqrt(max(rr, 0.0)))
    copy(v["r"], v["rp"])
    for name in ("p", "v"):
        v[name][:] = 0.0
    rho_old = alpha = omega_old = 1.0
    if reason is None and run.inside is not None:
        return _bicgstab_inside(run, i, np.array([rho, rho_old, alpha, omega_old]))
    while reason is None:
        if rho == 0.0:
            return i, _breakdown("(r, r~)", rho), 0
        beta = (rho / rho_old) * (alpha / omega_old)
        lincomb(1.0, v["r"], -omega_old * beta, v["v"], beta, v["p"])  # p = r + beta (p - omega v)
        run.A("p", "z")
        run.B("z", "v", fused_done=False)
        d1 = run.reduce(np.array([dot(v["v"], v["rp"])]))[0]
        if d1 == 0.0:
            return i, _breakdown("(B A p, r~)", d1), 0
        alpha = rho / d1
        waxpy(v["s"], -alpha, v["v"], v["r"])  # s = r - alpha v
        run.A("s", "z")
        run.B("z", "t", fused_done=False)
        dot_two(v["s"], v["t"], v["t"], v["t"], out)
        st, tt = run.reduce(out)
        if tt == 0.0 or st == 0.0:
            return _stalled(run, i, alpha, "p", "s", ("(B A s, B A s)", tt) if tt == 0.0 else ("omega", st))
        omega = st / tt
        axpy(alpha, v["p"], v["x"])
        axpy(omega, v["s"], v["x"])
        waxpy(v["r"], -omega, v["t"], v["s"])  # r = s - omega t
        rho_old, omega_old = rho, omega
        dot_two(v["r"], v["r"], v["r"], v["rp"], out)
        rr, rho = run.reduce(out)
        i += 1
        reason = run.check(i, math.sqrt(max(rr, 0.0)))
    return i, reason, 0


INSIDE_ITERATIONS = 1024
"""The most iterations one compiled call of :func:`_bicgstab_inside` runs before Python sees them."""


def _bicgstab_inside(run, i: int, state: np.ndarray):
    """:func:`bicgstab`'s loop from iteration ``i`` (``state = [rho, rho_old, alpha,
    omega_old]``) as calls of :func:`.compiled.bicgstab_iterations` (an assembled matrix, a
    pointwise preconditioner): the same bits, norms, counts and reasons as the Python loop."""
    v, reason = run.v, None
    history = np.empty(max(1, min(run.maxiter, INSIDE_ITERATIONS)))
    distributed, (p_all, s_all), exchange, functions, handles = run.inside_halos(("p", "s"))
    vectors = [v[name] for name in ("x", "r", "rp", "p", "v", "s", "t", "z")]
    after = (distributed, p_all, s_all, exchange, functions, handles)
    try:
        while reason is None:
            i, why, value, reason = _called_inside(run, bicgstab_iterations, vectors, state, i, history, after)
            if why == RHO:
                reason = _breakdown("(r, r~)", value)
            elif why == DENOMINATOR:
                reason = _breakdown("(B A p, r~)", value)
            elif why in (STALLED_T, STALLED_S):
                run.inside_done("p", "s", "z")
                what = ("(B A s, B A s)", value) if why == STALLED_T else ("omega", value)
                return _stalled(run, i, float(state[2]), "p", "s", what)
    finally:
        run.inside_done("p", "s", "z")
    return i, reason, 0


def _stalled(run, i: int, alpha: float, direction: str, rest: str, what: tuple):
    """BiCGStab's ``omega`` cannot be formed (``t = 0`` or ``(s, t) = 0``): when ``s = 0``
    the half step ``x += alpha p`` solves it, else the recurrence breaks down."""
    v = run.v
    ss = run.reduce(np.array([dot(v[rest], v[rest])]))[0]
    if ss != 0.0:
        return i, _breakdown(*what), 0
    axpy(alpha, v[direction], v["x"])
    return i + 1, run.check(i + 1, 0.0), 0


def pipebicgstab(run):
    """Pipelined BiCGStab, right-preconditioned (PETSc's KSPPIPEBCGS): ``||r||`` is tested."""
    v = run.v
    run.A("x", "q2")
    residual(v["b"], v["q2"], v["r"])
    i = 0
    reason = run.check(i, _norm(run, "r"))
    if reason is not None:
        return i, reason, 0
    rho, d2 = _pipebicgstab_start(run)
    if d2 == 0.0:
        return i, _breakdown("(A B r, r~)", d2), 0
    alpha, beta, omega = rho / d2, 0.0, 0.0
    if run.inside is not None:
        return _pipebicgstab_inside(run, i, np.array([rho, alpha, beta, omega, 0.0]))
    while True:
        _pipebicgstab_directions(v, i, beta, omega)
        waxpy(v["q"], -alpha, v["s"], v["r"])
        waxpy(v["q2"], -alpha, v["s2"], v["r2"])
        waxpy(v["y"], -alpha, v["z"], v["w"])
        handle = run.start(np.array([dot(v["q"], v["y"]), dot(v["y"], v["y"])]))
        _apply_ba(run, "z", "z2", "v")  # z2 = B z, v = A z2
        qy, yy = run.wait(handle)
        if yy == 0.0 or qy == 0.0:
            return _stalled(run, i, alpha, "p2", "q", ("(y, y)", yy) if yy == 0.0 else ("omega", qy))
        omega = qy / yy
        rho_old = rho
        rr, rho, denominator, beta = _pipebicgstab_step(run, alpha, omega, rho_old)
        i += 1
        if i % 100 == 1 and 1 < i < 1002:  # PETSc's periodic replacement (its i > 0, i % 100 == 0, i < 1001)
            _pipebicgstab_replace(run)
        reason = run.check(i, math.sqrt(max(rr, 0.0)))
        if reason is not None:
            return i, reason, 0
        if rho == 0.0 or denominator == 0.0:
            return i, _breakdown("(r, r~)", rho) if rho == 0.0 else _breakdown("alpha's denominator", 0.0), 0
        alpha = rho / denominator


_PIPEBICGSTAB_VECTORS = ("x", "r", "rp", "r2", "w", "w2", "t", "p2", "s", "s2", "z", "z2", "v", "q", "q2", "y")


def _pipebicgstab_inside(run, i: int, state: np.ndarray):
    """:func:`pipebicgstab`'s loop from iteration ``i`` (``state = [rho, alpha, beta, omega, _]``)
    as calls of :func:`.compiled.pipebicgstab_iterations` (an assembled matrix, a pointwise
    preconditioner), PETSc's periodic residual replacement done here between them: the same
    bits, norms, counts and reasons as the Python loop."""
    v, reason = run.v, None
    history = np.empty(max(1, min(run.maxiter, INSIDE_ITERATIONS)))
    distributed, (z2_all, w2_all), exchange, functions, handles = run.inside_halos(("z2", "w2"))
    vectors = [v[name] for name in _PIPEBICGSTAB_VECTORS]
    after = (distributed, z2_all, w2_all, exchange, functions, handles)
    try:
        while reason is None:
            i, why, value, reason = _called_inside(run, pipebicgstab_iterations, vectors, state, i, history, after)
            if why == RHO:
                reason = _breakdown("(r, r~)", value)
            elif why == DENOMINATOR:
                reason = _breakdown("alpha's denominator", 0.0)
            elif why in (STALLED_T, STALLED_S):
                run.inside_done("z2", "w2", "v", "t")
                what = ("(y, y)", value) if why == STALLED_T else ("omega", value)
                return _stalled(run, i, float(state[1]), "p2", "q", what)
            elif why == REPLACE:
                reason = _replaced(run, i, state)
    finally:
        run.inside_done("z2", "w2", "v", "t")
    return i, reason, 0


def _replaced(run, i: int, state: np.ndarray):
    """The end of iteration ``i`` of :func:`pipebicgstab` after the compiled iterations stopped for
    its residual replacement (``state = [rho, rr, beta, omega, denominator]``): the replacement,
    the norm test, the breakdown tests; ``state`` then holds the loop's ``[rho, alpha, beta,
    omega]``. The reason to stop, or None."""
    rho, rr, beta, omega, denominator = (float(value) for value in state[:5])
    _pipebicgstab_replace(run)
    reason = run.check(i, math.sqrt(max(rr, 0.0)))
    if reason is None and (rho == 0.0 or denominator == 0.0):
        reason = _breakdown("(r, r~)", rho) if rho == 0.0 else _breakdown("alpha's denominator", 0.0)
    if reason is None:
        state[:4] = (rho, rho / denominator, beta, omega)
    return reason


def _pipebicgstab_start(run) -> tuple[float, float]:
    """``r~ = r``; ``r2 = B r``, ``w = A r2``, ``w2 = B w``, ``t = A w2``: ``(r, r~)`` and
    ``(w, r~)``, each reduction in flight during an operator application."""
    v = run.v
    copy(v["r"], v["rp"])
    handle = run.start(np.array([dot(v["r"], v["rp"])]))
    _apply_ba(run, "r", "r2", "w")
    rho = run.wait(handle)[0]
    handle = run.start(np.array([dot(v["w"], v["rp"])]))
    _apply_ba(run, "w", "w2", "t")
    return rho, run.wait(handle)[0]


def _pipebicgstab_step(run, alpha: float, omega: float, rho_old: float):
    """The update, then ``||r||^2``, ``rho`` and ``alpha``'s denominator summed while
    ``t = A B w`` is computed: ``(rr, rho, denominator, beta)``."""
    v = run.v
    _pipebicgstab_update(v, alpha, omega)
    handle = run.start(np.array([dot(v["r"], v["r"]), dot(v["r"], v["rp"]), dot(v["s"], v["rp"]),
                                 dot(v["w"], v["rp"]), dot(v["z"], v["rp"])]))
    _apply_ba(run, "w", "w2", "t")
    rr, rho, d1, d2, d3 = run.wait(handle)
    beta = (rho / rho_old) * (alpha / omega)
    return rr, rho, d2 + beta * d1 - beta * omega * d3, beta


def _apply_ba(run, src: str, preconditioned: str, dst: str) -> None:
    """``preconditioned = B src``, ``dst = A preconditioned`` (right preconditioning)."""
    run.B(src, preconditioned, fused_done=False)
    run.A(preconditioned, dst)


def _pipebicgstab_directions(v, i: int, beta: float, omega: float) -> None:
    if i == 0:
        for src, dst in (("r2", "p2"), ("w", "s"), ("w2", "s2"), ("t", "z")):
            copy(v[src], v[dst])
        return
    for new, old, correction in (("r2", "p2", "s2"), ("w", "s", "z"), ("w2", "s2", "z2"), ("t", "z", "v")):
        lincomb(1.0, v[new], -beta * omega, v[correction], beta, v[old])  # old = new + beta (old - omega correction)


def _pipebicgstab_update(v, alpha: float, omega: float) -> None:
    """``x += alpha p2 + omega q2; r = q - omega y; r2 = q2 - omega (w2 - alpha z2);
    w = y - omega (t - alpha v)``."""
    axpy(alpha, v["p2"], v["x"])
    axpy(omega, v["q2"], v["x"])
    waxpy(v["r"], -omega, v["y"], v["q"])
    waxpy(v["r2"], -alpha, v["z2"], v["w2"])
    waxpy(v["r2"], -omega, v["r2"], v["q2"])
    waxpy(v["w"], -alpha, v["v"], v["t"])
    waxpy(v["w"], -omega, v["w"], v["y"])


def _pipebicgstab_replace(run) -> None:
    """Recompute ``r = b - A x`` and the vectors that follow from it and from ``p2``."""
    v = run.v
    run.A("x", "r")
    residual(v["b"], v["r"], v["r"])
    _apply_ba(run, "r", "r2", "w")
    _apply_ba(run, "w", "w2", "t")
    run.A("p2", "s")
    _apply_ba(run, "s", "s2", "z")
    _apply_ba(run, "z", "z2", "v")


NONSYMMETRIC = {"gmres": gmres, "pipegmres": pipegmres, "bicgstab": bicgstab, "pipebicgstab": pipebicgstab}
