"""Preconditioners of :func:`meshchain.solve` (``pc=``).

* ``None``: none (ones, fused into the methods' vector passes).
* ``"jacobi"``: the inverse diagonal, pointwise (fused into the methods' vector passes).
* ``"sgs"``: GeoFEM-style localized symmetric Gauss-Seidel: block Jacobi over the ranks, one
  symmetric sweep on each rank's owned block of an assembled matrix; no communication. Its
  sweep is applied as two triangular solves, as ILU(0)'s (:class:`SymmetricGaussSeidel`).
* ``"bjacobi-ilu"``: PETSc's default parallel preconditioner (``PCBJACOBI`` with ``PCILU``
  on each block): ILU(0) of each rank's owned block of an assembled matrix (owned rows,
  owned columns, this rank's local order, natural ordering, no fill), factored when a
  solve first needs it (see below); each application is a forward and a backward
  triangular solve, with no communication. A matrix of ``dim > 1`` is factored by scalar rows, as PETSc factors the
  AIJ matrix :meth:`Mat.to_petsc <meshchain.Mat.to_petsc>` makes of it.
* ``"chebyshev"``: a Chebyshev polynomial of degree :data:`CHEBYSHEV_DEGREE` in the
  Jacobi-scaled operator ``D^-1 A``, on the interval PETSc's Chebyshev smoother takes
  (:data:`CHEBYSHEV_BOUNDS` times the largest eigenvalue that :data:`ESTIMATE_STEPS` steps
  of Jacobi-preconditioned CG estimate when it is set up). Its applications are SpMVs (with
  their halo exchanges) and vector updates only, no reduction: it suits the pipelined
  methods. Assembled or matrix-free (with a diagonal).
* a :class:`Preconditioner`: the user's own ``apply(r, z)`` on dats.

**Set-up kept.** As PETSc sets a preconditioner up again only when its operator changed, the
set-up of ``"jacobi"``, ``"sgs"`` and ``"bjacobi-ilu"`` (the diagonal, its check, the ILU(0)
factors) and ``"chebyshev"``'s eigenvalue estimate are kept with an assembled matrix and
used again by the next solve while its values and layout are unchanged
(:meth:`~meshchain.engine.matrices.Matrices.values_stamp`, the same on every rank); an
assembly, ``zero``/``zero_rows``, a repartition or new halo layers set them up again (values
changed behind meshchain's back, through arrays PETSc shares with :meth:`Mat.to_petsc
<meshchain.Mat.to_petsc>`, are not seen). A matrix-free operator's are made for every solve
(its diagonal is a dat that may change at any time).

Every one is a fixed linear operator ``B``, symmetric positive definite when ``A`` is
(``"bjacobi-ilu"``: when every pivot of the factorization is positive, which holds for
M-matrices such as the Poisson matrix; a negative pivot makes CG report an indefinite
preconditioner), so the CG methods stay valid.

Examples
--------
>>> import numpy as np
>>> pc = Pointwise(np.array([0.5, 0.25]))
>>> z = np.zeros(2); pc.apply(np.array([2.0, 4.0]), z); z.tolist()
[1.0, 1.0]

A user's preconditioner (here Jacobi, as a parallel loop) on a 1D reaction-diffusion matrix:

>>> import meshchain as mc
>>> nodes, edges = mc.Set(40, "nodes"), mc.Set(39, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[i, i + 1] for i in range(39)], "e2n")
>>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
>>> @mc.kernel
... def element(a):
...     a[0, 0] += 1.2
...     a[0, 1] += -1.0
...     a[1, 0] += -1.0
...     a[1, 1] += 1.2
>>> mc.par_loop(element, edges, A(mc.INC, (e2n, e2n)))
>>> d = mc.Dat(nodes, 1, None, "d"); A.diagonal(d)
>>> @mc.kernel
... def divide(r, d, z):
...     z[0] = r[0] / d[0]
>>> jacobi = mc.Preconditioner(lambda r, z: mc.par_loop(divide, nodes, r(mc.READ), d(mc.READ), z(mc.WRITE)),
...                            row_set=nodes, dim=1, name="my jacobi")
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.sin(np.arange(40.0)), "b")
>>> exact = np.linalg.solve(A.to_scipy().toarray(), np.sin(np.arange(40.0)))
>>> for pc in ("jacobi", jacobi, "bjacobi-ilu", "chebyshev"):
...     x.data[...] = 0.0
...     info = mc.solve(A, x, b, pc=pc, rtol=1e-12)
...     print(pc, info.iterations, np.allclose(x.data[:, 0], exact))
jacobi 40 True
Preconditioner('my jacobi') 40 True
bjacobi-ilu 1 True
chebyshev 15 True
"""

