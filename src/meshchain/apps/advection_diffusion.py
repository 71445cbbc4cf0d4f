"""Steady advection-diffusion, ``-eps Δu + v·∇u = f``, assembled into a nonsymmetric
:class:`meshchain.Mat` for the nonsymmetric Krylov methods of :func:`meshchain.solve`.

Discretisation
--------------
Vertex-centred, on triangles or tetrahedra, with a constant velocity ``v``:

* diffusion: the P1 stiffness matrix ``eps |K| grad(phi_i) . grad(phi_j)`` (the same as
  :mod:`meshchain.apps.poisson`); on a Delaunay mesh its off-diagonals are ``<= 0``;
* advection: first-order upwind finite volumes on the median dual mesh. In a cell ``K``
  the piece of the dual face between nodes ``i`` and ``j`` carries the flux
  ``beta_ij = v . n_ij = w_j - w_i`` with ``w_i = |K| v . grad(phi_i) / (d + 1)`` (the
  median dual face normal is ``n_ij = |K| (grad(phi_j) - grad(phi_i)) / (d + 1)``);
  the upwind value is taken on each piece: ``a_ij += min(beta_ij, 0)`` and
  ``a_ii += max(beta_ij, 0)``. ``upwind=False`` gives the P1 Galerkin (central)
  advection ``a_ij += w_j`` instead, which oscillates once the cell Péclet number
  exceeds 1.

Both are assembled by one par_loop over the cells through the pair
``(cell2node, cell2node)``. The upwind advection is not symmetric (``min(beta_ij, 0)``
sits in row ``i`` and ``min(-beta_ij, 0)`` in row ``j``), so the matrix is nonsymmetric for
``v != 0`` and symmetric for ``v = 0``. Its off-diagonals are ``<= 0`` and every interior
row sums to zero (a closed control volume, ``div v = 0``): a diagonally dominant
M-matrix, whose solution obeys the discrete maximum principle (no oscillations, whatever
the Péclet number).

Dirichlet conditions ``u = g`` hold on the whole boundary. As in
:mod:`meshchain.apps.poisson`, Dirichlet nodes are decoupled in the element kernel (their
rows and columns get no contribution; the columns' values ``a_ij g_j`` move to the
right-hand side) and their rows get a unit diagonal by :meth:`~meshchain.Mat.zero_rows`,
with ``b_i = g_i``. The default data is ``f = 0`` with ``g = 1`` on the inflow side
``x = 0`` and ``g = 0`` elsewhere (:func:`plume`): a plume carried along ``v``, with an
internal layer and outflow boundary layers, whose exact values lie in ``[0, 1]``.

The cell Péclet number is ``Pe = |v| h / (2 eps)``, with ``h`` the mesh size of
:func:`mesh_size`; ``declare(mesh, peclet=Pe)`` chooses ``eps`` to give it (``Pe ~ 1``:
diffusion and advection balance; ``Pe ~ 100``: advection dominates).

Examples
--------
>>> import numpy as np, scipy.sparse.linalg as spla
>>> from meshchain.apps import advection_diffusion as ad
>>> from meshchain.meshes import structured_tris
>>> problem = ad.declare(structured_tris(8, 8), peclet=100.0)
>>> round(problem.peclet, 6), problem.diffusion < 1e-3
(100.0, True)
>>> A, b = ad.reference(problem)
>>> bool(abs(problem.A.to_scipy() - A).max() < 1e-12), bool(abs(A - A.T).max() > 0.05)
(True, True)
>>> u = spla.spsolve(A.tocsc(), b)
>>> bool(u.min() >= -1e-12 and u.max() <= 1 + 1e-12)
True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
import scipy.sparse as sp

import meshchain as mc
from .poisson import SIMPLEX_GEOMETRY

__all__ = ["AdvectionDiffusion", "declare", "assemble", "solve", "reference", "assemble_scipy",
           "element_matrices", "element_source", "mesh_size", "diffusion_for", "plume",
           "DEFAULT_DIFFUSION", "DEFAULT_VELOCITY"]

DEFAULT_DIFFUSION = 0.01
"""``eps`` when neither ``diffusion`` nor ``peclet`` is given."""

DEFAULT_VELOCITY = {2: (1.0, 0.5), 3: (1.0, 0.5, 0.25)}
"""The velocity per geometric dimension when none is given."""


# --- the element matrix, as kernel source and as NumPy ----------------------------------------------

def element_source(gdim: int, upwind: bool = True) -> str:
    """Kernel lines (indented, after the geometry of :mod:`meshchain.apps.poisson`) that set
    the locals ``m{i}{j}``: the element matrix, diffusion plus advection, read from the
    global ``k = (eps, f, v_0, ..., v_{d-1})``.

    Examples
    --------
    >>> src = element_source(2)
    >>> "w2 = vol / 3.0 * (k[2] * g20 + k[3] * g21)" in src, "abs(" in src
    (True, True)
    >>> "abs(" in element_source(3, upwind=False)
    False
    """
    n = gdim + 1
    lines = []
    for i in range(n):
        dot = " + ".join(f"k[{2 + d}] * g{i}{d}" for d in range(gdim))
        lines.append(f"    w{i} = vol / {n}.0 * ({dot})")
    for i in range(n):
        for j in range(n):
            stiff = " + ".join(f"g{i}{d} * g{j}{d}" for d in range(gdim))
            lines.append(f"    m{i}{j} = k[0] * vol * ({stiff}) + {_advection(i, j, n, upwind)}")
    return "\n".join(lines) + "\n"


def _advection(i: int, j: int, n: int, upwind: bool) -> str:
    """The advection entry ``(i, j)`` of the element matrix, as an expression."""
    if not upwind:
        return f"w{j}"
    if i != j:  # min(beta_ij, 0), beta_ij = w_j - w_i
        return f"0.5 * ((w{j} - w{i}) - abs(w{j} - w{i}))"
    return " + ".join(f"0.5 * ((w{m} - w{i}) + abs(w{m} - w{i}))" for m in range(n) if m != i)


def _matrix_source(gdim: int, upwind: bool) -> str:
    """``advdiff(a, x, bc, k)``: the element matrix into the free-free entries."""
    lines = ["def advdiff(a, x, bc, k):", SIMPLEX_GEOMETRY[gdim].rstrip("\n"), element_source(gdim, upwind).rstrip("\n")]
    for i in range(gdim + 1):
        for j in range(gdim + 1):
            lines += [f"    if bc[{i}, 0] == 0 and bc[{j}, 0] == 0:", f"        a[{i}, {j}] += m{i}{j}"]
    return "\n".join(lines) + "\n"


def _rhs_source(gdim: int, upwind: bool) -> str:
    """``advdiff_rhs(b, x, bc, g, k)``: lumped ``f`` minus the Dirichlet columns, free rows."""
    n = gdim + 1
    lines = ["def advdiff_rhs(b, x, bc, g, k):", SIMPLEX_GEOMETRY[gdim].rstrip("\n"),
             element_source(gdim, upwind).rstrip("\n"), f"    share = k[1] * vol / {n}.0"]
    for i in range(n):
        lift = " + ".join(f"m{i}{j} * (bc[{j}, 0] * g[{j}, 0])" for j in range(n))
        lines += [f"    if bc[{i}, 0] == 0:", f"        b[{i}, 0] += share - ({lift})"]
    return "\n".join(lines) + "\n"


_DIRICHLET_SOURCE = """def dirichlet_rhs(b, g, bc):
    b[0] = bc[0] * g[0]
