"""s-step CG (issue 36): the block form (``method="sstep-cg"``) and CA-CG (``method="ca-cg"``)
reach SciPy's direct solution on SPD P1 and random SPD problems on 1-4 ranks, take about CG's
iterations, send one message per neighbour and make one reduction per ``s`` iterations, keep
a matrix's Newton shifts for its next solves, and refuse bad options on every rank."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import scipy.sparse.linalg as spla
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import meshchain as mc
import meshchain.linalg.blockcg as blockcg
import meshchain.linalg.sstep as sstep
from meshchain.apps import poisson
from meshchain.engine.powers import SequencePlan
from meshchain.meshes import jittered_delaunay, structured_quads, structured_tris
from meshchain.testing import parallel_assert
from test_solvers import MESHES, Problem, matrix_free


def relative_error(got, want) -> float:
    return float(np.abs(got.ravel() - want.ravel()).max() / np.abs(want).max())


def iteration_bound(cg, problem, steps) -> float:
    """At most 1.2 times CG's iterations plus ``s``; where CG ended by running out of Krylov
    space (at least as many iterations as unknowns: meshes of 8-12 nodes), 4 times CG's plus
    ``s``. There the space runs out inside a block, the basis's rounding rather than the method
    sets the residual the block ends with (1e-10 where CG's is 1e-13), and the directions
    start again from it: another pass over the whole space, sometimes two (100 examples on 1-4
    ranks: up to 3.5 times CG's iterations, for example ``structured_quads(2, 3)``, 12
    unknowns, ``rtol=1e-12``, ``s=4``: 33 iterations to CG's 13)."""
    exhausted = cg.iterations >= problem.expected.size
    return (4.0 if exhausted else 1.2) * cg.iterations + steps


def close_on_rank_0(comm, gathered, expected):
    """The solution (gathered: rank 0 holds it) within 1e-8 of the direct one, asserted on every
    rank at once, so a failure fails every rank and hypothesis shrinks in step on all of them."""
    def close():
        error = relative_error(gathered, expected) if comm.rank == 0 else 0.0
        assert error < 1e-8, f"relative error {error:.3g}"
        return True

    parallel_assert(close, "the solution against the direct one, on rank 0", comm=comm)


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), steps=st.integers(1, 8),
       basis=st.sampled_from(["newton", "monomial"]), pc=st.sampled_from([None, "jacobi"]))
@example(mesh=jittered_delaunay(8, seed=0), dim=1, seed=0, steps=3, basis="newton", pc=None)  # crept: 46 its
@example(mesh=jittered_delaunay(8, seed=0), dim=1, seed=0, steps=4, basis="newton", pc=None)
@example(mesh=jittered_delaunay(8, seed=28), dim=1, seed=26, steps=7, basis="newton", pc=None)  # stagnated
def test_ca_cg_reaches_the_direct_solution_on_random_spd_problems(comm, mesh, dim, seed, steps, basis, pc):
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    cg, _ = problem.solve("cg", pc, rtol=1e-12)
    if basis == "monomial" and steps > 4:
        steps = 4  # the monomial basis loses rank beyond a few steps: the Newton basis is the default
    info, x = problem.solve("ca-cg", pc, rtol=1e-12, s=steps, basis=basis)
    assert info.converged, info.reason
    assert info.true_residual_preconditioned <= 1e-12 * info.residual_history[0] * 10
    assert info.iterations <= iteration_bound(cg, problem, steps), (info.iterations, cg.iterations)
    close_on_rank_0(comm, x, problem.expected)


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), steps=st.integers(1, 4),
       basis=st.sampled_from(["newton", "monomial"]), pc=st.sampled_from([None, "jacobi"]))
@example(mesh=jittered_delaunay(8, seed=0), dim=1, seed=1, steps=4, basis="newton", pc=None)  # kept a noise pivot
def test_block_sstep_cg_reaches_the_direct_solution_on_random_spd_problems(comm, mesh, dim, seed, steps, basis, pc,
                                                                          monkeypatch):
    """The block form to rtol 1e-10 with ``s <= 4`` on these meshes of 8-60 nodes (its attainable
    accuracy on them is about 1e-11, and larger ``s`` exhaust their Krylov spaces in a few
    blocks: the Poisson test below runs ``s = 8``); the iterations are CG's rounded up to a
    multiple of ``s``, at most 1.2 times CG's plus ``s``. On several ranks the outer iterations
    run in compiled calls (each basis, its sums and their sum over ranks in one): the solve has
    the bits of the steps called from Python."""
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    cg, _ = problem.solve("cg", pc, rtol=1e-10)
    info, x = problem.solve("sstep-cg", pc, rtol=1e-10, s=steps, basis=basis)
    assert info.converged, info.reason
    assert info.true_residual_preconditioned <= 1e-10 * info.residual_history[0] * 10
    assert info.iterations <= iteration_bound(cg, problem, steps), (info.iterations, cg.iterations)
    close_on_rank_0(comm, x, problem.expected)
    compiled, python = solved_both_ways(problem, monkeypatch, "sstep-cg", pc, rtol=1e-10, s=steps, basis=basis)
    assert ("outers" in compiled[0]) == (comm.size > 1 and compiled_mpi())  # made where they can be
    assert compiled[1:] == python[1:]