from __future__ import annotations

import math
import warnings

import numba
import numpy as np

from ..backends.sparse import gauss_seidel_factors, ilu0, ilu_apply, owned_block, split_factors
from ..core.errors import CaptureError, MeshchainWarning, SolverError
from ..types import Dat, Set
from .fused import dot, scale
from .operators import found_kept, kept_for

__all__ = ["PRECONDITIONERS", "CHEBYSHEV_DEGREE", "CHEBYSHEV_BOUNDS", "ESTIMATE_STEPS", "ZERO_PIVOT", "Pointwise",
           "SymmetricGaussSeidel", "IncompleteLU", "Chebyshev", "Preconditioner", "UserPreconditioner",
           "make_preconditioner"]

PRECONDITIONERS = (None, "jacobi", "sgs", "bjacobi-ilu", "chebyshev")

ZERO_PIVOT = 100.0 * np.finfo(np.float64).eps
"""``"bjacobi-ilu"``: a pivot ``|u_ii| <= ZERO_PIVOT * sum_j |a_ij|`` is zero: PETSc's
default ``-pc_factor_zeropivot`` value, measured against the original row's absolute sum
(PETSc's test may weigh the row differently; a pivot this small fails in both)."""

CHEBYSHEV_DEGREE = 3
"""``"chebyshev"``: the degree of its residual polynomial (``CHEBYSHEV_DEGREE - 1`` SpMVs
per application). Odd, so that ``B`` is positive definite for every SPD ``A`` however far off
the eigenvalue estimate is (an even degree's residual polynomial exceeds 1 beyond the upper
bound)."""

CHEBYSHEV_BOUNDS = (0.1, 1.1)
"""``"chebyshev"``: the interval ``[0.1, 1.1]`` times the estimated largest eigenvalue of
``D^-1 A`` (PETSc's ``-ksp_chebyshev_esteig 0,0.1,0,1.1``)."""

ESTIMATE_STEPS = 10
"""``"chebyshev"``: the steps of Jacobi-preconditioned CG (from a fixed pseudo-random
right-hand side) whose Lanczos tridiagonal estimates the largest eigenvalue (PETSc's
default ``-ksp_chebyshev_esteig_steps``)."""


class Preconditioner:
    """A user's preconditioner for :func:`meshchain.solve`: ``pc=Preconditioner(apply)``.

    Parameters
    ----------
    apply : callable
        ``apply(r, z)`` sets ``z = B r``: ``r`` and ``z`` are float64 dats on the
        operator's row set, of its dim (the solver's own, the same ones every call). It may
        run parallel loops (it is captured once per solve and replayed, like a
        :class:`~meshchain.LinearOperator`'s ``apply``; one that reads values between its
        loops runs as written, with a warning) or write ``z.data``. It must write every
        owned value of ``z`` and leave ``r`` alone. ``B`` must be one fixed linear operator,
        symmetric positive definite for the CG methods.
    row_set : Set, keyword-only, optional
        The set ``apply`` expects ``r`` and ``z`` on (checked against the operator's rows).
    dim : int, keyword-only, optional
        The dim it expects (checked against the operator's).
    name : str, keyword-only

    Raises
    ------
    SolverError
        ``apply`` is not callable, ``row_set`` is not a Set or ``dim`` not a positive
        integer; when solving (on every rank): the row set or dim differs from the
        operator's, or the first ``apply`` raised or left values of ``z`` unwritten.
    """

    pointwise = False

    def __init__(self, apply, *, row_set=None, dim=None, name: str = "preconditioner"):
        if not callable(apply):
            raise SolverError(f"Preconditioner {name!r}: apply must be callable as apply(r, z), "
                              f"got {type(apply).__name__}.")
        if row_set is not None and not isinstance(row_set, Set):
            raise SolverError(f"Preconditioner {name!r}: row_set must be a meshchain.Set, got {type(row_set).__name__}.")
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1):
            raise SolverError(f"Preconditioner {name!r}: dim must be a positive integer, got {dim!r}.")
        self.apply, self.row_set, self.dim, self.name = apply, row_set, dim, name

    def __repr__(self) -> str:
        return f"Preconditioner({self.name!r})"