"""


def element_matrices(coords: np.ndarray, cells: np.ndarray, diffusion: float, velocity,
                     upwind: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Every cell's element matrix (shape ``(ncell, d + 1, d + 1)``) and measure, with NumPy.

    Examples
    --------
    >>> xy, tri = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), np.array([[0, 1, 2]])
    >>> m, vol = element_matrices(xy, tri, 0.0, (1.0, 0.0))
    >>> print((m[0] * 6).round(12).tolist(), vol.tolist())
    [[3.0, 0.0, 0.0], [-2.0, 0.0, -1.0], [-1.0, 0.0, 1.0]] [0.5]
    >>> m[0].sum(axis=1).tolist()  # -|K| v.grad(phi_i): zero once summed around an interior node
    [0.5, -0.5, 0.0]
    """
    x = np.asarray(coords, dtype=np.float64)[np.asarray(cells)]
    gdim = x.shape[2]
    edges = x[:, 1:, :] - x[:, :1, :]
    vol = np.linalg.det(edges) / math.factorial(gdim)
    grads = np.empty_like(x)
    grads[:, 1:, :] = np.transpose(np.linalg.inv(edges), (0, 2, 1))
    grads[:, 0, :] = -grads[:, 1:, :].sum(axis=1)
    m = diffusion * vol[:, None, None] * np.einsum("eid,ejd->eij", grads, grads)
    w = vol[:, None] / (gdim + 1) * (grads @ np.asarray(velocity, dtype=np.float64))
    if not upwind:
        return m + w[:, None, :], vol
    beta = w[:, None, :] - w[:, :, None]  # beta[e, i, j] = w_j - w_i
    m += np.minimum(beta, 0.0)
    idx = np.arange(gdim + 1)
    m[:, idx, idx] += np.maximum(beta, 0.0).sum(axis=2)
    return m, vol


