"""Krylov methods on SPD-by-construction FEM matrices: every method and preconditioner
reaches SciPy's direct solution on 1-4 ranks, N ranks take the iterations 1 rank takes (±1)
and give its solution to round-off; breakdowns and bad input are reported, never hidden."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import scipy.sparse.linalg as spla
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.apps import poisson
from meshchain.linalg.recovery import FALSE_CONVERGENCE_FACTOR
from meshchain.meshes import jittered_delaunay, structured_quads, structured_tris
from test_mat import copy_kernel, reference

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

METHODS = ("cg", "cg1", "pipecg", "groppcg", "pipecr")


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def spd_blocks(ncell: int, width: int, seed: int, shift: float = 0.2) -> np.ndarray:
    """Element matrices ``M^T M + shift I``: symmetric positive definite (for ``shift > 0``)."""
    m = np.random.default_rng(seed).standard_normal((ncell, width, width))
    return np.einsum("eki,ekj->eij", m, m) + shift * np.eye(width)[None]


class Problem:
    """An assembled SPD problem on ``mesh`` with a random right-hand side."""

    def __init__(self, mesh, *, dim: int = 1, seed: int = 0, shift: float = 0.2, method: str = "kway"):
        d = self.mesh = mesh.declare()
        width = d.cell2node.arity * dim
        self.blocks = spd_blocks(mesh.ncell, width, seed, shift)
        k = self.k = mc.Dat(d.cells, width * width, self.blocks.reshape(mesh.ncell, -1), "k")
        rhs = np.random.default_rng(seed + 7).standard_normal((mesh.nnode, dim))
        self.b = mc.Dat(d.nodes, dim, rhs, "b")
        self.x = mc.Dat(d.nodes, dim, None, "x")
        mc.partition(method, coords=d.coords, seed_set=d.cells, seed=seed)
        self.A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A", dim=dim)
        mc.par_loop(copy_kernel(width, width), d.cells, self.A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
        self.expected = spla.spsolve(reference(mesh.cells, self.blocks, mesh.nnode, dim).tocsc(), rhs.ravel())

    def solve(self, method, pc, **options):
        self.x.data[...] = 0.0
        info = mc.solve(self.A, self.x, self.b, method=method, pc=pc, **options)
        return info, self.x.gather()


def solve_all(mesh, dim, seed, pcs, rtol):
    problem = Problem(mesh, dim=dim, seed=seed)
    return problem, {(m, pc): problem.solve(m, pc, rtol=rtol) for m in METHODS for pc in pcs}


MESHES = st.one_of(st.builds(jittered_delaunay, st.integers(8, 60), seed=st.integers(0, 99)),
                   st.builds(structured_quads, st.integers(2, 7), st.integers(2, 7)))


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_every_method_reaches_the_direct_solution_with_the_iterations_of_one_rank(comm, mesh, dim, seed):
    mc.reset_runtime(comm=self_comm())
    _, serial = solve_all(mesh, dim, seed, (None, "jacobi"), 1e-10)
    mc.reset_runtime(comm=comm)
    problem, distributed = solve_all(mesh, dim, seed, (None, "jacobi"), 1e-10)
    scale = np.linalg.norm(problem.expected)
    for key, (info, x) in distributed.items():
        one, x_one = serial[key]
        assert info.converged and one.converged, (key, info.reason, one.reason)
        assert abs(info.iterations - one.iterations) <= 1, (key, info.iterations, one.iterations)
        assert len(info.residual_history) == info.iterations + 1
        if comm.rank == 0:
            np.testing.assert_allclose(x.ravel(), problem.expected, atol=1e-6 * scale, err_msg=str(key))
            np.testing.assert_allclose(x.ravel(), x_one.ravel(), atol=1e-8 * scale, err_msg=str(key))


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("dim", [1, 2])
def test_rank_local_sgs_converges_to_the_direct_solution(comm, dim):
    mc.reset_runtime(comm=comm)
    problem, results = solve_all(jittered_delaunay(40, seed=3), dim, 11, ("sgs",), 1e-10)
    for key, (info, x) in results.items():
        assert info.converged, (key, info.reason)
        if comm.rank == 0:
            np.testing.assert_allclose(x.ravel(), problem.expected, atol=1e-6 * np.linalg.norm(problem.expected))
    plain = problem.solve("cg", "jacobi", rtol=1e-10)[0]
    assert results[("cg", "sgs")][0].iterations < plain.iterations  # it preconditions


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_residual_replacement_reaches_the_accuracy_plain_pipecg_cannot(comm):
    """At ``rtol=1e-14`` plain PIPECG's recurrences drift from ``b - A x``: without residual
    replacement it reaches the tolerance only by restarting (``linalg/recovery.py``), with it
    (on by default for a Mat) it needs no restart; both end with the true residual within
    the factor of the tolerance that ``converged`` promises, as classical CG does."""
    mc.reset_runtime(comm=comm)
    p = poisson.declare(structured_tris(32, 32))
    plain = poisson.solve(p, method="pipecg", pc="jacobi", rtol=1e-14, residual_replacement=False)
    replaced = poisson.solve(p, method="pipecg", pc="jacobi", rtol=1e-14, residual_replacement=True)
    default = poisson.solve(p, method="pipecg", pc="jacobi", rtol=1e-14)
    classical = poisson.solve(p, method="cg", pc="jacobi", rtol=1e-14)
    assert replaced.replacements >= 1 and replaced.restarts == 0, (replaced.replacements, replaced.restarts)
    assert (default.iterations, default.replacements) == (replaced.iterations, replaced.replacements)
    assert plain.replacements == 0 and plain.restarts >= 1, (plain.replacements, plain.restarts, plain.reason)
    target = 1e-14 * replaced.residual_history[0]
    for info in (plain, replaced, classical):
        assert info.converged, (info.method, info.reason)
        assert info.true_residual_preconditioned <= FALSE_CONVERGENCE_FACTOR * target, info.true_residual_preconditioned
    # the replacements inside compiled calls, as the Python loop (a monitor makes it run) does them, bit for bit
    for option in (True, False, None):
        inside = poisson.solve(p, method="pipecg", pc="jacobi", rtol=1e-14, residual_replacement=option)
        loop = poisson.solve(p, method="pipecg", pc="jacobi", rtol=1e-14, residual_replacement=option,
                             monitor=lambda i, norm: None)
        assert inside.residual_history == loop.residual_history and inside.true_residual == loop.true_residual
        assert (inside.iterations, inside.replacements, inside.restarts, inside.reductions) == \
            (loop.iterations, loop.replacements, loop.restarts, loop.reductions)


def compiled_exchanges(matrices, A) -> list:
    """The compiled iterations' halo exchanges kept with ``A``'s pattern."""
    return [exchange for key, (_, exchange) in matrices.pattern(A).exchanges.items() if isinstance(key, tuple)]


@pytest.mark.mpi(nprocs=2, timeout=300)
def test_compiled_iterations_keep_their_halo_exchange_with_the_matrix(comm):
    """On several ranks the iterations inside compiled calls exchange the operator's input
    (``p``), and the start's and the exit's products ``x``, through persistent requests made at
    the first solve and kept with the matrix (two: one per message tag, ``p``'s and that of the
    method's first work vector, ``r``, which the products outside the iterations use): the next
    solve starts the same ones, also for another ``x``. Halo layers
    added (an s-step solve's matrix powers) move the matrix to the new layout and free them;
    the next solve makes new ones and reaches the answer a fresh runtime reaches."""
    mc.reset_runtime(comm=comm)
    p = poisson.declare(structured_tris(16, 16))
    matrices = mc.get_runtime().surface.matrices
    first = poisson.solve(p, method="cg")
    kept = compiled_exchanges(matrices, p.A)
    assert len(kept) == 2 and all(len(e.requests) > 0 for e in kept), kept
    again = poisson.solve(p, method="cg")
    assert compiled_exchanges(matrices, p.A) == kept and again.residual_history == first.residual_history
    for _ in range(3):  # a new x each time: no new exchange
        assert mc.solve(p.A, mc.Dat(p.u.dataset, 1, None, "u again"), p.b, method="cg", rtol=1e-10).converged
    assert compiled_exchanges(matrices, p.A) == kept
    assert poisson.solve(p, method="sstep-cg", s=3).converged  # three halo layers: the matrix moves
    assert all(len(e.requests) == 0 for e in kept) and compiled_exchanges(matrices, p.A) == []
    after = poisson.solve(p, method="cg")
    x = p.u.gather()
    assert len(compiled_exchanges(matrices, p.A)) == 2 and after.iterations == first.iterations
    mc.reset_runtime(comm=comm)
    fresh = poisson.declare(structured_tris(16, 16))
    poisson.solve(fresh, method="cg")
    expected = fresh.u.gather()
    if comm.rank == 0:
        np.testing.assert_allclose(x, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_default_replacement_waits_until_the_tolerance_is_within_reach_of_rounding(comm):
    """PETSc's criterion (``residual_replacement=True``) replaces whenever the gap estimate
    crosses ``sqrt(eps)`` times the residual, also at ``rtol=1e-8`` where the estimate stays
    far below the target; the default replaces only where the estimate reaches
    ``TARGET_FRACTION`` of the target. At ``1e-8`` it makes no replacement, and its solve is the
    plain recurrence's (the same iterations and norms), whose true residual meets the
    tolerance; nearer rounding (``1e-13``) it replaces, and the true residual meets it too."""
    mc.reset_runtime(comm=comm)
    p = poisson.declare(structured_tris(24, 24))
    for rtol in (1e-8, 1e-13):
        petsc = poisson.solve(p, method="pipecg", pc="jacobi", rtol=rtol, residual_replacement=True)
        default = poisson.solve(p, method="pipecg", pc="jacobi", rtol=rtol)
        plain = poisson.solve(p, method="pipecg", pc="jacobi", rtol=rtol, residual_replacement=False)
        target = rtol * default.residual_history[0]
        for info in (petsc, default, plain):
            assert info.converged, (rtol, info.reason)
            assert info.true_residual_preconditioned <= FALSE_CONVERGENCE_FACTOR * target, (rtol, info.replacements)
        assert petsc.replacements >= 1, rtol
        if rtol == 1e-8:
            assert default.replacements == 0 and default.restarts == 0, (default.replacements, default.restarts)
            assert default.residual_history == plain.residual_history and default.iterations == plain.iterations
        else:
            assert default.replacements >= 1 and default.restarts == 0, (default.replacements, default.restarts)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
@pytest.mark.parametrize("method", METHODS)
def test_indefinite_and_singular_matrices_do_not_claim_convergence(comm, method):
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(5, 5), seed=4, shift=-1.5)  # element matrices with negative eigenvalues
    info, x = problem.solve(method, None, rtol=1e-10, maxiter=200)
    if info.converged:  # allowed only with the right answer
        assert info.true_residual <= 1e-6 * np.linalg.norm(problem.b.gather() if comm.rank == 0 else 1.0)
    else:
        assert info.reason.startswith(("indefinite", "diverged")), info.reason
    mc.reset_runtime(comm=comm)
    singular = Problem(structured_quads(4, 4), seed=5, shift=0.0)  # M^T M of 4x4 blocks: still SPD, so
    singular.A.zero_rows([3], diagonal=0.0)  # a zero row makes it singular (and b has a value there)
    info, _ = singular.solve(method, None, rtol=1e-12, maxiter=300)
    assert not info.converged, info.reason
    assert info.reason.startswith(("indefinite", "diverged", "stagnated")), info.reason


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=600)
@settings(max_examples=18, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), shift=st.sampled_from([0.2, -1.5]),
       pc=st.sampled_from([None, "jacobi", "bjacobi-ilu", "sgs"]), maxiter=st.sampled_from([0, 1, 3, 10000]),
       rtol=st.sampled_from([1e-10, 1e-3]),
       method=st.sampled_from(["cg", "cg1", "pipecg", "pipecr", "groppcg", "bicgstab", "gmres", "pipebicgstab",
                                "pipegmres"]))
def test_cg_inside_compiled_calls_equals_the_python_loop_bit_for_bit(comm, mesh, dim, seed, shift, pc, maxiter, rtol,
                                                                    method):
    """``cg``, ``cg1``, ``pipecg``, ``pipecr``, ``groppcg``, ``bicgstab``, ``pipebicgstab``, ``gmres`` and
    ``pipegmres`` (a cycle per call; restart 5 here, so that solves restart) run their iterations
    inside compiled calls (the nonsymmetric ones, ``cg`` and ``groppcg`` with ILU(0) and SGS too; the
    others with them run the Python loop both times)
    (``linalg/compiled.py``; on
    several ranks with MPI called from them); a monitor makes them
    run the Python loop (and the true residual at exit by its Python steps, not
    ``compiled.true_residual_sums``): iterates, norms, reason and counts are the same on every rank, for SPD
    and indefinite matrices, converged, stopped by maxiter, refused or broken down (Jacobi on
    a diagonal with a negative entry is refused before iterating, the same way both times). The
    monitor saw every norm recorded, but where a restart (or a new GMRES cycle) replaced one by
    the true residual's."""
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed, shift=shift)
    seen, refusals = [], []
    outcomes = []
    options = {"restart": 5} if method.endswith("gmres") else {}
    for monitor in (None, lambda i, norm: seen.append((i, norm))):
        try:
            outcomes.append(problem.solve(method, pc, rtol=rtol, maxiter=maxiter, monitor=monitor, **options))
        except mc.errors.SolverError as exc:
            refusals.append(str(exc))
    if refusals:
        assert len(refusals) == 2 and refusals[0] == refusals[1], refusals
        assert shift < 0 and ("positive diagonal" in refusals[0] and pc in ("jacobi", "sgs")
                              or "zero pivot" in refusals[0] and pc == "bjacobi-ilu"), (pc, refusals[0])
        return
    (inside, x_inside), (loop, x_loop) = outcomes
    assert inside.residual_history == loop.residual_history
    assert [i for i, _ in seen] == list(range(len(loop.residual_history)))
    # a GMRES cycle's first norm is its true residual's, which replaces the last cycle's estimate
    replaced = set(range(options["restart"], len(seen), options["restart"])) if options else set()
    if not loop.restarts:
        assert [norm for k, norm in enumerate(loop.residual_history) if k not in replaced] == \
            [norm for k, (_, norm) in enumerate(seen) if k not in replaced]
    assert (inside.iterations, inside.reason, inside.reductions) == (loop.iterations, loop.reason, loop.reductions)
    assert inside.true_residual == loop.true_residual
    if comm.rank == 0:
        np.testing.assert_array_equal(x_inside, x_loop)


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_compiled_iterations_on_ranks_without_halo_columns_keep_the_python_loops_bits(comm, monkeypatch):
    """Two meshes apart, one per rank: no rank's matrix has a halo column, so the compiled
    iterations make each product, and the sums made in its pass (``csr_product_dot``,
    ``csr_product_dots``, ``csr_product_scaled_dots``), while the (empty) exchange is in flight.
    The iterates and norms are the Python loop's, bit for bit."""
    from meshchain.meshes.generators import UnstructuredMesh

    solve_module = importlib.import_module("meshchain.linalg.solve")
    halos = []
    inside = solve_module.SolveRun._inside

    def spy(run, *args):
        found = inside(run, *args)
        halos.append(None if found is None else bool(found[-1]))
        return found

    monkeypatch.setattr(solve_module.SolveRun, "_inside", spy)
    one = structured_quads(6, 6)
    apart = UnstructuredMesh.from_cells(np.vstack([one.coords, one.coords + [10.0, 0.0]]),
                                        np.vstack([one.cells, one.cells + one.nnode]), one.cell_type)
    mc.reset_runtime(comm=comm)
    problem = Problem(apart, seed=3)
    for method, pc in (("cg", None), ("cg", "jacobi"), ("cg1", "jacobi"), ("pipecg", "jacobi"), ("pipecr", "jacobi"),
                       ("groppcg", "jacobi"), ("groppcg", "bjacobi-ilu"), ("bicgstab", "jacobi"),
                       ("bicgstab", "bjacobi-ilu")):
        compiled, x_compiled = problem.solve(method, pc, rtol=1e-10)
        assert halos[-1] is False, (method, pc, halos)  # compiled, with no halo column on this rank
        loop, x_loop = problem.solve(method, pc, rtol=1e-10, monitor=lambda i, norm: None)
        assert compiled.converged and compiled.iterations > 3, (method, pc, compiled.iterations)
        assert compiled.residual_history == loop.residual_history, (method, pc)
        assert compiled.reductions == loop.reductions
        if comm.rank == 0:
            np.testing.assert_array_equal(x_compiled, x_loop)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_the_cg_family_makes_no_product_or_sum_in_python(comm, monkeypatch):
    """With an assembled matrix and a compiled preconditioner the CG family's solves make no product
    and no sum over ranks from Python: their starts (``linalg/starts.py``), iterations and true
    residuals at exit run in compiled calls, so no rank waits for another's Python between two of
    them. A monitor makes them run their Python steps (the reference the bit-for-bit tests compare
    with), which do."""
    solve_module = importlib.import_module("meshchain.linalg.solve")
    calls = []

    def spy(name):
        original = getattr(solve_module.SolveRun, name)
        return lambda run, *args, **options: calls.append(name) or original(run, *args, **options)

    for name in ("A", "start", "wait", "reduce"):
        monkeypatch.setattr(solve_module.SolveRun, name, spy(name))
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(7, 7), seed=6)
    for method, pc in (("cg", "jacobi"), ("cg1", "jacobi"), ("pipecg", "jacobi"), ("pipecr", None),
                       ("groppcg", "jacobi"), ("groppcg", "bjacobi-ilu")):
        options = {"residual_replacement": False} if method == "pipecg" else {}  # a replacement multiplies
        calls.clear()
        compiled, x_compiled = problem.solve(method, pc, rtol=1e-10, **options)
        assert compiled.converged and calls == [], (method, pc, calls)
        calls.clear()
        loop, x_loop = problem.solve(method, pc, rtol=1e-10, monitor=lambda i, norm: None, **options)
        assert "A" in calls and ("reduce" in calls or "start" in calls), (method, pc, calls)
        assert compiled.residual_history == loop.residual_history and compiled.reductions == loop.reductions
        if comm.rank == 0:
            np.testing.assert_array_equal(x_compiled, x_loop)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("method", ["cg", "cg1", "pipecg", "pipecr", "groppcg"])