_NO_FACTORS = (np.zeros(1, np.uint32), np.zeros(0, np.uint32), np.zeros(0), np.zeros(1, np.uint32),
               np.zeros(0, np.uint32), np.zeros(0), np.zeros(0))
"""A pointwise preconditioner's :attr:`Pointwise.compiled` after its ``dinv``: no ILU factors
(the types of :class:`IncompleteLU`'s, so that one compiled method serves both)."""


class Pointwise:
    """``z = dinv * r``; the methods fuse it into their vector passes (``pointwise``).
    ``compiled``: what :func:`.compiled.precondition` takes."""

    pointwise = True

    def __init__(self, dinv: np.ndarray):
        self.dinv = dinv
        self.compiled = (dinv, *_NO_FACTORS)

    def apply(self, r: np.ndarray, z: np.ndarray) -> None:
        scale(self.dinv, r, z)


class IncompleteLU:
    """ILU(0) of this rank's owned block of an assembled matrix (``"bjacobi-ilu"``).

    Parameters
    ----------
    indptr, indices, values : ndarray
        The factors :func:`~meshchain.backends.sparse.ilu0` left (CSR of the owned block),
        kept in :func:`~meshchain.backends.sparse.split_factors`' layout.
    diagonal : ndarray
        Every row's diagonal position.

    Attributes
    ----------
    compiled : tuple
        What :func:`.compiled.precondition` takes: the nonsymmetric methods apply the ILU
        inside their compiled calls.
    """

    pointwise = False

    def __init__(self, indptr, indices, values, diagonal):
        small = np.int32 if len(indices) < 2**31 else np.int64  # half the index traffic of the solves
        factors = split_factors(indptr.astype(small), indices.astype(small), values, diagonal.astype(small))
        unsigned = np.dtype(small).str.replace("i", "u")  # no negative-index wraparound in the solves
        self.factors = tuple(a.view(unsigned) if a.dtype == small else a for a in factors)
        self.inverse = 1.0 / values[diagonal]
        self.dinv = np.ones(len(diagonal))  # what the fused passes apply; apply() overwrites it
        self.compiled = (self.dinv, *self.factors, self.inverse)

    @classmethod
    def factor(cls, pattern, operator):
        """Factor ``pattern``'s owned block (collective: a zero pivot on any rank raises
        :class:`SolverError` on every rank)."""
        indptr, indices, values = owned_block(pattern.indptr, pattern.split, pattern.indices, pattern.values)
        diagonal, row = ilu0(indptr, indices, values, ZERO_PIVOT)
        error = None
        if row >= 0:
            what = "no diagonal entry" if diagonal[row] < 0 else f"pivot {values[diagonal[row]]!r}"
            error = SolverError(f"solve: pc='bjacobi-ilu': the ILU(0) of {operator.name!r}'s owned block has a zero "
                                f"pivot in owned row {row} (of {len(diagonal)}): {what}; try pc='jacobi' or 'sgs'.")
        operator.agree(error)
        return cls(indptr, indices, values, diagonal)

    def apply(self, r: np.ndarray, z: np.ndarray) -> None:
        ilu_apply(*self.factors, self.inverse, r, z)


