"""A solve of a Mat again, with the same vectors and options, keeps its set-up: the
bits of a solve set up anew; a changed matrix, vectors, options or layout is set up anew;
nothing is kept of a solve that raised, and nothing kept holds the user's vectors."""

from __future__ import annotations

import gc
import importlib
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.meshes import jittered_delaunay
from test_mat import copy_kernel
from test_solvers import MESHES, Problem, matrix_free

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

solve_module = importlib.import_module("meshchain.linalg.solve")

ALL_METHODS = ("cg", "cg1", "pipecg", "groppcg", "pipecr", "gmres", "pipegmres", "bicgstab", "pipebicgstab")


def kept_run(A, method: str):
    """The run kept for the next solve of ``A`` by ``method`` (None if none is)."""
    kept = mc.api.engine_surface().solver_cache(solve_module.KEPT_SOLVES).get(A, {}).get(method)
    return None if kept is None else kept.run


def forgotten(problem, method, pc, **options):
    """``problem.solve(...)`` with nothing kept: set up anew."""
    mc.api.engine_surface().solver_cache(solve_module.KEPT_SOLVES).clear()
    return problem.solve(method, pc, **options)


def assert_same_solve(one, other, comm):
    (a, x_a), (b, x_b) = one, other
    assert a.residual_history == b.residual_history
    assert (a.iterations, a.reason, a.reductions, a.restarts) == (b.iterations, b.reason, b.reductions, b.restarts)
    assert (a.true_residual, a.true_residual_preconditioned) == (b.true_residual, b.true_residual_preconditioned)
    if comm.rank == 0:
        np.testing.assert_array_equal(x_a, x_b)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000),
       pc=st.sampled_from([None, "jacobi", "bjacobi-ilu", "sgs"]), method=st.sampled_from(ALL_METHODS))
def test_a_solve_again_keeps_its_set_up_and_gives_the_bits_of_one_set_up_anew(comm, mesh, dim, seed, pc, method):
    """The second solve with the same Mat, vectors and options runs on the first one's kept
    run; so does a third after the right-hand side's values changed in place (a time loop),
    and a fourth into new Dats ``x`` and ``b`` (temporaries made for every step). Each gives
    the bits of a solve set up anew, on every rank."""
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    options = dict(rtol=1e-9, **({"restart": 5} if method.endswith("gmres") else {}))
    first = problem.solve(method, pc, **options)
    run = kept_run(problem.A, method)
    assert run is not None and "x" not in run.dats  # kept, without the user's vectors
    again = problem.solve(method, pc, **options)
    assert kept_run(problem.A, method) is run
    assert_same_solve(again, first, comm)
    assert first[0].converged, first[0].reason

    problem.b.data[...] *= -0.5  # new values, the same Dat
    kept = problem.solve(method, pc, **options)
    assert kept_run(problem.A, method) is run
    fresh = forgotten(problem, method, pc, **options)
    assert kept_run(problem.A, method) is not run  # set up anew
    assert_same_solve(kept, fresh, comm)
    if comm.rank == 0:
        np.testing.assert_allclose(kept[1], -0.5 * first[1], rtol=1e-6, atol=1e-8 * np.abs(first[1]).max())

    run = kept_run(problem.A, method)
    x, b = problem.x, problem.b
    problem.x = mc.Dat(x.dataset, x.dim, None, "new x")  # temporaries: the solve writes its answer there
    problem.b = mc.Dat(b.dataset, b.dim, None, "new b")
    problem.b.data[...] = -2.0 * b.data_ro  # the owned rows: the two dats are laid out alike
    kept = problem.solve(method, pc, **options)
    assert kept_run(problem.A, method) is run
    assert_same_solve(kept, forgotten(problem, method, pc, **options), comm)
    if comm.rank == 0:
        np.testing.assert_allclose(kept[1], first[1], rtol=1e-6, atol=1e-8 * np.abs(first[1]).max())  # -2 x -0.5


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_changed_matrix_vectors_or_options_are_set_up_anew(comm):
    """New values assembled into the Mat, other options: each solve is set up anew and solves
    the problem it is given; another ``x`` is solved on the kept run; vectors and options
    refused the first time are refused after a kept solve too, on every rank."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(40, seed=6), dim=2, seed=3)
    scale = np.linalg.norm(problem.expected)
    info, x = problem.solve("cg", "jacobi", rtol=1e-10)
    run = kept_run(problem.A, "cg")

    d, width = problem.mesh, problem.mesh.cell2node.arity * 2
    problem.A.zero()  # A doubled: x halves
    problem.k.data[...] *= 2.0
    mc.par_loop(copy_kernel(width, width), d.cells, problem.A(mc.INC, (d.cell2node, d.cell2node)), problem.k(mc.READ))
    info, x = problem.solve("cg", "jacobi", rtol=1e-10)
    assert info.converged and kept_run(problem.A, "cg") is not run
    if comm.rank == 0:
        np.testing.assert_allclose(x.ravel(), problem.expected / 2, atol=1e-6 * scale)

    run = kept_run(problem.A, "cg")
    other = mc.Dat(d.nodes, 2, None, "other x")
    info = mc.solve(problem.A, other, problem.b, method="cg", pc="jacobi", rtol=1e-10)
    assert info.converged and kept_run(problem.A, "cg") is run
    gathered = other.gather()
    if comm.rank == 0:
        np.testing.assert_allclose(gathered.ravel(), problem.expected / 2, atol=1e-6 * scale)

    run = kept_run(problem.A, "cg")
    loose, _ = problem.solve("cg", "jacobi", rtol=1e-3)
    assert kept_run(problem.A, "cg") is not run and loose.iterations < info.iterations
    for kept, bad in ((dict(maxiter=10000), dict(maxiter=1e4)), (dict(maxiter=1), dict(maxiter=True)),
                      (dict(), dict(restart=30.0)), (dict(), dict(rtol=-1.0))):
        problem.solve("cg", "jacobi", rtol=1e-3, **kept)  # kept, with options equal to the bad ones as numbers
        with pytest.raises(mc.errors.SolverError):
            problem.solve("cg", "jacobi", **{"rtol": 1e-3, **bad})
    on_cells = mc.Dat(d.cells, 2, None, "on cells")
    refused = ((on_cells, problem.b, mc.errors.SetMismatchError), (problem.b, problem.b, mc.errors.SolverError),
               (mc.Dat(d.nodes, 1, None, "dim 1"), problem.b, mc.errors.SolverError),
               (np.zeros(3), problem.b, mc.errors.SolverError))
    for x, b, error in refused:
        problem.solve("cg", "jacobi", rtol=1e-3)  # kept
        with pytest.raises(error):
            mc.solve(problem.A, x, b, method="cg", pc="jacobi", rtol=1e-3)


@pytest.mark.mpi(nprocs=2, timeout=300)
def test_a_kept_solve_is_set_up_anew_after_the_halos_deepened(comm):
    """An s-step solve deepens the halo layers (the matrix powers kernel), so the matrix's
    columns and every dat's rows move: the next ``cg`` solve is set up anew and gives the bits
    of one set up anew."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(60, seed=2), seed=5)
    problem.solve("cg", "jacobi", rtol=1e-9)
    run = kept_run(problem.A, "cg")
    assert problem.solve("sstep-cg", "jacobi", rtol=1e-9, s=4)[0].converged
    after = problem.solve("cg", "jacobi", rtol=1e-9)
    assert kept_run(problem.A, "cg") is not run
    assert_same_solve(after, forgotten(problem, "cg", "jacobi", rtol=1e-9), comm)


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_nothing_is_kept_of_a_solve_that_raised(comm, monkeypatch):
    """A solve interrupted by an exception (here one raised inside the method, on every rank)
    drops what was kept: the next solve is set up anew and right."""
    from meshchain.linalg import krylov

    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(30, seed=4), seed=1)
    first = problem.solve("cg", "jacobi", rtol=1e-9)
    assert kept_run(problem.A, "cg") is not None

    def interrupted(run):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setitem(solve_module.METHODS, "cg", interrupted)
        with pytest.raises(KeyboardInterrupt):
            problem.solve("cg", "jacobi", rtol=1e-9)
    assert kept_run(problem.A, "cg") is None
    assert_same_solve(problem.solve("cg", "jacobi", rtol=1e-9), first, comm)
    assert krylov.cg is solve_module.METHODS["cg"]