def compiled_mpi() -> bool:
    from meshchain.comm.compiled import available

    return available()


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_the_true_residual_expected_to_converge_is_made_in_one_compiled_call_with_the_same_bits(comm, monkeypatch):
    """Where the residual's rate says the next norm meets the tolerance, the true residual
    (its product with the exchange, the residual and its three sums) is made in one compiled
    call on several ranks: the solve has the bits of the same steps from Python."""
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_tris(12, 12), dim=1, seed=3)
    problem.solve("sstep-cg", "jacobi", rtol=1e-10, s=4)  # the Newton shifts found: both solves below reuse them
    compiled, python = solved_both_ways(problem, monkeypatch, "sstep-cg", "jacobi", rtol=1e-10, s=4)
    assert compiled[0] == ({"outers", "true residual"} if compiled_mpi() else set())
    assert python[0] == set() and compiled[1:] == python[1:] and compiled[4] == "converged"


class _Poisson:
    """The Poisson app's problem as :func:`solved_both_ways` solves it (from ``x = 0``)."""

    def __init__(self, mesh):
        self.p = poisson.declare(mesh)

    def solve(self, method, pc, **options):
        self.p.u.data[...] = 0.0
        info = poisson.solve(self.p, method=method, pc=pc, **options)
        return info, self.p.u.gather()


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_a_residual_expected_to_converge_that_did_not_goes_on_in_compiled_calls_with_the_same_bits(comm, monkeypatch):
    """Where the residual's rate said the next norm meets the tolerance and it did not, the
    block after that test is made in a compiled call (it was made from Python), counted with
    the test in one step of the test of progress: the solve has the bits of the same steps
    from Python."""
    mc.reset_runtime(comm=comm)
    problem = _Poisson(jittered_delaunay(100, seed=11))
    problem.solve("sstep-cg", "jacobi", rtol=1e-8, s=3)  # the Newton shifts found: both solves below reuse them
    steps, outer, outers = [], blockcg._BlockRun.outer, blockcg._BlockRun.outers

    def logged_outer(self, shifts):
        steps.append(outer(self, shifts))
        return steps[-1]

    def logged_outers(self, shifts, best, idle, recent):
        found = outers(self, shifts, best, idle, recent)
        steps.append(("compiled", found[3], recent, found[1]) if found is not None else None)
        return found

    monkeypatch.setattr(blockcg._BlockRun, "outer", logged_outer)
    monkeypatch.setattr(blockcg._BlockRun, "outers", logged_outers)
    compiled, python = solved_both_ways(problem, monkeypatch, "sstep-cg", "jacobi", rtol=1e-8, s=3)
    assert compiled[1:] == python[1:] and compiled[4] == "converged"
    assert "tested" in steps, "the rate no longer misjudges this solve: choose another"
    if compiled_mpi():  # the compiled solve's first: the step after the test made a block, given the tested norm,
        after = steps[steps.index("tested") + 1]  # which its test of progress took as the smallest so far
        assert isinstance(after, tuple) and after[0] == "compiled" and math.isfinite(after[2])
        assert after[1] == 1, "the call made more blocks: its smallest norm is no longer the first block's"
        assert after[3] == after[2]


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
@pytest.mark.parametrize("method,pc", [("sstep-cg", "jacobi"), ("sstep-cg", None), ("ca-gmres", "jacobi")])
def test_a_solve_after_the_matrix_is_assembled_again_has_the_bits_of_one_in_a_fresh_session(comm, method, pc):
    """A time loop assembles its matrix again before each solve: the matrix powers rows keep their
    structure and fetch only their values again, the plans stay, the costs are not measured again.
    The solve after that has the bits of the same solve in a fresh session where the matrix was
    assembled once with those values (iterations, residual history, reason, ``x``); the new values
    keep the diagonal, so that a scaled matrix kept for the old values would show."""
    from test_mat import copy_kernel
    from test_solvers import spd_blocks

    mesh = jittered_delaunay(70, seed=4)
    width = 3 * 2
    first = spd_blocks(mesh.ncell, width, 5)  # the Problem's own blocks (its seed)
    diagonal = np.eye(width, dtype=bool)[None]
    second = np.where(diagonal, first, 0.5 * first).reshape(mesh.ncell, -1)  # new values, the same diagonal:
    # Jacobi's scaling is unchanged, so S A S must be worked out again for the new values alone
    outcomes = []
    for fresh in (False, True):
        mc.reset_runtime(comm=comm)
        problem = Problem(mesh, dim=2, seed=5)  # assembled once with its own blocks
        d = problem.mesh
        values = mc.Dat(d.cells, width * width, second, "second")
        if not fresh:  # solved with the first values, then assembled again with the second ones
            assert problem.solve(method, pc, rtol=1e-10, s=3)[0].converged
        problem.A.zero()
        mc.par_loop(copy_kernel(width, width), d.cells, problem.A(mc.INC, (d.cell2node, d.cell2node)),
                    values(mc.READ))
        info, x = problem.solve(method, pc, rtol=1e-10, s=3)
        outcomes.append((info.iterations, info.reason, info.residual_history, None if x is None else x.tobytes()))
    assert outcomes[0] == outcomes[1] and outcomes[0][1] == "converged"


