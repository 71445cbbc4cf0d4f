"""Telling rounding from a real breakdown: restarts, the direct curvature check and stagnation.

The single-reduction and pipelined methods (``cg1``, ``pipecg``, ``groppcg``, ``pipecr``) get
their inner products from recurrences. Near the attainable accuracy the recurrences carry
more rounding than signal: a step's ``(p, A p)`` can come out ``<= 0`` on an SPD matrix, or
the recursive residual can meet the tolerance while the true one has not. PETSc's KSPPIPECG
reports the first as an indefinite matrix; meshchain checks before it says so:

* a **breakdown** (a curvature or ``(r, B r)`` that is not positive) is checked directly: the
  method's direction ``p`` is multiplied by the operator and ``(p, A p)`` summed from the
  vectors, and ``(r, B r)`` from ``r = b - A x``. A value below ``-CURVATURE_NOISE * eps *
  ||p|| ||A p||`` proves the matrix (or the preconditioner) indefinite, and the solve stops
  with ``reason="indefinite: ..."`` naming the directly computed value; otherwise the
  recurrence lost its accuracy and the method **restarts** from the current ``x``;
* a **false convergence** (the recursive residual met the target, the true one is more than
  :data:`FALSE_CONVERGENCE_FACTOR` above it) restarts the method too, and so does a
  **breakdown** of the nonsymmetric methods (``reason="breakdown: ..."``: a zero ``(r, r~)``
  in BiCGStab);
* a restart that finds the true residual no lower than :data:`PROGRESS` times the one at the
  previous restart, or :data:`RESTARTS` restarts, ends the solve: as ``reason="stagnated:
  ..."`` (the tolerance is below what the method can attain in floating point on this
  problem) when the true residual is within :data:`ROUNDING_LEVEL` of the initial one, else
  with the breakdown the recurrence reported (``"indefinite: ..."``).

A restart keeps the iteration count, the target and the residual history (the restart's
first norm, the true one, replaces the recursive norm of that iteration).

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes = mc.Set(3, "nodes")
>>> @mc.kernel
... def negate(a, b):
...     b[0] = -a[0]
>>> minus = mc.LinearOperator(nodes, lambda x, y: mc.par_loop(negate, nodes, x(mc.READ), y(mc.WRITE)), name="minus")
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.ones(3), "b")
>>> mc.solve(minus, x, b, method="pipecg", pc=None).reason.split(" (the")[0]
'indefinite: (p, A p) computed directly = -3.000e+00 <= 0'
"""

from __future__ import annotations

import math
import time

import numpy as np

from .fused import dot, residual
from .nonsymmetric import NONSYMMETRIC

__all__ = ["run_recovering", "FALSE_CONVERGENCE_FACTOR", "RESTARTS", "PROGRESS", "CURVATURE_NOISE", "ROUNDING_LEVEL"]

FALSE_CONVERGENCE_FACTOR = 10.0
"""A solve counts as converged only if its true preconditioned residual is within this
factor of the tolerance the recursive one met."""

RESTARTS = 8
"""The most restarts of one solve."""

PROGRESS = 0.9
"""A restart must find the true residual below this fraction of the previous restart's."""

CURVATURE_NOISE = 1e3
"""A directly computed ``(p, A p)`` within ``CURVATURE_NOISE * eps * ||p|| ||A p||`` of zero
is rounding, not a proof of indefiniteness."""

_EPS = float(np.finfo(np.float64).eps)

_DIRECTIONS = {False: "preconditioned residual B (b - A x)", True: "method's last search direction"}

ROUNDING_LEVEL = math.sqrt(_EPS)
"""Restarts that make no progress mean stagnation when the true residual is below this
fraction of the initial one; above it, the breakdown the recurrence saw is reported."""


