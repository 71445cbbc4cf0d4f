"""``mc.solve``: Krylov methods on dats, with the true residual checked at exit.

Vectors are dats on the operator's row set: ``x`` and ``b`` are the user's, the work
vectors are dats the solver declares once per operator, method and session. The methods work
on each rank's owned values through fused compiled passes (:mod:`.fused`), apply the operator
through :meth:`Mat.mult <meshchain.Mat.mult>`'s overlapped SpMV (or the matrix-free loops;
with an assembled matrix and no monitor, through the compiled halo exchange and product the
compiled iterations use) and combine every dot product of a step in one reduction. A solve
like the last one (the same Mat and options; any x and b) runs on the :class:`SolveRun` that
solve kept (:func:`_kept_run`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import time

import numpy as np

from ..comm.hang import wait_request
from ..comm.pairwise import short_sum
from ..core import activity
from ..core.errors import SetMismatchError, SolverError
from ..types import Dat, Mat
from .block_solve import is_block_system, solve_blocks
from .cagmres import solve_cagmres
from .compiled import product_on_ranks, true_residual_sums, true_residual_sums_on_ranks
from .fused import dot, residual
from .info import SolveInfo, monitored
from .krylov import METHODS as SYMMETRIC, VECTORS
from .nonsymmetric import NONSYMMETRIC, UNPRECONDITIONED_NORM, nonsymmetric_vectors
from .petsc import solve_with_petsc
from .operators import as_operator, found_kept, kept_for
from .precond import PRECONDITIONERS, Preconditioner, make_preconditioner
from .recovery import run_recovering
from .replacement import TARGET_FRACTION, ReplacementBounds
from .blockcg import solve_block
from .freecg import solve_free
from .sstep import check_options, solve_cacg
from .tune import choose_steps, iterations_needed, record_iterations

__all__ = ["SolveInfo", "solve_with", "METHODS", "PRECONDITIONERS"]

DIVERGENCE_TOLERANCE = 1e5
"""A residual norm of a nonsymmetric method above this multiple of the initial one ends the
solve as diverged (PETSc's default ``dtol``). The CG family stops on a curvature instead
(``cg``/``cg1``/``bicgstab`` iterate inside compiled calls that test what the Python loop tests)."""

METHODS = {**SYMMETRIC, **NONSYMMETRIC}
FACTORS_INSIDE = (*NONSYMMETRIC, "cg", "groppcg")
"""The methods whose compiled iterations apply a factored preconditioner (``"bjacobi-ilu"``, ``"sgs"``) too;
the other symmetric methods run their Python loop with it."""
S_STEP = ("sstep-cg", "ca-cg", "ca-gmres")
"""The communication-avoiding methods (:mod:`.blockcg`, :mod:`.sstep`, :mod:`.cagmres`): matrix powers kernel,
assembled Mat."""
"""Every Krylov method by name (``method="petsc"`` hands the problem to PETSc instead)."""


def work_vectors(method: str, restart: int) -> tuple[str, ...]:
    """The names of ``method``'s work vectors (the first two free between its runs)."""
    return VECTORS[method] if method in VECTORS else nonsymmetric_vectors(method, restart)

class SolveRun:
    """A solve's vectors, operator, preconditioner, reductions and convergence test (kept for
    the next solve like it: :meth:`renew` and :meth:`release`)."""

    def __init__(self, engine, operator, dats: dict, pc, *, method: str, rtol, atol, maxiter, monitor,
                 replacement: bool | None, restart: int):
        self.engine, self.operator, self.dats, self.pc = engine, operator, dats, pc
        self.n = n = engine.n_owned(operator.row_set) * operator.dim
        self._look_up_vectors()
        self.rtol, self.atol, self.maxiter_total, self.monitor = rtol, atol, maxiter, monitor
        self.comm = engine.comm
        if self.comm is not None:
            from mpi4py import MPI

            self.sum_op = MPI.SUM
        self._reset()
        self._mpi_handles = None  # the communicator's handles for compiled calls, made at first use
        self.method, self.replacement, self.restart_length = method, replacement, restart
        self.unpreconditioned = method in UNPRECONDITIONED_NORM  # the norm tested is ||b - A x||
        self.inside = self._inside(engine, operator, pc, n, monitor)

    def _look_up_vectors(self) -> None:
        """The storage records of the vectors and their flat views of the owned values."""
        self.storages = dict(zip(self.dats, self.engine.storages(tuple(self.dats.values()))))
        self.v = {name: s.flat(self.n) for name, s in self.storages.items()}

    def _reset(self) -> None:
        """What a solve counts and records, from nothing."""
        self.history, self.target, self.wait_time, self.reductions = [], None, 0.0, 0
        self.maxiter, self.iterations_before, self.restarts, self._restarted = self.maxiter_total, 0, 0, False

    def renew(self, x, b) -> None:
        """Make this run, kept from an earlier solve (:func:`_kept_run`), solve again for ``x``
        and ``b``: their storages and every vector's view looked up again, the counts reset."""
        self.dats["x"], self.dats["b"] = x, b
        self._look_up_vectors()
        if self.comm is not None:
            self.operator.overlap = self.engine.overlap()  # as configured now
        self._reset()

    def release(self) -> None:
        """Drop the user's ``x`` and ``b`` (and their storages and views): a kept run holds no
        user data between solves."""
        for kept in (self.dats, self.storages, self.v):
            del kept["x"], kept["b"]

    def _inside(self, engine, operator, pc, n: int, monitor):
        """The CSR arguments of :func:`.compiled.cg_iterations` (``indptr, split, indices,
        values, halo``) when the iterations can run inside compiled calls: an assembled
        matrix, a pointwise preconditioner (the nonsymmetric methods and ``cg``: any with a
        ``compiled`` form, ILU(0) and SGS too: :data:`FACTORS_INSIDE`), no monitor, and on
        several ranks an MPI library compiled code can call
        (:func:`meshchain.comm.compiled.available`, with the functions' addresses); else None."""
        pattern = getattr(operator, "pattern", None)
        compiled_pc = pc.pointwise or (self.method in FACTORS_INSIDE and hasattr(pc, "compiled"))
        if pattern is None or monitor is not None or not compiled_pc or pattern.n_rows != n:  # n_rows: scalar rows
            return None
        if engine.distributed:
            from ..comm.compiled import addresses, available

            if not available() or addresses() is None:
                return None
            return _csr_arguments(pattern)
        return self.one_process_matrix()

    def one_process_matrix(self) -> tuple | None:
        """The CSR arguments of the one-process compiled passes (``indptr, split, indices, values,
        halo``) when the operator is an assembled matrix whose rows are this process's vectors'
        (no halo rows); else None (several ranks, a matrix-free operator)."""
        pattern = getattr(self.operator, "pattern", None)
        if pattern is None or self.engine.distributed:
            return None
        if any(s.host.size != pattern.n_rows for s in self.storages.values()):
            return None
        return _csr_arguments(pattern)

    def inside_extra(self, source: str) -> tuple:
        """What the ``..._on_ranks`` functions of :mod:`.compiled` take after their one-process
        counterparts' arguments (``()`` on one process): vector ``source`` (the operator's
        input) with its halo rows, the arrays of a halo exchange of it (kept with the matrix
        between solves), the MPI functions' addresses and the MPI handles."""
        if not self.engine.distributed:
            return ()
        from ..comm.compiled import addresses

        vector = self.storages[source]
        e = self.operator.compiled_exchange(vector.tag)
        return (vector.host.reshape(-1), e.send_at, e.send, e.receive_at, e.receive, e.requests, e.statuses,
                addresses(), self.mpi_handles())

    def mpi_handles(self) -> np.ndarray:
        """The communicator's handles the compiled calls take (:func:`~meshchain.comm.compiled.handles`),
        made once per run."""
        if self._mpi_handles is None:
            from ..comm.compiled import handles

            self._mpi_handles = handles(self.comm)
        return self._mpi_handles

    def inside_halos(self, sources) -> tuple:
        """What iterations by address (:func:`.compiled.bicgstab_iterations`,
        :func:`.compiled.gmres_cycle`) take beside their vectors: ``(distributed, vectors with
        halo rows, exchange, functions, handles)`` for the operator's inputs ``sources`` (names);
        on one process the vectors themselves and empty arrays. The exchange is kept with the
        matrix between solves."""
        if not self.engine.distributed:
            return False, tuple(self.v[name] for name in sources), *_ONE_PROCESS
        from ..comm.compiled import addresses  # mpi4py: only on several ranks

        e = self.operator.compiled_exchange(self.storages[sources[0]].tag)
        exchange = (e.send_at, e.send, e.receive_at, e.receive, e.requests, e.statuses)
        return (True, tuple(self.storages[name].host.reshape(-1) for name in sources), exchange, addresses(),
                self.mpi_handles())

    def divergence_limit(self) -> float:
        """The norm above which :meth:`check` calls the solve diverged (PETSc's ``dtol``;
        infinite for the methods it does not apply to)."""
        if self.method in NONSYMMETRIC and self.history:
            return DIVERGENCE_TOLERANCE * self.history[0]
        return math.inf

    def inside_done(self, *names: str) -> None:
        """What :meth:`A` marks, after iterations ran inside compiled calls: the halos of the
        vectors the operator read and wrote (``names``) are stale."""
        for name in names:
            self.storages[name].valid_depth = 0

    def communication_failed(self, code: int) -> None:
        """An MPI call inside compiled code failed on this rank: the others may wait for it in a
        collective, so every rank is aborted (:func:`meshchain.comm.agree.abort_all`)."""
        from ..comm.compiled import abort_on_error

        abort_on_error(self.comm, "an MPI call inside the compiled solver iterations", code, SolverError)

    def A(self, src: str, dst: str) -> None:  # noqa: N802 - the operator's name
        source = self.storages[src]
        source.valid_depth = 0  # written in place by the solver: its halo is stale
        if self.inside is not None and self.comm is not None:
            self._product_on_ranks(source, dst)
        else:
            self.operator.apply(self.dats[src], self.dats[dst], source, self.storages[dst])

    def _product_on_ranks(self, source, dst: str) -> None:
        """``dst = A source`` on several ranks by the compiled product the compiled iterations
        make theirs with (:func:`.compiled.product_on_ranks`, its sum unused; the owned rows
        while the messages travel): the bits of :meth:`Mat.mult <meshchain.Mat.mult>`'s path,
        in one compiled call, with the exchange :meth:`exchange_extra` gives (a user's ``x`` made
        anew for every solve makes no new one)."""
        x_all, *exchange, functions, _ = self.exchange_extra(source)
        _, error = product_on_ranks(*self.inside, x_all, self.v[dst], *exchange, functions)
        if error:
            self.communication_failed(error)
        self.storages[dst].valid_depth = 0

    def exchange_extra(self, source) -> tuple:
        """``(source with its halo rows, send_at, send, receive_at, receive, requests, statuses,
        MPI functions, MPI handles)``: what a compiled product on several ranks of ``source`` (a
        storage) takes beside the matrix. The exchange's persistent requests carry any vector of
        the matrix's columns: the one kept with the matrix for the message tag of the method's
        first work vector serves every such product."""
        from ..comm.compiled import addresses

        e = self.operator.compiled_exchange(self.storages[next(iter(self.dats))].tag)  # the first: a work vector
        return (source.host.reshape(-1), e.send_at, e.send, e.receive_at, e.receive, e.requests, e.statuses,
                addresses(), self.mpi_handles())

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
        """A blocking reduction (with TCP and more ranks than cores it completes much sooner
        than ``Iallreduce`` and an immediate wait): :func:`~meshchain.comm.pairwise.short_sum`,
        one message round per doubling of the ranks, as the compiled iterations' sums
        (:func:`meshchain.comm.by_address.sum_all`) make it: the same bits."""
        self.reductions += 1
        if self.comm is None:
            return values
        result = np.array(values, dtype=np.float64)
        began = time.perf_counter()
        with activity.waiting("a reduction over ranks (a solver's dot products summed)"):
            short_sum(self.comm, result)
        self.wait_time += time.perf_counter() - began
        return result

    def wait(self, handle) -> np.ndarray:
        if self.comm is None:
            return handle
        request, result = handle
        began = time.perf_counter()
        if activity.watched:
            wait_request(request, "a reduction over ranks (Iallreduce of a solver's dot products)")
        else:
            request.Wait()
        self.wait_time += time.perf_counter() - began
        return result

    def check(self, i: int, norm: float) -> str | None:
        """Record the norm of iteration ``i`` (of this run of the method: see :meth:`restart`)
        and say why to stop, or None."""
        if self._restarted:  # the restart's true norm replaces the recursive one of its iteration
            self._restarted = False
            self.history[-1] = norm
        else:
            self.history.append(norm)
            if self.monitor is not None:
                monitored(self.comm, self.monitor, self.iterations_before + i, norm)
        if not math.isfinite(norm):
            return "diverged: the residual norm is not finite"
        if self.target is None:
            self.target = max(self.rtol * norm, self.atol)
        if norm <= self.target:
            return "converged"
        if self.method in NONSYMMETRIC and norm > DIVERGENCE_TOLERANCE * self.history[0]:
            return (f"diverged: the residual {norm:.3e} grew above {DIVERGENCE_TOLERANCE:.0e} times the initial "
                    f"{self.history[0]:.3e} (PETSc's dtol)")
        if i >= self.maxiter:
            return (f"diverged: maxiter={self.maxiter_total} reached (residual {norm:.3e}, "
                    f"target {self.target:.3e})")
        return None

    def check_again(self, i: int, norm: float) -> str | None:
        """Test a recomputed norm of iteration ``i`` (a GMRES restart's true residual), which
        replaces the estimate recorded for it."""
        self._restarted = True
        return self.check(i, norm)

    def restart(self) -> None:
        """The method runs again from the current ``x`` (:mod:`.recovery`): its iterations
        count on from :attr:`iterations_before`, its target stays."""
        self.restarts += 1
        self._restarted = True
        self.maxiter = self.maxiter_total - self.iterations_before

    def replacement_bounds_of(self):
        """None, or a function of ``||b||`` giving the rounding-error bounds of residual
        replacement (:mod:`.replacement`): with ``residual_replacement=None`` (the default)
        whenever the operator gives ``||A||_inf`` and its nonzeros per row (every Mat; a
        LinearOperator given them), and then replacing only where the tolerance is within reach
        of rounding (:data:`~.replacement.TARGET_FRACTION`); with ``True``, by PETSc's criterion
        alone. ``||A||_inf`` and the nonzeros are asked for now (collective the first time), so
        that a LinearOperator without them is refused before any iteration; ``||b||`` comes
        later (pipecg sums it in its first reduction)."""
        if not (self.replacement or self.replacement is None and self.operator.gives_bounds):
            return None
        operator = self.operator
        norm_inf, nonzeros = operator.norm_inf(), operator.nonzeros_per_row()
        size = operator.row_set.size * operator.dim
        fraction = 0.0 if self.replacement else TARGET_FRACTION
        return lambda b_norm: ReplacementBounds(norm_inf=norm_inf, nonzeros=nonzeros, size=size, b_norm=b_norm,
                                                fraction=fraction)

    def true_residual(self, r: str, z: str) -> tuple[float, float]:
        """``||b - A x||`` and ``||B (b - A x)||`` (``r`` and ``z`` are spare vectors): on one
        process with an assembled matrix and a compiled preconditioner in one compiled call
        (:func:`.compiled.true_residual_sums`, the same bits), so on several ranks after
        compiled iterations (:func:`.compiled.true_residual_sums_on_ranks`, its sum over ranks
        included: :meth:`products_and_sums`); with a monitor by the Python steps,
        as the iterations (the reference the tests compare the compiled calls with)."""
        matrix = None
        if self.monitor is None:  # the CSR arguments the iterations took on one process, else looked for
            one_process = self.inside is not None and not self.engine.distributed
            if self.inside is not None and self.engine.distributed and hasattr(self.pc, "compiled"):
                total = self.products_and_sums(true_residual_sums_on_ranks, ("x",), (r,), self.v["b"], self.v[r],
                                               self.v[z], sums=2)
                return math.sqrt(total[0]), math.sqrt(total[1])
            matrix = self.inside if one_process else self.one_process_matrix()
        if matrix is not None and hasattr(self.pc, "compiled"):
            self.storages["x"].valid_depth = self.storages[r].valid_depth = 0  # as A() marks them
            sums = np.empty(2)
            true_residual_sums(*matrix, self.v["x"], self.v["b"], self.v[r], self.v[z], self.pc.compiled, sums)
            self.reductions += 1  # the sum over ranks that one process does not need, counted as reduce() does
            return math.sqrt(sums[0]), math.sqrt(sums[1])
        self.A("x", r)
        residual(self.v["b"], self.v[r], self.v[r])
        self.B(r, z, fused_done=False)
        sums = self.reduce(np.array([dot(self.v[r], self.v[r]), dot(self.v[z], self.v[z])]))
        return math.sqrt(sums[0]), math.sqrt(sums[1])

    def products_and_sums(self, function, sources: tuple, targets: tuple, *vectors, sums: int) -> np.ndarray:
        """Products by the matrix and sums over ranks in one compiled call, on one process or several
        ranks: a method's start (:mod:`.starts`) or the true residual at exit
        (:func:`.compiled.true_residual_sums_on_ranks`), with no Python between the products and the
        sums for another rank to wait on. ``function`` takes the matrix, whether distributed, the
        MPI functions and handles, the vectors ``sources`` (names, ``x`` first: the products'
        inputs) with their halo rows, ``vectors``, the compiled preconditioner, ``total`` (``sums``
        values: returned) and the halo exchange's arrays (:meth:`exchange_extra`'s). The products'
        inputs and outputs (``targets``) are marked stale as :meth:`A` marks them; the sum is
        counted as :meth:`reduce` and :meth:`start` count theirs."""
        storages = self.storages
        for name in (*sources, *targets):
            storages[name].valid_depth = 0
        if self.engine.distributed:
            _, *exchange, functions, handles = self.exchange_extra(storages["x"])
            halos, exchange = [storages[name].host.reshape(-1) for name in sources], tuple(exchange)
        else:
            halos, (exchange, functions, handles) = [self.v[name] for name in sources], _ONE_PROCESS
        total = np.empty(sums)
        error = function(*self.inside, self.engine.distributed, functions, handles, *halos, *vectors, self.pc.compiled,
                         total, exchange)
        if error:
            self.communication_failed(error)
        self.reductions += 1
        return total



_ONE_PROCESS = ((np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int32),
                 np.zeros(1, np.uint8)), np.zeros(4, np.int64), np.zeros(3, np.int64))
