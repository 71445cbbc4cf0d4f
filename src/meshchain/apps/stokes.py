"""Stokes flow with stabilised P1-P1 elements: a block system over a mixed space, assembled
by one loop into a block :class:`meshchain.Mat` and solved by PETSc with a Schur-complement
field split.

``-Δu + ∇p = f``, ``div u = 0`` on the unit square (triangles), ``u = 0`` on the boundary,
with the manufactured solution ``u = (π sin²(πx) sin(2πy), -π sin(2πx) sin²(πy))`` (divergence
free, zero on the boundary) and ``p = cos(πx) cos(πy)`` (mean zero). Velocity (dim 2) and
pressure (dim 1) both live on the nodes: the space is ``mc.MixedSet([nodes, nodes])`` with
dims ``(2, 1)``, the unknowns a :class:`~meshchain.MixedDat`. Equal-order elements need
stabilisation: Brezzi-Pitkäranta's ``-β h² (∇p, ∇q)`` (``h² = 2 |cell|``) in the pressure
block. The element kernel receives one 9 x 9 block (the cell's six velocity rows, then its
three pressure rows) through a :class:`~meshchain.MixedMap`, as PyOP2 lays out a mixed
element matrix, and the load kernel one flat view of nine right-hand-side values.

The Dirichlet velocity nodes form a :class:`~meshchain.Subset` of the nodes (``wall``):
their rows and columns get no element contributions and
``K.zero_rows(wall, 1.0, component=0)`` gives them a unit diagonal; the pressure, defined up
to a constant, is pinned at node 0. The velocity error (lumped-mass L2 norm at the nodes) falls
by about 4 per refinement, the pressure error by about 3.

Examples
--------
>>> from meshchain.apps import stokes
>>> from meshchain.meshes import structured_tris
>>> problem = stokes.declare(structured_tris(8, 8))
>>> info = stokes.solve(problem)
>>> velocity, pressure = stokes.errors(problem)
>>> info.converged, velocity < 0.1, pressure < 1.0
(True, True, True)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import meshchain as mc

from .poisson import SIMPLEX_GEOMETRY

__all__ = ["Stokes", "declare", "assemble", "solve", "errors", "element_source", "manufactured", "SCHUR"]

SCHUR = {
    "ksp_type": "fgmres",
    "pc_type": "fieldsplit",
    "pc_fieldsplit_type": "schur",
    "pc_fieldsplit_schur_fact_type": "full",
    "pc_fieldsplit_schur_precondition": "selfp",
    "fieldsplit_0_ksp_type": "preonly",
    "fieldsplit_0_pc_type": "gamg",
    "fieldsplit_1_ksp_type": "gmres",
    "fieldsplit_1_ksp_rtol": 1e-8,
    "fieldsplit_1_pc_type": "jacobi",
}
"""The default PETSc options: FGMRES around a full Schur-complement factorisation, the
velocity block by algebraic multigrid, the Schur complement by GMRES preconditioned with
its ``selfp`` approximation ``C - B diag(A)^-1 B^T`` (fields ``0``: velocity, ``1``: pressure)."""


def element_source(beta: float) -> str:
    """The element kernel ``stokes(a, x, bc)``: rows/columns ``2 i + c`` are velocity
    component ``c`` of the cell's node ``i``, ``6 + k`` the pressure of node ``k``.

    >>> source = element_source(0.05)
    >>> "a[6, 7] +=" in source and "a[1, 8] +=" in source and "a[8, 5] +=" in source
    True
    """
    lines = ["def stokes(a, x, bc):", SIMPLEX_GEOMETRY[2].rstrip("\n"), "    third = vol / 3.0",
             f"    stab = -{float(beta)!r} * 2.0 * vol * vol"]
    for i in range(3):
        for j in range(3):
            dot = f"(g{i}0 * g{j}0 + g{i}1 * g{j}1)"
            lines += [f"    if bc[{i}, 0] == 0 and bc[{j}, 0] == 0:"]
            lines += [f"        a[{2 * i + c}, {2 * j + c}] += vol * {dot}" for c in range(2)]
            lines += [f"    a[{6 + i}, {6 + j}] += stab * {dot}"]
            lines += [f"    if bc[{j}, 0] == 0:"]
            for c in range(2):  # -(p, div v) and -(q, div u): the pressure times the velocity's divergence
                lines += [f"        a[{6 + i}, {2 * j + c}] += -third * g{j}{c}",
                          f"        a[{2 * j + c}, {6 + i}] += -third * g{j}{c}"]
    return "\n".join(lines) + "\n"


def _load_source() -> str:
    """``load(b, f, x, bc)``: the lumped body force into the velocity rows of free nodes
    (``b`` the flat view: six velocity values, then three pressure values, which stay 0)."""
    lines = ["def load(b, f, x, bc):", SIMPLEX_GEOMETRY[2].rstrip("\n"), "    share = vol / 3.0"]
    for i in range(3):
        lines += [f"    if bc[{i}, 0] == 0:"]
        lines += [f"        b[{2 * i + c}] += f[{i}, {c}] * share" for c in range(2)]
    return "\n".join(lines) + "\n"


def _error_source() -> str:
    """``squared(total, u, p, exact_u, exact_p, x)``: the cell's lumped-mass squared L2 errors
    of velocity (``total[0]``) and pressure (``total[1]``)."""
    lines = ["def squared(total, u, p, exact_u, exact_p, x):", SIMPLEX_GEOMETRY[2].rstrip("\n"), "    su = 0.0", "    sp = 0.0"]
    for i in range(3):
        lines += [f"    su += (u[{i}, 0] - exact_u[{i}, 0]) ** 2 + (u[{i}, 1] - exact_u[{i}, 1]) ** 2",
                  f"    sp += (p[{i}, 0] - exact_p[{i}, 0]) ** 2"]
    lines += ["    total[0] += su * vol / 3.0", "    total[1] += sp * vol / 3.0"]
    return "\n".join(lines) + "\n"


def manufactured(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``u`` (n x 2), ``p`` (n) and ``f = -Δu + ∇p`` (n x 2) at the points ``coords``.

    >>> u, p, f = manufactured(np.array([[0.25, 0.25]]))
    >>> np.round(u, 6).tolist(), round(float(p[0]), 6), np.round(f, 4).tolist()
    ([[1.570796, -1.570796]], 0.5, [[60.4418, -63.5833]])
    """
    pi = math.pi
    x, y = coords[:, 0], coords[:, 1]
    u = np.stack([pi * np.sin(pi * x) ** 2 * np.sin(2 * pi * y), -pi * np.sin(2 * pi * x) * np.sin(pi * y) ** 2], 1)
    p = np.cos(pi * x) * np.cos(pi * y)
    laplacian = np.stack([2 * pi ** 3 * np.sin(2 * pi * y) * (2 * np.cos(2 * pi * x) - 1),
                          -2 * pi ** 3 * np.sin(2 * pi * x) * (2 * np.cos(2 * pi * y) - 1)], 1)
    grad_p = np.stack([-pi * np.sin(pi * x) * np.cos(pi * y), -pi * np.cos(pi * x) * np.sin(pi * y)], 1)
    return u, p, -laplacian + grad_p


