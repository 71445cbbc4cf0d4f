"""``mc.solve(..., method="petsc")``: the problem handed to PETSc's KSP and PC (petsc4py).

Everything PETSc was built with (its Krylov methods, GAMG, LU, ...) is reachable through
``options``, given in PETSc's own names without the leading dash. They go into PETSc's
options database under a prefix unique to the solve, so they reach only this solve's KSP,
its PC and their sub-objects, and are removed when the solve ends.

**Operators.** An assembled :class:`~meshchain.Mat` becomes an AIJ matrix
(:meth:`Mat.to_petsc <meshchain.Mat.to_petsc>`: its values and column indices are copied,
once per solve). A matrix-free :class:`~meshchain.LinearOperator` becomes a PETSc Python
(shell) matrix whose ``mult`` copies PETSc's vector into a work dat, applies the operator
and copies the result back (two copies of the owned values per product); its
``getDiagonal`` copies the operator's ``diagonal`` dat (for ``pc_type jacobi``).

**Vectors.** ``x`` and ``b`` are not copied: the PETSc vectors are made on the dats' owned
values (:meth:`Mat.petsc_vec <meshchain.Mat.petsc_vec>`'s layout: each rank's owned rows
in local order, ranks one after the other), so PETSc writes the solution straight into
``x``. PETSc does not write ``b`` (``ksp_diagonal_scale`` scales it and scales it back).

**Precedence.** :data:`DEFAULTS` (``ksp_type gmres``; the convergence test relative to
``||B r_0||``, as meshchain's other methods test), then ``rtol``/``atol``/``maxiter``
(``KSPSetTolerances``) and ``pc`` (:data:`PC_OPTIONS`), then ``options``: an option given
explicitly wins (``ksp_rtol`` over ``rtol``, ``pc_type`` over ``pc``; with a ``pc_type``
the options ``pc`` implies are not set at all). The initial guess is ``x``
(``KSPSetInitialGuessNonzero``; not with ``ksp_type preonly``, which refuses one).

**Unused options** are an error, as PETSc's ``-options_left`` reports them: after the
solve, any option given in ``options`` that PETSc never read (a misspelling, an option of
another KSP or PC type) raises :class:`~meshchain.core.errors.SolverError` naming it, on
every rank. The solution is then already in ``x``; the check needs the solve, because
PETSc reads some options only while it sets up or runs (GAMG's level options,
``ksp_view``). Options that no KSP or PC reads (``mat_*``, ``vec_*``) count as unused.

**Errors.** PETSc's errors become :class:`~meshchain.core.errors.SolverError` s naming the
options they concern; an exception raised inside a callback PETSc makes (the operator's
``apply``, a user's preconditioner, ``monitor``) becomes a ``SolverError`` naming it, with
the original exception as its cause. Both are raised on
every rank; an exception in a callback on some ranks only leaves the others waiting inside
PETSc's next collective call, as any MPI program would.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> from meshchain.apps import poisson
>>> from meshchain.meshes import structured_tris
>>> p = poisson.declare(structured_tris(8, 8))
>>> A, x, b = p.A, p.u, p.b
>>> info = mc.solve(A, x, b, method="petsc", options={"ksp_type": "cg", "pc_type": "jacobi", "ksp_rtol": 1e-12})
>>> info.converged, info.reason, info.method, info.pc, info.true_residual < 1e-9
(True, 'converged', 'petsc', 'jacobi', True)
>>> info.iterations == mc.solve(A, mc.Dat(x.dataset, 1, None, "y"), b, method="cg", rtol=1e-12).iterations
True
>>> mc.solve(A, x, b, method="petsc", options={"ksp_typo": "cg"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
meshchain.core.errors.SolverError: solve(method='petsc'): PETSc never read the option ksp_typo='cg' ...
"""

from __future__ import annotations

import contextlib
import itertools
import re
import time

import numpy as np

from ..core.errors import MeshchainError, SolverError
from ..types import Dat
from .precond import Preconditioner, make_preconditioner
from .info import SolveInfo
from .recovery import FALSE_CONVERGENCE_FACTOR
from .operators import found_kept, kept_for

__all__ = ["PC_OPTIONS", "petsc_settings", "solve_with_petsc"]

