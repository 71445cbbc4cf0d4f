"""The preconditioners beyond Jacobi: ``"bjacobi-ilu"`` (ILU(0) per rank, PETSc's default
PCBJACOBI/PCILU), ``"chebyshev"`` (a polynomial in the Jacobi-scaled operator, no
reductions) and a user's :class:`meshchain.Preconditioner`. Each reaches SciPy's direct
solution, preconditions (fewer iterations than Jacobi), and bad input is refused on every
rank."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import scipy.sparse as sp

import meshchain as mc
from meshchain.apps import poisson
from meshchain.backends.sparse import ilu0, ilu0_solve, owned_block
from meshchain.linalg import precond
from meshchain.meshes import jittered_delaunay, structured_tris
from test_mat import copy_kernel
from test_solvers import METHODS, Problem, matrix_free

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


# --- ILU(0) on one rank's block ----------------------------------------------------------------------


def dense_ilu0(a: np.ndarray) -> np.ndarray:
    """ILU(0) by the textbook IKJ loop on a dense array (entries outside the pattern dropped)."""
    lu, n = a.copy(), len(a)
    keep = a != 0.0
    for i in range(1, n):
        for k in range(i):
            if keep[i, k]:
                lu[i, k] /= lu[k, k]
                lu[i, k + 1:] -= np.where(keep[i, k + 1:], lu[i, k] * lu[k, k + 1:], 0.0)
    return lu


def factor(a: np.ndarray):
    csr = sp.csr_matrix(a)
    csr.sort_indices()
    indptr, indices, values = owned_block(csr.indptr.astype(np.int64), csr.indptr[1:].astype(np.int64),
                                          csr.indices.astype(np.int64), csr.data.astype(np.float64))
    diagonal, row = ilu0(indptr, indices, values, precond.ZERO_PIVOT)
    return indptr, indices, values, diagonal, row


def test_ilu0_of_a_banded_matrix_is_its_lu_and_of_a_sparse_one_the_textbook_ilu0():
    rng = np.random.default_rng(1)
    n = 9
    tridiagonal = np.diag(rng.uniform(4, 5, n)) + np.diag(rng.uniform(-1, 1, n - 1), 1) + np.diag(
        rng.uniform(-1, 1, n - 1), -1)
    indptr, indices, values, diagonal, row = factor(tridiagonal)
    assert row == -1
    lu = sp.csr_matrix((values, indices, indptr), shape=(n, n)).toarray()
    lower, upper = np.tril(lu, -1) + np.eye(n), np.triu(lu)
    np.testing.assert_allclose(lower @ upper, tridiagonal, atol=1e-13)  # no fill: ILU(0) = LU
    r = rng.standard_normal(n)
    z = np.zeros(n)
    ilu0_solve(indptr, indices, values, diagonal, 1.0 / values[diagonal], r, z)
    np.testing.assert_allclose(z, np.linalg.solve(tridiagonal, r), rtol=1e-12)

    a = sp.random(30, 30, density=0.15, random_state=3).toarray() + np.diag(rng.uniform(3, 4, 30))
    indptr, indices, values, diagonal, row = factor(a)
    assert row == -1
    np.testing.assert_allclose(sp.csr_matrix((values, indices, indptr), shape=a.shape).toarray(), dense_ilu0(a),
                               rtol=1e-12, atol=1e-14)

    # halo columns (after split) are left out of the owned block
    block = owned_block(np.array([0, 3, 5]), np.array([2, 4]), np.array([0, 1, 2, 1, 3]),
                        np.array([1.0, 2.0, 9.0, 3.0, 9.0]))
    assert [b.tolist() for b in block] == [[0, 2, 3], [0, 1, 1], [1.0, 2.0, 3.0]]

    singular = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 3.0]])  # second pivot 1 - 1 = 0
    assert factor(singular)[4] == 1
    assert factor(np.array([[2.0, 1.0], [1.0, 0.0]]) * [[1, 1], [1, 0]])[4] == 1  # no diagonal entry stored


# --- bjacobi-ilu against PETSc ------------------------------------------------------------------------


def petsc_iterations(A, b, pc: str, rtol: float) -> int:
    PETSc = pytest.importorskip("petsc4py.PETSc")
    matrix, rhs = A.to_petsc(), A.petsc_vec(b)
    x = rhs.duplicate()
    x.set(0.0)
    ksp = PETSc.KSP().create(comm=matrix.getComm())
    ksp.setOperators(matrix)
    ksp.setType("cg")
    ksp.getPC().setType(pc)
    ksp.setTolerances(rtol=rtol, atol=0.0, max_it=2000)
    ksp.solve(rhs, x)
    its, reason = ksp.getIterationNumber(), ksp.getConvergedReason()
    for obj in (ksp, x, rhs, matrix):
        obj.destroy()
    assert reason > 0, reason
    return its


class PoissonProblem:
    """The Poisson app's problem with :class:`test_solvers.Problem`'s surface."""

    def __init__(self, mesh):
        p = self.p = poisson.declare(mesh)
        self.A, self.b, self.x = p.A, p.b, p.u
        matrix, b = p.A.to_scipy(), p.b.gather()
        self.expected = None if matrix is None else sp.linalg.spsolve(matrix.tocsc(), b.ravel())

    def solve(self, method, pc, **options):
        return poisson.solve(self.p, method=method, pc=pc, **options), self.x.gather()


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=300)
def test_bjacobi_ilu_takes_petscs_iterations_and_reaches_the_direct_solution(comm):
    pytest.importorskip("petsc4py.PETSc")
    problems = {"poisson": lambda: PoissonProblem(structured_tris(24, 24)),
                "dim 2": lambda: Problem(jittered_delaunay(40, seed=3), dim=2, seed=11, shift=2.0)}
    for name, declare in problems.items():
        mc.reset_runtime(comm=comm)  # on several ranks, a mesh is declared in a fresh session
        problem = declare()
        info, x = problem.solve("cg", "bjacobi-ilu", rtol=1e-10)
        theirs = petsc_iterations(problem.A, problem.b, "bjacobi", 1e-10)
        assert info.converged, (name, info.reason)
        assert abs(info.iterations - theirs) <= 1, (name, comm.size, info.iterations, theirs)
        jacobi = problem.solve("cg", "jacobi", rtol=1e-10)[0]
        assert info.iterations < jacobi.iterations, (name, info.iterations, jacobi.iterations)  # it preconditions
        if comm.rank == 0:
            np.testing.assert_allclose(x.ravel(), problem.expected, atol=1e-7 * np.linalg.norm(problem.expected))
    for method in METHODS[1:]:  # every method with it
        info, x = problem.solve(method, "bjacobi-ilu", rtol=1e-10)
        assert info.converged, (method, info.reason)
        if comm.rank == 0:
            np.testing.assert_allclose(x.ravel(), problem.expected, atol=1e-6 * np.linalg.norm(problem.expected))

    with pytest.raises(mc.SolverError, match="matrix-free"):
        mc.solve(matrix_free(problem, 2), problem.x, problem.b, pc="bjacobi-ilu")
    mc.reset_runtime(comm=comm)
    singular = Problem(jittered_delaunay(30, seed=1), seed=2)
    singular.A.zero_rows([7], diagonal=0.0)  # its owner finds a zero pivot; every rank raises
    with pytest.raises(mc.SolverError, match=r"bjacobi-ilu.*zero pivot"):
        singular.solve("cg", "bjacobi-ilu")


# --- Chebyshev -------------------------------------------------------------------------------------------

REDUCTIONS_PER_ITERATION = {"cg": 2, "cg1": 1, "pipecg": 1, "groppcg": 2, "pipecr": 1}


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_chebyshev_converges_with_every_method_without_reductions(comm, monkeypatch):
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(60, seed=4), dim=2, seed=5)
    sums, applying = [], []
    setup_sums = precond._sums
    monkeypatch.setattr(precond, "_sums", lambda engine, values: sums.append(bool(applying)) or setup_sums(engine,
                                                                                                           values))
    apply = precond.Chebyshev.apply
    monkeypatch.setattr(precond.Chebyshev, "apply",
                        lambda self, r, z: applying.append(1) or apply(self, r, z) or applying.clear())
    scale = np.linalg.norm(problem.expected)
    for method in METHODS:
        info, x = problem.solve(method, "chebyshev", rtol=1e-10)
        jacobi = problem.solve(method, "jacobi", rtol=1e-10)[0]
        assert info.converged, (method, info.reason)
        assert info.iterations < jacobi.iterations, (method, info.iterations, jacobi.iterations)
        per = REDUCTIONS_PER_ITERATION[method]  # the method's reductions, none of the preconditioner's
        assert info.reductions - per * info.iterations == jacobi.reductions - per * jacobi.iterations, method
        if comm.rank == 0:
            np.testing.assert_allclose(x.ravel(), problem.expected, atol=1e-6 * scale, err_msg=method)
    assert sums and not any(sums)  # the eigenvalue estimate's reductions, none while applying

    op = matrix_free(problem, 2)  # matrix-free: the same polynomial, through the operator's loops
    problem.x.data[...] = 0.0
    free = mc.solve(op, problem.x, problem.b, method="pipecg", pc="chebyshev", rtol=1e-10)
    assembled = problem.solve("pipecg", "chebyshev", rtol=1e-10)[0]
    assert free.converged and abs(free.iterations - assembled.iterations) <= 1, (free.iterations,
                                                                                 assembled.iterations)
    assert problem.solve("cg", "chebyshev", rtol=1e-10)[0].iterations <= assembled.iterations + 1


def test_chebyshev_is_a_fixed_spd_operator_and_its_estimate_bounds_the_spectrum():
    problem = Problem(jittered_delaunay(25, seed=2), seed=3)
    from meshchain.api import engine_surface
    from meshchain.linalg.operators import as_operator

    engine = engine_surface()
    operator = as_operator(engine, problem.A)
    n = engine.n_owned(operator.row_set)
    pc = precond.make_preconditioner("chebyshev", operator, n, engine=engine)
    columns = []
    for i in range(n):
        z = np.zeros(n)
        pc.apply(np.eye(n)[i], z)
        columns.append(z)
    B = np.array(columns).T
    np.testing.assert_allclose(B, B.T, atol=1e-12 * np.abs(B).max())
    assert np.linalg.eigvalsh(B).min() > 0
    dense = problem.A.to_scipy().toarray()
    d = np.sqrt(np.diag(dense))
    largest = np.linalg.eigvalsh(dense / d[:, None] / d[None]).max()
    assert 0.8 * largest <= pc.largest <= largest * (1 + 1e-10)  # Ritz values lie inside the spectrum
    z = np.zeros(n)
    pc.apply(np.eye(n)[0], z)
    np.testing.assert_array_equal(z, B[:, 0])  # the same operator every time


# --- the user's Preconditioner -----------------------------------------------------------------------------

DIVIDE = mc.Kernel.from_source("def divide(r, d, z):\n    z[0] = r[0] / d[0]\n    z[1] = r[1] / d[1]\n")


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_users_preconditioner_by_par_loop_solves_like_jacobi_and_bad_ones_are_refused(comm):
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(40, seed=6), dim=2, seed=8)
    nodes = problem.mesh.nodes
    diagonal = mc.Dat(nodes, 2, None, "diagonal")
    problem.A.diagonal(diagonal)
    calls = []

    def jacobi(r, z):
        calls.append(1)
        mc.par_loop(DIVIDE, nodes, r(mc.READ), diagonal(mc.READ), z(mc.WRITE))

    mine = mc.Preconditioner(jacobi, row_set=nodes, dim=2, name="my jacobi")
    for method in ("cg", "pipecg"):
        calls.clear()
        info, x = problem.solve(method, mine, rtol=1e-10)
        theirs, x_theirs = problem.solve(method, "jacobi", rtol=1e-10)
        assert info.converged and info.iterations == theirs.iterations, (method, info.iterations, theirs.iterations)
        assert len(calls) == 1  # captured once, replayed
        if comm.rank == 0:
            np.testing.assert_allclose(x, x_theirs, rtol=1e-9, atol=1e-12)

    with pytest.raises(mc.SolverError, match="callable"):
        mc.Preconditioner(np.ones(3))
    with pytest.raises(mc.SolverError, match="dim must be a positive integer"):
        mc.Preconditioner(jacobi, dim=0)
    cells = problem.mesh.cells
    refused = [
        (mc.Preconditioner(jacobi, row_set=cells, name="on cells"), r"'on cells' works on 'cells'"),
        (mc.Preconditioner(jacobi, dim=1, name="scalar"), "'scalar' works on dats of dim 1"),
        (mc.Preconditioner(lambda r, z: None, name="idle"), "'idle'.*left .* unwritten"),
        (mc.Preconditioner(lambda r, z: mc.par_loop(DIVIDE, cells, r(mc.READ), diagonal(mc.READ), z(mc.WRITE)),
                           name="wrong set"), "'wrong set'.*raised"),
    ]
    if comm.size > 1:  # a failure on one rank only is raised on every rank
        def on_rank_one(r, z):
            if comm.rank == 1:
                raise ZeroDivisionError("rank one's trouble")
            z.data[...] = r.data_ro

        refused.append((mc.Preconditioner(on_rank_one, name="one"), "(rank one's trouble|rank 1)"))
    for pc, message in refused:
        with pytest.raises(mc.SolverError, match=message):
            problem.solve("cg", pc, rtol=1e-10)


def test_the_new_preconditioners_call_no_blas(monkeypatch):
    """As ``test_solvers.test_a_solve_calls_no_blas``: set-up and applications included."""
    from test_solvers import BLAS_ENTRY_POINTS

    problem = Problem(jittered_delaunay(20, seed=1), seed=2)

    def refused(*args, **kwargs):
        raise AssertionError("a BLAS call inside mc.solve")

    for name in BLAS_ENTRY_POINTS:
        monkeypatch.setattr(np, name, refused)
    for pc in ("bjacobi-ilu", "chebyshev"):
        info, _ = problem.solve("pipecg", pc, rtol=1e-10)
        assert info.converged, (pc, info.reason)


# --- set-up kept with the matrix ----------------------------------------------------------------------------

KEPT = ("jacobi", "sgs", "bjacobi-ilu", "chebyshev")


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_preconditioners_set_up_is_kept_until_the_matrix_changes(comm, monkeypatch):
    """A second solve with the same matrix sets nothing up and gives the bits of a solve that
    set everything up again; new values (an assembly) are set up again and solved right."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(40, seed=6), dim=2, seed=3)
    setups = []
    setup = precond._setup
    monkeypatch.setattr(precond, "_setup", lambda pc, *args: setups.append(pc) or setup(pc, *args))
    scale = np.linalg.norm(problem.expected)
    solve_module = importlib.import_module("meshchain.linalg.solve")
    for pc in KEPT:
        first, x_first = problem.solve("cg", pc, rtol=1e-10)
        again, x_again = problem.solve("pipecg", pc, rtol=1e-10)
        kept, x_kept = problem.solve("cg", pc, rtol=1e-10)
        assert setups.count(pc) == 1, (pc, setups)  # the second and third solves used the first one's
        with monkeypatch.context() as m:
            m.setattr(precond, "_KEPT", ())  # nothing kept: set up again
            mc.api.engine_surface().solver_cache(solve_module.KEPT_SOLVES).clear()  # nor the solve's own set-up
            fresh, x_fresh = problem.solve("cg", pc, rtol=1e-10)
        assert setups.count(pc) == 2, (pc, setups)
        assert first.converged and again.converged and kept.converged, pc
        assert kept.iterations == fresh.iterations == first.iterations, pc
        assert kept.residual_history == fresh.residual_history, pc  # the same bits
        if comm.rank == 0:
            np.testing.assert_array_equal(x_kept, x_fresh, err_msg=pc)
            np.testing.assert_allclose(x_again.ravel(), problem.expected, atol=1e-6 * scale, err_msg=pc)

    d, width = problem.mesh, problem.mesh.cell2node.arity * 2
    problem.A.zero()  # new values: A doubled, so x halves
    problem.k.data[...] *= 2.0
    mc.par_loop(copy_kernel(width, width), d.cells, problem.A(mc.INC, (d.cell2node, d.cell2node)), problem.k(mc.READ))
    for pc in KEPT:
        info, x = problem.solve("cg", pc, rtol=1e-10)
        assert setups.count(pc) == 3 and info.converged, (pc, setups, info.reason)
        if comm.rank == 0:
            np.testing.assert_allclose(x.ravel(), problem.expected / 2, atol=1e-6 * scale, err_msg=pc)

    op = matrix_free(problem, 2)  # matrix-free: its diagonal is a dat, set up at every solve
    for _ in range(2):
        problem.x.data[...] = 0.0
        assert mc.solve(op, problem.x, problem.b, method="cg", pc="jacobi", rtol=1e-10).converged
    assert setups.count("jacobi") == 5, setups


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_cg_applies_ilu_inside_its_compiled_calls(comm, monkeypatch):
    """``cg`` with ``"bjacobi-ilu"`` iterates inside compiled calls (the bits of its Python
    loop: ``test_solvers.test_cg_inside_compiled_calls_equals_the_python_loop_bit_for_bit``)."""
    from meshchain.linalg import krylov

    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(50, seed=2), dim=2, seed=8)
    calls = []
    for name in ("cg_iterations", "cg_iterations_on_ranks"):
        monkeypatch.setattr(krylov, name, lambda *args, call=getattr(krylov, name): calls.append(1) or call(*args))
    info, x = problem.solve("cg", "bjacobi-ilu", rtol=1e-10)
    assert info.converged and calls, (info.reason, calls)
    if comm.rank == 0:
        np.testing.assert_allclose(x.ravel(), problem.expected, atol=1e-7 * np.linalg.norm(problem.expected))