def solved_both_ways(problem, monkeypatch, method, pc, **options):
    """``(compiled calls made, iterations, reductions, residual history, reason, x's bits, true
    residual's two norms)`` of
    a block s-step solve with its outer iterations (and the true residual its rate says
    converged) in compiled calls where it can, and with each step called from Python (no
    compiled call of the matrix powers kernel's arguments; the Newton shifts known to both).
    The compiled calls made: a set of ``"outers"`` and ``"true residual"``."""
    from meshchain.engine import powers

    made, outers, true_sums = [], blockcg._BlockRun.outers, blockcg.true_residual_sums

    def counted_outers(self, shifts, best, idle, recent):
        found = outers(self, shifts, best, idle, recent)
        if found is not None:
            made.append("outers")
        return found

    def counted_sums(*arguments):
        made.append("true residual")
        return true_sums(*arguments)

    outcomes = []
    for compiled in (True, False):
        with monkeypatch.context() as patch:
            if compiled:
                patch.setattr(blockcg._BlockRun, "outers", counted_outers)
                patch.setattr(blockcg, "true_residual_sums", counted_sums)
            else:
                patch.setattr(blockcg._BlockRun, "outers", lambda *_: None)
                patch.setattr(powers.SequencePlan, "compiled_arguments", lambda *_: None)
            info, x = problem.solve(method, pc, **options)
        outcomes.append((set(made), info.iterations, info.reductions, info.residual_history, info.reason,
                         None if x is None else x.tobytes(), info.true_residual, info.true_residual_preconditioned))
        made.clear()
    return outcomes


@pytest.mark.mpi(nprocs=(1, 2, 4), timeout=600)
@pytest.mark.parametrize("method", ["sstep-cg", "ca-cg"])
@pytest.mark.parametrize("steps", [2, 4, 8])
def test_sstep_cg_solves_the_poisson_problem_like_cg(comm, method, steps):
    mc.reset_runtime(comm=comm)
    p = poisson.declare(jittered_delaunay(400, seed=11))
    cg = poisson.solve(p, method="cg", pc="jacobi", rtol=1e-12)
    reference = p.u.gather()
    for _ in range(2):  # the second solve starts from the Newton shifts the first one found
        info = poisson.solve(p, method=method, pc="jacobi", rtol=1e-12, s=steps)
        assert info.converged, info.reason
        assert abs(info.iterations - cg.iterations) <= max(2, 0.2 * cg.iterations), (info.iterations, cg.iterations)
        x = p.u.gather()
        A = p.A.to_scipy()
        b = p.b.gather()
        if comm.rank == 0:
            direct = spla.spsolve(A.tocsc(), b.ravel())
            assert relative_error(x, direct) < 1e-8 and relative_error(reference, direct) < 1e-8


