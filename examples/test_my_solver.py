"""Regression tests for a small meshchain solver: how to test your own.

The solver: explicit heat diffusion on a triangle mesh, one flux per edge into its two nodes,
then a node update; ``steps`` time steps, each a loop chain. The tests show meshchain's pytest
plugin (installed with meshchain):

- ``@pytest.mark.parallel(nprocs=[2, 3])`` runs a test under ``mpiexec -n 2`` and ``-n 3``
  from plain ``pytest`` (ids ``[nprocs=2]``, ``[nprocs=3]``), with a wall clock that kills a
  hanging test and an abort when one rank fails;
- the ``tri_mesh`` fixture gives a small structured triangle mesh (its size an indirect
  parameter), ``one_and_all_ranks`` checks that N ranks give one rank's answer;
- ``assert_gathered_close`` compares a distributed dat with an array, naming the worst
  element; ``parallel_assert`` makes every rank agree on an assertion.

Run with ``pytest examples/test_my_solver.py`` (``-v`` shows the parallel items).
"""

from __future__ import annotations

import numpy as np
import pytest

import meshchain as mc
from meshchain.testing import assert_gathered_close, parallel_assert

#: The solver's total heat and its hottest value after 20 steps on the 12 x 12 mesh, computed
#: once (on one process) and kept: a change of the solver that changes them fails the test.
REFERENCE = {"total": 22.240722736890202, "hottest": 0.4902581368036542}


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Every test starts from a fresh meshchain runtime (nothing declared, default options)."""
    mc.reset_runtime()
    yield
    mc.reset_runtime()


@mc.kernel
def edge_flux(u_a, u_b, flux_a, flux_b):
    d = 0.05 * (u_b[0] - u_a[0])
    flux_a[0] += d
    flux_b[0] -= d


@mc.kernel
def apply_flux(flux, u):
    u[0] += flux[0]
    flux[0] = 0.0


@mc.kernel
def heat_and_peak(u, total, hottest):
    total[0] += u[0]
    hottest[0] = max(hottest[0], u[0])


def solve(mesh, *, steps: int = 20, ca=True) -> dict:
    """Declare the problem on ``mesh``, partition it, run ``steps`` steps and return the
    temperature (a dat) with the total heat and the hottest value (the same on every rank)."""
    nodes, edges = mc.Set(mesh.nnode, "nodes"), mc.Set(mesh.nfacet, "edges")
    e2n = mc.Map(edges, nodes, 2, mesh.facets, "e2n")
    x, y = mesh.coords[:, 0], mesh.coords[:, 1]
    u = mc.Dat(nodes, 1, np.exp(-20 * ((x - 0.3) ** 2 + (y - 0.6) ** 2)), "u")
    flux = mc.Dat(nodes, 1, None, "flux")
    total, hottest = mc.Global(1, 0.0, "total"), mc.Global(1, -np.inf, "hottest")
    mc.partition("block")
    for _ in range(steps):
        with mc.loop_chain("step", ca=ca):
            mc.par_loop(edge_flux, edges, u(mc.READ, e2n[0]), u(mc.READ, e2n[1]),
                        flux(mc.INC, e2n[0]), flux(mc.INC, e2n[1]))
            mc.par_loop(apply_flux, nodes, flux(mc.RW), u(mc.RW))
    mc.par_loop(heat_and_peak, nodes, u(mc.READ), total(mc.INC), hottest(mc.MAX))
    return {"u": u, "total": float(total.value[0]), "hottest": float(hottest.value[0])}


@pytest.mark.parametrize("tri_mesh", [12], indirect=True)
def test_serial_run_matches_the_stored_reference(tri_mesh):
    result = solve(tri_mesh)
    assert result["total"] == pytest.approx(REFERENCE["total"], rel=1e-12)
    assert result["hottest"] == pytest.approx(REFERENCE["hottest"], rel=1e-12)


@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("tri_mesh", [12], indirect=True)
def test_parallel_runs_match_the_stored_reference(tri_mesh, comm):
    mc.reset_runtime(comm=comm)
    result = solve(tri_mesh)
    parallel_assert(abs(result["total"] - REFERENCE["total"]) <= 1e-12 * REFERENCE["total"],
                    f"total heat {result['total']!r} on {comm.size} ranks")


@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("tri_mesh", [9], indirect=True)
def test_n_ranks_give_one_ranks_answer(tri_mesh, one_and_all_ranks):
    def program():
        result = solve(tri_mesh, steps=6)
        return {"u": result["u"].gather(), "total": result["total"]}

    one_and_all_ranks(program, rtol=1e-13)


@pytest.mark.parallel(nprocs=[2, 3])
@pytest.mark.parametrize("tri_mesh", [9], indirect=True)
def test_communication_avoiding_chain_equals_loop_by_loop(tri_mesh, comm):
    mc.reset_runtime(comm=comm)
    loop_by_loop = solve(tri_mesh, steps=6, ca=False)["u"].gather()
    expected = comm.bcast(loop_by_loop, root=0)
    mc.reset_runtime(comm=comm)
    avoiding = solve(tri_mesh, steps=6, ca=True)
    assert_gathered_close(avoiding["u"], expected, rtol=1e-13)
    parallel_assert(mc.stats().chains["step"].mode == "ca", "the chain ran communication-avoiding")