def test_long_solves_run_inside_compiled_calls_in_several_parts(comm, monkeypatch, method):
    """More iterations than one compiled call runs (``INSIDE_ITERATIONS``): the parts join up
    (cg1's, pipecg's and pipecr's first iteration ends in Python after their compiled start,
    their compiled iterations run from the second)."""
    from meshchain.linalg import krylov

    calls = []
    pipelined = method.startswith("pipe") or method == "groppcg"  # one function, one process or several
    name = f"{method}_iterations" if comm.size == 1 or pipelined else f"{method}_iterations_on_ranks"
    iterate = getattr(krylov, name)
    monkeypatch.setattr(krylov, "INSIDE_ITERATIONS", 5)
    monkeypatch.setattr(krylov, name, lambda *args: calls.append(1) or iterate(*args))
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(9, 9), seed=2)
    options = {"residual_replacement": False} if method == "pipecg" else {}  # a replacement ends a call early
    inside, x_inside = problem.solve(method, None, rtol=1e-12, **options)
    made = len(calls)
    loop, x_loop = problem.solve(method, None, rtol=1e-12, monitor=lambda i, norm: None, **options)
    assert inside.iterations > 3 * krylov.INSIDE_ITERATIONS and inside.converged
    assert made == -(-inside.iterations // krylov.INSIDE_ITERATIONS) and len(calls) == made  # the monitor: Python
    assert inside.residual_history == loop.residual_history and inside.reductions == loop.reductions
    if comm.rank == 0:
        np.testing.assert_array_equal(x_inside, x_loop)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_long_bicgstab_solves_run_inside_compiled_calls_in_several_parts(comm, monkeypatch):
    """BiCGStab's compiled iterations (``bicgstab_iterations``) over more iterations than one
    call runs: the parts join up, with the Python loop's bits."""
    from meshchain.linalg import nonsymmetric

    calls = []
    iterate = nonsymmetric.bicgstab_iterations
    monkeypatch.setattr(nonsymmetric, "INSIDE_ITERATIONS", 3)
    monkeypatch.setattr(nonsymmetric, "bicgstab_iterations", lambda *args: calls.append(1) or iterate(*args))
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(9, 9), seed=2)
    inside, x_inside = problem.solve("bicgstab", "jacobi", rtol=1e-12)
    made = len(calls)
    loop, x_loop = problem.solve("bicgstab", "jacobi", rtol=1e-12, monitor=lambda i, norm: None)
    assert inside.iterations > 3 * nonsymmetric.INSIDE_ITERATIONS and inside.converged
    assert made == -(-inside.iterations // nonsymmetric.INSIDE_ITERATIONS) and len(calls) == made
    assert inside.residual_history == loop.residual_history and inside.reductions == loop.reductions
    if comm.rank == 0:
        np.testing.assert_array_equal(x_inside, x_loop)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("restart", [4, 30])
@pytest.mark.parametrize("method", ["gmres", "pipegmres"])
def test_gmres_cycles_inside_compiled_calls_equal_the_python_loop(comm, monkeypatch, restart, method):
    """GMRES and p(1)-GMRES run each cycle as one compiled call (``gmres_cycle``,
    ``pipegmres_cycle``): over many restarts, with no preconditioner, Jacobi and ILU(0), the
    iterates, norms and reductions of their Python loops (which a monitor makes them run), bit
    for bit."""
    from meshchain.linalg import nonsymmetric

    calls = []
    compiled = nonsymmetric._called_inside
    monkeypatch.setattr(nonsymmetric, "_called_inside", lambda *args: calls.append(1) or compiled(*args))
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(40, seed=3), dim=2, seed=4)
    for pc in (None, "jacobi", "bjacobi-ilu"):
        calls.clear()
        inside, x_inside = problem.solve(method, pc, rtol=1e-10, restart=restart)
        made = len(calls)
        assert made == -(-inside.iterations // restart), (pc, made)  # a compiled call per cycle
        loop, x_loop = problem.solve(method, pc, rtol=1e-10, restart=restart, monitor=lambda i, norm: None)
        assert len(calls) == made, pc  # the monitor: the Python loop
        restarts = 1 if pc == "bjacobi-ilu" else 3  # ILU(0) needs 8 iterations here
        assert inside.converged and (restart > 4 or inside.iterations > restarts * restart), (pc, inside.iterations)
        assert inside.residual_history == loop.residual_history, pc
        assert (inside.iterations, inside.reductions) == (loop.iterations, loop.reductions), pc
        if comm.rank == 0:
            np.testing.assert_array_equal(x_inside, x_loop)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_pipelined_bicgstab_inside_compiled_calls_replaces_its_residual_as_the_python_loop(comm, monkeypatch):
    """Pipelined BiCGStab's compiled iterations stop for PETSc's periodic residual replacement
    (iteration 101 here) and at every ``INSIDE_ITERATIONS``: the Python loop's bits throughout."""
    from meshchain.apps import advection_diffusion as ad
    from meshchain.linalg import nonsymmetric

    monkeypatch.setattr(nonsymmetric, "INSIDE_ITERATIONS", 7)
    mc.reset_runtime(comm=comm)
    problem = ad.declare(structured_tris(30, 30), peclet=1.0)
    options = dict(method="pipebicgstab", pc=None, rtol=1e-300, maxiter=130)  # on past rounding level
    inside = ad.solve(problem, **options)
    x_inside = problem.x.gather()
    loop = ad.solve(problem, **options, monitor=lambda i, norm: None)
    assert inside.iterations > 101, (inside.iterations, inside.reason)
    assert inside.residual_history == loop.residual_history
    assert (inside.iterations, inside.reductions) == (loop.iterations, loop.reductions)
    x_loop = problem.x.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(x_inside, x_loop)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("method", ["bicgstab", "pipebicgstab"])
def test_bicgstab_with_ilu_inside_compiled_calls_equals_the_python_loop(comm, monkeypatch, method):
    """BiCGStab and pipelined BiCGStab apply ``"bjacobi-ilu"`` (each rank's ILU(0)) inside their
    compiled calls, over several calls, on the advection-diffusion operator: the Python loop's
    bits."""
    from meshchain.apps import advection_diffusion as ad
    from meshchain.linalg import nonsymmetric

    calls = []
    compiled = nonsymmetric._called_inside
    monkeypatch.setattr(nonsymmetric, "_called_inside", lambda *args: calls.append(1) or compiled(*args))
    monkeypatch.setattr(nonsymmetric, "INSIDE_ITERATIONS", 2)
    mc.reset_runtime(comm=comm)
    problem = ad.declare(jittered_delaunay(300, seed=5), peclet=100.0)
    options = dict(method=method, pc="bjacobi-ilu", rtol=1e-10)
    inside = ad.solve(problem, **options)
    x_inside, made = problem.x.gather(), len(calls)
    loop = ad.solve(problem, **options, monitor=lambda i, norm: None)
    assert inside.converged and made >= 3 and len(calls) == made, (inside.reason, made)
    assert inside.residual_history == loop.residual_history
    assert (inside.iterations, inside.reductions) == (loop.iterations, loop.reductions)
    x_loop = problem.x.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(x_inside, x_loop)


def matrix_free(problem, dim):
    """The problem's operator as a LinearOperator: y = 0, then y[c2n] += K_e x[c2n] per cell."""
    d, width = problem.mesh, problem.mesh.cell2node.arity * dim
    arity = d.cell2node.arity
    lines = ["def element_apply(y, x, k):"]
    for i in range(width):
        terms = " + ".join(f"k[{i * width + j}] * x[{j // dim}, {j % dim}]" for j in range(width))
        lines.append(f"    y[{i // dim}, {i % dim}] += {terms}")
    element = mc.Kernel.from_source("\n".join(lines) + "\n")
    clear = mc.Kernel.from_source("def clear(y):\n" + "".join(f"    y[{c}] = 0.0\n" for c in range(dim)))
    assert arity * dim == width

    def apply(x, y):
        mc.par_loop(clear, d.nodes, y(mc.WRITE))
        mc.par_loop(element, d.cells, y(mc.INC, d.cell2node), x(mc.READ, d.cell2node), problem.k(mc.READ))

    diagonal = mc.Dat(d.nodes, dim, None, "diagonal")
    problem.A.diagonal(diagonal)
    return mc.LinearOperator(d.nodes, apply, dim=dim, diagonal=diagonal, name="element-by-element")


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("method", METHODS)
def test_matrix_free_operator_solves_like_the_assembled_matrix(comm, method):
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(30, seed=2), dim=2, seed=9)
    assembled, x_assembled = problem.solve(method, "jacobi", rtol=1e-10)
    op = matrix_free(problem, 2)
    problem.x.data[...] = 0.0
    free = mc.solve(op, problem.x, problem.b, method=method, pc="jacobi", rtol=1e-10)
    x_free = problem.x.gather()
    assert free.converged, free.reason
    applied = mc.stats().chains["element-by-element.apply"]  # its apply captured, then replayed
    assert applied.executions >= free.iterations and applied.loops == 2 * applied.executions, applied
    assert abs(free.iterations - assembled.iterations) <= 1
    if comm.rank == 0:
        np.testing.assert_allclose(x_free, x_assembled, atol=1e-8 * np.linalg.norm(x_assembled))


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=200)
@pytest.mark.parametrize("method", ["cg", "pipecg", "gmres", "sstep-cg", "ca-gmres"])
def test_a_monitor_that_raises_on_one_rank_raises_on_every_rank(comm, method):
    """A monitor raising on the last rank only left the other ranks waiting in the solve's next
    sum (a hang); now every rank raises its exception (``comm/agree.py``), and the session goes
    on: the next solve converges."""
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(4, 4), seed=3)

    def monitor(i, norm):
        if comm.rank == comm.size - 1 and i == 2:
            raise ValueError("the user's monitor failed")

    with pytest.raises(ValueError, match="the user's monitor failed"):
        problem.solve(method, "jacobi", rtol=1e-10, monitor=monitor)
    info, _ = problem.solve(method, "jacobi", rtol=1e-10)
    assert info.converged, info.reason