PC_OPTIONS = {
    None: {"pc_type": "none"},
    "jacobi": {"pc_type": "jacobi"},
    # PETSc's SOR on a parallel matrix sweeps each rank's owned block (omega 1: Gauss-Seidel),
    # the preconditioner meshchain's own "sgs" applies
    "sgs": {"pc_type": "sor", "pc_sor_local_symmetric": None},
    "bjacobi-ilu": {"pc_type": "bjacobi", "sub_pc_type": "ilu"},
}
"""The PETSc options each ``pc=`` stands for (used when ``options`` give no ``pc_type``)."""

DEFAULTS = {"ksp_type": "gmres", "ksp_converged_use_initial_residual_norm": None}
"""What every solve starts from: PETSc's default KSP type, and its convergence test relative
to ``||B r_0||`` as meshchain's other methods test (with a nonzero initial guess PETSc's own
default is relative to ``||B b||``)."""

_prefixes = itertools.count()
SHELL_VECTORS = "petsc shell matrix vectors"
"""The session's solver cache (per LinearOperator: ``{"vectors": (source, target)}``) of the shell matrix's dats."""


def solve_with_petsc(engine, A, operator, x, b, *, pc, options: dict, rtol: float, atol: float, maxiter: int,
                     monitor=None) -> SolveInfo:
    """:func:`meshchain.solve` with ``method="petsc"`` (collective; see the module docstring).

    Parameters
    ----------
    engine : Surface
        The session's engine surface.
    A : Mat or LinearOperator
    operator : object
        The solvers' view of ``A`` (:func:`.operators.as_operator`).
    x, b : Dat
        Checked by the caller (float64 dats on the operator's rows).
    pc : None, str or Preconditioner, keyword-only
        A key of :data:`PC_OPTIONS`, or a user's preconditioner (applied through a PETSc
        Python, i.e. shell, preconditioner).
    options : dict, keyword-only
        PETSc options without the leading dash; values are strings, numbers, booleans or
        None (a flag).
    rtol, atol : float, keyword-only
    maxiter : int, keyword-only
    monitor : callable, keyword-only
        ``monitor(iteration, norm)``, called on every rank at every iteration (from 0) with
        the residual norm PETSc's convergence test uses.

    Returns
    -------
    SolveInfo
        With ``method="petsc"`` and ``pc`` the PETSc type used. ``converged``: PETSc's
        reason is positive and the true residual is within
        :data:`~.recovery.FALSE_CONVERGENCE_FACTOR` of the tolerance (in the norm PETSc tested).
        ``residual_history``: the norms the monitor saw; ``true_residual_preconditioned``:
        ``||B (b - A x)||`` with the solve's PC ``B``; ``time_per_iteration``: ``KSPSolve``'s wall
        time (after ``KSPSetUp``, which builds the preconditioner) per iteration;
        ``reductions`` and ``time_reduction_wait`` are 0 (PETSc makes and waits for its own
        reductions, which meshchain does not count); ``replacements``: 0.

    Raises
    ------
    SolverError
        On every rank: petsc4py is missing, an option is malformed, PETSc refuses an
        option or fails, an option was never read, or the operator cannot give what the
        preconditioner needs.
    """
    PETSc = _import_petsc()  # noqa: N806 - the module's own name
    settings = petsc_settings(pc, options)
    _check_operator_can_precondition(operator, pc, settings)
    shell = _user_preconditioner(engine, operator, pc) if _uses_shell_preconditioner(pc, options) else None
    callbacks = _Callbacks(monitor)
    info, unused, error = None, [], None
    with _options_in_database(PETSc, settings) as (prefix, database), _destroyed_after() as objects:
        try:
            mat, xv, bv = _petsc_problem(PETSc, engine, A, operator, x, b, callbacks, objects)
            ksp = _configured_ksp(PETSc, mat, prefix, shell, callbacks, objects, rtol=rtol, atol=atol,
                                  maxiter=maxiter, guess_given="ksp_initial_guess_nonzero" in options)
            info = _run(PETSc, ksp, mat, xv, bv, callbacks, objects)
            unused = [name for name in options if not database.used(name)]
            engine.halos_stale(x)
        except (PETSc.Error, MeshchainError) as exc:
            error = _as_solver_error(PETSc, exc, callbacks, settings, operator)
    operator.agree(error)
    operator.agree(_unused_options_error(unused, settings) if unused else None)
    return info