"""What the compiled calls that also run on several ranks take on one process for the halo exchange's
arrays, the MPI functions and the MPI handles (not used there)."""


def _csr_arguments(pattern) -> tuple:
    """``(indptr, split, indices, values, halo)``: what the compiled passes take of a matrix."""
    return (*pattern.unsigned, pattern.values, pattern.n_cols > pattern.n_owned_cols)


_solving: set = set()  # (id of the operator, method) of the solves running now


@contextlib.contextmanager
def _not_nested(A, method: str):
    """Refuse a solve of ``A`` by ``method`` inside another one (from a user's preconditioner
    or operator): both would use the same work vectors."""
    key = (id(A), method)
    if key in _solving:
        raise SolverError(f"solve: a solve of {getattr(A, 'name', A)!r} with method={method!r} was called inside "
                          f"another one (a preconditioner or operator that solves): they would share work vectors; "
                          f"use another method for the inner solve.")
    _solving.add(key)
    try:
        yield
    finally:
        _solving.discard(key)


WORK_VECTORS = "solver work vectors"
"""The session's solver cache (per operator: ``{method: (names, dats)}``) of the work vectors."""


def _work_dats(engine, A, operator, method: str, restart: int) -> dict:
    """The method's work vectors for ``A`` (declared once per operator, method and session;
    again when GMRES's restart length changes, replacing the last ones)."""
    per_operator = kept_for(engine, WORK_VECTORS, A)
    names = work_vectors(method, restart)
    found = per_operator.get(method)
    if found is None or found[0] != names:
        dats = {name: Dat(operator.row_set, operator.dim, None, f"{operator.name}:{method}:{name}") for name in names}
        found = per_operator[method] = (names, dats)
    else:
        found_kept(engine, WORK_VECTORS)
    return found[1]


