"""What a solve reports: :class:`SolveInfo` (every method, ``method="petsc"`` included), and
the user's ``monitor`` called with every norm (:func:`monitored`)."""

from __future__ import annotations

import dataclasses

from ..comm.agree import raise_together

__all__ = ["SolveInfo", "monitored"]


def monitored(comm, monitor, iteration: int, norm: float) -> None:
    """Call ``monitor(iteration, norm)``; an exception it raises on some ranks is raised on
    every rank (:func:`~meshchain.comm.agree.raise_together`: one small ``Allreduce`` per call
    on several ranks), so that no rank waits in the solve's next sum for one that left it.

    >>> monitored(None, lambda i, norm: print(i, norm), 3, 0.5)
    3 0.5
    """
    error = None
    try:
        monitor(iteration, norm)
    except Exception as exc:  # the user's code: any exception, raised on every rank below
        error = exc
    raise_together(comm, error)


@dataclasses.dataclass
class SolveInfo:
    """What :func:`meshchain.solve` did (the same on every rank).

    Attributes
    ----------
    iterations : int
    converged : bool
        The recursive residual met the tolerance and the true one is within
        :data:`~meshchain.linalg.recovery.FALSE_CONVERGENCE_FACTOR` of it.
    reason : str
        ``"converged"``, or why not (``"diverged: maxiter ..."``, ``"indefinite: ..."``
        (proved by inner products computed directly), ``"stagnated: ..."`` (the tolerance
        is below the method's attainable accuracy), ``"breakdown: ..."`` (BiCGStab)).
    residual_history : list of float
        The residual norm the method tested at each iteration (from 0): the
        preconditioned ``||B r||``, except for the right-preconditioned ``"pipebicgstab"``
        (``||r||``) and PETSc's choice with ``method="petsc"``.
    true_residual : float
        ``||b - A x||_2`` computed at exit (comparable with the history of
        ``"pipebicgstab"``).
    true_residual_preconditioned : float
        ``||B (b - A x)||_2``, comparable with the history of the other methods.
    time_per_iteration : float
        Seconds per iteration (wall clock of the iterations, this rank).
    time_reduction_wait : float
        Seconds spent waiting for reductions to complete (this rank; 0 for iterations run
        inside compiled calls, :mod:`.compiled`).
    reductions : int
        Reductions started.
    replacements : int
        Residual replacements made.
    method : str
    pc : str, None or Preconditioner
        As passed (with ``method="petsc"``: the PETSc PC type used).
    restarts : int
        Restarts from the current ``x`` after rounding broke a recurrence down
        (:mod:`meshchain.linalg.recovery`).
    steps : int or None
        The ``s`` of ``"sstep-cg"``, ``"ca-cg"`` and ``"ca-gmres"`` (chosen by the model with
        ``s="auto"``); None for the other methods.
    predicted : dict
        With ``s="auto"``: the Krylov model's predicted seconds per iteration of every
        method on this problem (``"cg"``, ``"pipecg"``, ``"gmres"``, ``"sstep-cg s=4"``, ...,
        the s-step methods at the ``s`` the solved method chooses among;
        :mod:`meshchain.model.krylov`), to set beside ``time_per_iteration``; else empty.
    """

    iterations: int
    converged: bool
    reason: str
    residual_history: list
    true_residual: float
    true_residual_preconditioned: float
    time_per_iteration: float
    time_reduction_wait: float
    reductions: int
    replacements: int
    method: str
    pc: str | None
    restarts: int = 0
    steps: int | None = None
    predicted: dict = dataclasses.field(default_factory=dict)
