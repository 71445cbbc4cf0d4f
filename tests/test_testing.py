"""meshchain.testing's collective assertions, comparison helper and mesh fixtures (the
harness behind the markers is tested in test_mpi_harness.py)."""

from __future__ import annotations

import numpy as np
import pytest

import meshchain as mc
from meshchain.testing import assert_gathered_close, assert_same_on_all_ranks, parallel_assert


@pytest.mark.parallel(nprocs=[1, 2, 3], timeout=120)
def test_parallel_assert_fails_on_every_rank_naming_the_failing_ones(comm):
    parallel_assert(True)
    parallel_assert(lambda: comm.size > 0, "callables are called")
    with pytest.raises(AssertionError, match=r"failed on rank\(s\) \[0\]: rank 0 only"):
        parallel_assert(comm.rank != 0, "rank 0 only")
    with pytest.raises(AssertionError, match=r"ZeroDivisionError"):
        parallel_assert(lambda: 1 / (comm.rank - comm.size + 1) > 0)  # raises on the last rank
    parallel_assert(False, participating=False)  # only takes part


@pytest.mark.parallel(nprocs=[2, 3], timeout=120)
def test_same_on_all_ranks_compares_with_rank_zero(comm):
    assert_same_on_all_ranks(np.arange(4.0))
    assert_same_on_all_ranks({"a": 1, "b": (2, 3)})
    assert_same_on_all_ranks(np.array([np.nan, 1.0]))
    with pytest.raises(AssertionError, match=r"rank\(s\) \[1"):
        assert_same_on_all_ranks(np.arange(4) + (comm.rank > 0))
    with pytest.raises(AssertionError, match="differs from rank 0"):
        assert_same_on_all_ranks(comm.rank)


def example_solver():
    """The heat-diffusion solver of ``examples/test_my_solver.py``."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "test_my_solver.py"
    spec = importlib.util.spec_from_file_location("example_test_my_solver", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.solve


def declared_diffusion(mesh, *, ca):
    return example_solver()(mesh, steps=3, ca=ca)["u"]


@pytest.mark.parallel(nprocs=[2, 3], timeout=180)
@pytest.mark.parametrize("tri_mesh", [6], indirect=True)
def test_gathered_close_reports_the_worst_global_id(comm, tri_mesh):
    from mpi4py import MPI

    mc.reset_runtime(comm=MPI.COMM_SELF)
    expected = declared_diffusion(tri_mesh, ca=False).data_ro.copy()
    mc.reset_runtime(comm=comm)
    u = declared_diffusion(tri_mesh, ca=True)
    assert_gathered_close(u, expected, rtol=1e-13)
    wrong = expected.copy()
    wrong[17, 0] += 1.0
    with pytest.raises(AssertionError, match=r"Dat 'u': 1 of \d+ values differ.*global id 17"):
        assert_gathered_close(u, wrong, rtol=1e-13)


@pytest.mark.parallel(nprocs=[2, 3], timeout=180)
@pytest.mark.parametrize("quad_mesh", [(5, 4)], indirect=True)
def test_one_and_all_ranks_fixture_compares_the_results(one_and_all_ranks, quad_mesh):
    results = one_and_all_ranks(lambda: {"u": declared_diffusion(quad_mesh, ca=True).gather()}, rtol=1e-13)
    assert set(results) == {"u"}
    calls = iter(range(2))

    def differs():  # the second (parallel) run returns other values
        return {"n": np.array([next(calls)])}

    with pytest.raises(AssertionError, match="ranks differ from one"):
        one_and_all_ranks(differs)


@pytest.mark.parametrize("tri_mesh", [3, (4, 2)], indirect=True)
@pytest.mark.parametrize("quad_mesh", [3], indirect=True)
def test_mesh_fixtures_take_their_size_from_the_parameter(tri_mesh, quad_mesh, delaunay_mesh, naca_mesh):
    assert tri_mesh.ncell in (2 * 3 * 3, 2 * 4 * 2)
    assert quad_mesh.ncell == 9
    assert delaunay_mesh.ncell > 0
    assert naca_mesh.ncell == 3 * 4 * 6
