"""``mc.solve``: Krylov methods on dats, with the true residual checked at exit.

Vectors are dats on the operator's row set: ``x`` and ``b`` are the user's, the work
vectors are dats the solver declares once per operator and method. The methods work on
each rank's owned values through fused compiled passes (:mod:`.fused`), apply the operator
through :meth:`Mat.mult <meshchain.Mat.mult>`'s overlapped SpMV (or the matrix-free loops)
and combine every dot product of a step in one ``Iallreduce``.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from ..core.cache import memo
from ..core.errors import SetMismatchError, SolverError
from ..types import Dat
from .fused import dot, residual
from .krylov import METHODS, VECTORS
from .operators import as_operator
from .precond import PRECONDITIONERS, make_preconditioner
from .replacement import ReplacementBounds

__all__ = ["SolveInfo", "solve_with", "METHODS", "PRECONDITIONERS"]

FALSE_CONVERGENCE_FACTOR = 10.0
"""A solve counts as converged only if its true preconditioned residual is within this
factor of the tolerance the recursive one met."""


@dataclasses.dataclass
class SolveInfo:
    """What :func:`meshchain.solve` did (the same on every rank).

    Attributes
    ----------
    iterations : int
    converged : bool
        The recursive residual met the tolerance and the true one is within
        :data:`FALSE_CONVERGENCE_FACTOR` of it.
    reason : str
        ``"converged"``, or why not (``"diverged: maxiter ..."``, ``"indefinite: ..."``,
        ``"false convergence: ..."``).
    residual_history : list of float
        The preconditioned residual norm the method tested at each iteration (from 0).
    true_residual : float
        ``||b - A x||_2`` computed at exit.
    true_residual_preconditioned : float
        ``||B (b - A x)||_2``, comparable with the history.
    time_per_iteration : float
        Seconds per iteration (wall clock of the iterations, this rank).
    time_reduction_wait : float
        Seconds spent waiting for reductions to complete (this rank; 0 for iterations run
        inside compiled calls, :mod:`.compiled`).
    reductions : int
        Reductions started.
    replacements : int
        Residual replacements made.
    method, pc : str
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


