"""P1 finite elements for the Poisson problem, assembled into a :class:`meshchain.Mat` and
solved with :func:`meshchain.solve`.

``-Δu = f`` on the unit square (triangles) or the unit cube (tetrahedra, GeoFEM's "cube"),
``u = 0`` on the boundary, with the manufactured solution ``u = Π exp(a_d x_d) sin(π x_d)``
(not a sine mode: those are eigenvectors of the discrete Laplacian on structured meshes,
which every Krylov method solves in one step) and ``f = -Δu``. The element stiffness matrices are assembled by one par_loop into a matrix
whose sparsity comes from the cell-to-node map; the load vector is lumped (``f`` at the nodes
times a share of the cell's measure), which keeps second order. The Dirichlet nodes form a
:class:`~meshchain.Subset` of the nodes (``wall``): a loop over it flags them, the element
kernel decouples them (their rows and columns get no contribution), and
:meth:`~meshchain.Mat.zero_rows` of the subset gives them a unit diagonal, so the matrix stays
symmetric positive definite and every CG variant applies.

The error is the lumped-mass L2 norm of ``u_h - u`` at the nodes; it falls by about 4 each
time the mesh is refined by 2.

Examples
--------
>>> from meshchain.apps import poisson
>>> from meshchain.meshes import structured_tris
>>> problem = poisson.declare(structured_tris(8, 8))
>>> info = poisson.solve(problem, method="cg", pc="jacobi", rtol=1e-10)
>>> info.converged, poisson.error(problem) < 2e-2
(True, True)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import meshchain as mc

__all__ = ["Poisson", "declare", "assemble", "solve", "error", "stiffness_source", "manufactured", "SIMPLEX_GEOMETRY"]

# per geometric dimension: how to compute the barycentric gradients g{i}{d} and the measure
# ``vol`` of a simplex with vertices x[0..d] (``x`` the coordinates through the cell-to-node map)
SIMPLEX_GEOMETRY = {
    2: """    ax = x[1, 0] - x[0, 0]
    ay = x[1, 1] - x[0, 1]
    bx = x[2, 0] - x[0, 0]
    by = x[2, 1] - x[0, 1]
    det = ax * by - ay * bx
    vol = 0.5 * det
    g10 = by / det
    g11 = -bx / det
    g20 = -ay / det
    g21 = ax / det
    g00 = -g10 - g20
    g01 = -g11 - g21
""",
    3: """    ax = x[1, 0] - x[0, 0]
    ay = x[1, 1] - x[0, 1]
    az = x[1, 2] - x[0, 2]
    bx = x[2, 0] - x[0, 0]
    by = x[2, 1] - x[0, 1]
    bz = x[2, 2] - x[0, 2]
    cx = x[3, 0] - x[0, 0]
    cy = x[3, 1] - x[0, 1]
    cz = x[3, 2] - x[0, 2]
    det = ax * (by * cz - bz * cy) - ay * (bx * cz - bz * cx) + az * (bx * cy - by * cx)
    vol = det / 6.0
    g10 = (by * cz - bz * cy) / det
    g11 = (bz * cx - bx * cz) / det
    g12 = (bx * cy - by * cx) / det
    g20 = (cy * az - cz * ay) / det
    g21 = (cz * ax - cx * az) / det
    g22 = (cx * ay - cy * ax) / det
    g30 = (ay * bz - az * by) / det
    g31 = (az * bx - ax * bz) / det
    g32 = (ax * by - ay * bx) / det
    g00 = -g10 - g20 - g30
    g01 = -g11 - g21 - g31
    g02 = -g12 - g22 - g32
""",
}


def stiffness_source(gdim: int) -> str:
    """The element kernel ``stiffness(a, x, bc)`` for P1 simplices in ``gdim`` dimensions:
    ``a[i, j] += vol * grad(phi_i) . grad(phi_j)`` unless node i or j is a Dirichlet node.

    >>> "a[2, 1] +=" in stiffness_source(2), "a[3, 3] +=" in stiffness_source(3)
    (True, True)
    """
    lines = ["def stiffness(a, x, bc):", SIMPLEX_GEOMETRY[gdim].rstrip("\n")]
    for i in range(gdim + 1):
        for j in range(gdim + 1):
            dot = " + ".join(f"g{i}{d} * g{j}{d}" for d in range(gdim))
            lines += [f"    if bc[{i}, 0] == 0 and bc[{j}, 0] == 0:",
                      f"        a[{i}, {j}] += vol * ({dot})"]
    return "\n".join(lines) + "\n"


def _load_source(gdim: int) -> str:
    """``load(b, f, x, bc)``: the lumped load ``f_i vol / (d + 1)`` into every free node."""
    lines = ["def load(b, f, x, bc):", SIMPLEX_GEOMETRY[gdim].rstrip("\n"), f"    share = vol / {gdim + 1}.0"]
    for i in range(gdim + 1):
        lines += [f"    if bc[{i}, 0] == 0:", f"        b[{i}, 0] += f[{i}, 0] * share"]
    return "\n".join(lines) + "\n"


def _error_source(gdim: int) -> str:
    """``squared(total, u, exact, x)``: the lumped-mass squared L2 error of the cell."""
    lines = ["def squared(total, u, exact, x):", SIMPLEX_GEOMETRY[gdim].rstrip("\n"), "    s = 0.0"]
    for i in range(gdim + 1):
        lines.append(f"    s += (u[{i}, 0] - exact[{i}, 0]) ** 2")
    lines.append(f"    total[0] += s * vol / {gdim + 1}.0")
    return "\n".join(lines) + "\n"


RATES = (1.0, 0.5, 0.25)
"""The exponential rates ``a_d`` of the manufactured solution, per coordinate."""


def manufactured(coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``u = Π_d exp(a_d x_d) sin(π x_d)`` (``a_d`` from :data:`RATES`) and ``f = -Δu`` at
    the points ``coords``.

    >>> u, f = manufactured(np.array([[0.5, 0.5]]))
    >>> round(float(u[0]), 6), round(float(f[0]), 4)
    (2.117, 39.1417)
    """
    pi = math.pi
    factors = [np.exp(a * t) * np.sin(pi * t) for a, t in zip(RATES, coords.T)]
    seconds = [np.exp(a * t) * ((a * a - pi * pi) * np.sin(pi * t) + 2 * a * pi * np.cos(pi * t))
               for a, t in zip(RATES, coords.T)]
    u = np.prod(factors, axis=0)
    f = np.zeros(len(coords))
    for d, second in enumerate(seconds):
        f -= second * np.prod([g for e, g in enumerate(factors) if e != d], axis=0)
    return u, f


