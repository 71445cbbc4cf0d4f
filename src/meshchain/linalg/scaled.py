"""What the s-step Krylov methods (:mod:`.blockcg`, :mod:`.sstep`, :mod:`.cagmres`) share: a solve of the
symmetrically scaled system ``Â x̂ = b̂`` (``Â = S A S``, ``x = S x̂``, ``b̂ = S b``; ``S =
D^-1/2`` with ``pc="jacobi"``, else the identity) whose products come from the matrix powers
kernel (:meth:`~meshchain.engine.matrices.Matrices.products`, which scales as it
multiplies), its work vectors' owned rows, its reductions and its convergence test.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes, edges = mc.Set(6, "nodes"), mc.Set(5, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[i, i + 1] for i in range(5)], "e2n")
>>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
>>> spring = mc.Kernel.from_source("def spring(a):\\n    a[0, 0] += 3.0\\n    a[0, 1] -= 1.0\\n"
...                                "    a[1, 0] -= 1.0\\n    a[1, 1] += 3.0\\n")
>>> mc.par_loop(spring, edges, A(mc.INC, (e2n, e2n)))
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.ones(6), "b")
>>> info = mc.solve(A, x, b, method="ca-gmres", s=3, restart=6)
>>> info.converged
True
"""

from __future__ import annotations

import math

import numpy as np

from ..comm.pairwise import short_sum
from ..core.cache import memo
from ..core.errors import SolverError
from ..types import Dat, Mat
from .fused import dot
from .info import monitored
from .operators import LinearOperator, found_kept, kept_for

__all__ = ["ScaledRun", "work_dats", "enter", "leave", "check_matrix"]

WORK_VECTORS = "s-step work vectors"
"""The session's solver cache (per matrix: ``{(method, steps): dats}``) of the s-step methods' work vectors."""
SCALES = "Jacobi scalings"  # the session's solver cache, per matrix: {"scale": (values stamp, owned rows of D^-1/2)}
_held = memo("scale vectors' contents", weak=True)  # per work dat "scale": the key of the scaling it holds


def check_matrix(A, pc, method: str) -> None:
    """Refuse what the matrix powers kernel cannot run (the same on every rank): a matrix-free
    operator takes the block s-step CG only."""
    if not (isinstance(A, Mat) or (method == "sstep-cg" and isinstance(A, LinearOperator))):
        raise SolverError(f"solve: method={method!r} runs the matrix powers kernel of an assembled mc.Mat; "
                          f"{type(A).__name__} {getattr(A, 'name', '')!r} is not one (use method='cg', 'pipecg' or "
                          f"'gmres').")
    if pc not in (None, "jacobi"):
        raise SolverError(f"solve: method={method!r} takes pc=None or 'jacobi' (a symmetric scaling the matrix "
                          f"powers kernel applies), got {pc!r}.")


def work_dats(engine, A, method: str, steps: int, names) -> dict:
    """The work vectors ``names`` of ``method`` with ``steps`` for ``A`` (declared once per
    matrix, session, method and ``steps``)."""
    per_matrix = kept_for(engine, WORK_VECTORS, A)
    found = per_matrix.get((method, steps))
    if found is None:
        found = per_matrix[(method, steps)] = {name: Dat(A.row_set, A.dim, None, f"{A.name}:{method}:{name}")
                                               for name in names}
    else:
        found_kept(engine, WORK_VECTORS)
    return found


class ScaledRun:
    """One solve of the scaled system: vectors (owned rows), reductions, products, the
    convergence test on the norms it is given."""

    def __init__(self, engine, A, dats: dict, *, jacobi: bool, rtol, atol, maxiter, monitor):
        self.engine, self.A, self.dats = engine, A, dats
        self.comm = engine.comm
        self.n, self.jacobi = engine.n_owned(A.row_set) * A.dim, jacobi
        self.v, self.hosts = {}, {}
        self.views()
        self.rtol, self.atol, self.maxiter, self.monitor = rtol, atol, maxiter, monitor
        self.history, self.reductions, self.iterations = [], 0, 0
        self.target = None

    def views(self) -> None:
        """The owned rows of every work vector (again when a storage got a new array: halo
        layers added by the first product of an ``s``-step basis move every dat)."""
        for name, d in self.dats.items():
            host = self.engine.storage(d).host
            if self.hosts.get(name) is not host:
                self.hosts[name], self.v[name] = host, host.reshape(-1)[:self.n]

    def total(self, values: np.ndarray) -> np.ndarray:
        """``values`` summed over the ranks (one reduction; a block of them in one message
        round per doubling of the ranks, :func:`meshchain.comm.pairwise.short_sum`)."""
        self.reductions += 1
        return short_sum(self.comm, values)

    def products(self, wanted) -> None:
        """Sequences of products of ``Â`` (one matrix powers exchange): ``(x, ys, shifts)``
        or ``(x, ys, shifts, pulls)`` by work-vector name."""
        dats = self.dats
        self.engine.matrices.products(self.A, [(dats[x], [dats[y] for y in ys], *rest) for x, ys, *rest in wanted],
                                      scale=dats["scale"] if self.jacobi else None)
        self.views()

    def fresh(self, name: str) -> None:
        """The owned rows of work vector ``name`` were changed here: its halo is stale."""
        self.engine.halos_stale(self.dats[name])

    def tested(self, norm: float, iteration: int | None = None) -> bool:
        """Record the norm of this iteration (``iteration``; None: one norm per iteration so
        far); whether it meets the tolerance."""
        if self.target is None:
            self.target = max(self.rtol * norm, self.atol)
        self.history.append(norm)
        if self.monitor is not None:
            monitored(self.comm, self.monitor, len(self.history) - 1 if iteration is None else iteration, norm)
        return norm <= self.target

    def residual(self, into: str) -> None:
        """``into = b̂ - Â x̂`` (one exchange)."""
        self.products([("x", ["t"], None)])
        np.subtract(self.v["b"], self.v["t"], out=self.v[into])
        self.fresh(into)

    def plain_norm(self, name: str) -> float:
        """``||v||`` of work vector ``name``, summed over the ranks (one reduction)."""
        v = self.v[name]
        return math.sqrt(max(float(self.total(np.array([dot(v, v)]))[0]), 0.0))


