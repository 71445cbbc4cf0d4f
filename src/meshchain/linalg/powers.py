"""``A x, A² x, ..., Aˢ x`` with one halo exchange, for both kinds of operator.

An assembled :class:`~meshchain.Mat` runs the matrix powers kernel
(:meth:`~meshchain.Mat.powers`, :mod:`meshchain.engine.powers`): its halo rows are kept
locally and ``x`` is exchanged ``s`` layers deep once. A matrix-free
:class:`~meshchain.LinearOperator` records its ``s`` applications as one
communication-avoiding loop chain (``mc.loop_chain(..., ca=True)``): one grouped message
per neighbour, the redundant work on deeper halos worked out by the chain's inspector.
Either way the products have the bits of ``s`` separate products on integer data.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes = mc.Set(3, "nodes")
>>> @mc.kernel
... def triple(a, b):
...     b[0] = 3.0 * a[0]
>>> op = mc.LinearOperator(nodes, lambda x, y: mc.par_loop(triple, nodes, x(mc.READ), y(mc.WRITE)), name="triple")
>>> x = mc.Dat(nodes, 1, np.ones(3), "x")
>>> ys = [mc.Dat(nodes, 1, None, f"y{k}") for k in range(2)]
>>> matrix_powers(op, x, ys)
>>> [float(y.data[0, 0]) for y in ys]
[3.0, 9.0]
"""

from __future__ import annotations

from ..api import loop_chain
from ..core.errors import SolverError
from ..types import Dat, Mat
from .operators import LinearOperator

__all__ = ["matrix_powers"]


def matrix_powers(A, x, ys) -> None:
    """``ys[k] = A^(k+1) x`` for ``k = 0..len(ys)-1`` with one halo exchange (collective).

    Parameters
    ----------
    A : Mat or LinearOperator
        Square.
    x : Dat
    ys : sequence of Dat
        ``s >= 1`` dats alike ``x``, distinct from it and from each other.
    """
    ys = list(ys)
    if isinstance(A, Mat):
        A.powers(x, ys)
        return
    if not isinstance(A, LinearOperator):
        raise SolverError(f"matrix_powers: A must be a meshchain.Mat or a meshchain.LinearOperator, got "
                          f"{type(A).__name__}.")
    if not ys:
        raise SolverError(f"matrix_powers({A.name!r}): give at least one output dat (s = len(ys) >= 1).")
    for d in (x, *ys):
        if not isinstance(d, Dat) or d.dataset is not A.row_set or d.dim != A.dim:
            raise SolverError(f"matrix_powers({A.name!r}): x and ys must be Dats on {A.row_set.name!r} of dim {A.dim}, "
                              f"got {d!r}.")
    if len({id(d) for d in (x, *ys)}) != len(ys) + 1:
        raise SolverError(f"matrix_powers({A.name!r}): x and the output dats must be distinct dats.")
    with loop_chain(f"{A.name}.powers", ca=True):
        previous = x
        for y in ys:
            A.apply(previous, y)
            previous = y