@contextlib.contextmanager
def _options_in_database(PETSc, settings: dict):  # noqa: N803 - the module's own name
    """``settings`` in PETSc's options database under a prefix of their own while the block
    runs (yields the prefix and the database's view of it); removed afterwards."""
    prefix = f"meshchain_solve{next(_prefixes)}_"
    database = PETSc.Options(prefix)
    try:
        for name, value in settings.items():
            database.setValue(name, _option_text(value))
        yield prefix, database
    finally:
        for name in settings:
            database.delValue(name)


@contextlib.contextmanager
def _destroyed_after():
    """A list to append PETSc objects to, destroyed (last first) when the block ends."""
    objects = []
    try:
        yield objects
    finally:
        for obj in reversed(objects):
            obj.destroy()


# --- settings ---------------------------------------------------------------------------------------------


def petsc_settings(pc, options: dict) -> dict:
    """The PETSc options of a solve (names without the prefix or dash): the default KSP type,
    the options ``pc`` stands for (none for a user's preconditioner, or when ``options`` give a
    ``pc_type``), then ``options``, which win.

    >>> petsc_settings("sgs", {"ksp_type": "cg"})["pc_type"]
    'sor'
    >>> settings = petsc_settings("bjacobi-ilu", {"pc_type": "gamg", "ksp_rtol": 1e-6})
    >>> settings["ksp_type"], settings["pc_type"], settings["ksp_rtol"], "sub_pc_type" in settings
    ('gmres', 'gamg', 1e-06, False)
    """
    _check_options(options)
    settings = dict(DEFAULTS)
    if "pc_type" not in options and not isinstance(pc, Preconditioner):
        if pc not in PC_OPTIONS:
            raise SolverError(f"solve(method='petsc'): unknown preconditioner {pc!r}; choose one of "
                              f"{', '.join(map(repr, PC_OPTIONS))}, a meshchain.Preconditioner, or any PETSc "
                              f"preconditioner with options={{'pc_type': ...}}.")
        settings.update(PC_OPTIONS[pc])
    settings.update(options)
    return settings


def _check_options(options) -> None:
    if not isinstance(options, dict):
        raise SolverError(f"solve(method='petsc'): options must be a dict of PETSc options, got "
                          f"{type(options).__name__}.")
    for name, value in options.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", name):
            dashed = isinstance(name, str) and name.startswith("-")
            hint = f" (without the dash: {name.lstrip('-')!r})" if dashed else ""
            raise SolverError(f"solve(method='petsc'): option {name!r} is not a PETSc option name{hint}; give names "
                              f"as PETSc spells them, without the leading dash, e.g. 'ksp_type'.")
        if value is not None and not isinstance(value, (str, bool, int, float, np.integer, np.floating, list, tuple)):
            raise SolverError(f"solve(method='petsc'): option {name}={value!r}: give a string, a number, a boolean, "
                              f"a list of those, or None for a flag.")


