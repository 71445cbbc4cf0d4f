"""Linear solvers on the mesh: Krylov methods (classical, single-reduction and pipelined
CG, pipelined CR; restarted and pipelined GMRES, BiCGStab and pipelined BiCGStab) with
pointwise, block-ILU, polynomial and users' preconditioners, for assembled
:class:`~meshchain.Mat` matrices and matrix-free :class:`LinearOperator` s, with vectors
as dats; and PETSc's whole KSP/PC toolbox through ``method="petsc"``.

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
from .operators import LinearOperator
from .powers import matrix_powers
from .precond import PRECONDITIONERS, Preconditioner
from .solve import METHODS, SolveInfo, solve_with

__all__ = ["solve", "matrix_powers", "LinearOperator", "Preconditioner", "SolveInfo", "METHODS", "PRECONDITIONERS"]


def solve(A, x, b, *, method: str = "cg", pc: str | None = "jacobi", rtol: float = 1e-8, atol: float = 0.0,
          maxiter: int = 10000, residual_replacement: bool | None = None, restart: int = 30, options: dict | None = None,
          monitor=None, s: int | None = None, basis: str = "newton") -> SolveInfo:
    """Solve ``A x = b`` from the values ``x`` holds, with a Krylov method (collective).

    Parameters
    ----------
    A : Mat or LinearOperator
        Square, rows on the set ``x`` and ``b`` live on. The CG-family methods need it
        symmetric positive definite (a nonsymmetric one is accepted, but CG's theory does
        not hold for it: use a nonsymmetric method); GMRES and BiCGStab take any
        nonsingular operator.
    x, b : Dat
        The initial guess (overwritten by the solution) and the right-hand side. A block
        ``Mat`` over mixed spaces takes :class:`~meshchain.MixedDat` s instead, with
        ``method="petsc"`` (its components are PETSc's fields ``"0"``, ``"1"``, ... for
        ``pc_type fieldsplit``; see :mod:`meshchain.linalg.block_solve`).
    method : {"cg", "cg1", "pipecg", "groppcg", "pipecr", "sstep-cg", "ca-cg", "gmres", "pipegmres", "ca-gmres", \
"bicgstab", "pipebicgstab", "petsc"}, keyword-only
        Symmetric positive definite operators: ``"cg"``: classical preconditioned CG, two
        blocking reductions per iteration. ``"cg1"``: Chronopoulos/Gear, one blocking
        reduction. ``"pipecg"``: Ghysels-Vanroose pipelined CG, one non-blocking reduction
        in flight while the preconditioner and the SpMV run. ``"groppcg"``: Gropp's CG, two
        non-blocking reductions. ``"pipecr"``: pipelined conjugate residuals.
        ``"sstep-cg"``: s-step (communication-avoiding) CG in block form, ``s`` iterations
        from ``s`` products, one matrix powers exchange and one reduction (assembled
        matrices, or matrix-free operators whose bases run as communication-avoiding loop
        chains, :mod:`meshchain.linalg.freecg`; ``pc=None`` or ``"jacobi"``; the residual is
        tested every ``s`` iterations; ``s <= 5`` advised; :mod:`meshchain.linalg.blockcg`).
        ``"ca-cg"``: CA-CG, CG's own iterations and residuals from ``2s - 1`` products per
        exchange and reduction (assembled matrices; :mod:`meshchain.linalg.sstep`).
        Any operator (:mod:`meshchain.linalg.nonsymmetric`): ``"gmres"``: restarted GMRES,
        left-preconditioned (PETSc's default). ``"pipegmres"``: p(1)-GMRES, one
        non-blocking reduction per iteration. ``"ca-gmres"``: communication-avoiding GMRES,
        ``s`` Arnoldi columns per matrix powers exchange and per reduction (assembled
        matrices, ``pc=None`` or ``"jacobi"`` as a symmetric scaling, so the norm tested is
        ``||D^-1/2 r||``; :mod:`meshchain.linalg.cagmres`). ``"bicgstab"``: BiCGStab, left-preconditioned.
        ``"pipebicgstab"``: pipelined BiCGStab, right-preconditioned (the norm tested is
        ``||b - A x||``), two non-blocking reductions.
        ``"petsc"``: PETSc's KSP and PC, chosen with ``options`` (needs petsc4py:
        ``pip install meshchain[petsc]``; see :mod:`meshchain.linalg.petsc`).
    pc : {None, "jacobi", "sgs", "bjacobi-ilu", "chebyshev"} or Preconditioner, keyword-only
        ``"sgs"``: one symmetric Gauss-Seidel sweep on each rank's owned block (block
        Jacobi over the ranks; assembled matrices only). ``"bjacobi-ilu"``: ILU(0) of each
        rank's owned block (PETSc's default PCBJACOBI with PCILU; assembled matrices
        only). ``"chebyshev"``: a degree-3 Chebyshev polynomial in the Jacobi-scaled
        operator, bounds from a few CG steps at set-up; no reductions when applied, so it
        suits the pipelined methods. A :class:`~meshchain.Preconditioner`: the user's own
        ``apply(r, z)`` (see :mod:`meshchain.linalg.precond`).
    rtol, atol : float, keyword-only
        Stop when the preconditioned residual norm ``||B r||`` is at most
        ``max(rtol * ||B r_0||, atol)`` (PETSc's default test).
    maxiter : int, keyword-only
        A residual that grows above ``1e5`` times the initial one also ends the solve
        (``"diverged: ..."``, PETSc's ``dtol``).
    residual_replacement : bool or None, keyword-only
        For ``"pipecg"``: replace the recursive residual when the rounding-error bounds of
        Cools et al. say it drifted (PETSc's PIPECGRR, with the matrix's real nonzeros per
        row); reaches the accuracy of classical CG. ``None`` (the default): on whenever the
        operator gives the bounds' inputs (every Mat; a LinearOperator given ``norm_inf`` and
        ``nonzeros_per_row``), replacing only where the bounds' gap estimate also exceeds a
        tenth of the target norm (the tolerance is within reach of rounding), so a loose
        tolerance runs plain PIPECG's iterations; ``True``: PETSc's criterion alone, which also
        replaces far above the tolerance (each replacement: four products and two
        preconditioner applications). Whatever this says, a
        recurrence that rounding breaks down (a curvature ``<= 0`` that inner products
        computed directly do not confirm, or a recursive residual that met the tolerance
        while the true one did not) restarts the method from the current ``x``
        (:mod:`meshchain.linalg.recovery`).
    restart : int, keyword-only
        The basis size of ``"gmres"``, ``"pipegmres"`` and ``"ca-gmres"`` (restarted every
        ``restart`` iterations, PETSc's default 30).
    options : dict, keyword-only
        For ``method="petsc"`` only: PETSc options in PETSc's names without the dash
        (``{"ksp_type": "cg", "pc_type": "gamg"}``; the KSP type defaults to ``"gmres"``).
        They win over ``rtol``, ``atol``, ``maxiter`` and ``pc`` (which PETSc gets as
        ``pc_type`` ``none``, ``jacobi``, or ``sor`` with local symmetric sweeps for ``"sgs"``).
    s : int, keyword-only
        ``"sstep-cg"``'s, ``"ca-cg"``'s and ``"ca-gmres"``'s iterations per exchange and
        reduction (1 to 16; default 4), or ``"auto"``: the ``s`` the Krylov model predicts fastest from costs
        measured on ``A`` (:mod:`meshchain.linalg.tune`; ``SolveInfo.steps`` says which, and
        ``SolveInfo.predicted`` the predicted time per iteration of every method, the s-step ones at
        the ``s`` this method chooses among). The default is a
        number, not ``"auto"``: the model chooses from timings, which differ from run to run (between
        ``s = 4`` and 5 on the same problem here), and a different ``s`` gives different iterates.
    basis : {"newton", "monomial"}, keyword-only
        The s-step methods' Krylov basis: Newton polynomials with shifts from Ritz values
        (the default, stable for larger ``s``; complex Ritz pairs as real three-term steps in
        ``"ca-gmres"``) or monomials.
    monitor : callable, keyword-only
        ``monitor(iteration, norm)``, called on every rank; an exception it raises on some
        ranks is raised on every rank (one small ``Allreduce`` per call on several ranks).
        Without one, ``"cg"`` and
        ``"cg1"`` with an assembled matrix and ``pc=None`` or ``"jacobi"`` runs its iterations inside
        compiled calls, on several ranks with MPI called from them (no Python between
        iterations; the same bits as with a monitor, see :mod:`meshchain.linalg.compiled`).
        Anything but None or a callable is refused.

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
        without a diagonal, a non-positive diagonal). With ``method="petsc"``: petsc4py
        missing, an option PETSc refuses or never reads (named); ``options`` with another method.
    SetMismatchError
        When ``x`` or ``b`` live on another set than the operator's rows.

    Notes
    -----
    A solve of the same assembled Mat by the same method with the same options as the last
    one (any ``x`` and ``b``: the same Dats with new values, or new Dats, as a time loop passes
    them) runs on the set-up that solve kept (work vectors, preconditioner, compiled
    arguments): the same bits as a solve set up anew. New values assembled into the Mat, other
    options, a monitor, a user's or Chebyshev preconditioner, or a mesh partitioned or laid
    out again set it up anew. ``mc.stats().caches["kept
    solves"]`` counts the solves that ran on a kept set-up (``hits``).
    """
    return solve_with(engine_surface(), A, x, b, method=method, pc=pc, rtol=rtol, atol=atol, maxiter=maxiter,
                      residual_replacement=residual_replacement, restart=restart, options=options, monitor=monitor, s=s, basis=basis)