class SolveRun:
    """One solve's vectors, operator, preconditioner, reductions and convergence test."""

    def __init__(self, engine, operator, dats: dict, pc, *, rtol, atol, maxiter, monitor, replacement: bool):
        self.engine, self.operator, self.dats, self.pc = engine, operator, dats, pc
        self.storages = {name: engine.storage(d) for name, d in dats.items()}
        n = engine.n_owned(operator.row_set) * operator.dim
        self.v = {name: s.host.reshape(-1)[:n] for name, s in self.storages.items()}
        self.rtol, self.atol, self.maxiter, self.monitor = rtol, atol, maxiter, monitor
        self.comm = engine.comm
        if self.comm is not None:
            from mpi4py import MPI

            self.sum_op = MPI.SUM
        self.history, self.target, self.wait_time, self.reductions = [], None, 0.0, 0
        self.replacement = replacement
        self.inside = self._inside(engine, operator, pc, n, monitor)
        self._exchange = None  # the halo exchange of iterations inside compiled calls on several ranks

    def _inside(self, engine, operator, pc, n: int, monitor):
        """The CSR arguments of :func:`.compiled.cg_iterations` (``indptr, split, indices,
        values, halo``) when the iterations can run inside compiled calls: an assembled
        matrix, a pointwise preconditioner, no monitor, and on several ranks an MPI library
        compiled code can call (:func:`meshchain.comm.compiled.available`); else None."""
        pattern = getattr(operator, "pattern", None)
        if pattern is None or monitor is not None or not pc.pointwise or pattern.n_rows * operator.dim != n:
            return None
        if engine.distributed:
            from ..comm.compiled import available

            if not available():
                return None
        elif any(len(s.host.reshape(-1)) != n for s in self.storages.values()):
            return None
        return (*pattern.unsigned, pattern.values, pattern.n_cols > pattern.n_owned_cols)

    def inside_extra(self, source: str) -> tuple:
        """What the ``..._on_ranks`` functions of :mod:`.compiled` take after their one-process
        counterparts' arguments (``()`` on one process): vector ``source`` (the operator's
        input) with its halo rows, the arrays of a halo exchange of it (made now;
        :meth:`inside_done` frees it) and the MPI handles."""
        if not self.engine.distributed:
            return ()
        from ..comm.compiled import CompiledExchange, handles

        exports, imports = self.operator.halo_rows()
        vector = self.storages[source]
        self._exchange = CompiledExchange(self.comm, exports, imports, self.operator.dim, tag=vector.tag)
        e = self._exchange
        return (vector.host.reshape(-1), e.send_at, e.send, e.receive_at, e.receive, e.requests, e.statuses,
                handles(self.comm))

    def inside_done(self, source: str, target: str) -> None:
        """What :meth:`A` marks, after iterations ran inside compiled calls: the halos of the
        vectors the operator read and wrote are stale (and the halo exchange is freed)."""
        self.storages[source].valid_depth = self.storages[target].valid_depth = 0
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.close()

    def communication_failed(self, code: int) -> None:
        """An MPI call inside compiled code failed on this rank: the others may wait for it in a
        collective, so every rank is aborted (:func:`meshchain.comm.agree.abort_all`)."""
        from mpi4py import MPI

        from ..comm.agree import abort_all

        abort_all(self.comm, "an MPI call inside the compiled solver iterations",
                  SolverError(f"MPI error {code}: {MPI.Get_error_string(code)}"))

    def A(self, src: str, dst: str) -> None:  # noqa: N802 - the operator's name
        source = self.storages[src]
        source.valid_depth = 0  # written in place by the solver: its halo is stale
        self.operator.apply(self.dats[src], self.dats[dst], source, self.storages[dst])

    def B(self, src: str, dst: str, *, fused_done: bool = True) -> None:  # noqa: N802
        """``dst = B src``; with ``fused_done`` a pointwise preconditioner already did it."""
        if not (fused_done and self.pc.pointwise):
            self.pc.apply(self.v[src], self.v[dst])

    def start(self, values: np.ndarray):
        self.reductions += 1
        if self.comm is None:
            return values
        result = np.empty_like(values)
        return self.comm.Iallreduce(values, result, op=self.sum_op), result

    def reduce(self, values: np.ndarray) -> np.ndarray:
        """A blocking reduction (``MPI_Allreduce``: with TCP and more ranks than cores it
        completes much sooner than ``Iallreduce`` and an immediate wait)."""
        self.reductions += 1
        if self.comm is None:
            return values
        result = np.empty_like(values)
        began = time.perf_counter()
        self.comm.Allreduce(values, result, op=self.sum_op)
        self.wait_time += time.perf_counter() - began
        return result

    def wait(self, handle) -> np.ndarray:
        if self.comm is None:
            return handle
        request, result = handle
        began = time.perf_counter()
        request.Wait()
        self.wait_time += time.perf_counter() - began
        return result

    def check(self, i: int, norm: float) -> str | None:
        self.history.append(norm)
        if self.monitor is not None:
            self.monitor(i, norm)
        if not math.isfinite(norm):
            return "diverged: the residual norm is not finite"
        if i == 0:
            self.target = max(self.rtol * norm, self.atol)
        if norm <= self.target:
            return "converged"
        if i >= self.maxiter:
            return f"diverged: maxiter={self.maxiter} reached (residual {norm:.3e}, target {self.target:.3e})"
        return None

    def replacement_bounds(self):
        if not self.replacement:
            return None
        operator = self.operator
        b = self.v["b"]
        b_norm = math.sqrt(self.sum(dot(b, b)))
        size = operator.row_set.size * operator.dim
        return ReplacementBounds(norm_inf=operator.norm_inf(), nonzeros=operator.nonzeros_per_row(), size=size,
                                 b_norm=b_norm)

    def sum(self, value: float) -> float:
        return float(self.reduce(np.array([value]))[0])

    def true_residual(self, r: str, z: str) -> tuple[float, float]:
        """``||b - A x||`` and ``||B (b - A x)||`` (``r`` and ``z`` are spare vectors)."""
        self.A("x", r)
        residual(self.v["b"], self.v[r], self.v[r])
        self.B(r, z, fused_done=False)
        sums = self.reduce(np.array([dot(self.v[r], self.v[r]), dot(self.v[z], self.v[z])]))
        return math.sqrt(sums[0]), math.sqrt(sums[1])


_workspaces = memo("solver work vectors", weak=True)  # per operator: (engine, method -> dats)