@dataclasses.dataclass
class Stokes:
    """The declared problem: mesh, mixed space, block matrix, unknowns and right-hand side."""

    mesh: object
    space: mc.MixedSet
    both: mc.MixedMap
    K: object  # the block matrix (a MixedMat)
    up: mc.MixedDat  # velocity and pressure
    rhs: mc.MixedDat
    f: mc.Dat
    exact_u: mc.Dat
    exact_p: mc.Dat
    bc: mc.Dat
    wall: mc.Subset
    pin: mc.Subset  # node 0, where the pressure is pinned
    pinned: mc.Global  # the exact pressure there
    kernels: dict


def declare(mesh, *, beta: float = 0.2, method: str = "kway", seed: int = 0) -> Stokes:
    """Declare the problem on a triangle ``mesh`` of the unit square, partition it over the
    ranks and assemble the block matrix and the right-hand side (every rank passes the same
    whole mesh)."""
    if mesh.cell_type != "triangle":
        raise mc.DeclarationError(f"the Stokes app needs a triangle mesh, not {mesh.cell_type!r}")
    u_values, p_values, f_values = manufactured(mesh.coords)
    boundary = np.unique(mesh.boundary_facets).astype(np.int64)
    d = mesh.declare()
    nodes = d.nodes
    space = mc.MixedSet([nodes, nodes], "velocity_pressure")
    problem = Stokes(
        mesh=d, space=space, both=mc.MixedMap([d.cell2node, d.cell2node], "cell2dofs"), K=None,
        up=mc.MixedDat(space, (2, 1), None, "up"), rhs=mc.MixedDat(space, (2, 1), None, "rhs"),
        f=mc.Dat(nodes, 2, f_values, "f"), exact_u=mc.Dat(nodes, 2, u_values, "exact_u"),
        exact_p=mc.Dat(nodes, 1, p_values, "exact_p"), bc=mc.Dat(nodes, 1, None, "bc"),
        wall=mc.Subset(nodes, boundary, "wall"), pin=mc.Subset(nodes, [0], "pin"),
        pinned=mc.Global(1, float(p_values[0]), "pinned"),
        kernels={"flag": mc.Kernel.from_source("def flag(bc):\n    bc[0] = 1.0\n"),
                 "pin": mc.Kernel.from_source("def pin(b, value):\n    b[0] = value[0]\n"),
                 "stokes": mc.Kernel.from_source(element_source(beta)),
                 "load": mc.Kernel.from_source(_load_source()),
                 "squared": mc.Kernel.from_source(_error_source())},
    )
    mc.partition(method, coords=d.coords, seed_set=None if method == "rib" else d.cells, seed=seed)
    mc.par_loop(problem.kernels["flag"], problem.wall, problem.bc(mc.WRITE))
    problem.K = mc.Mat(space, space, [(problem.both, problem.both)], "K", dim=(2, 1))
    assemble(problem)
    return problem