@dataclasses.dataclass
class Poisson:
    """The declared problem: mesh sets and maps, the matrix and the vectors."""

    mesh: object
    gdim: int
    A: mc.Mat
    u: mc.Dat
    b: mc.Dat
    f: mc.Dat
    exact: mc.Dat
    bc: mc.Dat
    wall: mc.Subset  # the Dirichlet nodes
    kernels: dict


def declare(mesh, *, method: str = "kway", seed: int = 0) -> Poisson:
    """Declare the problem on ``mesh`` (triangles or tetrahedra), partition it over the
    ranks (``method``), and assemble the matrix and the load vector.

    Every rank passes the same whole mesh (as with the other apps)."""
    if mesh.cell_type not in ("triangle", "tetra"):
        raise mc.DeclarationError(f"the Poisson app needs a triangle or tetrahedron mesh, not {mesh.cell_type!r}")
    gdim = mesh.coords.shape[1]
    exact_values, load_values = manufactured(mesh.coords)
    boundary = np.unique(mesh.boundary_facets).astype(np.int64)
    d = mesh.declare()
    nodes = d.nodes
    problem = Poisson(
        mesh=d, gdim=gdim, A=None,
        u=mc.Dat(nodes, 1, None, "u"), b=mc.Dat(nodes, 1, None, "b"),
        f=mc.Dat(nodes, 1, load_values, "f"),
        exact=mc.Dat(nodes, 1, exact_values, "exact"), bc=mc.Dat(nodes, 1, None, "bc"),
        wall=mc.Subset(nodes, boundary, "wall"),
        kernels={"flag": mc.Kernel.from_source("def flag(bc):\n    bc[0] = 1.0\n"),
                 "stiffness": mc.Kernel.from_source(stiffness_source(gdim)),
                 "load": mc.Kernel.from_source(_load_source(gdim)),
                 "squared": mc.Kernel.from_source(_error_source(gdim))},
    )
    mc.partition(method, coords=d.coords, seed_set=None if method == "rib" else d.cells, seed=seed)
    mc.par_loop(problem.kernels["flag"], problem.wall, problem.bc(mc.WRITE))  # 1 on the Dirichlet nodes
    problem.A = mc.Mat(nodes, nodes, [(d.cell2node, d.cell2node)], "A")
    assemble(problem)
    return problem


def assemble(p: Poisson) -> None:
    """Assemble the stiffness matrix (Dirichlet rows: unit diagonal) and the load vector."""
    d = p.mesh
    p.A.zero()
    mc.par_loop(p.kernels["stiffness"], d.cells, p.A(mc.INC, (d.cell2node, d.cell2node)),
                d.coords(mc.READ, d.cell2node), p.bc(mc.READ, d.cell2node))
    p.A.zero_rows(p.wall, diagonal=1.0)
    mc.par_loop(p.kernels["load"], d.cells, p.b(mc.INC, d.cell2node), p.f(mc.READ, d.cell2node),
                d.coords(mc.READ, d.cell2node), p.bc(mc.READ, d.cell2node))


def solve(p: Poisson, *, method: str = "cg", pc: str | None = "jacobi", rtol: float = 1e-10, **options):
    """Solve ``A u = b`` from ``u = 0`` with :func:`meshchain.solve`; returns its info."""
    p.u.data[...] = 0.0
    return mc.solve(p.A, p.u, p.b, method=method, pc=pc, rtol=rtol, **options)


def error(p: Poisson) -> float:
    """The lumped-mass L2 norm of ``u_h - u`` over the nodes (the same on every rank)."""
    total = mc.Global(1, 0.0, "squared error")
    d = p.mesh
    mc.par_loop(p.kernels["squared"], d.cells, total(mc.INC), p.u(mc.READ, d.cell2node),
                p.exact(mc.READ, d.cell2node), d.coords(mc.READ, d.cell2node))
    return math.sqrt(float(total.value[0]))