def _work_dats(engine, A, operator, method: str) -> dict:
    """The method's work vectors for ``A`` (declared once per operator, method and engine)."""
    per_operator = _workspaces.setdefault(A, {})
    found = per_operator.get(method)
    if found is None or found[0] is not engine:
        dats = {name: Dat(operator.row_set, operator.dim, None, f"{operator.name}:{method}:{name}")
                for name in VECTORS[method]}
        found = per_operator[method] = (engine, dats)
    return found[1]


def _check(A, operator, x, b, method, pc, rtol, atol, maxiter) -> None:
    if method not in METHODS:
        raise SolverError(f"solve: unknown method {method!r}; choose one of {', '.join(map(repr, METHODS))}.")
    if pc not in PRECONDITIONERS:
        raise SolverError(f"solve: unknown preconditioner {pc!r}; choose one of {', '.join(map(repr, PRECONDITIONERS))}.")
    for what, dat in (("x", x), ("b", b)):
        if not isinstance(dat, Dat):
            raise SolverError(f"solve: {what} must be a meshchain.Dat, got {type(dat).__name__}.")
        if dat.dataset is not operator.row_set:
            raise SetMismatchError(f"solve: {what} (Dat {dat.name!r}) lives on {dat.dataset.name!r}, but the rows of "
                                   f"{operator.name!r} are on {operator.row_set.name!r}.")
        if dat.dim != operator.dim or dat.dtype != np.float64:
            raise SolverError(f"solve: {what} (Dat {dat.name!r}) has dim {dat.dim} and dtype {dat.dtype}; "
                              f"{operator.name!r} needs float64 dats of dim {operator.dim}.")
    if x is b:
        raise SolverError(f"solve: x and b are the same Dat {x.name!r}; pass two.")
    if not (rtol >= 0 and atol >= 0) or (rtol == 0 and atol == 0):
        raise SolverError(f"solve: need rtol >= 0 and atol >= 0, not both zero; got rtol={rtol}, atol={atol}.")
    if int(maxiter) != maxiter or maxiter < 0:
        raise SolverError(f"solve: maxiter must be a non-negative integer, got {maxiter!r}.")


def solve_with(engine, A, x, b, *, method="cg", pc="jacobi", rtol=1e-8, atol=0.0, maxiter=10000,
               residual_replacement=False, monitor=None) -> SolveInfo:
    """:func:`meshchain.solve` on ``engine`` (see there)."""
    operator = as_operator(engine, A)
    _check(A, operator, x, b, method, pc, rtol, atol, maxiter)
    if residual_replacement and method != "pipecg":
        raise SolverError(f"solve: residual_replacement is implemented for method='pipecg' (as PETSc's PIPECGRR), "
                          f"not for {method!r}.")
    if engine.backend_name in ("cupy", "cuda-emulation"):
        raise SolverError("solve: the Krylov methods run on host arrays; use the numba or reference backend.")
    dats = dict(_work_dats(engine, A, operator, method), x=x, b=b)
    engine.dat_values(x, write=True)  # pending loops that write x have run; its halo is stale
    engine.run_pending(b)
    n = engine.n_owned(operator.row_set) * operator.dim
    run = SolveRun(engine, operator, dats, make_preconditioner(pc, operator, n), rtol=rtol, atol=atol,
              maxiter=int(maxiter), monitor=monitor, replacement=bool(residual_replacement))
    began = time.perf_counter()
    iterations, reason, replacements = METHODS[method](run)
    elapsed = time.perf_counter() - began
    engine.halos_stale(x)
    spare = VECTORS[method]
    true, true_preconditioned = run.true_residual(spare[0], spare[1])
    converged = reason == "converged"
    if converged and true_preconditioned > FALSE_CONVERGENCE_FACTOR * run.target:
        converged = False
        reason = (f"false convergence: the recursive residual met {run.target:.3e} but the true one is "
                  f"{true_preconditioned:.3e}")
    return SolveInfo(iterations=iterations, converged=converged, reason=reason, residual_history=run.history,
                     true_residual=true, true_residual_preconditioned=true_preconditioned,
                     time_per_iteration=elapsed / max(iterations, 1), time_reduction_wait=run.wait_time,
                     reductions=run.reductions, replacements=replacements, method=method, pc=pc)