@pytest.mark.mpi(nprocs=(1, 2), timeout=200)
def test_bad_solver_input_is_refused_on_every_rank_naming_the_object(comm):
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(3, 3), seed=1)
    d = problem.mesh
    on_cells = mc.Dat(d.cells, 1, None, "on cells")
    wide = mc.Dat(d.nodes, 2, None, "wide")
    cases = [
        (dict(method="tfqmr"), mc.SolverError, "unknown method 'tfqmr'"),
        (dict(pc="ilu"), mc.SolverError, "unknown preconditioner 'ilu'"),
        (dict(b=on_cells), mc.SetMismatchError, r"'on cells'\) lives on 'cells'"),
        (dict(x=wide), mc.SolverError, r"'wide'\) has dim 2"),
        (dict(method="cg", residual_replacement=True), mc.SolverError, "residual_replacement"),
        (dict(rtol=-1.0), mc.SolverError, "rtol"),
        (dict(rtol=None), mc.SolverError, "rtol=None"),  # these raised TypeError from inside the set-up
        (dict(atol="0"), mc.SolverError, "atol='0'"),
        (dict(rtol=float("nan")), mc.SolverError, "rtol=nan"),
        (dict(maxiter=2.5), mc.SolverError, "maxiter"),
        (dict(monitor=5), mc.SolverError, "monitor must be None or a function"),
        (dict(method="sstep-cg", monitor="print"), mc.SolverError, "monitor must be None or a function"),
    ]
    for options, error, message in cases:
        args = dict(A=problem.A, x=problem.x, b=problem.b, method="cg", pc="jacobi")
        args.update(options)
        with pytest.raises(error, match=message):
            mc.solve(args.pop("A"), args.pop("x"), args.pop("b"), **args)
    free = mc.LinearOperator(d.nodes, lambda x, y: None, name="no diagonal")
    with pytest.raises(mc.SolverError, match="'no diagonal'.*diagonal"):
        mc.solve(free, problem.x, problem.b, pc="jacobi")
    with pytest.raises(mc.SolverError, match="matrix-free"):
        mc.solve(free, problem.x, problem.b, pc="sgs")
    seen = []  # refused before any iteration: pipecg sums ||b|| in its first reduction, asks for ||A||_inf first
    with pytest.raises(mc.SolverError, match="'no diagonal'.*norm_inf"):
        mc.solve(free, problem.x, problem.b, method="pipecg", pc=None, residual_replacement=True,
                 monitor=lambda i, norm: seen.append(i))
    assert seen == []
    with pytest.raises(mc.SolverError, match="must be a meshchain.Mat"):
        mc.solve(np.eye(3), problem.x, problem.b)
    problem.A.zero_rows([0], diagonal=-1.0)
    with pytest.raises(mc.SolverError, match="positive diagonal"):
        mc.solve(problem.A, problem.x, problem.b, pc="jacobi")


BLAS_ENTRY_POINTS = ("dot", "vdot", "inner", "matmul", "tensordot", "einsum")


def test_a_solve_calls_no_blas(monkeypatch):
    """NumPy's dot products call the BLAS library, whose threads (OpenBLAS starts one per
    core) fight Numba's pool for the cores: a CG iteration ran 40x slower with no thread
    variables set. Every method and preconditioner, with residual replacement (its bounds and
    restarts) and the true residual at exit, runs with NumPy's BLAS entry points refused."""
    problem = Problem(structured_quads(6, 6), seed=2)

    def refused(*args, **kwargs):
        raise AssertionError("a BLAS call inside mc.solve")

    for name in BLAS_ENTRY_POINTS:
        monkeypatch.setattr(np, name, refused)
    for method in METHODS:
        for pc in (None, "jacobi", "sgs"):
            info, _ = problem.solve(method, pc, rtol=1e-10)
            assert info.converged, (method, pc, info.reason)
    info, _ = problem.solve("pipecg", "jacobi", rtol=1e-13, residual_replacement=True)
    assert info.converged, info.reason
