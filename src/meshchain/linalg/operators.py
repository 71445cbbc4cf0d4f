"""Operators the solvers apply: an assembled :class:`~meshchain.Mat` or a matrix-free
:class:`LinearOperator` whose ``apply(x, y)`` records parallel loops.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes = mc.Set(4, "nodes")
>>> @mc.kernel
... def twice(a, b):
...     b[0] = 2.0 * a[0]
>>> double = mc.LinearOperator(nodes, lambda x, y: mc.par_loop(twice, nodes, x(mc.READ), y(mc.WRITE)),
...                            name="double")
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.arange(1.0, 5.0), "b")
>>> mc.solve(double, x, b, method="cg", pc=None).iterations
1
>>> x.data[:, 0].tolist()
[0.5, 1.0, 1.5, 2.0]
"""

from __future__ import annotations

import warnings

import numpy as np

from ..comm.agree import raise_together
from ..core.errors import CaptureError, MeshchainWarning, SolverError
from ..types import Dat, Mat, Set

__all__ = ["LinearOperator", "as_operator", "kept_for", "found_kept"]


class LinearOperator:
    """A matrix-free operator: ``apply(x, y)`` records par_loops that set ``y = A x``.

    Parameters
    ----------
    row_set : Set
        The set ``x`` and ``y`` live on (square operators).
    apply : callable
        ``apply(x, y)`` for dats on ``row_set`` of dim ``dim``: every owned value of ``y``
        must be written.
    dim : int, keyword-only
    diagonal : Dat, keyword-only
        The operator's diagonal (for ``pc="jacobi"``).
    norm_inf : float, keyword-only
        ``||A||_inf`` (for residual replacement's rounding-error bounds).
    nonzeros_per_row : int, keyword-only
        The most terms any row of ``A x`` sums (the same).
    name : str, keyword-only
    """

    def __init__(self, row_set, apply, *, dim: int = 1, diagonal=None, norm_inf=None, nonzeros_per_row=None,
                 name: str = "operator"):
        if not isinstance(row_set, Set):
            raise SolverError(f"LinearOperator {name!r}: row_set must be a meshchain.Set, got {type(row_set).__name__}.")
        if not callable(apply):
            raise SolverError(f"LinearOperator {name!r}: apply must be callable as apply(x, y).")
        if diagonal is not None and (not isinstance(diagonal, Dat) or diagonal.dataset is not row_set
                                     or diagonal.dim != dim):
            raise SolverError(f"LinearOperator {name!r}: diagonal must be a Dat on {row_set.name!r} of dim {dim}.")
        self.row_set, self.col_set, self.apply, self.dim, self.name = row_set, row_set, apply, dim, name
        self.diagonal, self.norm_inf, self.nonzeros_per_row = diagonal, norm_inf, nonzeros_per_row

    def __repr__(self) -> str:
        return f"LinearOperator({self.row_set.name}, {self.name!r}, dim={self.dim})"


class _Operator:
    """What both kinds of operator share."""

    engine = None

    def agree(self, error) -> None:
        """Raise ``error`` (or another rank's) on every rank, or return when there is none."""
        raise_together(self.engine.comm if self.engine.distributed else None, error)


