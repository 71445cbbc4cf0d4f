"""``mc.solve`` on block systems: a block :class:`~meshchain.Mat` over mixed spaces with
:class:`~meshchain.MixedDat` vectors, handed to PETSc (``method="petsc"``).

The blocks become one AIJ matrix (:meth:`MixedMat.to_petsc
<meshchain.types.mixed_mat.MixedMat.to_petsc>`), ``x`` and ``b`` are copied into PETSc
vectors in its numbering and the solution is copied back into ``x``. Each component is a
field for PETSc's ``pc_type fieldsplit`` (named ``"0"``, ``"1"``, ...: options
``fieldsplit_0_pc_type`` and so on), so block preconditioners such as a Schur complement
factorisation for Stokes are options away. Everything else is as
:mod:`meshchain.linalg.petsc` describes (defaults, precedence, unused options, errors).
The native Krylov methods take one dat; a block system with another method is refused.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> cells, nodes = mc.Set(2, "cells"), mc.Set(2, "nodes")
>>> c2n = mc.Map(cells, nodes, 1, [[0], [1]], "c2n")
>>> c2c = mc.Map(cells, cells, 1, [[0], [1]], "c2c")
>>> space, m = mc.MixedSet([nodes, cells]), mc.MixedMap([c2n, c2c])
>>> A = mc.Mat(space, space, [(m, m)], "A")
>>> k = mc.Kernel.from_source("def k(a):\\n    a[0, 0] += 2.0\\n    a[0, 1] += 1.0\\n    a[1, 0] += 1.0\\n"
...                           "    a[1, 1] += 3.0\\n")
>>> mc.par_loop(k, cells, A(mc.INC, (m, m)))
>>> x, b = mc.MixedDat(space, 1, None, "x"), mc.MixedDat(space, 1, np.ones(4), "b")
>>> info = mc.solve(A, x, b, method="petsc", options={"ksp_type": "preonly", "pc_type": "lu"})
>>> info.converged, [np.round(d.data_ro.ravel(), 6).tolist() for d in x.split]
(True, [[0.4, 0.4], [0.2, 0.2]])
"""

from __future__ import annotations

from ..comm.agree import raise_together
from ..core.errors import MeshchainError, SolverError
from ..types.mixed import MixedDat
from ..types.mixed_mat import MixedMat
from .info import SolveInfo
from .petsc import (PC_OPTIONS, _as_solver_error, _Callbacks, _configured_ksp, _destroyed_after, _import_petsc,
                    _options_in_database, _run, _unused_options_error, petsc_settings)

__all__ = ["solve_blocks", "is_block_system"]


def is_block_system(A, x, b) -> bool:
    """Whether any of ``A``, ``x``, ``b`` is a block matrix or a mixed dat."""
    return isinstance(A, MixedMat) or isinstance(x, MixedDat) or isinstance(b, MixedDat)


def _check(A, x, b, *, method, pc, residual_replacement, restart) -> None:
    if method != "petsc":
        raise SolverError(f"solve: a block system (a Mat over mixed spaces, MixedDat vectors) is solved with "
                          f"method='petsc' (PETSc's KSP, with pc_type fieldsplit over its components); the native "
                          f"method {method!r} takes one Dat.")
    if not isinstance(A, MixedMat):
        raise SolverError(f"solve: MixedDat vectors need a block matrix (mc.Mat over mixed spaces), got "
                          f"{type(A).__name__}.")
    if tuple(A.row_space) != tuple(A.col_space) or A.dims != A.col_dims:
        raise SolverError(f"solve: Mat {A.name!r} is not square (its row and column spaces or dims differ).")
    for what, v in (("x", x), ("b", b)):
        if not isinstance(v, MixedDat):
            raise SolverError(f"solve: {what} must be a MixedDat on Mat {A.name!r}'s space, got {type(v).__name__}.")
    if x is b:
        raise SolverError(f"solve: x and b are the same MixedDat {x.name!r}; pass two.")
    if pc not in PC_OPTIONS:
        raise SolverError(f"solve: a block system takes pc= one of {', '.join(map(repr, PC_OPTIONS))} or PETSc's own "
                          f"options (pc_type fieldsplit ...), got {pc!r}.")
    if residual_replacement is not None or restart != 30:
        raise SolverError("solve: with method='petsc', pass PETSc's own options instead of residual_replacement= or "
                          "restart=.")


def solve_blocks(engine, A, x, b, *, method, pc, rtol, atol, maxiter, residual_replacement, restart, options,
                 monitor) -> SolveInfo:
    """:func:`meshchain.solve` of a block system (collective; see the module docstring)."""
    _check(A, x, b, method=method, pc=pc, residual_replacement=residual_replacement, restart=restart)
    PETSc = _import_petsc()  # noqa: N806 - the module's own name
    options = options or {}
    settings = petsc_settings(pc, options)
    callbacks = _Callbacks(monitor)
    matrices = engine.matrices
    info, unused, error = None, [], None
    with _options_in_database(PETSc, settings) as (prefix, database), _destroyed_after() as objects:
        try:
            mat = matrices.block_to_petsc(A)
            objects.append(mat)
            xv, bv = matrices.block_petsc_vec(A, x), matrices.block_petsc_vec(A, b, columns=False)
            fields = matrices.block_fields(A)
            objects += [xv, bv, *(index_set for _, index_set in fields)]
            ksp = _configured_ksp(PETSc, mat, prefix, None, callbacks, objects, rtol=rtol, atol=atol,
                                  maxiter=int(maxiter), guess_given="ksp_initial_guess_nonzero" in options,
                                  fields=fields)
            info = _run(PETSc, ksp, mat, xv, bv, callbacks, objects)
            matrices.block_from_petsc_vec(A, xv, x)
            unused = [name for name in options if not database.used(name)]
        except (PETSc.Error, MeshchainError) as exc:
            error = _as_solver_error(PETSc, exc, callbacks, settings, None)
    raise_together(engine.comm, error)
    raise_together(engine.comm, _unused_options_error(unused, settings) if unused else None)
    return info