def assemble(p: Stokes) -> None:
    """Assemble the block matrix (Dirichlet velocity rows and the pinned pressure: unit
    diagonal) and the right-hand side."""
    d = p.mesh
    p.K.zero()
    mc.par_loop(p.kernels["stokes"], d.cells, p.K(mc.INC, (p.both, p.both)), d.coords(mc.READ, d.cell2node),
                p.bc(mc.READ, d.cell2node))
    p.K.zero_rows(p.wall, 1.0, component=0)
    p.K.zero_rows([0], 1.0, component=1)
    p.rhs.zero()
    mc.par_loop(p.kernels["load"], d.cells, p.rhs(mc.INC, p.both), p.f(mc.READ, d.cell2node),
                d.coords(mc.READ, d.cell2node), p.bc(mc.READ, d.cell2node))
    mc.par_loop(p.kernels["pin"], p.pin, p.rhs.split[1](mc.WRITE), p.pinned(mc.READ))


def solve(p: Stokes, *, options: dict | None = None, rtol: float = 1e-10):
    """Solve the block system from zero with PETSc (``options`` default :data:`SCHUR`)."""
    p.up.zero()
    return mc.solve(p.K, p.up, p.rhs, method="petsc", rtol=rtol, options=dict(SCHUR if options is None else options))


def errors(p: Stokes) -> tuple[float, float]:
    """The lumped-mass L2 errors of velocity and pressure."""
    d = p.mesh
    total = mc.Global(2, 0.0, "errors")
    u, pressure = p.up.split
    mc.par_loop(p.kernels["squared"], d.cells, total(mc.INC), u(mc.READ, d.cell2node), pressure(mc.READ, d.cell2node),
                p.exact_u(mc.READ, d.cell2node), p.exact_p(mc.READ, d.cell2node), d.coords(mc.READ, d.cell2node))
    velocity, pressure_error = total.value
    return math.sqrt(velocity), math.sqrt(pressure_error)