def test_a_solve_nested_in_another_of_the_same_matrix_is_refused_and_keeps_nothing():
    """A solve of the same Mat by the same method inside another (here from a monitor) is
    refused as before, even where a kept run would fit it, and holds none of its vectors."""
    mc.reset_runtime()
    problem = Problem(jittered_delaunay(30, seed=2))
    problem.solve("cg", "jacobi", rtol=1e-8)
    run = kept_run(problem.A, "cg")

    def monitor(i, norm):  # the kept run's own Mat, vectors and options
        mc.solve(problem.A, problem.x, problem.b, method="cg", pc="jacobi", rtol=1e-8)

    with pytest.raises(mc.errors.SolverError, match="inside"):
        problem.solve("cg", "jacobi", rtol=1e-8, monitor=monitor)
    assert kept_run(problem.A, "cg") is run and "x" not in run.dats and "b" not in run.storages


def test_what_is_kept_holds_no_user_vectors_and_goes_with_its_session():
    """Between solves a kept run holds neither ``x`` nor ``b``: they are freed when the user
    drops them. What the solvers keep (work vectors, set-ups, kept runs) is the session's: after
    solves by every kind of method and preconditioner, assembled and matrix-free, a session
    reset frees the old session, its Mat, vectors and operators."""
    session = mc.reset_runtime()
    problem = Problem(jittered_delaunay(30, seed=1))
    for _ in range(2):
        problem.solve("cg", "jacobi", rtol=1e-8)
    x, b = mc.Dat(problem.mesh.nodes, 1, None, "x2"), mc.Dat(problem.mesh.nodes, 1, np.ones(problem.mesh.nodes.size),
                                                              "b2")
    for _ in range(2):
        assert mc.solve(problem.A, x, b, method="pipecg", rtol=1e-8).converged
    assert kept_run(problem.A, "pipecg") is not None
    vectors = [weakref.ref(x), weakref.ref(b)]
    del x, b
    gc.collect()
    assert [ref() for ref in vectors] == [None, None]
    for method, pc in (("pipecg", "sgs"), ("cg", "chebyshev"), ("gmres", "bjacobi-ilu"), ("sstep-cg", "jacobi")):
        assert problem.solve(method, pc, rtol=1e-8)[0].converged, (method, pc)
    op = matrix_free(problem, 1)
    for method in ("cg", "sstep-cg"):
        problem.x.data[...] = 0.0
        assert mc.solve(op, problem.x, problem.b, method=method, pc="jacobi", rtol=1e-8).converged, method
    A, x, b = problem.A, problem.x, problem.b  # kept by the user across the reset
    held = [weakref.ref(obj) for obj in (problem.A, problem.x, problem.b, op, session)]
    del problem, session, op
    mc.reset_runtime()
    gc.collect()
    assert held[-1]() is None  # the old session, though its Mat and vectors live on
    del A, x, b
    gc.collect()
    assert [ref() for ref in held] == [None] * 5