def enter(engine, A, x, b, run: ScaledRun) -> None:
    """Set up the scaled system: ``scale`` (``S``'s diagonal), ``x̂ = S^-1 x``, ``b̂ = S b``
    (collective: a non-positive diagonal with Jacobi is refused on every rank)."""
    v = run.v
    engine.dat_values(x, write=True)
    user_x = engine.storage(x).host.reshape(-1)[:run.n]
    user_b = engine.dat_values(b, write=False).reshape(-1)[:run.n]
    scale = _scale(engine, A, run) if run.jacobi else 1.0
    held = _scaling_key(engine, A, run)
    if held is None or _held.get(run.dats["scale"]) != held:  # its halo stays valid otherwise
        v["scale"][...] = scale
        run.fresh("scale")
        _held[run.dats["scale"]] = held
    np.divide(user_x, v["scale"], out=v["x"])
    np.multiply(user_b, v["scale"], out=v["b"])
    run.fresh("x")


def _scaling_key(engine, A, run: ScaledRun):
    """What identifies the scaling of this solve on every rank alike (None: a matrix-free
    operator's, new at every solve). Whether the work vector ``scale`` must be written again,
    and its halo exchanged, is decided from it, never from the values a rank holds: a rank
    whose owned rows did not change (none, or equal ones) still needs its neighbours' new
    values, and a rank that skipped the exchange the others made received their messages in
    its next one (MPI_ERR_TRUNCATE on 3 ranks, ``structured_quads(3, 2)``: one rank owns no row)."""
    if not run.jacobi:
        return "identity"
    if not isinstance(A, Mat):
        return None
    return engine.matrices.values_stamp(A)  # the work dats are the engine's own: no engine in the key


def _scale(engine, A, run: ScaledRun) -> np.ndarray:
    """``D^-1/2``'s diagonal (owned rows), kept per matrix until its values change (collective
    the first time: a non-positive diagonal is refused on every rank); a matrix-free
    operator's from its ``diagonal`` dat, at every solve."""
    if not isinstance(A, Mat):
        if A.diagonal is None:
            raise SolverError(f"LinearOperator {A.name!r}: pc='jacobi' needs its diagonal; pass diagonal=<Dat>.")
        return _positive(run, A, engine.dat_values(A.diagonal, write=False).reshape(-1)[:run.n].copy())
    stamp = engine.matrices.values_stamp(A)
    found = kept_for(engine, SCALES, A).get("scale")
    if found is not None and found[0] == stamp:
        found_kept(engine, SCALES)
        return found[1]
    scale = _positive(run, A, engine.matrices.diagonal_values(A))
    kept_for(engine, SCALES, A)["scale"] = (stamp, scale)
    return scale


def _positive(run: ScaledRun, A, diagonal: np.ndarray) -> np.ndarray:
    """``1 / sqrt(diagonal)`` after refusing a non-positive entry on every rank."""
    bad = int(run.total(np.array([float(np.count_nonzero(~(diagonal > 0)))]))[0])
    if bad:
        raise SolverError(f"solve: pc='jacobi' needs a positive diagonal; {'Mat' if isinstance(A, Mat) else 'LinearOperator'} "
                          f"{A.name!r} has {bad} non-positive diagonal entries.")
    return 1.0 / np.sqrt(diagonal)


def leave(engine, x, run: ScaledRun) -> None:
    """``x = S x̂`` into the user's dat."""
    user_x = engine.storage(x).host.reshape(-1)[:run.n]  # its array too may have moved (halo layers added)
    np.multiply(run.v["x"], run.v["scale"], out=user_x)
    engine.halos_stale(x)