def _option_text(value):
    """``value`` as the options database holds it (None: a flag without a value)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_option_text(v) for v in value)
    return str(value)


def _uses_shell_preconditioner(pc, options: dict) -> bool:
    return isinstance(pc, Preconditioner) and "pc_type" not in options


def _check_operator_can_precondition(operator, pc, settings: dict) -> None:
    """A matrix-free operator gives PETSc no entries: refuse the preconditioners that need
    them before PETSc fails inside, and ask for the diagonal Jacobi needs now."""
    if getattr(operator, "pattern", None) is not None:
        return
    if settings.get("pc_type") == "sor":
        raise SolverError(f"solve(method='petsc'): pc_type sor (what pc='sgs' stands for) needs an assembled matrix; "
                          f"{operator.name!r} is matrix-free (use pc='jacobi' with its diagonal, or None).")
    if settings.get("pc_type") == "jacobi":
        operator.diagonal()  # SolverError when the LinearOperator has none


def _user_preconditioner(engine, operator, pc):
    """The user's preconditioner as the methods apply it (``apply(r, z)`` on owned values,
    through its dats: :class:`.precond.UserPreconditioner`)."""
    return make_preconditioner(pc, operator, engine.n_owned(operator.row_set) * operator.dim, engine=engine)


# --- PETSc objects ----------------------------------------------------------------------------------------


def _import_petsc():
    try:
        import petsc4py

        petsc4py.init()
        from petsc4py import PETSc
    except ImportError as exc:
        raise SolverError("solve(method='petsc') needs petsc4py, which is not installed: pip install "
                          "meshchain[petsc] (PETSc builds from source, about 10 minutes).") from exc
    return PETSc


def _petsc_comm(PETSc, engine):  # noqa: N803 - the module's own name
    if not engine.distributed:
        return PETSc.COMM_SELF
    comm = engine.comm
    return PETSc.Comm(comm if hasattr(comm, "Get_size") else comm.comm)


def _petsc_problem(PETSc, engine, A, operator, x, b, callbacks, objects):  # noqa: N803
    """``(matrix, x, b)`` as PETSc objects (appended to ``objects``, to destroy)."""
    comm = _petsc_comm(PETSc, engine)
    if getattr(operator, "pattern", None) is not None:
        mat = engine.matrices.to_petsc(A)  # what A.to_petsc() does, in the session handed down
    else:
        mat = _shell_matrix(PETSc, comm, engine, operator, callbacks)
    objects.append(mat)
    size = operator.row_set.size * operator.dim
    xv = _vector_on(PETSc, comm, engine.dat_values(x, write=True), size)  # PETSc writes the solution here
    objects.append(xv)
    bv = _vector_on(PETSc, comm, engine.dat_values(b, write=False), size)
    objects.append(bv)
    return mat, xv, bv


def _vector_on(PETSc, comm, owned: np.ndarray, size: int):  # noqa: N803
    """A PETSc Vec on the owned values ``owned`` (the same memory: they are contiguous rows)."""
    if not owned.flags.c_contiguous:
        raise SolverError("solve(method='petsc'): a dat's owned values are not contiguous; PETSc cannot use them "
                          "in place.")
    flat = owned.reshape(-1)
    return PETSc.Vec().createWithArray(flat, size=(len(flat), size), comm=comm)


def _shell_matrix(PETSc, comm, engine, operator, callbacks):  # noqa: N803
    n = engine.n_owned(operator.row_set) * operator.dim
    size = operator.row_set.size * operator.dim
    mat = PETSc.Mat().createPython(((n, size), (n, size)), _ShellOperator(engine, operator, callbacks), comm=comm)
    mat.setUp()
    return mat


def _work_vectors(operator) -> tuple:
    """The two dats the shell matrix applies a matrix-free operator between (declared once
    per LinearOperator and session)."""
    engine, op = operator.engine, operator.op
    per_operator = kept_for(engine, SHELL_VECTORS, op)
    if "vectors" not in per_operator:
        per_operator["vectors"] = tuple(Dat(op.row_set, op.dim, None, f"{op.name}:petsc:{what}")
                                        for what in ("source", "target"))
    else:
        found_kept(engine, SHELL_VECTORS)
    return per_operator["vectors"]


class _ShellOperator:
    """The context of PETSc's Python matrix for a matrix-free operator: ``y = A x`` through
    two work dats (a copy in, a copy out)."""

    def __init__(self, engine, operator, callbacks):
        self.engine, self.operator, self.callbacks = engine, operator, callbacks
        self.source, self.target = _work_vectors(operator)

    def mult(self, mat, x, y) -> None:
        with self.callbacks.recorded():
            engine = self.engine
            engine.dat_values(self.source, write=True).reshape(-1)[...] = x.getArray(readonly=True)
            self.operator.apply(self.source, self.target, engine.storage(self.source), engine.storage(self.target))
            y.getArray()[...] = engine.dat_values(self.target, write=False).reshape(-1)

    def getDiagonal(self, mat, d) -> None:  # noqa: N802 - PETSc's name
        with self.callbacks.recorded():
            d.getArray()[...] = self.operator.diagonal()


class _ShellPreconditioner:
    """The context of PETSc's Python PC for a user's preconditioner: ``z = B r`` on the owned
    values of PETSc's vectors, in place."""

    def __init__(self, preconditioner, callbacks):
        self.preconditioner, self.callbacks = preconditioner, callbacks

    def apply(self, pc, r, z) -> None:
        with self.callbacks.recorded():
            self.preconditioner.apply(r.getArray(readonly=True), z.getArray())


