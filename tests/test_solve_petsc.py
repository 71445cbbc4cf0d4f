"""``mc.solve(..., method="petsc")`` hands the problem to PETSc's KSP/PC: the same
iterations and solution as PETSc driven by hand (1-3 ranks), SciPy's direct solution,
matrix-free operators through a shell matrix, user preconditioners through a shell PC, and
bad options refused with a SolverError on every rank (petsc4py, which `make test` builds).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import scipy.sparse.linalg as spla

import meshchain as mc
from meshchain.apps import poisson
from meshchain.meshes import jittered_delaunay, structured_tris
from test_solvers import Problem, matrix_free

PETSc = pytest.importorskip("petsc4py.PETSc", reason="petsc4py is not installed (make test builds it)")

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

RTOL = 1e-10


def setup(comm):
    mc.reset_runtime(comm=comm)
    return poisson.declare(structured_tris(12, 12))


def by_hand(problem, ksp_type: str, pc_type: str):
    """PETSc driven by hand from zero: its iterations and solution (as a dat's owned values)."""
    A = problem.A.to_petsc()
    b = problem.A.petsc_vec(problem.b)
    x = b.duplicate()
    x.set(0.0)
    ksp = PETSc.KSP().create(comm=A.getComm())
    ksp.setOperators(A)
    ksp.setType(ksp_type)
    ksp.getPC().setType(pc_type)
    ksp.setTolerances(rtol=RTOL, atol=0.0, max_it=10000)
    ksp.solve(b, x)
    result = mc.Dat(problem.mesh.nodes, 1, None, "by hand")
    problem.A.from_petsc_vec(x, result)
    iterations = ksp.getIterationNumber()
    for obj in (ksp, x, b, A):
        obj.destroy()
    return iterations, result.data_ro.copy()


def no_options_left() -> bool:
    return not any(name.startswith("meshchain_solve") for name in PETSc.Options().getAll())


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_petsc_method_equals_petsc_driven_by_hand_and_the_direct_solution(comm):
    problem = setup(comm)
    for ksp_type in ("cg", "gmres"):
        for pc_type in ("jacobi", "bjacobi", "gamg"):
            expected_iterations, expected = by_hand(problem, ksp_type, pc_type)
            calls = []
            info = poisson.solve(problem, method="petsc", rtol=RTOL, options={"ksp_type": ksp_type, "pc_type": pc_type},
                                 monitor=lambda i, norm: calls.append((i, norm)))
            key = (ksp_type, pc_type)
            assert info.converged and info.reason == "converged", (key, info.reason)
            assert (info.method, info.pc) == ("petsc", pc_type)
            assert info.iterations == expected_iterations, (key, info.iterations, expected_iterations)
            scale = np.abs(expected).max()
            np.testing.assert_allclose(problem.u.data_ro, expected, rtol=0, atol=1e-12 * scale, err_msg=str(key))
            assert calls == list(enumerate(info.residual_history)), key  # on every rank
            assert len(info.residual_history) == info.iterations + 1
            assert info.true_residual_preconditioned <= 10 * RTOL * info.residual_history[0], key
    # the last answer is SciPy's direct solution
    A, b, x = problem.A.to_scipy(), problem.b.gather(), problem.u.gather()
    if comm.rank == 0:
        direct = spla.spsolve(A.tocsc(), b.ravel())
        np.testing.assert_allclose(x.ravel(), direct, atol=1e-8 * np.abs(direct).max())
    assert no_options_left()


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_pc_names_map_to_petscs_preconditioners_and_tolerances_to_ksp(comm):
    problem = setup(comm)
    sgs = poisson.solve(problem, method="petsc", pc="sgs", rtol=RTOL, options={"ksp_type": "cg"})
    own = poisson.solve(problem, method="cg", pc="sgs", rtol=RTOL)
    assert sgs.converged and sgs.pc == "sor"
    assert abs(sgs.iterations - own.iterations) <= 1, (sgs.iterations, own.iterations)  # the same rank-local SGS
    default = poisson.solve(problem, method="petsc", pc="jacobi", rtol=RTOL)  # PETSc's default: gmres
    assert default.iterations == by_hand(problem, "gmres", "jacobi")[0]
    assert poisson.solve(problem, method="petsc", pc=None, rtol=RTOL).pc == "none"
    ilu = poisson.solve(problem, method="petsc", pc="bjacobi-ilu", rtol=RTOL, options={"ksp_type": "cg"})
    assert ilu.converged and ilu.pc == "bjacobi" and ilu.iterations == by_hand(problem, "cg", "bjacobi")[0]
    # options win over the keyword arguments
    loose = poisson.solve(problem, method="petsc", pc="jacobi", rtol=RTOL, options={"ksp_rtol": 1e-3})
    assert loose.converged and loose.iterations < default.iterations
    stopped = poisson.solve(problem, method="petsc", pc="jacobi", rtol=RTOL, maxiter=3)
    assert not stopped.converged and stopped.iterations == 3
    assert stopped.reason.startswith("diverged: PETSc KSP_DIVERGED_ITS, maxiter=3"), stopped.reason
    # the initial guess is x: from the solution, the first residual already meets atol
    assert poisson.solve(problem, method="petsc", pc="jacobi", rtol=RTOL).converged
    again = mc.solve(problem.A, problem.u, problem.b, method="petsc", pc="jacobi", rtol=1e-6, atol=1e-6)
    assert again.converged and again.iterations == 0, again
    assert no_options_left()


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_matrix_free_operator_solves_through_a_shell_matrix(comm):
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(30, seed=2), dim=2, seed=9)
    options = {"ksp_type": "cg", "pc_type": "jacobi"}
    assembled, x_assembled = problem.solve("petsc", None, rtol=RTOL, options=options)
    problem.x.data[...] = 0.0
    free = mc.solve(matrix_free(problem, 2), problem.x, problem.b, method="petsc", rtol=RTOL, options=options)
    x_free = problem.x.gather()
    assert assembled.converged and free.converged, (assembled.reason, free.reason)
    assert free.pc == "jacobi" and abs(free.iterations - assembled.iterations) <= 1
    if comm.rank == 0:
        scale = np.linalg.norm(problem.expected)
        np.testing.assert_allclose(x_free.ravel(), x_assembled.ravel(), atol=1e-8 * scale)
        np.testing.assert_allclose(x_free.ravel(), problem.expected, atol=1e-6 * scale)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_bad_input_raises_a_solver_error_on_every_rank_naming_the_option(comm):
    problem = setup(comm)
    A, u, b = problem.A, problem.u, problem.b
    cases = [
        (dict(method="petsc", options={"ksp_type": "bogus"}), "ksp_type='bogus'"),
        (dict(method="petsc", options={"ksp_type": "cg", "pc_type": "nonesuch"}), "pc_type='nonesuch'"),
        (dict(method="petsc", options={"ksp_type": "cg", "ksp_gmres_restart": 5}), "never read.*ksp_gmres_restart"),
        (dict(method="petsc", options={"ksp_typ": "cg", "pc_gamg_thresold": 0.1}), "ksp_typ='cg', pc_gamg_thresold"),
        (dict(method="petsc", options={"-ksp_type": "cg"}), "without the dash: 'ksp_type'"),
        (dict(method="cg", options={"ksp_type": "cg"}), "for method='petsc' only"),
        (dict(method="petsc", pc="chebyshev"), "unknown preconditioner 'chebyshev'.*pc_type"),
    ]
    for arguments, message in cases:
        with pytest.raises(mc.SolverError, match=message):
            mc.solve(A, u, b, **arguments)
    free = mc.LinearOperator(problem.mesh.nodes, lambda x, y: A.mult(x, y), name="free")
    with pytest.raises(mc.SolverError, match="'free'.*diagonal"):
        mc.solve(free, u, b, method="petsc", pc="jacobi")
    with pytest.raises(mc.SolverError, match="matrix-free"):
        mc.solve(free, u, b, method="petsc", pc="sgs")
    with pytest.raises(mc.SolverError, match="pc_type='gamg'.*matrix-free"):
        mc.solve(free, u, b, method="petsc", pc=None, options={"pc_type": "gamg"})
    assert no_options_left()
    assert poisson.solve(problem, method="petsc", pc="jacobi").converged  # PETSc is still usable