def assemble_scipy(mesh, diffusion: float, velocity, boundary_values: np.ndarray, flags: np.ndarray, *,
                   source: float = 0.0, upwind: bool = True) -> tuple[sp.csr_matrix, np.ndarray]:
    """The matrix and right-hand side of :func:`assemble`, serially with NumPy and SciPy:
    the reference the distributed assembly is compared with (``flags`` 1 on Dirichlet nodes,
    ``boundary_values`` their values ``g``)."""
    m, vol = element_matrices(mesh.coords, mesh.cells, diffusion, velocity, upwind)
    cells, n = mesh.cells, mesh.nnode
    free = flags[cells] == 0
    kept = np.where(free[:, :, None] & free[:, None, :], m, 0.0)
    arity = cells.shape[1]
    rows = np.repeat(cells[:, :, None], arity, axis=2).ravel()
    cols = np.repeat(cells[:, None, :], arity, axis=1).ravel()
    dirichlet = flags == 1
    A = sp.csr_matrix((kept.ravel(), (rows, cols)), shape=(n, n)) + sp.diags(dirichlet.astype(np.float64))
    gd = np.where(dirichlet, boundary_values, 0.0)
    lift = source * vol[:, None] / arity - np.einsum("eij,ej->ei", m, gd[cells])
    b = np.bincount(cells.ravel(), weights=np.where(free, lift, 0.0).ravel(), minlength=n)
    b[dirichlet] = boundary_values[dirichlet]
    return A.tocsr(), b


# --- parameters -----------------------------------------------------------------------------------

def mesh_size(mesh) -> float:
    """``h = (d! mean|K|)^(1/d)``: the grid spacing of ``structured_tris(n, n)``,
    ``structured_tets(n, n, n)`` and ``jittered_delaunay`` (``1 / n``, ``1 / (m - 1)``).

    >>> from meshchain.meshes import structured_tris
    >>> round(mesh_size(structured_tris(16, 16)), 12)
    0.0625
    """
    gdim = mesh.coords.shape[1]
    mean = float(np.mean(np.abs(mesh.signed_measures())))
    return (math.factorial(gdim) * mean) ** (1.0 / gdim)


def diffusion_for(peclet: float, velocity, h: float) -> float:
    """The ``eps`` giving the cell Péclet number ``|v| h / (2 eps) = peclet``.

    >>> diffusion_for(1.0, (3.0, 4.0), 0.1)
    0.25
    """
    if not (isinstance(peclet, (int, float)) and math.isfinite(peclet) and peclet > 0):
        raise mc.DeclarationError(f"peclet must be a positive number, got {peclet!r}")
    return float(np.linalg.norm(velocity)) * h / (2.0 * peclet)