class _Callbacks:
    """The monitor and residual history, and the first exception raised in a callback PETSc
    made (PETSc reports it as a bare ``PETSc.Error``; it is raised instead)."""

    def __init__(self, monitor):
        self.monitor, self.history, self.failure = monitor, [], None

    def recorded(self):
        return _Recorder(self)

    def __call__(self, ksp, iteration: int, norm: float) -> None:
        with self.recorded():
            self.history.append(float(norm))
            if self.monitor is not None:
                self.monitor(int(iteration), float(norm))


class _Recorder:
    def __init__(self, callbacks):
        self.callbacks = callbacks

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None and self.callbacks.failure is None:
            self.callbacks.failure = exc
        return False


def _configured_ksp(PETSc, mat, prefix: str, shell_preconditioner, callbacks, objects, *,  # noqa: N803
                    rtol: float, atol: float, maxiter: int, guess_given: bool, fields=()):
    """The KSP of one solve; ``fields``: ``(name, IS)`` pairs for ``pc_type fieldsplit``
    (given after the options chose the PC type; other PC types ignore them)."""
    ksp = PETSc.KSP().create(comm=mat.getComm())
    objects.append(ksp)
    ksp.setOptionsPrefix(prefix)
    ksp.setOperators(mat)
    ksp.setTolerances(rtol=rtol, atol=atol, max_it=maxiter)
    ksp.setInitialGuessNonzero(True)
    if shell_preconditioner is not None:
        pc = ksp.getPC()
        pc.setType(PETSc.PC.Type.PYTHON)
        pc.setPythonContext(_ShellPreconditioner(shell_preconditioner, callbacks))
    ksp.setFromOptions()  # the options win over the calls above
    if fields:
        ksp.getPC().setFieldSplitIS(*fields)
    if ksp.getType() == PETSc.KSP.Type.PREONLY and not guess_given:
        ksp.setInitialGuessNonzero(False)  # preonly applies the PC to b and refuses an initial guess
    ksp.setMonitor(callbacks)  # after setFromOptions: ksp_monitor_cancel would drop it
    ksp.setUp()
    return ksp


# --- the solve and its report -----------------------------------------------------------------------------


def _run(PETSc, ksp, mat, xv, bv, callbacks, objects) -> SolveInfo:  # noqa: N803
    began = time.perf_counter()
    ksp.solve(bv, xv)
    elapsed = time.perf_counter() - began
    iterations, code = ksp.getIterationNumber(), int(ksp.getConvergedReason())
    true, true_preconditioned = _true_residuals(ksp, mat, xv, bv, objects)
    rtol, atol, _, max_it = ksp.getTolerances()
    history = callbacks.history
    target = max(rtol * history[0], atol) if history else None
    converged, reason = code > 0, _reason(PETSc, code, max_it, history, target)
    tested = _tested_true_norm(PETSc, ksp, true, true_preconditioned)
    if converged and target is not None and tested is not None and tested > FALSE_CONVERGENCE_FACTOR * target:
        converged = False
        reason = (f"false convergence: PETSc {_reason_name(PETSc, code)}, the recursive residual met {target:.3e} "
                  f"but the true one is {tested:.3e}")
    return SolveInfo(iterations=iterations, converged=converged, reason=reason, residual_history=list(history),
                     true_residual=true, true_residual_preconditioned=true_preconditioned,
                     time_per_iteration=elapsed / max(iterations, 1), time_reduction_wait=0.0, reductions=0,
                     replacements=0, method="petsc", pc=ksp.getPC().getType())


def _true_residuals(ksp, mat, xv, bv, objects) -> tuple[float, float]:
    """``||b - A x||`` and ``||B (b - A x)||`` (``B``: the solve's preconditioner)."""
    r, z = bv.duplicate(), bv.duplicate()
    objects += [r, z]
    mat.mult(xv, r)
    r.aypx(-1.0, bv)
    ksp.getPC().apply(r, z)
    return float(r.norm()), float(z.norm())