class SymmetricGaussSeidel(IncompleteLU):
    """One symmetric Gauss-Seidel sweep on this rank's owned block of an assembled matrix
    (``"sgs"``): ``z = M^-1 r`` with ``M = (D + L) D^-1 (D + U)``, forward ``(D + L) t = r``
    then backward ``(D + U) z = D t``, applied as :class:`IncompleteLU`'s triangular solves of
    the factors ``L D^-1`` and ``D + U`` (:func:`~meshchain.backends.sparse.gauss_seidel_factors`),
    so the methods that apply ILU(0) inside their compiled calls apply it there too.

    >>> import scipy.sparse as sp
    >>> a = sp.csr_matrix(np.array([[4.0, -1.0, 0.0], [-1.0, 4.0, -1.0], [0.0, -1.0, 4.0]]))
    >>> class Block:
    ...     indptr, split, indices, values = a.indptr, a.indptr[1:], a.indices, a.data
    >>> z = np.zeros(3); SymmetricGaussSeidel.of(Block).apply(np.ones(3), z)
    >>> d, lower = np.diag(a.diagonal()), sp.tril(a, -1).toarray()
    >>> np.allclose(z, np.linalg.solve((d + lower) @ np.linalg.inv(d) @ (d + lower.T), np.ones(3)))
    True
    """

    @classmethod
    def of(cls, pattern):
        """The sweep of ``pattern``'s owned block (its diagonal checked positive before)."""
        indptr, indices, values = owned_block(pattern.indptr, pattern.split, pattern.indices, pattern.values)
        return cls(indptr, indices, values, gauss_seidel_factors(indptr, indices, values))


SETUPS = "preconditioner set-ups"
"""The session's solver cache (per Mat: ``{(pc, n): (values stamp, kept set-up)}``) of the kept set-ups."""
_KEPT = ("jacobi", "sgs", "bjacobi-ilu", "chebyshev")
"""The preconditioners whose set-up is kept with an assembled matrix (see the module docstring)."""

SCRATCH = "preconditioner work vectors"
"""The session's solver cache (per row set: ``{(purpose, dim): dats}``) of the preconditioners' work vectors."""


def _scratch_dats(engine, operator, purpose: str, names) -> list:
    """Two or more dats on ``operator``'s rows for ``purpose`` (declared once per row set,
    dim and session; collective on several ranks, as every set-up is)."""
    found = kept_for(engine, SCRATCH, operator.row_set)
    key = (purpose, operator.dim)
    if key not in found:
        found[key] = [Dat(operator.row_set, operator.dim, None, f"{purpose}:{name}") for name in names]
    else:
        found_kept(engine, SCRATCH)
    return found[key]


class _Vectors:
    """Dats the preconditioner hands the operator: their storages and owned values."""

    def __init__(self, engine, operator, purpose: str, names, n: int):
        self.operator = operator
        self.dats = _scratch_dats(engine, operator, purpose, names)
        self.storages = [engine.storage(d) for d in self.dats]
        self.v = [s.host.reshape(-1)[:n] for s in self.storages]

    def multiply(self, src: int, dst: int) -> None:
        """``v[dst] = A v[src]`` (``v[src]``'s owned values were written in place)."""
        self.storages[src].valid_depth = 0
        self.operator.apply(self.dats[src], self.dats[dst], self.storages[src], self.storages[dst])


def _sums(engine, values: np.ndarray) -> np.ndarray:
    """``values`` summed over the ranks (a blocking reduction; set-up only)."""
    if not engine.distributed:
        return values
    from mpi4py import MPI

    result = np.empty_like(values)
    engine.comm.Allreduce(values, result, op=MPI.SUM)
    return result