def plume(coords: np.ndarray) -> np.ndarray:
    """The default Dirichlet data: 1 on the inflow side ``x = 0``, 0 elsewhere.

    >>> plume(np.array([[0.0, 0.3], [1.0, 0.3], [0.5, 0.0]])).tolist()
    [1.0, 0.0, 0.0]
    """
    return np.where(np.isclose(coords[:, 0], 0.0), 1.0, 0.0)


def _parameters(mesh, velocity, diffusion, peclet) -> tuple[np.ndarray, float, float]:
    """The velocity, ``eps`` and ``h`` that ``declare`` was asked for (checked)."""
    gdim = mesh.coords.shape[1]
    v = np.asarray(DEFAULT_VELOCITY[gdim] if velocity is None else velocity, dtype=np.float64)
    if v.shape != (gdim,) or not np.all(np.isfinite(v)):
        raise mc.DeclarationError(f"velocity must be {gdim} finite numbers on this mesh, got {velocity!r}")
    if diffusion is not None and peclet is not None:
        raise mc.DeclarationError("give diffusion or peclet, not both")
    h = mesh_size(mesh)
    if peclet is not None:
        if not np.any(v):
            raise mc.DeclarationError("peclet needs a nonzero velocity; give diffusion instead")
        return v, diffusion_for(peclet, v, h), h
    eps = DEFAULT_DIFFUSION if diffusion is None else diffusion
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise mc.DeclarationError(f"diffusion must be a positive number, got {diffusion!r}")
    return v, float(eps), h


# --- the problem ----------------------------------------------------------------------------------

@dataclasses.dataclass
class AdvectionDiffusion:
    """The declared problem: mesh sets and maps, the matrix, the vectors and the parameters."""

    mesh: object  # the declared mesh (sets, maps, coords)
    geometry: object  # the UnstructuredMesh it was declared from (for the reference)
    gdim: int
    A: mc.Mat
    x: mc.Dat  # the solution
    b: mc.Dat
    g: mc.Dat  # Dirichlet values (read on boundary nodes only)
    bc: mc.Dat  # 1 on Dirichlet nodes
    k: mc.Global  # (eps, f, v_0, ..., v_{d-1}), read by the kernels
    boundary: np.ndarray  # global ids of the Dirichlet nodes
    boundary_values: np.ndarray  # g at every node (global numbering)
    diffusion: float
    velocity: np.ndarray
    source: float
    h: float
    upwind: bool
    kernels: dict

    @property
    def peclet(self) -> float:
        """The cell Péclet number ``|v| h / (2 eps)``."""
        return float(np.linalg.norm(self.velocity)) * self.h / (2.0 * self.diffusion)