LAPLACE_AND_MASS = """
def laplace_and_mass(a, x):
    ax, ay = x[1, 0] - x[0, 0], x[1, 1] - x[0, 1]
    bx, by = x[2, 0] - x[0, 0], x[2, 1] - x[0, 1]
    det = ax * by - ay * bx
    g = ((ay - by) / det, (bx - ax) / det, by / det, -bx / det, -ay / det, ax / det)
    for i in range(3):
        for j in range(3):
            for c in range(DIM):
                a[DIM * i + c, DIM * j + c] += 0.5 * abs(det) * (g[2 * i] * g[2 * j] + g[2 * i + 1] * g[2 * j + 1])
        for c in range(DIM):
            a[DIM * i + c, DIM * i + c] += abs(det) / 12.0 * (c + 1)
"""


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
@pytest.mark.parametrize("method", ["sstep-cg", "ca-cg"])
@pytest.mark.parametrize("side, dim, pc, rtol", [(24, 1, None, 1e-6), (12, 2, "jacobi", 1e-10)])
def test_a_plateau_of_cgs_own_residual_is_no_reason_to_restart(comm, method, side, dim, pc, rtol):
    """P1 stiffness plus a mass term (no boundary rows) with a random right-hand side: CG's
    residual norm rises for about 60 iterations before it falls (24 x 24, no preconditioner).
    The s-step methods took such a plateau for a basis losing rank: they replaced the residual,
    started the directions again (the Krylov space thrown away), halved ``s`` and ended as
    stagnated (``s = 1`` too), or took twice CG's iterations (12 x 12, two components, Jacobi:
    224 and 236 iterations to CG's 108, the second solve from the kept Newton shifts). The true
    residual looked at after outer iterations without progress agrees with the recursive one
    there, so now the directions go on: converged, in CG's iterations (+ ``s``), in both
    solves."""
    mc.reset_runtime(comm=comm)
    d = structured_tris(side, side).declare()
    mc.partition("kway", coords=d.coords, seed_set=d.cells)
    A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A", dim=dim)
    kernel = mc.Kernel.from_source(LAPLACE_AND_MASS.replace("DIM", str(dim)))
    mc.par_loop(kernel, d.cells, A(mc.INC, (d.cell2node, d.cell2node)), d.coords(mc.READ, d.cell2node))
    b = mc.Dat(d.nodes, dim, np.random.default_rng(1).standard_normal((d.nodes.size, dim)), "b")
    cg = mc.solve(A, mc.Dat(d.nodes, dim, None, "x"), b, method="cg", pc=pc, rtol=rtol)
    assert cg.converged
    for steps in (1, 2, 4):
        for _ in range(2):  # the second solve starts from the Newton shifts the first one found
            info = mc.solve(A, mc.Dat(d.nodes, dim, None, "x"), b, method=method, pc=pc, rtol=rtol, s=steps)
            assert info.converged, (steps, info.reason)
            assert info.iterations <= 1.2 * cg.iterations + steps, (steps, info.iterations, cg.iterations)


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("method", ["sstep-cg", "ca-cg"])
@pytest.mark.parametrize("steps", [3, 6])
def test_each_outer_iteration_sends_one_message_per_neighbour_and_reduces_once(comm, method, steps, monkeypatch):
    from test_chains_mpi import CountingComm

    counting = CountingComm(comm, monkeypatch)
    mc.reset_runtime(comm=counting)
    problem = Problem(structured_tris(12, 12), dim=1, seed=4)
    per_outer = []
    run_class = blockcg._BlockRun if method == "sstep-cg" else sstep._CACGRun
    outer = run_class.outer

    def counted(self, shifts):
        counting.sends.clear()
        reductions = self.reductions
        outcome = outer(self, shifts)
        per_outer.append((collections.Counter(dest for dest, _ in counting.sends), self.reductions - reductions))
        return outcome

    monkeypatch.setattr(run_class, "outer", counted)
    exchanged = SequencePlan.exchanged

    def counted_inside(self, error):  # compiled code started the plan's persistent requests: count its sends
        exchanged(self, error)
        ids = {id(request) for request in self.inside[0]._requests}
        counting.sends.extend(found[1:] for key, found in counting._persistent.items() if key in ids)

    monkeypatch.setattr(SequencePlan, "exchanged", counted_inside)
    with monkeypatch.context() as python_steps:  # every outer iteration from Python, counted one by one
        python_steps.setattr(blockcg._BlockRun, "outers", lambda *_: None)
        problem.solve(method, "jacobi", rtol=1e-10, s=steps)  # (the Newton shifts found)
        per_outer.clear()
        info, _ = problem.solve(method, "jacobi", rtol=1e-10, s=steps)
    assert info.converged and len(per_outer) >= 2
    for sends, reductions in per_outer:
        assert reductions == 1  # the Gram matrices, in one Allreduce
        # the basis (or, in the block form's last, the true residual's product): one message to each neighbour
        assert set(sends.values()) == {1}, sends
    full = [s for s, _ in per_outer[:-1]]
    assert all(s == full[0] for s in full)
    if method == "sstep-cg":  # several outer iterations in one compiled call: as many reductions, each basis
        counting.sends.clear()  # starting its exchange's persistent requests once: one message per neighbour
        compiled, _ = problem.solve(method, "jacobi", rtol=1e-10, s=steps)
        assert (compiled.iterations, compiled.reductions) == (info.iterations, info.reductions)
        assert counting.sends and set(collections.Counter(dest for dest, _ in counting.sends).values()) == {1}


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
             (dict(method="ca-cg", s=0), "s must be an integer from 1 to 16"),
             (dict(method="ca-cg", basis="chebyshev"), "unknown s-step basis 'chebyshev'"),
             (dict(method="cg", s=4), "options of method='sstep-cg', 'ca-cg' and 'ca-gmres'")]
    for options, message in cases:
        with pytest.raises(mc.SolverError, match=message):
            mc.solve(A, x, b, **options)
    with pytest.raises(mc.SolverError, match="assembled mc.Mat"):
        mc.solve(op, x, b, method="ca-cg")
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
    """CA-CG's monomial basis of 16 steps loses rank on a 961-node Poisson problem: the solve
    ends as a breakdown or stagnation, or creeps to maxiter and says the basis may have lost
    rank (which happens depends on rounding: on 2 ranks with NumPy 2.4 it creeps), the same on
    every rank, x finite; the Newton basis of 16 steps converges in CG's iterations."""
    mc.reset_runtime(comm=comm)
    p = poisson.declare(structured_tris(30, 30))
    for pc in (None, "jacobi"):
        cg = poisson.solve(p, method="cg", pc=pc, rtol=1e-10)
        lost = poisson.solve(p, method="ca-cg", pc=pc, rtol=1e-10, s=16, basis="monomial", maxiter=2000)
        assert not lost.converged, lost.reason
        assert (lost.reason.split(":")[0] in ("breakdown", "stagnated")  # or it crept to maxiter, and says why
                or lost.reason.startswith("diverged: maxiter") and "basis of s = 16 steps may have lost rank" in lost.reason
                and "basis='newton'" in lost.reason), lost.reason
        assert comm.allgather(lost.reason) == [lost.reason] * comm.size
        assert np.isfinite(p.u.data_ro).all() and np.isfinite(lost.true_residual)
        newton = poisson.solve(p, method="ca-cg", pc=pc, rtol=1e-10, s=16)
        assert newton.converged and abs(newton.iterations - cg.iterations) <= 2, (newton.iterations, cg.iterations)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_the_block_form_halves_s_where_its_basis_cannot_progress_and_never_claims_convergence(comm):
    """Springs of stiffness 1e-6..1e6 (condition number about 1e12): residual replacements stop
    lowering the residual, ``s`` is halved with a warning down to 1, then the solve ends as
    stagnated, the same on every rank, long before ``maxiter``, with x finite."""
    mc.reset_runtime(comm=comm)
    n = 200
    nodes, edges = mc.Set(n, "nodes"), mc.Set(n - 1, "edges")
    e2n = mc.Map(edges, nodes, 2, [[i, i + 1] for i in range(n - 1)], "e2n")
    k = mc.Dat(edges, 1, np.logspace(-6, 6, n - 1)[np.random.default_rng(0).permutation(n - 1)], "k")
    mc.partition("block", seed_set=nodes)
    A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
    spring = mc.Kernel.from_source("def spring(a, k):\n    a[0, 0] += k[0] + 1e-6\n    a[0, 1] -= k[0]\n"
                                   "    a[1, 0] -= k[0]\n    a[1, 1] += k[0] + 1e-6\n")
    mc.par_loop(spring, edges, A(mc.INC, (e2n, e2n)), k(mc.READ))
    x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.random.default_rng(1).standard_normal(n), "b")
    with pytest.warns(mc.MeshchainWarning, match="going on with s=4") as caught:
        info = mc.solve(A, x, b, method="sstep-cg", rtol=1e-10, s=8, maxiter=5000)
    assert [str(w.message).split("going on with ")[1][:3] for w in caught
            if "going on" in str(w.message)] == ["s=4", "s=2", "s=1"]
    assert not info.converged and info.reason.startswith("stagnated"), info.reason
    assert comm.allgather(info.reason) == [info.reason] * comm.size
    assert info.iterations < 1000 and np.isfinite(x.data_ro).all()


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("method", ["sstep-cg", "ca-cg"])
def test_a_matrix_keeps_its_newton_shifts_until_its_values_change(comm, method, monkeypatch):
    """The Ritz iterations run in the first solve only; the second starts from the kept shifts
    (and converges as well); a new assembly into the matrix makes the next solve find new ones."""
    mc.reset_runtime(comm=comm)
    p = poisson.declare(jittered_delaunay(300, seed=3))
    found = []
    ritz = sstep.CGRun.ritz_values

    def counted(self, count):
        found.append(count)
        return ritz(self, count)

    monkeypatch.setattr(sstep.CGRun, "ritz_values", counted)
    cg = poisson.solve(p, method="cg", pc="jacobi", rtol=1e-10)
    infos = [poisson.solve(p, method=method, pc="jacobi", rtol=1e-10, s=4) for _ in range(2)]
    assert found == [4]
    poisson.solve(p, method=method, pc="jacobi", rtol=1e-10, s=2)  # another s: its own shifts
    assert found == [4, 2]
    d = p.mesh
    bump = mc.Kernel.from_source("def bump(a):\n" + "".join(f"    a[{i}, {i}] += 0.5\n" for i in range(3)))
    mc.par_loop(bump, d.cells, p.A(mc.INC, (d.cell2node, d.cell2node)))
    infos.append(poisson.solve(p, method=method, pc="jacobi", rtol=1e-10, s=4))
    assert found == [4, 2, 4]
    for info in infos:
        assert info.converged, info.reason
        assert info.iterations <= 1.2 * cg.iterations + 4, (info.iterations, cg.iterations)


