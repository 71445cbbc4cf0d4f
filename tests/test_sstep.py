"""s-step CG (issue 36): ``method="sstep-cg"`` reaches SciPy's direct solution on SPD P1 and
random SPD problems on 1-4 ranks, takes about CG's iterations, sends one message per
neighbour and makes one reduction per ``s`` iterations, and refuses bad options on every rank."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import scipy.sparse.linalg as spla
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
import meshchain.linalg.sstep as sstep
from meshchain.apps import poisson
from meshchain.meshes import jittered_delaunay, structured_tris
from test_solvers import MESHES, Problem


def relative_error(got, want) -> float:
    return float(np.abs(got.ravel() - want.ravel()).max() / np.abs(want).max())


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), steps=st.integers(1, 8),
       basis=st.sampled_from(["newton", "monomial"]), pc=st.sampled_from([None, "jacobi"]))
def test_sstep_cg_reaches_the_direct_solution_on_random_spd_problems(comm, mesh, dim, seed, steps, basis, pc):
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    cg, _ = problem.solve("cg", pc, rtol=1e-12)
    if basis == "monomial" and steps > 4:
        steps = 4  # the monomial basis loses rank beyond a few steps: the Newton basis is the default
    info, x = problem.solve("sstep-cg", pc, rtol=1e-12, s=steps, basis=basis)
    assert info.converged, info.reason
    assert info.true_residual_preconditioned <= 1e-12 * info.residual_history[0] * 10
    assert info.iterations <= 1.2 * cg.iterations + steps, (info.iterations, cg.iterations)
    if comm.rank == 0:
        assert relative_error(x, problem.expected) < 1e-8


@pytest.mark.mpi(nprocs=(1, 2, 4), timeout=600)
@pytest.mark.parametrize("steps", [2, 4, 8])
def test_sstep_cg_solves_the_poisson_problem_like_cg(comm, steps):
    mc.reset_runtime(comm=comm)
    p = poisson.declare(jittered_delaunay(400, seed=11))
    cg = poisson.solve(p, method="cg", pc="jacobi", rtol=1e-12)
    reference = p.u.gather()
    info = poisson.solve(p, method="sstep-cg", pc="jacobi", rtol=1e-12, s=steps)
    assert info.converged, info.reason
    assert abs(info.iterations - cg.iterations) <= max(2, 0.2 * cg.iterations), (info.iterations, cg.iterations)
    x = p.u.gather()
    A = p.A.to_scipy()
    b = p.b.gather()
    if comm.rank == 0:
        direct = spla.spsolve(A.tocsc(), b.ravel())
        assert relative_error(x, direct) < 1e-8 and relative_error(reference, direct) < 1e-8


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("steps", [3, 6])
def test_each_outer_iteration_sends_one_message_per_neighbour_and_reduces_once(comm, steps, monkeypatch):
    from test_chains_mpi import CountingComm

    counting = CountingComm(comm, monkeypatch)
    mc.reset_runtime(comm=counting)
    problem = Problem(structured_tris(12, 12), dim=1, seed=4)
    per_outer = []
    outer = sstep._Run.outer

    def counted(self, shifts):
        counting.sends.clear()
        reductions = self.reductions
        outcome = outer(self, shifts)
        per_outer.append((collections.Counter(dest for dest, _ in counting.sends), self.reductions - reductions))
        return outcome

    monkeypatch.setattr(sstep._Run, "outer", counted)
    info, _ = problem.solve("sstep-cg", "jacobi", rtol=1e-10, s=steps)
    assert info.converged and len(per_outer) >= 2
    for sends, reductions in per_outer:
        assert reductions == 1  # the Gram matrices, in one Allreduce
        assert sends and set(sends.values()) == {1}, sends  # the basis: one message to each neighbour
    full = [s for s, _ in per_outer[:-1]]
    assert all(s == full[0] for s in full)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_bad_sstep_options_are_refused_on_every_rank(comm):
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_tris(4, 4), dim=1, seed=1)
    A, x, b = problem.A, problem.x, problem.b
    op = mc.LinearOperator(problem.mesh.nodes, lambda u, v: A.mult(u, v), name="wrapped")
    cases = [(dict(method="sstep-cg", s=0), "s must be an integer from 1 to 16"),
             (dict(method="sstep-cg", s=17), "s must be an integer from 1 to 16"),
             (dict(method="sstep-cg", s=2.0), "s must be an integer"),
             (dict(method="sstep-cg", basis="chebyshev"), "unknown s-step basis 'chebyshev'"),
             (dict(method="sstep-cg", pc="sgs"), "takes pc=None or 'jacobi'"),
             (dict(method="sstep-cg", residual_replacement=True), "residual_replacement is implemented for method='pipecg'"),
             (dict(method="cg", s=4), "options of method='sstep-cg'")]
    for options, message in cases:
        with pytest.raises(mc.SolverError, match=message):
            mc.solve(A, x, b, **options)
    with pytest.raises(mc.SolverError, match="assembled mc.Mat"):
        mc.solve(op, x, b, method="sstep-cg")
    assert mc.solve(A, x, b, method="sstep-cg", s=2).converged  # the session goes on


def test_ritz_values_by_bisection_equal_lapacks():
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 16):
        diagonal, off = rng.uniform(1, 5, n), rng.uniform(-1, 1, max(n - 1, 1))
        T = np.diag(diagonal) + np.diag(off[:n - 1], 1) + np.diag(off[:n - 1], -1)
        np.testing.assert_allclose(sstep.tridiagonal_eigenvalues(diagonal, off), np.linalg.eigvalsh(T), atol=1e-12)


def test_leja_shifts_and_the_basis_change_matrix():
    assert sstep.leja([], 3).tolist() == [0.0, 0.0, 0.0]
    assert sstep.leja([2.0], 3).tolist() == [2.0, 2.0, 2.0]
    shifts = sstep.leja([1.0, 5.0, 3.0], 3)
    assert shifts[0] == 5.0 and sorted(shifts) == [1.0, 3.0, 5.0]
    rng = np.random.default_rng(0)
    A = rng.standard_normal((6, 6))
    A = A + A.T
    p, r = rng.standard_normal(6), rng.standard_normal(6)
    steps, theta = 3, np.array([0.5, -1.0, 2.0])
    P = [p]
    for j in range(steps):
        P.append(A @ P[-1] - theta[j] * P[-1])
    R = [r]
    for j in range(steps - 1):
        R.append(A @ R[-1] - theta[j] * R[-1])
    Y = np.column_stack(P + R)
    B = sstep.basis_change(theta, steps)
    used = [j for j in range(2 * steps + 1) if j not in (steps, 2 * steps)]  # the last of each block is not multiplied
    np.testing.assert_allclose((A @ Y)[:, used], (Y @ B)[:, used], atol=1e-10)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_basis_that_loses_rank_ends_with_its_reason_and_never_claims_convergence(comm):
    """The monomial basis of 16 steps loses rank on a 961-node Poisson problem: the solve ends
    as a breakdown or stagnation, the same on every rank, x finite; the Newton basis of 16
    steps converges in CG's iterations."""
    mc.reset_runtime(comm=comm)
    p = poisson.declare(structured_tris(30, 30))
    for pc in (None, "jacobi"):
        cg = poisson.solve(p, method="cg", pc=pc, rtol=1e-10)
        lost = poisson.solve(p, method="sstep-cg", pc=pc, rtol=1e-10, s=16, basis="monomial", maxiter=2000)
        assert not lost.converged and lost.reason.split(":")[0] in ("breakdown", "stagnated"), lost.reason
        assert comm.allgather(lost.reason) == [lost.reason] * comm.size
        assert np.isfinite(p.u.data_ro).all() and np.isfinite(lost.true_residual)
        newton = poisson.solve(p, method="sstep-cg", pc=pc, rtol=1e-10, s=16)
        assert newton.converged and abs(newton.iterations - cg.iterations) <= 2, (newton.iterations, cg.iterations)