def run_recovering(method, run, spare: tuple[str, str]) -> tuple[int, str, int, tuple[float, float]]:
    """Run ``method(run)``, restarting it where rounding broke it down (module docstring).

    ``spare``: two of the method's work vectors, free between its runs. Returns
    ``(iterations, reason, replacements, (||b - A x||, ||B (b - A x)||))`` over all runs, the
    true residual norms at exit; ``run.restarts`` counts the restarts.
    """
    replacements, previous = 0, None
    while True:
        i, reason, replaced = method(run)
        run.stopped = time.perf_counter()
        replacements += replaced
        run.iterations_before += i
        verdict, true = _verdict(run, reason, spare)
        if verdict != "restart":
            return run.iterations_before, verdict, replacements, true
        tested = _tested(run, true)
        if previous is not None and not tested < PROGRESS * previous or run.restarts >= RESTARTS:
            return run.iterations_before, _no_progress(run, tested, reason), replacements, true
        previous = tested
        run.restart()


def _verdict(run, reason: str, spare) -> tuple[str, tuple[float, float]]:
    """``(reason, true residual norms)`` to end the solve with, or ``("restart", ...)``."""
    if reason.startswith("indefinite"):
        proof = _proof_of_indefiniteness(run, *spare)
        if proof is not None:
            return proof, run.true_residual(*spare)
        return "restart", run.true_residual(*spare)
    true = run.true_residual(*spare)
    if reason.startswith("breakdown"):
        return "restart", true
    if reason == "converged" and _tested(run, true) > FALSE_CONVERGENCE_FACTOR * run.target:
        return "restart", true
    return reason, true


def _tested(run, true: tuple[float, float]) -> float:
    """The true residual norm the method's test compares: ``||b - A x||`` for the
    right-preconditioned methods, else ``||B (b - A x)||``."""
    return true[0] if run.unpreconditioned else true[1]


def _proof_of_indefiniteness(run, r: str, z: str) -> str | None:
    """A reason when inner products summed directly from vectors prove the operator or the
    preconditioner indefinite: ``(r, B r)`` for ``r = b - A x``, then ``(d, A d)`` for the
    preconditioned residual ``z = B r`` and the method's last direction ``p``; None when they
    are positive or at rounding level."""
    v = run.v
    run.A("x", r)
    residual(v["b"], v[r], v[r])
    run.B(r, z, fused_done=False)
    rz, rr, zz = run.reduce(np.array([dot(v[r], v[z]), dot(v[r], v[r]), dot(v[z], v[z])]))
    if rz < -CURVATURE_NOISE * _EPS * math.sqrt(max(rr * zz, 0.0)):
        return (f"indefinite: (r, B r) computed directly = {rz:.3e} <= 0 (the preconditioner is not positive "
                f"definite)")
    for direction in (z, "p"):
        run.A(direction, r)
        dad, dd, aa = run.reduce(np.array([dot(v[direction], v[r]), dot(v[direction], v[direction]),
                                           dot(v[r], v[r])]))
        if dad < -CURVATURE_NOISE * _EPS * math.sqrt(max(dd * aa, 0.0)):
            return (f"indefinite: (p, A p) computed directly = {dad:.3e} <= 0 (the matrix is not positive definite; "
                    f"p the {_DIRECTIONS[direction == 'p']}, ||p|| = {math.sqrt(dd):.3e}, ||A p|| = {math.sqrt(aa):.3e})")
    return None


def _no_progress(run, true: float, reason: str) -> str:
    """Why a solve whose restarts stopped making progress ends: stagnation at the rounding
    level, or (the residual far above it) the breakdown the recurrence saw."""
    if reason.startswith(("indefinite", "breakdown")) and true > ROUNDING_LEVEL * run.history[0]:
        confirmed = "; not confirmed by inner products computed directly, but" if reason[0] == "i" else ";"
        return (f"{reason}{confirmed} the true residual {true:.3e} is far above rounding level and restarting did "
                f"not reduce it")
    instead = "method='gmres'" if run.method in NONSYMMETRIC else "method='cg'"
    return (f"stagnated: the true residual {true:.3e} stays above the target {run.target:.3e} after "
            f"{run.restarts} restart(s) (the last run ended with: {reason}); this is the attainable accuracy of "
            f"method {run.method!r} here: loosen rtol, or use {instead}")