def declare(mesh, *, velocity=None, diffusion: float | None = None, peclet: float | None = None,
            source: float = 0.0, dirichlet: Callable[[np.ndarray], np.ndarray] = plume, upwind: bool = True,
            method: str = "kway", seed: int = 0) -> AdvectionDiffusion:
    """Declare the problem on ``mesh``, partition it over the ranks and assemble it.

    Parameters
    ----------
    mesh : UnstructuredMesh
        Triangles or tetrahedra; every rank passes the same whole mesh.
    velocity : sequence of float, optional
        The constant velocity ``v`` (default :data:`DEFAULT_VELOCITY`).
    diffusion : float, optional
        ``eps`` (default :data:`DEFAULT_DIFFUSION`); not with ``peclet``.
    peclet : float, optional
        The cell Péclet number ``|v| h / (2 eps)`` to give, choosing ``eps``.
    source : float
        The constant ``f``.
    dirichlet : callable
        ``g(coords) -> values`` on the nodes (read on the boundary), default :func:`plume`.
    upwind : bool
        Upwind advection (an M-matrix; default) or P1 Galerkin (central) advection.
    method, seed
        The partitioner (as :func:`meshchain.partition`) and its seed.

    Returns
    -------
    AdvectionDiffusion
        With ``A`` and ``b`` assembled and ``x`` zero.
    """
    if mesh.cell_type not in ("triangle", "tetra"):
        raise mc.DeclarationError(f"the advection-diffusion app needs a triangle or tetrahedron mesh, "
                                  f"not {mesh.cell_type!r}")
    v, eps, h = _parameters(mesh, velocity, diffusion, peclet)
    gdim = mesh.coords.shape[1]
    boundary = np.unique(mesh.boundary_facets).astype(np.int64)
    flags = np.zeros(mesh.nnode)
    flags[boundary] = 1.0
    g = np.asarray(dirichlet(mesh.coords), dtype=np.float64).reshape(mesh.nnode)
    d = mesh.declare()
    p = AdvectionDiffusion(
        mesh=d, geometry=mesh, gdim=gdim, A=None,
        x=mc.Dat(d.nodes, 1, None, "x"), b=mc.Dat(d.nodes, 1, None, "b"), g=mc.Dat(d.nodes, 1, g, "g"),
        bc=mc.Dat(d.nodes, 1, flags, "bc"), k=mc.Global(2 + gdim, [eps, float(source), *v], "k"),
        boundary=boundary, boundary_values=g, diffusion=eps, velocity=v, source=float(source), h=h,
        upwind=bool(upwind), kernels=_kernels(gdim, bool(upwind)),
    )
    mc.partition(method, coords=d.coords, seed_set=None if method == "rib" else d.cells, seed=seed)
    p.A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A")
    assemble(p)
    return p


def _kernels(gdim: int, upwind: bool) -> dict:
    return {"matrix": mc.Kernel.from_source(_matrix_source(gdim, upwind)),
            "rhs": mc.Kernel.from_source(_rhs_source(gdim, upwind)),
            "dirichlet": mc.Kernel.from_source(_DIRICHLET_SOURCE)}


def assemble(p: AdvectionDiffusion) -> None:
    """Assemble the matrix (Dirichlet rows: unit diagonal) and the right-hand side."""
    d = p.mesh
    p.A.zero()
    mc.par_loop(p.kernels["matrix"], d.cells, p.A(mc.INC, (d.cell2node, d.cell2node)),
                d.coords(mc.READ, d.cell2node), p.bc(mc.READ, d.cell2node), p.k(mc.READ))
    p.A.zero_rows(p.boundary, diagonal=1.0)
    mc.par_loop(p.kernels["dirichlet"], d.nodes, p.b(mc.WRITE), p.g(mc.READ), p.bc(mc.READ))
    mc.par_loop(p.kernels["rhs"], d.cells, p.b(mc.INC, d.cell2node), d.coords(mc.READ, d.cell2node),
                p.bc(mc.READ, d.cell2node), p.g(mc.READ, d.cell2node), p.k(mc.READ))


def solve(p: AdvectionDiffusion, *, method: str = "gmres", pc: str | None = "jacobi", rtol: float = 1e-10,
          **options):
    """Solve ``A x = b`` from ``x = 0`` with :func:`meshchain.solve`; returns its info."""
    p.x.data[...] = 0.0
    return mc.solve(p.A, p.x, p.b, method=method, pc=pc, rtol=rtol, **options)


def reference(p: AdvectionDiffusion) -> tuple[sp.csr_matrix, np.ndarray] | None:
    """The matrix and right-hand side assembled serially by :func:`assemble_scipy`, in global
    numbering, on rank 0 (None on the other ranks): compare with ``p.A.to_scipy()`` and
    ``p.b.gather()``, or solve with ``scipy.sparse.linalg.spsolve``."""
    if mc.get_runtime().rank != 0:
        return None
    flags = np.zeros(p.geometry.nnode)
    flags[p.boundary] = 1.0
    return assemble_scipy(p.geometry, p.diffusion, p.velocity, p.boundary_values, flags,
                          source=p.source, upwind=p.upwind)