def _check(A, operator, x, b, method, pc) -> None:
    if method not in METHODS and method not in ("petsc", *S_STEP):
        raise SolverError(f"solve: unknown method {method!r}; choose one of "
                          f"{', '.join(map(repr, (*METHODS, *S_STEP, 'petsc')))}.")
    if not isinstance(pc, Preconditioner) and pc not in PRECONDITIONERS:
        raise SolverError(f"solve: unknown preconditioner {pc!r}; choose one of {', '.join(map(repr, PRECONDITIONERS))}.")
    _check_vectors(operator, x, b)


def _check_stopping(rtol, atol, maxiter, monitor) -> None:
    """Refuse tolerances that are not real numbers ``>= 0`` (not both zero), a ``maxiter`` that
    is not a count and a ``monitor`` that cannot be called, before anything is set up (the
    same arguments on every rank: every rank raises)."""
    if not (_is_tolerance(rtol) and _is_tolerance(atol)) or (rtol == 0 and atol == 0):
        raise SolverError(f"solve: need rtol >= 0 and atol >= 0 (real numbers), not both zero; got rtol={rtol!r}, "
                          f"atol={atol!r}.")
    if not _is_count(maxiter, least=0):
        raise SolverError(f"solve: maxiter must be a non-negative integer, got {maxiter!r}.")
    if monitor is not None and not callable(monitor):
        raise SolverError(f"solve: monitor must be None or a function monitor(iteration, norm), got "
                          f"{type(monitor).__name__} {monitor!r}.")


