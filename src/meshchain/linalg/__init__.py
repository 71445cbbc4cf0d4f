"""Linear solvers on the mesh: Krylov methods (classical, single-reduction and pipelined
CG, pipelined CR) for assembled :class:`~meshchain.Mat` matrices and matrix-free
:class:`LinearOperator` s, with vectors as dats.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes, edges = mc.Set(4, "nodes"), mc.Set(3, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2], [2, 3]], "e2n")
>>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
>>> @mc.kernel
... def spring(a):
...     a[0, 0] += 2.0
...     a[0, 1] -= 1.0
...     a[1, 0] -= 1.0
...     a[1, 1] += 2.0
>>> mc.par_loop(spring, edges, A(mc.INC, (e2n, e2n)))
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.ones(4), "b")
>>> info = mc.solve(A, x, b, method="pipecg", pc="jacobi", rtol=1e-12)
>>> info.converged, info.iterations <= 4, info.true_residual < 1e-10
(True, True, True)
"""

from __future__ import annotations

from ..api import engine_surface
from .krylov import METHODS
from .operators import LinearOperator
from .precond import PRECONDITIONERS
from .solve import SolveInfo, solve_with

__all__ = ["solve", "LinearOperator", "SolveInfo", "METHODS", "PRECONDITIONERS"]


def solve(A, x, b, *, method: str = "cg", pc: str | None = "jacobi", rtol: float = 1e-8, atol: float = 0.0,
          maxiter: int = 10000, residual_replacement: bool = False, monitor=None) -> SolveInfo:
    """Solve ``A x = b`` from the values ``x`` holds, with a Krylov method (collective).

    Parameters
    ----------
    A : Mat or LinearOperator
        Symmetric positive definite (square; rows on the set ``x`` and ``b`` live on).
    x, b : Dat
        The initial guess (overwritten by the solution) and the right-hand side.
    method : {"cg", "cg1", "pipecg", "groppcg", "pipecr"}, keyword-only
        ``"cg"``: classical preconditioned CG, two blocking reductions per iteration.
        ``"cg1"``: Chronopoulos/Gear, one blocking reduction. ``"pipecg"``:
        Ghysels-Vanroose pipelined CG, one non-blocking reduction in flight while the
        preconditioner and the SpMV run. ``"groppcg"``: Gropp's CG, two non-blocking
        reductions. ``"pipecr"``: pipelined conjugate residuals.
    pc : {None, "jacobi", "sgs"}, keyword-only
        ``"sgs"``: one symmetric Gauss-Seidel sweep on each rank's owned block (block
        Jacobi over the ranks; assembled matrices only).
    rtol, atol : float, keyword-only
        Stop when the preconditioned residual norm ``||B r||`` is at most
        ``max(rtol * ||B r_0||, atol)`` (PETSc's default test).
    maxiter : int, keyword-only
    residual_replacement : bool, keyword-only
        For ``"pipecg"``: replace the recursive residual when the rounding-error bounds of
        Cools et al. say it drifted (PETSc's PIPECGRR, with the matrix's real nonzeros per
        row); reaches the accuracy of classical CG.
    monitor : callable, keyword-only
        ``monitor(iteration, norm)``, called on every rank. Without one, ``"cg"`` and
        ``"cg1"`` with an assembled matrix and ``pc=None`` or ``"jacobi"`` runs its iterations inside
        compiled calls, on several ranks with MPI called from them (no Python between
        iterations; the same bits as with a monitor, see :mod:`meshchain.linalg.compiled`).

    Returns
    -------
    SolveInfo
        Iterations, convergence and its reason, the residual history, the true residual
        ``||b - A x||`` computed at exit (a solve whose true residual is far above the
        tolerance is reported as not converged), times per iteration and waiting in
        reductions.

    Raises
    ------
    SolverError
        On every rank, for an unknown method or preconditioner, vectors of the wrong dim,
        or a preconditioner the operator cannot give (``"sgs"`` matrix-free, ``"jacobi"``
        without a diagonal, a non-positive diagonal).
    SetMismatchError
        When ``x`` or ``b`` live on another set than the operator's rows.
    """
    return solve_with(engine_surface(), A, x, b, method=method, pc=pc, rtol=rtol, atol=atol, maxiter=maxiter,
                      residual_replacement=residual_replacement, monitor=monitor)
