"""The Krylov model (issue 36, item 3): what it counts per iteration, how its choice of ``s``
follows the costs, the costs it measures on a matrix (the same on every rank), and
``s="auto"`` in ``mc.solve``. No test asserts a time: the predictions are checked against
the counts they are made of, and against measured times in ``benchmarks/krylov.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import meshchain as mc
from meshchain.apps import advection_diffusion as ad, poisson
from meshchain.comm.compiled import available
from meshchain.linalg.tune import measure_costs
from meshchain.meshes import jittered_delaunay, structured_tris
from meshchain.model.krylov import (DRIVER, STEP_CANDIDATES, KrylovCosts, best_steps, cacg_iteration,
                                    cagmres_iteration, candidates_of, cg_iteration, pipecg_iteration, predict,
                                    sstep_iteration)

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

COSTS = KrylovCosts(rows=2000, entries={j: 14000 + 900 * j for j in range(8)}, entry=1e-9, stream=4e-10,
                    exchange={k: 20e-6 + 1e-6 * k for k in STEP_CANDIDATES}, reduction=30e-6, per_number=2e-9)


def test_the_counts_of_an_iteration():
    """cg: one product, one exchange, two reductions, 18 streams per row; CA-CG with s = 1:
    one product of p and none of r, one exchange, one reduction of 2 (2s+1)² numbers; the
    block s-step CG with s = 2: two products (layers 1, 0), one exchange, one reduction of
    s (s + 1) + s² + 1 numbers, 9 dots in 2 passes, the block update in passes of two old directions."""
    c = COSTS
    assert cg_iteration(c) == pytest.approx(14000e-9 + 21e-6 + 60e-6 + 18 * 2000 * 4e-10)
    gram = 3 * 4 // 2 * 3  # the pairs of 3 vectors, each pair read with the Jacobi weights
    assert cacg_iteration(c, 1, jacobi=True) == pytest.approx(
        21e-6 + (30e-6 + 2e-9 * (18 - 1)) + 14000e-9 + (gram + 9 + 4) * 2000 * 4e-10)
    # the sums: v_0 and v_1 with v_0..v_2 in one pass (3 streams), and with both Â p_k in another (2 + 2);
    # the update: per direction p, q made (4), both old ones added (8), x and r (6); x and r kept (4)
    sums, update = 3 + 4, 2 * (4 + 8 + 6) + 4
    assert sstep_iteration(c, 2, jacobi=False) == pytest.approx(
        (22e-6 + (30e-6 + 2e-9 * (11 - 1)) + (14900 + 14000) * 1e-9 + (sums + update) * 2000 * 4e-10) / 2)
    # s = 3: the p sequence runs on layers 2, 1, 0, the r sequence on 2, 1 (its products are the deep ones)
    assert c.powers_entries([3, 2]) == (15800 + 14900 + 14000) + (15800 + 14900)
    assert set(predict(c, candidates=(2, 4))) == {"cg", "pipecg", "gmres", "sstep-cg s=2", "sstep-cg s=4",
                                                  "ca-cg s=2", "ca-cg s=4", "ca-gmres s=2", "ca-gmres s=4"}
    assert {k for k in predict(c) if k.startswith("sstep-cg")} == {f"sstep-cg s={k}" for k in candidates_of("sstep-cg")}
    assert max(candidates_of("sstep-cg")) == 5 and candidates_of("ca-cg") == STEP_CANDIDATES


def test_a_larger_working_set_streams_at_its_own_rate_and_the_driver_counts_in_calls():
    rates = dataclasses.replace(COSTS, stream={6: 1e-10, 24: 5e-10}, call=10e-6)
    assert rates.streamed(10, 6) == pytest.approx(10 * 2000 * 1e-10)
    assert rates.streamed(10, 7) == rates.streamed(10, 24) == pytest.approx(10 * 2000 * 5e-10)
    assert rates.streamed(10, 100) == rates.streamed(10, 24)  # beyond the largest measured: its rate
    base = dataclasses.replace(rates, call=0.0)
    assert cg_iteration(rates) - cg_iteration(base) == pytest.approx(DRIVER["cg"] * 10e-6)
    assert sstep_iteration(rates, 4, jacobi=True) - sstep_iteration(base, 4, jacobi=True) == pytest.approx(
        DRIVER["sstep-cg"] * 10e-6 / 4)


def test_the_block_parts_timed_replace_what_is_worked_out_for_them():
    """Where ``basis[s]`` was measured (the compiled outer iterations of several ranks), an
    outer iteration is that basis, the reduction and the streams: no products from ``entry``,
    no ``exchange``, no driver calls (Python sees only the last outer iteration); where
    ``block[s]`` was (the sums and update), it replaces their streams."""
    c = dataclasses.replace(COSTS, call=10e-6)
    timed = dataclasses.replace(c, basis={2: 70e-6, 4: 150e-6})
    sums, update = 3 + 4, 2 * (4 + 8 + 6) + 4  # as in test_the_counts_of_an_iteration
    assert sstep_iteration(timed, 2, jacobi=False) == pytest.approx(
        (70e-6 + (30e-6 + 2e-9 * (11 - 1)) + (sums + update) * 2000 * 4e-10) / 2)
    assert sstep_iteration(timed, 3, jacobi=False) == sstep_iteration(c, 3, jacobi=False)  # s = 3 not timed
    assert sstep_iteration(dataclasses.replace(timed, entry=1.0, exchange={}), 4, jacobi=True) == \
        sstep_iteration(timed, 4, jacobi=True)
    assert cg_iteration(timed) == cg_iteration(c)  # the other methods' products as before
    both = dataclasses.replace(timed, block={2: 9e-6}, stream=1.0)
    one = dataclasses.replace(c, basis={1: 50e-6})  # CG's product with its exchange, timed compiled
    assert cg_iteration(one) == pytest.approx(50e-6 + 2 * 30e-6 + 18 * 2000 * 4e-10 + DRIVER["cg"] * 10e-6)
    assert pipecg_iteration(one) - pipecg_iteration(c) == pytest.approx(50e-6 - (14000e-9 + 21e-6))
    assert sstep_iteration(both, 2, jacobi=True) == pytest.approx((70e-6 + (30e-6 + 2e-9 * (11 - 1)) + 9e-6) / 2)


def test_the_chosen_s_grows_with_the_cost_of_a_message_and_falls_with_the_cost_of_work():
    cheap = dataclasses.replace(COSTS, exchange={k: 1e-7 for k in STEP_CANDIDATES}, reduction=1e-7)
    costly = dataclasses.replace(COSTS, exchange={k: 500e-6 for k in STEP_CANDIDATES}, reduction=500e-6)
    for method in ("sstep-cg", "ca-cg", "ca-gmres"):
        low, middle, high = (best_steps(c, method) for c in (cheap, COSTS, costly))
        assert low <= middle <= high and low < high, (method, low, middle, high)
        assert high == max(candidates_of(method)) or method == "ca-cg"
    assert best_steps(cheap, "ca-cg") == 1  # messages free: the basis work does not pay
    # nor does the block form's where a recomputed halo row costs more than the streams it saves per iteration
    # (its sums and update stream fewer elements per iteration for s >= 2 than for s = 1: 23 against 26 at s = 4
    # with Jacobi, so with free messages and cheap rows s = 4 still pays)
    assert best_steps(dataclasses.replace(cheap, entry=3e-9), "sstep-cg") == 1
    assert best_steps(cheap, "sstep-cg") > 1
    assert cagmres_iteration(costly, 8) < cagmres_iteration(costly, 1) / 4


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_the_measured_costs_are_the_matrixs_and_the_same_on_every_rank(comm):
    mc.reset_runtime(comm=comm)
    p = poisson.declare(jittered_delaunay(600, seed=3))
    costs = measure_costs(mc.api.engine_surface(), p.A)
    A = p.A.to_scipy()  # on rank 0
    _, rows = mc.api.engine_surface().matrices.prepare_products(p.A, 1)
    local = int(rows.indptr[rows.count(0)])  # this rank's owned rows' entries: together the matrix's
    assert comm.allreduce(local) == comm.bcast(A.nnz if comm.rank == 0 else None)
    assert costs.entries[0] == max(comm.allgather(local))  # the largest part's
    assert all(costs.entries[j] <= costs.entries[j + 1] for j in range(len(costs.entries) - 1))
    assert costs.entry > 0 and costs.call >= 0 and all(rate > 0 for rate in costs.stream.values())
    if comm.size == 1:
        assert set(costs.exchange.values()) == {0.0} and costs.reduction == 0.0
    else:
        assert costs.reduction > 0 and all(t >= 0 for t in costs.exchange.values())
        assert costs.entries[max(costs.entries)] > costs.entries[0]  # halo rows the powers kernel recomputes
    shared = (costs.rows, tuple(costs.entries.items()), costs.entry, tuple(costs.stream.values()), costs.call, tuple(costs.exchange.values()), costs.reduction,
              costs.per_number)
    assert comm.allgather(shared) == [shared] * comm.size
    assert measure_costs(mc.api.engine_surface(), p.A) is costs  # kept until the layout changes
    p.A.zero()
    poisson.assemble(p)  # new values (assembled again, as a time loop does): what the pieces cost is unchanged
    assert measure_costs(mc.api.engine_surface(), p.A) is costs
    if comm.size > 1:  # a new layout: measured again
        mc.repartition("kway", weights=None, seed=1)
        p.A.zero()
        poisson.assemble(p)
        assert measure_costs(mc.api.engine_surface(), p.A) is not costs


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_s_auto_solves_with_the_s_the_model_chose(comm):
    """On every rank the same ``s`` (the parts differ in size: the largest part's counts and
    the slowest rank's times are every rank's; ``s`` chosen per rank once made the ranks
    reduce Gram matrices of different sizes)."""
    def problem(method):
        mc.reset_runtime(comm=comm)  # a new mesh: declared and partitioned afresh
        if method in ("sstep-cg", "ca-cg"):
            p = poisson.declare(structured_tris(20, 20))
            return p, lambda **o: poisson.solve(p, **o)
        q = ad.declare(jittered_delaunay(300, seed=4), peclet=10.0)
        return q, lambda **o: ad.solve(q, **o)

    for method in ("ca-gmres", "sstep-cg", "ca-cg"):
        p, solve = problem(method)
        info = solve(method=method, pc="jacobi", rtol=1e-10, s="auto")
        assert info.converged, info.reason
        assert info.steps in candidates_of(method) and comm.allgather(info.steps) == [info.steps] * comm.size
        chosen = min(candidates_of(method), key=lambda k: (info.predicted[f"{method} s={k}"], k))
        assert info.steps == chosen and info.predicted["cg"] > 0
        # measured as deep as the method's candidates (5 products for sstep-cg: not 8), and predicted there
        costs = measure_costs(mc.api.engine_surface(), p.A, candidates=candidates_of(method),
                              block_parts=method == "sstep-cg")  # kept: no timing
        assert tuple(costs.exchange) == candidates_of(method)
        # sstep-cg's parts timed as it runs them: its basis (on several ranks, compiled), its sums and update
        compiled = method == "sstep-cg" and comm.size > 1 and available()  # an MPI compiled code can call
        assert tuple(costs.basis) == (candidates_of(method) if compiled else ())
        assert tuple(costs.block) == (candidates_of(method) if method == "sstep-cg" else ())
        assert all(seconds > 0 for seconds in (*costs.basis.values(), *costs.block.values()))
        assert comm.allgather(tuple(costs.basis.values())) == [tuple(costs.basis.values())] * comm.size
        assert max(costs.entries) == (max(candidates_of(method)) - 1) * costs.depth
        assert {int(k.split("s=")[1]) for k in info.predicted if "s=" in k} == set(candidates_of(method))
        fixed = solve(method=method, pc="jacobi", rtol=1e-10, s=3)
        assert fixed.steps == 3 and fixed.predicted == {}
    with pytest.raises(mc.SolverError, match="or 'auto'"):
        poisson.solve(p, method="sstep-cg", s="fast")
    assert np.isfinite(p.u.data_ro).all()  # the Poisson problem, after the refused call


def test_the_choice_of_s_is_worked_out_once_per_measured_costs(monkeypatch):
    """``s="auto"``'s model predictions are made once per costs measured on the matrix: a
    second solve looks them up (the same ``s`` and predictions; a caller changing its
    ``predicted`` changes no later one), and so does a solve after the matrix got new values
    (they change no cost: a time loop that assembles its matrix again at every step pays no
    measurement per step)."""
    from meshchain.linalg import tune

    mc.reset_runtime()
    p = poisson.declare(structured_tris(12, 12))
    made = []
    real = tune.predict
    monkeypatch.setattr(tune, "predict", lambda *a, **k: made.append(1) or real(*a, **k))
    first = poisson.solve(p, method="sstep-cg", pc="jacobi", rtol=1e-8, s="auto")
    first.predicted["cg"] = -1.0
    second = poisson.solve(p, method="sstep-cg", pc="jacobi", rtol=1e-8, s="auto")
    assert len(made) == 1 and second.steps == first.steps and second.predicted["cg"] > 0
    bump = mc.Kernel.from_source("def bump(a):\n" + "".join(f"    a[{i}, {i}] += 0.1\n" for i in range(3)))
    d = p.mesh
    mc.par_loop(bump, d.cells, p.A(mc.INC, (d.cell2node, d.cell2node)))  # new values: the same costs
    third = poisson.solve(p, method="sstep-cg", pc="jacobi", rtol=1e-8, s="auto")
    assert len(made) == 1 and third.steps == first.steps and third.converged
    # another method measures as deep as its own candidates and predicts once; each method's choice is then
    # looked up, alternating (the other's not dropped)
    seen = {"sstep-cg": second.predicted}
    for method in ("ca-cg", "sstep-cg", "ca-cg"):
        info = poisson.solve(p, method=method, pc="jacobi", rtol=1e-8, s="auto")
        assert info.converged and info.predicted == seen.setdefault(method, info.predicted)
    assert len(made) == 2 and "ca-cg s=8" in seen["ca-cg"] and "ca-cg s=8" not in seen["sstep-cg"]


def test_a_block_solve_tells_the_next_auto_solve_the_iterations_it_needed(monkeypatch):
    """The block form tests its residual every ``s`` iterations: a converged ``s="auto"`` solve
    places the tolerance between its last two norms on their rate, and the next one chooses its
    ``s`` for those iterations rounded up to a multiple of ``s`` (50 with ``s = 5`` where CG needs
    46, 48 with ``s = 4``)."""
    from types import SimpleNamespace

    from meshchain.linalg import tune

    mc.reset_runtime()
    p = poisson.declare(structured_tris(14, 14))
    A, engine = p.A, mc.api.engine_surface()
    info = SimpleNamespace(residual_history=[1.0, 1e-3, 1e-5, 1e-7], iterations=50, steps=5, converged=True)
    tune.record_iterations(engine, A, "sstep-cg", info, jacobi=True, rtol=1e-6, atol=0.0)
    assert tune.iterations_needed(engine, A, "sstep-cg", jacobi=True, rtol=1e-6, atol=0.0) == 48  # 45 + 5 x 1/2
    assert tune.iterations_needed(engine, A, "sstep-cg", jacobi=False, rtol=1e-6, atol=0.0) is None  # another pc
    tune.record_iterations(engine, A, "sstep-cg", SimpleNamespace(residual_history=[1.0], iterations=8, steps=4,
                                                          converged=True), jacobi=True, rtol=1e-10, atol=0.0)
    assert tune.iterations_needed(engine, A, "sstep-cg", jacobi=True, rtol=1e-10, atol=0.0) == 7  # half a block: 6.5
    tune.record_iterations(engine, A, "ca-cg", info, jacobi=True, rtol=1e-6, atol=0.0)  # CG's own: nothing kept
    assert tune.iterations_needed(engine, A, "ca-cg", jacobi=True, rtol=1e-6, atol=0.0) is None
    costs = KrylovCosts(rows=1000, entries={j: 7000 + 600 * j for j in range(5)}, entry=1e-9, stream=3e-10,
                        exchange={k: 20e-6 for k in range(1, 6)}, reduction=60e-6, per_number=1e-8)
    assert best_steps(costs, "sstep-cg") == 5 and best_steps(costs, "sstep-cg", iterations=46) == 4
    assert best_steps(costs, "sstep-cg", iterations=45) == 5  # 45 with s = 5, 48 with 4
    asked, real = [], tune.best_steps
    monkeypatch.setattr(tune, "best_steps", lambda *a, **k: asked.append(k["iterations"]) or real(*a, **k))
    first = poisson.solve(p, method="sstep-cg", pc="jacobi", rtol=1e-8, s="auto")
    needed = tune.iterations_needed(engine, A, "sstep-cg", jacobi=True, rtol=1e-8, atol=0.0)
    second = poisson.solve(p, method="sstep-cg", pc="jacobi", rtol=1e-8, s="auto")
    assert first.converged and second.converged and asked == [None, needed]
    assert first.iterations - first.steps < needed <= first.iterations
