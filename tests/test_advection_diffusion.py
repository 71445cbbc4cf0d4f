"""The advection-diffusion app: the matrix and right-hand side assembled on 1-3 ranks equal
the serial SciPy reference; the matrix is nonsymmetric with a velocity and symmetric
without; upwinding gives an M-matrix whose direct solution keeps the discrete maximum
principle at a cell Péclet number of 100, where Galerkin advection oscillates."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

import meshchain as mc
from meshchain.apps import advection_diffusion as ad
from meshchain.meshes import jittered_delaunay, structured_quads, structured_tets, structured_tris

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

CASES = {  # the mesh, the problem's options; the reference backend (no compilation) keeps the file fast
    "delaunay-Pe100": (lambda: jittered_delaunay(150, seed=1), {"peclet": 100.0}),
    "tets-Pe1-source": (lambda: structured_tets(3, 3, 3), {"peclet": 1.0, "source": 1.0}),
}


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("case", sorted(CASES))
def test_assembly_equals_the_serial_scipy_reference_on_any_number_of_ranks(comm, case):
    mc.reset_runtime(comm=comm)
    make, options = CASES[case]
    mc.configure(backend="reference")
    problem = ad.declare(make(), **options)
    gathered, b = problem.A.to_scipy(), problem.b.gather()
    expected = ad.reference(problem)
    if comm.rank == 0:
        A_ref, b_ref = expected
        assert abs(gathered - A_ref).max() <= 1e-13 * abs(A_ref).max()
        np.testing.assert_allclose(b.ravel(), b_ref, rtol=1e-12, atol=1e-14)
        assert abs(b_ref).max() > 0  # the Dirichlet data (and source) reach the right-hand side
    else:
        assert expected is None and gathered is None


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_the_matrix_is_nonsymmetric_with_a_velocity_and_symmetric_without(comm):
    mc.reset_runtime(comm=comm)  # the default backend, numba (compiled once for the test session)
    mesh = jittered_delaunay(64, seed=4)
    problem = ad.declare(mesh, peclet=1.0)
    moving, b, expected = problem.A.to_scipy(), problem.b.gather(), ad.reference(problem)
    mc.reset_runtime(comm=comm)  # a new problem: declared and partitioned afresh
    still = ad.declare(mesh, velocity=(0.0, 0.0), diffusion=0.1).A.to_scipy()
    if comm.rank == 0:
        assert abs(moving - expected[0]).max() <= 1e-13 * abs(moving).max()
        np.testing.assert_allclose(b.ravel(), expected[1], rtol=1e-12, atol=1e-14)
        assert abs(moving - moving.T).max() > 0.1 * abs(moving).max()
        assert abs(still - still.T).max() <= 1e-15 * abs(still).max()


def reference_system(mesh, peclet: float, upwind: bool):
    """The serial reference at this cell Péclet number, default velocity and data."""
    flags = np.zeros(mesh.nnode)
    flags[np.unique(mesh.boundary_facets)] = 1.0
    velocity = ad.DEFAULT_VELOCITY[mesh.coords.shape[1]]
    eps = ad.diffusion_for(peclet, velocity, ad.mesh_size(mesh))
    A, b = ad.assemble_scipy(mesh, eps, velocity, ad.plume(mesh.coords), flags, upwind=upwind)
    return A, b, flags == 0


@pytest.mark.parametrize("mesh", [jittered_delaunay(900, seed=2), structured_tris(24, 24)], ids=["delaunay", "tris"])
def test_upwinding_gives_an_m_matrix_and_no_oscillations_at_high_peclet(mesh):
    A, b, free = reference_system(mesh, 100.0, upwind=True)
    off = A - sp.diags(A.diagonal())
    assert off.max() <= 1e-15 * abs(A).max()  # a Z-matrix
    u = spla.spsolve(A.tocsc(), b)
    g = ad.plume(mesh.coords)
    assert u.min() >= g.min() - 1e-12 and u.max() <= g.max() + 1e-12  # discrete maximum principle
    assert 0.2 < np.mean(u[free]) < 0.8  # the plume is there, not washed out
    A_central, b_central, _ = reference_system(mesh, 100.0, upwind=False)
    galerkin = spla.spsolve(A_central.tocsc(), b_central)
    assert galerkin.min() < -0.1 or galerkin.max() > 1.1  # central advection oscillates: the check bites


def test_interior_rows_of_the_full_operator_sum_to_zero():
    mesh = jittered_delaunay(100, seed=5)
    m, _ = ad.element_matrices(mesh.coords, mesh.cells, 0.01, (1.0, 0.5))
    sums = np.bincount(mesh.cells.ravel(), weights=m.sum(axis=2).ravel(), minlength=mesh.nnode)
    interior = np.setdiff1d(np.arange(mesh.nnode), mesh.boundary_facets)
    assert abs(sums[interior]).max() < 1e-14


def test_peclet_sets_the_diffusion_and_bad_parameters_are_refused():
    mesh = structured_tris(10, 10)
    assert ad.mesh_size(mesh) == pytest.approx(0.1)
    for peclet in (1.0, 100.0):
        eps = ad.diffusion_for(peclet, (1.0, 0.5), 0.1)
        assert np.hypot(1.0, 0.5) * 0.1 / (2 * eps) == pytest.approx(peclet)
    with pytest.raises(mc.DeclarationError, match="not both"):
        ad.declare(mesh, diffusion=0.1, peclet=1.0)
    with pytest.raises(mc.DeclarationError, match="velocity"):
        ad.declare(mesh, velocity=(1.0, 0.0, 0.0))
    with pytest.raises(mc.DeclarationError, match="nonzero velocity"):
        ad.declare(mesh, velocity=(0.0, 0.0), peclet=1.0)
    with pytest.raises(mc.DeclarationError, match="triangle or tetrahedron"):
        ad.declare(structured_quads(2, 2))