def _is_tolerance(value) -> bool:
    """Whether ``value`` is a real number (not a bool) of at least 0 (NaN is not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value >= 0


def _check_vectors(operator, x, b) -> None:
    """Refuse ``x`` and ``b`` unless they are two float64 Dats on the operator's rows, of its dim."""
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


def _is_count(value, *, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    if type(value) is int:  # the common case, without the abstract class's check
        return value >= least
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least


def solve_with(engine, A, x, b, *, method="cg", pc="jacobi", rtol=1e-8, atol=0.0, maxiter=10000,
               residual_replacement=None, restart=30, options=None, monitor=None, s=None,
               basis="newton") -> SolveInfo:
    """:func:`meshchain.solve` on ``engine`` (see there). A solve of the same Mat by the same
    method with the same options as the last one (any ``x`` and ``b``) runs on the set-up it
    kept (:func:`_kept_run`): the same bits as one set up anew, its vectors checked, its other
    checks and look-ups not made again."""
    engine.refuse_in_capture(f"mc.solve (method={method!r}: its iterations and tests run in Python)")
    key = None if options is not None or s is not None or basis != "newton" or method not in METHODS else \
        _kept_key(A, method, pc, rtol, atol, maxiter, residual_replacement, restart, monitor)
    if key is not None and (id(A), method) not in _solving and engine.backend_name not in ("cupy", "cuda-emulation"):
        kept = _kept_run(engine, A, x, b, key)  # (a solve nested in this one's is refused by the full path)
        if kept is not None:  # a solve like the last: its set-up as last time
            return _solved(engine, A, x, kept.run, kept, pc)
    if method not in S_STEP and (s is not None or basis != "newton"):
        raise SolverError(f"solve: s= and basis= are options of method='sstep-cg', 'ca-cg' and 'ca-gmres', not of "
                          f"{method!r}.")
    _check_stopping(rtol, atol, maxiter, monitor)
    if is_block_system(A, x, b):
        return solve_blocks(engine, A, x, b, method=method, pc=pc, rtol=rtol, atol=atol, maxiter=maxiter,
                            residual_replacement=residual_replacement, restart=restart, options=options,
                            monitor=monitor)
    operator = as_operator(engine, A)
    _check(A, operator, x, b, method, pc)
    if options is not None and method != "petsc":
        raise SolverError(f"solve: options= are PETSc options, for method='petsc' only (method={method!r}).")
    if method == "petsc":
        if residual_replacement is not None or restart != 30:
            raise SolverError("solve: with method='petsc', pass PETSc's own options instead of residual_replacement= "
                              "or restart= (options={'ksp_type': 'pipecgrr'} or {'ksp_gmres_restart': 50}).")
        return solve_with_petsc(engine, A, operator, x, b, pc=pc, options=options or {}, rtol=rtol, atol=atol,
                                maxiter=int(maxiter), monitor=monitor)
    if not _is_count(restart, least=1):
        raise SolverError(f"solve: restart must be a positive integer (GMRES's basis size), got {restart!r}.")
    if method not in ("gmres", "pipegmres", "ca-gmres") and restart != 30:
        raise SolverError(f"solve: restart= is the basis size of 'gmres', 'pipegmres' and 'ca-gmres', not of "
                          f"{method!r}.")
    if residual_replacement and method != "pipecg":
        raise SolverError(f"solve: residual_replacement is implemented for method='pipecg' (as PETSc's PIPECGRR), "
                          f"not for {method!r}.")
    if engine.backend_name in ("cupy", "cuda-emulation"):
        raise SolverError("solve: the Krylov methods run on host arrays; use the numba or reference backend.")
    if method in S_STEP:
        steps = check_options(A, pc, s, basis, method)
        engine.run_pending(b)
        predicted, auto = {}, steps == "auto"
        tolerances = dict(jacobi=pc == "jacobi", rtol=rtol, atol=atol)
        if auto:  # the Krylov model's choice, from costs measured on A (collective)
            steps, predicted = choose_steps(engine, A, method, jacobi=pc == "jacobi", restart=int(restart),
                                            iterations=iterations_needed(engine, A, method, **tolerances))
        options = dict(steps=steps, basis=basis, pc=pc, rtol=rtol, atol=atol, maxiter=int(maxiter), monitor=monitor)
        with _not_nested(A, method):
            if method == "ca-gmres":
                info = solve_cagmres(engine, A, x, b, restart=int(restart), **options)
            else:
                run = solve_cacg if method == "ca-cg" else solve_block if isinstance(A, Mat) else solve_free
                info = run(engine, A, x, b, **options)
        info.steps, info.predicted = steps, predicted
        if auto:
            record_iterations(engine, A, method, info, **tolerances)
        return info
    restart = int(restart)
    dats = dict(_work_dats(engine, A, operator, method, restart), x=x, b=b)
    engine.dat_values(x, write=True)  # pending loops that write x have run; its halo is stale
    engine.run_pending(b)
    n = engine.n_owned(operator.row_set) * operator.dim
    run = SolveRun(engine, operator, dats, make_preconditioner(pc, operator, n, engine=engine), method=method, rtol=rtol,
                   atol=atol, maxiter=int(maxiter), monitor=monitor, restart=restart,
                   replacement=None if residual_replacement is None else bool(residual_replacement))
    kept = None if key is None else _Kept(key, operator.values_stamp(), run)
    return _solved(engine, A, x, run, kept, pc)


def _solved(engine, A, x, run, kept, pc) -> SolveInfo:
    """Run ``run`` (its method, restarting where rounding broke it down) and say how it went;
    ``kept``: what to keep of it for the next solve of ``A`` (:func:`_kept_run`), or None;
    ``pc``: the preconditioner as the user named it."""
    method = run.method
    began = time.perf_counter()
    with _not_nested(A, method):
        try:
            iterations, reason, replacements, (true, true_preconditioned) = run_recovering(
                METHODS[method], run, work_vectors(method, run.restart_length)[:2])
        except BaseException:
            per_matrix = kept_for(engine, KEPT_SOLVES, A)
            if getattr(per_matrix.get(method), "run", None) is run:
                del per_matrix[method]  # whatever state it was left in: not kept
            raise
        finally:
            run.release()
    if kept is not None:
        kept_for(engine, KEPT_SOLVES, A)[method] = kept
    elapsed = run.stopped - began  # the iterations, without the true residual at exit
    engine.halos_stale(x)
    return SolveInfo(iterations=iterations, converged=reason == "converged", reason=reason,
                     residual_history=run.history,
                     true_residual=true, true_residual_preconditioned=true_preconditioned,
                     time_per_iteration=elapsed / max(iterations, 1), time_reduction_wait=run.wait_time,
                     reductions=run.reductions, replacements=replacements, method=method, pc=pc,
                     restarts=run.restarts)


KEPT_SOLVES = "kept solves"
"""The session's solver cache (per Mat: ``{method: _Kept}``) of the set-ups kept between solves."""


class _Kept:
    """A solve's set-up (its :class:`SolveRun`) kept in the session (:data:`KEPT_SOLVES`) for
    the next solve of the same Mat by the same method with the same options (``key``), while
    the matrix's values and layout (``stamp``, :meth:`Matrices.values_stamp
    <meshchain.engine.matrices.Matrices.values_stamp>`) stay the same. Between solves the run
    holds neither ``x`` nor ``b``: any two Dats on the matrix's rows may come next."""

    __slots__ = ("key", "stamp", "run")

    def __init__(self, key: tuple, stamp, run):
        self.key, self.stamp, self.run = key, stamp, run


def _kept_key(A, method, pc, rtol, atol, maxiter, residual_replacement, restart, monitor) -> tuple | None:
    """What a solve's set-up is kept by: its options, or None when it is not kept (a
    matrix-free operator, a monitor, a user's or Chebyshev preconditioner, made again per
    solve). Integers must be ``int``s, so that a value refused by the checks never equals a
    kept one (``maxiter=1e4``)."""
    if (monitor is not None or not isinstance(A, Mat) or not (pc is None or type(pc) is str) or pc == "chebyshev"
            or type(maxiter) is not int or type(restart) is not int):
        return None
    return (method, pc, rtol, atol, maxiter, residual_replacement, restart)


def _kept_run(engine, A, x, b, key: tuple):
    """The set-up this session kept from the last solve of ``A`` by ``key``'s method, made
    ready to solve for ``x`` and ``b`` (any two Dats on ``A``'s rows, checked as in a solve set
    up anew), if it was kept with the same options and the matrix's values and layout are
    unchanged; else None. Pending loops that write ``x``, ``b`` or ``A`` run first, as in a
    solve set up anew. Every rank decides alike (the stamp is the same on every rank)."""
    per_matrix = engine.solver_cache(KEPT_SOLVES).get(A, {})
    kept = per_matrix.get(key[0])
    if kept is None or kept.key != key or type(x) is not Dat or type(b) is not Dat:
        return None
    run = kept.run
    _check_vectors(run.operator, x, b)  # refused as in a solve set up anew
    engine.dat_values(x, write=True)  # pending loops that write x have run; its halo is stale
    engine.run_pending(b)
    if run.operator.values_stamp() != kept.stamp:
        del per_matrix[key[0]]  # never to be used again: its run, preconditioner and vectors go
        return None
    run.renew(x, b)
    found_kept(engine, KEPT_SOLVES)
    return kept