@mc.kernel
def divide(z, r, d):
    z[0] = r[0] / d[0]


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_a_user_preconditioner_goes_through_a_shell_pc(comm):
    problem = setup(comm)
    nodes = problem.mesh.nodes
    diagonal = mc.Dat(nodes, 1, None, "diagonal")
    problem.A.diagonal(diagonal)
    jacobi = mc.Preconditioner(lambda r, z: mc.par_loop(divide, nodes, z(mc.WRITE), r(mc.READ), diagonal(mc.READ)),
                               name="my jacobi")
    theirs = poisson.solve(problem, method="petsc", pc="jacobi", rtol=RTOL, options={"ksp_type": "cg"})
    mine = poisson.solve(problem, method="petsc", pc=jacobi, rtol=RTOL, options={"ksp_type": "cg"})
    assert mine.converged and mine.pc == "python" and mine.iterations == theirs.iterations
    np.testing.assert_allclose(mine.residual_history, theirs.residual_history, rtol=1e-10)

    def failing(r, z):
        raise ZeroDivisionError("the user's preconditioner failed")

    with pytest.raises(mc.SolverError, match="'failing'.*the user's preconditioner failed"):  # not a PETSc.Error
        poisson.solve(problem, method="petsc", pc=mc.Preconditioner(failing, name="failing"))
    assert no_options_left()


def test_missing_petsc4py_names_the_extra_to_install(monkeypatch):
    problem = setup(None)
    monkeypatch.setitem(sys.modules, "petsc4py", None)
    with pytest.raises(mc.SolverError, match=r"pip install meshchain\[petsc\]"):
        poisson.solve(problem, method="petsc")