@pytest.mark.mpi(nprocs=(1,), timeout=120)
def test_a_block_that_raises_the_residual_a_hundredfold_is_undone(comm, monkeypatch):
    """On 8 nodes CG's Krylov space is exhausted after 9 iterations; the block after that
    (``s = 3``) starts from a residual of rounding noise and raised it a hundredfold before
    blocks were undone; now ``x`` and ``r`` go back and the solve converges in CG's iterations."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(8, seed=0), dim=1, seed=0)
    undone = []
    undo = blockcg._BlockRun.undo

    def counted(self):
        undone.append(self.iterations)
        return undo(self)

    monkeypatch.setattr(blockcg._BlockRun, "undo", counted)
    cg, _ = problem.solve("cg", None, rtol=1e-12)
    info, x = problem.solve("sstep-cg", None, rtol=1e-12, s=3)
    assert undone, "the case no longer raises the residual: choose another"
    assert info.converged and info.iterations <= 1.2 * cg.iterations + 3, (info.iterations, cg.iterations)
    assert relative_error(x, problem.expected) < 1e-9


def test_the_block_kernels_equal_numpys():
    """``block_sums``, ``coefficients`` (with the Cholesky factor of the last block's ``W``) and
    ``block_update`` against the formulas in NumPy on a random SPD operator; a dependent
    direction ends the block."""
    rng = np.random.default_rng(3)
    n, m, count = 50, 3, 2
    M = rng.standard_normal((n, n))
    A = M @ M.T / n + np.eye(n)
    shifts = np.array([0.3, 1.7, 1.1])
    Y = np.zeros((m + 1, n + 7))  # rows longer than the owned part, as a plan's are
    Y[0, :n] = rng.standard_normal(n)
    for j in range(m):
        Y[j + 1, :n] = A @ Y[j, :n] - shifts[j] * Y[j, :n]
    P_old = rng.standard_normal((count, n))
    AQ, w = P_old @ A, rng.uniform(0.5, 2, n)
    sums = np.empty(m * (m + 1) + count * m + 1)
    blockcg.block_sums(Y, m, AQ, count, w, True, sums)
    V, R = Y[:, :n], Y[:m, :n]
    np.testing.assert_allclose(sums[:m * (m + 1)], (R @ V.T).ravel(), rtol=1e-12)
    np.testing.assert_allclose(sums[m * (m + 1):-1], (AQ @ R.T).ravel(), rtol=1e-12)
    np.testing.assert_allclose(sums[-1], (V[0] ** 2 * w).sum(), rtol=1e-12)
    W_old = P_old @ A @ P_old.T
    old = np.linalg.cholesky(W_old)
    B, W, L, a = np.zeros((m, m)), np.zeros((m, m)), np.zeros((m, m)), np.zeros(m)
    kept = blockcg.coefficients(sums, m, count, shifts, old, B, W, L, a)
    AR = V[1:] + shifts[:, None] * R
    B_want = -np.linalg.solve(W_old, AQ @ R.T)
    P_want = R + B_want.T @ P_old
    W_want = P_want @ A @ P_want.T
    assert kept == m
    np.testing.assert_allclose(B[:count], B_want, rtol=1e-9)
    np.testing.assert_allclose(W, W_want, rtol=1e-9, atol=1e-9 * np.abs(W_want).max())
    np.testing.assert_allclose(a, np.linalg.solve(W_want, R @ V[0]), rtol=1e-8)  # g = Rᵀ r: r ⟂ P_old in CG
    P, AQn = np.empty((m, n)), np.empty((m, n))
    x, r = rng.standard_normal(n), rng.standard_normal(n)
    x0, r0 = x.copy(), r.copy()
    blockcg.block_update(Y, shifts, m, P_old, AQ, count, B, a, P, AQn, x, r)
    np.testing.assert_allclose(P, P_want, rtol=1e-9)
    np.testing.assert_allclose(AQn, AR + B[:count].T @ AQ, rtol=1e-12)
    np.testing.assert_allclose(AQn, P_want @ A, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(x, x0 + P.T @ a, rtol=1e-12)
    np.testing.assert_allclose(r, r0 - AQn.T @ a, rtol=1e-12)
    dependent = np.array([[4.0, 2.0, 1.0], [2.0, 1.0, 0.5], [1.0, 0.5, 3.0]])  # second row: half the first
    assert blockcg.cholesky(dependent, 3, np.zeros((3, 3))) == 1


@pytest.mark.parametrize("m, count, kept", [(1, 0, 1), (2, 1, 2), (3, 2, 3), (3, 3, 2), (4, 4, 4), (5, 5, 5),
                                           (7, 6, 7), (8, 8, 8), (8, 8, 3), (9, 7, 9), (11, 10, 11), (12, 12, 12)])
def test_the_block_kernels_take_old_directions_in_groups_with_the_bits_of_one_pass_per_operation(m, count, kept):
    """``block_update`` adds the old directions four (then two, then one) at a time in one pass
    each, with ``p`` and ``q`` made in the first and ``x`` and ``r`` updated in the last: every
    entry gets the operations of one pass per operation, in the same order (NumPy's, below),
    bit for bit, with the solver's shapes (``s`` rows of old directions and of ``B``, of which
    ``count`` are used; ``kept`` new directions, fewer where ``W``'s factor ended early);
    ``block_sums``, taking up to four products per pass, equals NumPy's."""
    rng = np.random.default_rng(m * 256 + count * 16 + kept)
    n = 37
    Y, shifts = rng.standard_normal((m + 1, n + 5)), rng.standard_normal(m)
    P_old, AQ_old = rng.standard_normal((m, n)), rng.standard_normal((m, n))
    B, a = rng.standard_normal((m, m)), rng.standard_normal(m)
    x, r = rng.standard_normal(n), rng.standard_normal(n)
    want_x, want_r = x.copy(), r.copy()
    want_P, want_AQ = np.full((m, n), np.nan), np.full((m, n), np.nan)
    for j in range(kept):
        p, q = Y[j, :n].copy(), Y[j + 1, :n] + shifts[j] * Y[j, :n]
        for k in range(count):
            p += B[k, j] * P_old[k]
            q += B[k, j] * AQ_old[k]
        want_x += a[j] * p
        want_r -= a[j] * q
        want_P[j], want_AQ[j] = p, q
    P, AQ = np.full((m, n), np.nan), np.full((m, n), np.nan)
    blockcg.block_update(Y, shifts, kept, P_old, AQ_old, count, B, a, P, AQ, x, r)
    for got, want in ((P, want_P), (AQ, want_AQ), (x, want_x), (r, want_r)):
        assert np.array_equal(got.view(np.int64), want.view(np.int64))  # (the directions not kept untouched)
    w = rng.uniform(0.5, 2.0, n)
    sums = np.full(m * (m + 1) + count * m + 1, np.nan)
    blockcg.block_sums(Y, m, AQ_old, count, w, True, sums)
    V, R = Y[:, :n], Y[:m, :n]
    np.testing.assert_allclose(sums[:m * (m + 1)], (R @ V.T).ravel(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sums[m * (m + 1):-1], (AQ_old[:count] @ R.T).ravel(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sums[-1], (V[0] ** 2 * w).sum(), rtol=1e-12)


def test_the_block_sums_are_accurate_on_long_rows():
    """``block_sums`` adds its vectorised partial sums with Kahan's compensation: on 2^18
    entries of nearly equal products, where one running sum per lane drifts (4e-13 relative
    before; 1e-13 with the compensation undone by a fast-math caller's flag), every sum is
    within 1e-15 of the exact sum of its products (``math.fsum``)."""
    import math

    n, m, count = 1 << 18, 4, 4
    rng = np.random.default_rng(0)
    Y = np.full((m + 1, n + 3), 0.1) * rng.uniform(0.999, 1.001, (m + 1, 1))
    AQ, w = np.full((count, n), 0.3), np.full(n, 2.0)
    sums = np.empty(m * (m + 1) + count * m + 1)
    blockcg.block_sums(Y, m, AQ, count, w, True, sums)
    V = Y[:, :n]
    exact = [math.fsum(V[a] * V[c]) for a in range(m) for c in range(m + 1)]
    exact += [math.fsum(AQ[k] * V[a]) for k in range(count) for a in range(m)]
    np.testing.assert_allclose(sums[:-1], exact, rtol=1e-15, atol=0)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=600)
@pytest.mark.parametrize("pc", [None, "jacobi"])
def test_a_matrix_free_operator_runs_the_block_form_with_one_chain_per_basis(comm, pc):
    """A LinearOperator's block s-step CG: SciPy's solution, the assembled matrix's iterations
    (within one block), each basis one communication-avoiding chain with one grouped exchange;
    ``s="auto"`` is refused for it."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(60, seed=5), dim=2, seed=3)
    op = matrix_free(problem, 2)
    assembled, _ = problem.solve("sstep-cg", pc, rtol=1e-10, s=3)
    problem.x.data[...] = 0.0
    info = mc.solve(op, problem.x, problem.b, method="sstep-cg", pc=pc, rtol=1e-10, s=3)
    x = problem.x.gather()
    assert info.converged, info.reason
    assert abs(info.iterations - assembled.iterations) <= 3, (info.iterations, assembled.iterations)
    if comm.rank == 0:
        assert relative_error(x, problem.expected) < 1e-8
    chain = mc.stats().chains["element-by-element.sstep-basis3"]
    if comm.size > 1:
        assert chain.mode == "ca" and chain.segments == chain.executions  # one grouped exchange per basis
    with pytest.raises(mc.SolverError, match="s='auto' measures the costs of an assembled mc.Mat"):
        mc.solve(op, problem.x, problem.b, method="sstep-cg", s="auto")
    with pytest.raises(mc.SolverError, match="assembled mc.Mat"):
        mc.solve(op, problem.x, problem.b, method="ca-cg")


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
@pytest.mark.parametrize("method", ["sstep-cg", "ca-cg"])
def test_a_zero_first_guess_starts_without_a_product_and_gives_the_same_bits(comm, method, monkeypatch):
    """x = 0 on every rank: the first residual is b, with no exchange or product, and the solve
    gives the bits of one started from ``b - A 0``; x nonzero on one rank only: every rank
    computes the residual (the decision is the same everywhere) and the solve still converges.
    On several ranks the block reductions are summed by recursive doubling (the block form's
    from its compiled outer iterations), the lone norms by ``MPI_Allreduce``; the block form
    reduces the last residual's norm with the true residual's (three numbers)."""
    from meshchain.comm import pairwise

    mc.reset_runtime(comm=comm)
    problem = Problem(structured_tris(9, 9), dim=1, seed=3)
    starting, residuals = [False], []
    start, residual = sstep.CGRun.start, sstep.CGRun.residual

    def counted_start(self):
        starting[0] = True
        try:
            return start(self)
        finally:
            starting[0] = False

    def counted_residual(self, into):
        if starting[0]:
            residuals.append(into)
        residual(self, into)

    problem.solve(method, "jacobi", rtol=1e-10, s=4)  # the Newton shifts found: the solves below reuse them
    monkeypatch.setattr(sstep.CGRun, "start", counted_start)
    monkeypatch.setattr(sstep.CGRun, "residual", counted_residual)
    summed, pairwise_sum = [], pairwise.pairwise_sum

    def counted_sum(comm_, values):
        summed.append(len(values))
        return pairwise_sum(comm_, values)

    monkeypatch.setattr(pairwise, "pairwise_sum", counted_sum)
    outers = blockcg._BlockRun.outers

    def counted_outers(self, shifts, best, idle, recent):  # outer iterations in compiled code: a block's sums each
        reductions = self.reductions
        found = outers(self, shifts, best, idle, recent)
        summed.extend([self.steps * (self.steps + 1) + 1] * (self.reductions - reductions))
        return found

    monkeypatch.setattr(blockcg._BlockRun, "outers", counted_outers)
    info, x = problem.solve(method, "jacobi", rtol=1e-10, s=4)
    assert info.converged and residuals == []
    if comm.size > 1:  # each block's sums (at least s numbers) pairwise; one-number norms by MPI_Allreduce
        assert summed and max(summed) >= 4 and min(summed) >= 2 and len(summed) <= info.reductions
        # the block form's last norm (its rate said converged) with the true residual's two, in one reduction
        assert method == "ca-cg" or 3 in summed

    def always_a_product(self):  # the start before: r = b - A x whatever x is (its norm summed alike)
        self.residual("r")
        sums = self.total(np.array([sstep._weighted_dot(self.v["r"], self.v["weight"]), 1.0]))
        np.copyto(self.v["p"], self.v["r"])
        self.fresh("p")
        return float(np.sqrt(max(float(sums[0]), 0.0)))

    monkeypatch.setattr(sstep.CGRun, "start", always_a_product)
    before, x_before = problem.solve(method, "jacobi", rtol=1e-10, s=4)
    if comm.rank == 0:
        assert np.array_equal(x, x_before)
    assert info.residual_history == before.residual_history

    monkeypatch.setattr(sstep.CGRun, "start", counted_start)
    problem.x.data[...] = 0.0
    if comm.rank == 0:
        problem.x.data[0] = 1.0
    info = mc.solve(problem.A, problem.x, problem.b, method=method, pc="jacobi", rtol=1e-10, s=4)
    assert info.converged and residuals == ["r"]


@pytest.mark.mpi(nprocs=3, timeout=300)
@pytest.mark.parametrize("method", ["sstep-cg", "ca-cg", "ca-gmres"])
def test_a_rank_that_owns_no_row_exchanges_the_scaling_with_the_others(comm, method):
    """``structured_quads(3, 2)`` on 3 ranks: one rank owns no row, so its owned part of the
    Jacobi scaling never changes. Whether the scaling's halo is stale is decided alike on every
    rank; it was decided from the rank's own values, so that rank skipped the exchange the
    others made, and its next exchange received their messages (MPI_ERR_TRUNCATE, all aborted)."""
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(3, 2), dim=1, seed=0)
    assert 0 in comm.allgather(len(problem.x.data_ro))  # the case this test is about
    for steps in (1, 2, 1):  # a new solve of the same matrix: the scaling is kept, not exchanged again
        info, x = problem.solve(method, "jacobi", rtol=1e-10, s=steps)
        assert info.converged, info.reason
        close_on_rank_0(comm, x, problem.expected)