def _pseudo_random(engine, row_set, dim: int, n: int) -> np.ndarray:
    """Values in [0, 1) that depend on the global numbers of the rows only (the same vector
    on any number of ranks)."""
    layout = engine.layout_of(row_set)
    ids = np.arange(n // dim, dtype=np.uint64) if layout is None else layout.global_ids[: n // dim].astype(np.uint64)
    z = (ids[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)[None]).reshape(-1)
    with np.errstate(over="ignore"):  # splitmix64
        z = (z + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) / float(2**53)


def _largest_eigenvalue(diagonal: list, off: list) -> float:
    """The largest eigenvalue of the symmetric tridiagonal matrix (by bisection on Sturm
    counts: no LAPACK, whose BLAS threads the solver packages avoid)."""
    m = len(diagonal)
    radius = [abs(off[i - 1]) if i else 0.0 for i in range(m)]
    for i in range(m - 1):
        radius[i] += abs(off[i])
    low = min(d - r for d, r in zip(diagonal, radius))
    high = max(d + r for d, r in zip(diagonal, radius))
    for _ in range(100):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        below, q = 0, 1.0  # how many eigenvalues are below ``middle``
        for i in range(m):
            q = diagonal[i] - middle - (off[i - 1] ** 2 / q if i else 0.0)
            if q == 0.0:
                q = -1e-300
            below += q < 0.0
        low, high = (low, middle) if below == m else (middle, high)
    return high


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _chebyshev_step(a, b, dinv, w, res, d, z):
    """``res -= w``, ``d = a d + b dinv res``, ``z += d``."""
    for i in range(len(z)):
        res[i] -= w[i]
        d[i] = a * d[i] + b * dinv[i] * res[i]
        z[i] += d[i]


class Chebyshev:
    """A Chebyshev polynomial in ``D^-1 A`` (``"chebyshev"``; see the module docstring).

    ``B = p(D^-1 A) D^-1`` with ``1 - lambda p(lambda)`` the scaled Chebyshev polynomial of
    degree ``degree`` on ``[low, high]``: ``z = B r`` is ``degree`` steps of the Chebyshev
    iteration for ``A z = r`` from zero. ``B = D^-1/2 p(S) D^-1/2`` with ``S = D^-1/2 A
    D^-1/2``: symmetric; positive definite for an odd ``degree``.

    Parameters
    ----------
    engine : the engine surface
    operator : the solvers' operator
    dinv : ndarray
        The inverse diagonal (this rank's owned values).
    degree : int, keyword-only
    bounds : tuple of float, keyword-only
        ``[low, high]`` as multiples of the estimated largest eigenvalue of ``D^-1 A``.
    steps : int, keyword-only
        CG steps of the estimate.
    largest : float, keyword-only
        The estimate an earlier set-up made on the same operator (None: estimate it now).
    """

    pointwise = False

    def __init__(self, engine, operator, dinv: np.ndarray, *, degree: int = CHEBYSHEV_DEGREE,
                 bounds: tuple = CHEBYSHEV_BOUNDS, steps: int = ESTIMATE_STEPS, largest: float | None = None):
        n = len(dinv)
        self.jacobi, self.degree = dinv, degree
        self.dinv = np.ones(n)  # what the fused passes apply; apply() overwrites it
        self.vectors = _Vectors(engine, operator, "chebyshev", ("d", "w"), n)
        self.res = np.empty(n)
        self.largest = self._estimate(engine, operator, n, steps) if largest is None else largest
        self.low, self.high = bounds[0] * self.largest, bounds[1] * self.largest

    def _estimate(self, engine, operator, n: int, steps: int) -> float:
        """The largest eigenvalue of ``D^-1 A`` that ``steps`` steps of Jacobi-preconditioned
        CG find (the Ritz values of their Lanczos tridiagonal; collective)."""
        (p, w), dinv = self.vectors.v, self.jacobi
        r = _pseudo_random(engine, operator.row_set, operator.dim, n)
        z = dinv * r
        p[:] = z
        rz = _sums(engine, np.array([dot(r, z)]))[0]
        diagonal, off, alpha_old, beta_old = [], [], 1.0, 0.0
        for _ in range(steps):
            self.vectors.multiply(0, 1)
            pw = _sums(engine, np.array([dot(p, w)]))[0]
            if not (pw > 0.0 and rz > 0.0):
                break
            alpha = rz / pw
            r -= alpha * w
            z = dinv * r
            rz_new = _sums(engine, np.array([dot(r, z)]))[0]
            beta = rz_new / rz
            diagonal.append(1.0 / alpha + beta_old / alpha_old)
            off.append(math.sqrt(max(beta, 0.0)) / alpha)
            if not rz_new > 1e-28 * rz:  # the Krylov space is exhausted: its Ritz values are exact
                break
            p *= beta
            p += z
            rz, alpha_old, beta_old = rz_new, alpha, beta
        self._check(operator, diagonal)
        return _largest_eigenvalue(diagonal, off[:-1])

    @staticmethod
    def _check(operator, diagonal: list) -> None:
        error = None
        if not diagonal or not all(math.isfinite(d) for d in diagonal):
            error = SolverError(f"solve: pc='chebyshev': no eigenvalue estimate for {operator.name!r} (CG found "
                                f"(p, A p) <= 0 in its first step: the operator is not positive definite).")
        operator.agree(error)

    def apply(self, r: np.ndarray, z: np.ndarray) -> None:
        """``z = B r``: ``degree - 1`` SpMVs, no reduction."""
        (d, w), res, dinv = self.vectors.v, self.res, self.jacobi
        theta, delta = 0.5 * (self.high + self.low), 0.5 * (self.high - self.low)
        sigma = theta / delta
        rho = 1.0 / sigma
        res[:] = r
        scale(dinv, r, d)
        d *= 1.0 / theta
        z[:] = d
        for _ in range(self.degree - 1):
            self.vectors.multiply(0, 1)
            rho_new = 1.0 / (2.0 * sigma - rho)
            _chebyshev_step(rho_new * rho, 2.0 * rho_new / delta, dinv, w, res, d, z)
            rho = rho_new


class UserPreconditioner:
    """A :class:`Preconditioner` for one solve: the owned values copied into its dats, its
    ``apply`` (captured once and replayed), the values copied out; the first application
    is checked on every rank (it raised, or left values of ``z`` unwritten)."""

    pointwise = False

    def __init__(self, pc: Preconditioner, engine, operator, n: int):
        self.pc, self.engine, self.operator = pc, engine, operator
        self.dinv = np.ones(n)  # what the fused passes apply; apply() overwrites it
        self.vectors = _Vectors(engine, operator, f"user {pc.name}", ("r", "z"), n)
        self.step = engine.capture(pc.apply, name=f"{pc.name}.apply")
        self.checked = False

    @classmethod
    def make(cls, pc: Preconditioner, engine, operator, n: int):
        """The adapter, after checking ``pc``'s declared row set and dim against ``operator``'s."""
        error = None
        if pc.row_set is not None and pc.row_set is not operator.row_set:
            error = SolverError(f"solve: Preconditioner {pc.name!r} works on {pc.row_set.name!r}, but the rows of "
                                f"{operator.name!r} are on {operator.row_set.name!r}.")
        elif pc.dim is not None and pc.dim != operator.dim:
            error = SolverError(f"solve: Preconditioner {pc.name!r} works on dats of dim {pc.dim}, but "
                                f"{operator.name!r} has dim {operator.dim}.")
        operator.agree(error)
        return cls(pc, engine, operator, n)

    def apply(self, r: np.ndarray, z: np.ndarray) -> None:
        (rv, zv), storages = self.vectors.v, self.vectors.storages
        rv[:] = r
        if not self.checked:
            zv[:] = np.nan  # unwritten values show
        for s in storages:
            s.valid_depth = 0  # their owned values changed in place
        if self.checked:
            self._run()
        else:
            self._first()
        z[:] = zv

    def _run(self) -> None:
        r, z = self.vectors.dats
        if self.step is not None:
            try:
                self.step(r, z)
                return
            except CaptureError as exc:
                self.step = None
                warnings.warn(MeshchainWarning(f"[capture-refused] Preconditioner {self.pc.name!r}: its apply runs "
                                               f"uncaptured in this solve, loop by loop: {exc}"), stacklevel=5)
        self.pc.apply(r, z)
        self.engine.run_pending()

    def _first(self) -> None:
        """The first application, checked on every rank."""
        error = None
        try:
            self._run()
        except SolverError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - reported on every rank, as a SolverError
            error = SolverError(f"solve: Preconditioner {self.pc.name!r}: its apply(r, z) raised "
                                f"{type(exc).__name__}: {exc}")
            error.__cause__ = exc
        if error is None:
            missing = np.flatnonzero(~np.isfinite(self.vectors.v[1]))
            if missing.size:
                error = SolverError(f"solve: Preconditioner {self.pc.name!r}: its apply(r, z) left {missing.size} of "
                                    f"the {len(self.vectors.v[1])} owned values of z unwritten or not finite (first: "
                                    f"owned value {int(missing[0])}); it must set every owned value of z = B r.")
        self.operator.agree(error)
        self.checked = True


def _positive_diagonal(pc: str, operator, n: int) -> np.ndarray:
    """The operator's diagonal (collective: one not positive on any rank raises on every rank)."""
    diagonal = operator.diagonal()
    bad = np.flatnonzero(~(diagonal > 0.0))
    error = None
    if bad.size:
        error = SolverError(f"solve: pc={pc!r} needs a positive diagonal, but {operator.name!r} has "
                            f"{diagonal[bad[0]]!r} in owned row {int(bad[0])} (of {n}).")
    operator.agree(error)
    return diagonal


def make_preconditioner(pc, operator, n: int, *, engine):
    """The preconditioner ``pc`` for ``operator`` (``n`` owned values; collective).

    Parameters
    ----------
    pc : str, None or Preconditioner
        One of :data:`PRECONDITIONERS`, or a user's :class:`Preconditioner`.
    operator : the solvers' operator (an assembled matrix or a matrix-free one)
    n : int
        This rank's owned values.
    engine : the engine surface
        (``"chebyshev"`` and :class:`Preconditioner` need it.)

    Returns
    -------
    An object with ``apply(r, z)``, ``pointwise`` and ``dinv``.

    Raises
    ------
    SolverError
        An unknown ``pc``, a factorization or an estimate that failed, a diagonal not
        positive (on every rank).
    """
    if pc is None:
        return Pointwise(np.ones(n))
    if isinstance(pc, Preconditioner):
        return UserPreconditioner.make(pc, engine, operator, n)
    if pc not in PRECONDITIONERS:
        raise SolverError(f"solve: unknown preconditioner {pc!r}; choose one of {', '.join(map(repr, PRECONDITIONERS))}.")
    pattern = getattr(operator, "pattern", None)
    if pc in ("sgs", "bjacobi-ilu") and pattern is None:
        raise SolverError(f"solve: pc={pc!r} needs an assembled matrix; {operator.name!r} is matrix-free "
                          f"(use pc='chebyshev' or 'jacobi' with its diagonal, a mc.Preconditioner, or None).")
    stamp = operator.values_stamp() if pattern is not None else None  # None: nothing kept (matrix-free)
    kept = _kept_setup(operator, pc, n, engine, stamp)
    if kept is None:
        kept = _setup(pc, operator, n, engine)
        if stamp is not None and pc in _KEPT:
            kept_for(engine, SETUPS, operator.mat)[(pc, n)] = (stamp, kept)
    if pc == "chebyshev":  # its vectors are views of the session's dats: made again, the estimate kept
        dinv, largest = kept
        return Chebyshev(engine, operator, dinv, largest=largest)
    return kept


def _setup(pc: str, operator, n: int, engine):
    """What :func:`make_preconditioner` keeps of ``pc``'s set-up: the preconditioner itself, or
    for ``"chebyshev"`` ``(dinv, largest)`` (collective: the checks agree over ranks)."""
    if pc == "bjacobi-ilu":
        return IncompleteLU.factor(operator.pattern, operator)
    diagonal = _positive_diagonal(pc, operator, n)
    if pc == "jacobi":
        return Pointwise(1.0 / diagonal)
    if pc == "sgs":
        return SymmetricGaussSeidel.of(operator.pattern)
    made = Chebyshev(engine, operator, 1.0 / diagonal)
    return made.jacobi, made.largest


def _kept_setup(operator, pc: str, n: int, engine, stamp):
    """The set-up an earlier solve kept for ``operator``'s matrix with these values and layout
    (``stamp``), or None. Every rank finds the same (the stamp is the same on every rank)."""
    if stamp is None or pc not in _KEPT:
        return None
    cache = engine.solver_cache(SETUPS)
    found = cache.get(operator.mat, {}).get((pc, n))
    if found is None or found[0] != stamp:
        return None
    found_kept(engine, SETUPS)
    return found[1]