class _Assembled(_Operator):
    """A :class:`~meshchain.Mat` as the solvers see it."""

    def __init__(self, engine, mat):
        if mat.row_set is not mat.col_set or mat.dim != mat.col_dim:
            raise SolverError(f"Mat {mat.name!r} is rectangular ({mat.row_set.name!r} x {mat.col_set.name!r}, dims "
                              f"{mat.dim} x {mat.col_dim}); the Krylov methods need a square operator.")
        self.engine, self.mat, self.matrices = engine, mat, engine.matrices
        self.row_set, self.dim, self.name = mat.row_set, mat.dim, mat.name
        self.pattern = self.matrices.pattern(mat)  # built (and checked) now; no assembly during a solve
        self.overlap = engine.overlap() if engine.distributed else None  # one process: no exchange to overlap
        self.matrices.settle(mat)

    def apply(self, x, y, xs, ys) -> None:
        """``y = A x`` (``xs``, ``ys``: their storages)."""
        self.matrices.multiply(self.pattern, xs, ys, self.overlap)

    def halo_rows(self) -> tuple[dict, dict]:
        """Per neighbour, the rows of ``x`` that :meth:`apply`'s halo exchange sends and receives."""
        return self.matrices.halo_rows(self.pattern)

    def compiled_exchange(self, tag: int):
        """The halo exchange of ``x`` (message ``tag``) that compiled iterations run, kept with
        the matrix's pattern between solves."""
        return self.matrices.compiled_exchange(self.pattern, self.dim, tag)

    def diagonal(self) -> np.ndarray:
        return self.matrices.diagonal_values(self.mat)

    def values_stamp(self):
        """What changes whenever the matrix's values or layout change (the same on every rank)."""
        return self.matrices.values_stamp(self.mat)

    gives_bounds = True  # ||A||_inf and the nonzeros per row, for residual replacement

    def norm_inf(self) -> float:
        return self.matrices.norm_inf(self.mat)

    def nonzeros_per_row(self) -> int:
        return self.matrices.max_nonzeros(self.mat)


class _MatrixFree(_Operator):
    """A :class:`LinearOperator` as the solvers see it: its ``apply`` captured once per solve
    and vector pair (:mod:`meshchain.engine.capture`) and replayed in every iteration; an
    ``apply`` that cannot be captured (it reads values between its loops) runs as written,
    with a warning."""

    def __init__(self, engine, op: LinearOperator):
        self.engine, self.op = engine, op
        self.row_set, self.dim, self.name = op.row_set, op.dim, op.name
        self.step = engine.capture(op.apply, name=f"{op.name}.apply")

    def apply(self, x, y, xs=None, ys=None) -> None:
        if self.step is not None:
            try:
                self.step(x, y)
                return
            except CaptureError as exc:
                self.step = None
                warnings.warn(MeshchainWarning(f"[capture-refused] LinearOperator {self.name!r}: its apply runs "
                                               f"uncaptured in this solve, loop by loop: {exc}"), stacklevel=4)
        self.op.apply(x, y)
        self.engine.run_pending()

    def diagonal(self) -> np.ndarray:
        if self.op.diagonal is None:
            raise SolverError(f"LinearOperator {self.name!r}: pc='jacobi' needs its diagonal; pass diagonal=<Dat>.")
        return self.engine.dat_values(self.op.diagonal, write=False).reshape(-1).copy()

    @property
    def gives_bounds(self) -> bool:
        """Whether the user gave ``norm_inf`` and ``nonzeros_per_row`` (residual replacement)."""
        return self.op.norm_inf is not None and self.op.nonzeros_per_row is not None

    def norm_inf(self) -> float:
        if self.op.norm_inf is None:
            raise SolverError(f"LinearOperator {self.name!r}: residual replacement needs norm_inf= (||A||_inf).")
        return float(self.op.norm_inf)

    def nonzeros_per_row(self) -> int:
        if self.op.nonzeros_per_row is None:
            raise SolverError(f"LinearOperator {self.name!r}: residual replacement needs nonzeros_per_row=.")
        return int(self.op.nonzeros_per_row)


def kept_for(engine, name: str, A) -> dict:
    """What the session's solver cache ``name`` keeps for operator ``A`` (a Mat or
    LinearOperator, or a row set): a dict, made empty at first use (a miss of the cache,
    :meth:`~meshchain.engine.surface.Surface.solver_cache`); :func:`found_kept` counts the
    look-ups that find what they look for in it."""
    cache = engine.solver_cache(name)
    found = cache.get(A)
    if found is None:
        found = cache[A] = {}
    return found


def found_kept(engine, name: str) -> None:
    """Count a hit of the session's solver cache ``name``: something kept was used again
    (``mc.stats().caches[name].hits``)."""
    engine.solver_cache(name).hits += 1


def as_operator(engine, A):
    """The solvers' view of ``A`` (a Mat or a LinearOperator)."""
    if isinstance(A, Mat):
        return _Assembled(engine, A)
    if isinstance(A, LinearOperator):
        return _MatrixFree(engine, A)
    raise SolverError(f"solve: A must be a meshchain.Mat or a meshchain.LinearOperator, got {type(A).__name__}.")

