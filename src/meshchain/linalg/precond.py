"""Preconditioners: ``None``, ``"jacobi"`` (pointwise, fused into the methods' vector
passes) and ``"sgs"`` (GeoFEM-style localized: block Jacobi over the ranks, one symmetric
Gauss-Seidel sweep on each rank's owned block; no communication).

Examples
--------
>>> import numpy as np
>>> pc = Pointwise(np.array([0.5, 0.25]))
>>> z = np.zeros(2); pc.apply(np.array([2.0, 4.0]), z); z.tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import numpy as np

from ..backends.sparse import symmetric_gauss_seidel
from ..core.errors import SolverError
from .fused import scale

__all__ = ["PRECONDITIONERS", "Pointwise", "SymmetricGaussSeidel", "make_preconditioner"]

PRECONDITIONERS = (None, "jacobi", "sgs")


class Pointwise:
    """``z = dinv * r``; the methods fuse it into their vector passes (``pointwise``)."""

    pointwise = True

    def __init__(self, dinv: np.ndarray):
        self.dinv = dinv

    def apply(self, r: np.ndarray, z: np.ndarray) -> None:
        scale(self.dinv, r, z)


class SymmetricGaussSeidel:
    """One symmetric Gauss-Seidel sweep on this rank's owned block of an assembled matrix."""

    pointwise = False

    def __init__(self, pattern, diagonal: np.ndarray):
        self.pattern, self.diag = pattern, diagonal
        self.dinv = np.ones(len(diagonal))  # what the fused passes apply; apply() overwrites it

    def apply(self, r: np.ndarray, z: np.ndarray) -> None:
        p = self.pattern
        symmetric_gauss_seidel(p.indptr, p.split, p.indices, p.values, self.diag, r, z)


def make_preconditioner(pc, operator, n: int):
    """The preconditioner ``pc`` for ``operator`` (``n`` owned values)."""
    if pc is None:
        return Pointwise(np.ones(n))
    if pc not in PRECONDITIONERS:
        raise SolverError(f"solve: unknown preconditioner {pc!r}; choose one of {', '.join(map(repr, PRECONDITIONERS))}.")
    pattern = getattr(operator, "pattern", None)
    if pc == "sgs" and pattern is None:
        raise SolverError(f"solve: pc='sgs' needs an assembled matrix; {operator.name!r} is matrix-free "
                          f"(use pc='jacobi' with its diagonal, or None).")
    diagonal = operator.diagonal()
    bad = np.flatnonzero(~(diagonal > 0.0))
    error = None
    if bad.size:
        error = SolverError(f"solve: pc={pc!r} needs a positive diagonal, but {operator.name!r} has "
                            f"{diagonal[bad[0]]!r} in owned row {int(bad[0])} (of {n}).")
    operator.agree(error)
    if pc == "jacobi":
        return Pointwise(1.0 / diagonal)
    return SymmetricGaussSeidel(pattern, diagonal)