def _tested_true_norm(PETSc, ksp, true: float, true_preconditioned: float):  # noqa: N803
    """The true residual in the norm PETSc's convergence test used (None: another norm)."""
    kind = ksp.getNormType()
    if kind == PETSc.KSP.NormType.PRECONDITIONED:
        return true_preconditioned
    if kind == PETSc.KSP.NormType.UNPRECONDITIONED:
        return true
    return None


def _reason_name(PETSc, code: int) -> str:  # noqa: N803
    """PETSc's C name of a ``KSPConvergedReason``: ``KSP_DIVERGED_ITS``, ``KSP_CONVERGED_RTOL``, ..."""
    renamed = {"DIVERGED_MAX_IT": "DIVERGED_ITS", "DIVERGED_PCSETUP_FAILED": "DIVERGED_PC_FAILED"}
    for name in dir(PETSc.KSP.ConvergedReason):
        if name.isupper() and getattr(PETSc.KSP.ConvergedReason, name) == code and name != "ITERATING":
            return "KSP_" + renamed.get(name, name)
    return f"KSPConvergedReason {code}"


def _reason(PETSc, code: int, max_it: int, history: list, target) -> str:  # noqa: N803
    """``"converged"`` for a positive reason, else what went wrong with PETSc's name in it."""
    if code > 0:
        return "converged"
    name = _reason_name(PETSc, code)
    last = f"residual {history[-1]:.3e}, target {target:.3e}" if history else "no residual norms"
    if "INDEFINITE" in name:
        return f"indefinite: PETSc {name} ({last})"
    if name == "KSP_DIVERGED_ITS":
        return f"diverged: PETSc {name}, maxiter={max_it} reached ({last})"
    return f"diverged: PETSc {name} ({last})"


# --- errors -----------------------------------------------------------------------------------------------


def _petsc_message(error) -> str:
    """What a ``PETSc.Error`` says, without its stack of function names."""
    lines = [re.sub(r"^\[\d+\]\s*", "", line).strip() for line in str(error).splitlines()[1:]]
    said = [line for line in lines if line and not re.match(r"^\w+\(\) at ", line)]
    return "; ".join(said).rstrip(".") or str(error).splitlines()[0]


def _as_solver_error(PETSc, exc, callbacks, settings: dict, operator) -> MeshchainError:  # noqa: N803
    """The error to raise for ``exc``: a callback's own exception, a meshchain error as it is,
    or a PETSc error as a SolverError naming the options it concerns."""
    if isinstance(exc, PETSc.Error) and callbacks.failure is not None:
        failure = callbacks.failure
        if isinstance(failure, MeshchainError) or not isinstance(failure, Exception):  # KeyboardInterrupt: as it is
            return failure
        error = SolverError(f"solve(method='petsc'): {type(failure).__name__} in a callback PETSc made: {failure}")
        error.__cause__ = failure
        return error
    if not isinstance(exc, PETSc.Error):
        return exc
    message = _petsc_message(exc)
    named = [name for name, value in settings.items()
             if value is not None and re.search(rf"\b{re.escape(_option_text(value))}\b", message)]
    about = _named_options(named or list(settings), settings)
    hint = ""
    if operator is not None and getattr(operator, "pattern", None) is None:
        hint = (f" {operator.name!r} is matrix-free: PETSc sees no matrix entries, so only preconditioners that need "
                f"none apply (pc_type none, jacobi with its diagonal, shell).")
    error = SolverError(f"solve(method='petsc'): PETSc refused or failed with the option{'s' * (len(named) != 1)} "
                        f"{about}: {message}.{hint}")
    error.__cause__ = exc
    return error


def _named_options(names, settings: dict) -> str:
    return ", ".join(name if settings[name] is None else f"{name}={settings[name]!r}" for name in names)


def _unused_options_error(unused: list, settings: dict) -> SolverError:
    return SolverError(f"solve(method='petsc'): PETSc never read the option{'s' * (len(unused) > 1)} "
                       f"{_named_options(unused, settings)} (misspelt, or not one of this KSP type's or PC type's; "
                       f"like PETSc's -options_left). The solve ran without {'them' if len(unused) > 1 else 'it'}.")
