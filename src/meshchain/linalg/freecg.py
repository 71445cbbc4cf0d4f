"""The block s-step CG (:mod:`.blockcg`, ``method="sstep-cg"``) of a matrix-free
:class:`~meshchain.LinearOperator`: each basis is one communication-avoiding loop chain.

A basis ``v_{k+1} = (Â - θ_k) v_k`` (``Â = S A S``, ``S = D^-1/2`` with ``pc="jacobi"``, the
operator's ``diagonal``) is, per product, the user's ``apply`` loops between two direct
loops (``w = S v_k``; ``v_{k+1} = S v_{k+1} - θ_k v_k``), all ``s`` products recorded in one
``mc.loop_chain(..., ca=True)``: one grouped message per neighbour, the redundant work on
the deeper halo layers worked out by the chain's inspector, as :func:`~.powers.matrix_powers`
does. The rest of an outer iteration (the reduction, the block update) is the assembled
matrix's. The Newton shifts are found at every solve (an operator's values cannot be
stamped), and ``s="auto"`` is refused (the model measures an assembled matrix).

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes, edges = mc.Set(30, "nodes"), mc.Set(29, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[i, i + 1] for i in range(29)], "e2n")
>>> spring = mc.Kernel.from_source("def spring(y, x):\\n    y[0, 0] += 2.1 * x[0, 0] - x[1, 0]\\n"
...                                "    y[1, 0] += 2.1 * x[1, 0] - x[0, 0]\\n")
>>> clear = mc.Kernel.from_source("def clear(y):\\n    y[0] = 0.0\\n")
>>> def apply(x, y):
...     mc.par_loop(clear, nodes, y(mc.WRITE))
...     mc.par_loop(spring, edges, y(mc.INC, e2n), x(mc.READ, e2n))
>>> op = mc.LinearOperator(nodes, apply, name="springs")
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.ones(30), "b")
>>> info = mc.solve(op, x, b, method="sstep-cg", pc=None, s=3, rtol=1e-10)
>>> info.converged, info.true_residual < 1e-8
(True, True)
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..api import loop_chain, par_loop
from ..core.access import READ, RW, WRITE
from ..core.errors import SolverError
from ..ir.kernel import Kernel
from ..types import Global
from .blockcg import _BlockRun
from .info import SolveInfo
from .scaled import work_dats
from .sstep import drive
from .operators import found_kept, kept_for

__all__ = ["OperatorRun", "solve_free"]

SHIFT_GLOBALS = "s-step shift globals"
"""The session's solver cache (per operator: ``{s: globals}``) of the shifts' globals."""


class OperatorRun(_BlockRun):
    """A block s-step CG solve of a :class:`~meshchain.LinearOperator` (see the module docstring)."""

    def __init__(self, engine, A, dats: dict, steps: int, **options):
        super().__init__(engine, A, dats, steps, **options)
        self.temporary = dats["w"]
        self.thetas = _thetas(engine, A, steps)  # kept with the work vectors: the chains' plans are reused
        self.kernels = _kernels(A.dim)
        self.Y = np.empty((steps + 1, self.n))

    def prepare(self, steps: int) -> None:
        """Nothing: the loop chains build their halo layers as they run."""

    def stamp(self):
        return None

    def multiply(self, x, y) -> None:
        self.A.apply(x, y)
        self.engine.run_pending()

    def products(self, wanted) -> None:
        """Sequences ``(x, ys, shifts)`` of scaled, shifted applications by work-vector name,
        each as one communication-avoiding chain."""
        for x, ys, shifts, *pulls in wanted:
            if pulls:
                raise SolverError("solve: the block s-step CG of a LinearOperator takes real Newton shifts only.")
            self._sequence(x, [self.dats[y] for y in ys], np.zeros(len(ys)) if shifts is None else shifts)
        self.views()

    def compiled_product(self):
        """None: the operator's product is a chain of loops, not one compiled call."""
        return None

    def residual(self, into: str) -> None:
        """``into = b̂ - Â x̂`` (one application)."""
        self.products([("x", ["t"], None)])
        np.subtract(self.v["b"], self.v["t"], out=self.v[into])
        self.fresh(into)
        self.exit_norms = None

    def basis(self, m: int, shifts: np.ndarray) -> np.ndarray:
        """``V = [r, (Â - θ_0) r, ...]`` of ``m + 1`` vectors (their owned rows; one chain)."""
        names = [f"V{j}" for j in range(1, m + 1)]
        self.products([("r", names, shifts[:m])])
        Y = self.Y
        Y[0] = self.v["r"]
        for j, name in enumerate(names, start=1):
            Y[j] = self.v[name]
        return Y

    def outers(self, shifts: np.ndarray, best: float, idle: int, recent: float = math.inf) -> None:
        """None: each outer iteration runs its basis's chain from Python (:meth:`outer`)."""
        return None

    def _sequence(self, source: str, ys, shifts) -> None:
        """One chain per source vector and length (a chain's plan is kept per name)."""
        scale, w = self.dats["scale"], self.temporary
        scaled, finish = self.kernels
        name = f"{self.A.name}.sstep-basis{len(ys)}" if source == "r" else f"{self.A.name}.sstep-{source}"
        with loop_chain(name, ca=True):
            previous = self.dats[source]
            for y, shift, theta in zip(ys, shifts, self.thetas):
                theta.value = float(shift)
                par_loop(scaled, self.A.row_set, w(WRITE), previous(READ), scale(READ))
                self.A.apply(w, y)
                par_loop(finish, self.A.row_set, y(RW), previous(READ), scale(READ), theta(READ))
                previous = y
        self.engine.run_pending(ys[-1])


def _thetas(engine, A, steps: int) -> list:
    """The shifts' globals of ``A``'s chains (declared once per operator, session and ``s``)."""
    per_operator = kept_for(engine, SHIFT_GLOBALS, A)
    if steps not in per_operator:
        per_operator[steps] = [Global(1, 0.0, f"{A.name}:sstep-cg:theta{k}") for k in range(steps)]
    else:
        found_kept(engine, SHIFT_GLOBALS)
    return per_operator[steps]


@functools.lru_cache(maxsize=None)
def _kernels(dim: int) -> tuple:
    """``w = s x`` and ``y = s y - θ x`` on one element of ``dim`` values."""
    rows = range(dim)
    scaled = Kernel.from_source("def sstep_scaled(w, x, s):\n" + "".join(f"    w[{c}] = s[{c}] * x[{c}]\n" for c in rows))
    finish = Kernel.from_source("def sstep_finish(y, x, s, theta):\n"
                                + "".join(f"    y[{c}] = s[{c}] * y[{c}] - theta[0] * x[{c}]\n" for c in rows))
    return scaled, finish


def solve_free(engine, A, x, b, *, steps, basis, pc, rtol, atol, maxiter, monitor) -> SolveInfo:
    """``mc.solve(A, x, b, method="sstep-cg")`` with a matrix-free ``A`` (collective)."""
    names = ["x", "b", "r", "p", "t", "w", "scale", "weight", *[f"V{j}" for j in range(1, steps + 1)]]
    run = OperatorRun(engine, A, work_dats(engine, A, "sstep-cg", steps, names), steps, jacobi=pc == "jacobi",
                      rtol=rtol, atol=atol, maxiter=maxiter, monitor=monitor)
    return drive(run, A, x, b, steps=steps, basis=basis, pc=pc, method="sstep-cg")
