"""meshchain's Krylov methods against PETSc's on the same assembled matrix (petsc4py, which
`make test` builds): iteration counts within 2 of PETSc's same method, and ``A.to_petsc()``
holds the same operator as ``A.mult``.
"""

from __future__ import annotations

import numpy as np
import pytest

import meshchain as mc
from meshchain.apps import poisson
from meshchain.meshes import structured_tets, structured_tris

PETSc = pytest.importorskip("petsc4py.PETSc", reason="petsc4py is not installed (make test builds it)")

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

# meshchain method -> PETSc KSP type and options
KSP = {"cg": ("cg", {}), "cg1": ("cg", {"ksp_cg_single_reduction": None}), "pipecg": ("pipecg", {}),
       "groppcg": ("groppcg", {}), "pipecr": ("pipecr", {})}


def petsc_solve(problem, method: str, pc: str | None, rtol: float):
    ksp_type, options = KSP[method]
    A = problem.A.to_petsc()
    b = problem.A.petsc_vec(problem.b)
    x = b.duplicate()
    x.set(0.0)
    database = PETSc.Options()
    for key, value in options.items():
        database[key] = value
    ksp = PETSc.KSP().create(comm=A.getComm())
    ksp.setOperators(A)
    ksp.setType(ksp_type)
    ksp.getPC().setType(pc or "none")
    ksp.setTolerances(rtol=rtol, atol=0.0, max_it=2000)
    ksp.setFromOptions()
    for key in options:
        database.delValue(key)
    ksp.solve(b, x)
    its, reason = ksp.getIterationNumber(), ksp.getConvergedReason()
    for obj in (ksp, x, b, A):
        obj.destroy()
    return its, reason


def setup(comm, cell):
    mc.reset_runtime(comm=comm)
    mesh = structured_tris(12, 12) if cell == "triangle" else structured_tets(4, 4, 4)
    return poisson.declare(mesh)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
@pytest.mark.parametrize("cell", ["triangle", "tetra"])
@pytest.mark.parametrize("pc", [None, "jacobi"])
def test_iteration_counts_match_petscs_same_method(comm, cell, pc):
    problem = setup(comm, cell)
    for method in KSP:
        theirs, reason = petsc_solve(problem, method, pc, 1e-8)
        assert reason > 0, (method, reason)
        info = poisson.solve(problem, method=method, pc=pc, rtol=1e-8)
        assert info.converged, (method, info.reason)
        assert abs(info.iterations - theirs) <= 2, (method, pc, info.iterations, theirs)
        assert info.true_residual <= 1e-6 * np.sqrt(problem.mesh.nodes.size), (method, info.true_residual)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_to_petsc_applies_the_same_operator_as_mult(comm):
    problem = setup(comm, "triangle")
    y = mc.Dat(problem.mesh.nodes, 1, None, "y")
    problem.A.mult(problem.exact, y)
    A = problem.A.to_petsc()
    x = problem.A.petsc_vec(problem.exact)
    petsc_y = x.duplicate()
    A.mult(x, petsc_y)
    z = mc.Dat(problem.mesh.nodes, 1, None, "z")
    problem.A.from_petsc_vec(petsc_y, z)
    np.testing.assert_allclose(z.data_ro, y.data_ro, rtol=1e-13, atol=1e-13)
    assert A.getSize() == (problem.mesh.nodes.size, problem.mesh.nodes.size)
