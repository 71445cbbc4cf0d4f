"""The matrix powers kernel (issue 36): ``A x, ..., A^s x`` from one halo exchange equals ``s``
separate products, bit for bit on integer data, on 1-4 ranks, for an assembled matrix and a
matrix-free operator; its halo rows are valid as deep as it says; bad input is refused on
every rank; a matrix keeps its values when a chain adds halo layers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.meshes import jittered_delaunay, structured_quads
from meshchain.testing import parallel_assert
from helpers import equal_on_rank_0
from test_mat import copy_kernel
from test_solvers import matrix_free

MESHES = st.one_of(st.builds(jittered_delaunay, st.integers(8, 50), seed=st.integers(0, 99)),
                   st.builds(structured_quads, st.integers(2, 7), st.integers(2, 7)))


class Problem:
    """An assembled matrix of element blocks with entries in {-1, 0, 1} (powers up to 8 of
    integer vectors in {-1, 0, 1} stay below 2^53: every sum is exact in any order)."""

    def __init__(self, mesh, *, dim: int, seed: int):
        d = self.mesh = mesh.declare()
        rng = np.random.default_rng(seed)
        width = d.cell2node.arity * dim
        self.k = mc.Dat(d.cells, width * width, rng.integers(-1, 2, size=(mesh.ncell, width * width)).astype(float),
                        "k")
        self.x = mc.Dat(d.nodes, dim, rng.integers(-1, 2, size=(mesh.nnode, dim)).astype(float), "x")
        mc.partition("kway", coords=d.coords, seed_set=d.cells, seed=seed)
        self.A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A", dim=dim)
        mc.par_loop(copy_kernel(width, width), d.cells, self.A(mc.INC, (d.cell2node, d.cell2node)), self.k(mc.READ))
        self.dim = dim

    def vectors(self, count: int, name: str):
        return [mc.Dat(self.mesh.nodes, self.dim, None, f"{name}{i}") for i in range(count)]


def cell_sums(problem, y):
    """A loop that reads ``y`` through the cell-to-node map (its first halo layer)."""
    d = problem.mesh
    lines = ["def cell_sum(y, c):"] + [f"    c[0] += y[{n}, {j}]" for n in range(d.cell2node.arity)
                                        for j in range(problem.dim)]
    out = mc.Dat(d.cells, 1, None, f"sum-{y.name}")
    mc.par_loop(mc.Kernel.from_source("\n".join(lines) + "\n"), d.cells, y(mc.READ, d.cell2node), out(mc.WRITE))
    return out.gather()


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), steps=st.integers(1, 8))
def test_powers_of_an_assembled_matrix_equal_repeated_products(comm, mesh, dim, seed, steps):
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    single = problem.vectors(steps, "single")
    previous = problem.x
    for y in single:
        problem.A.mult(previous, y)
        previous = y
    expected = [y.gather() for y in single]
    powered = problem.vectors(steps, "powered")
    problem.A.powers(problem.x, powered)
    got = [y.gather() for y in powered]
    # the halo rows powers computed redundantly are what it says they are: a loop reading them
    # through the map (no exchange when the product is valid deep enough) sums the same
    sums = [cell_sums(problem, y) for y in (single[0], powered[0])]
    equal_on_rank_0(comm, [*zip(expected, got), (sums[0], sums[1])], "powers against repeated products")
    parallel_assert(comm.rank != 0 or np.abs(expected[-1]).max() < 2.0**53, "exact in float64", comm=comm)
    # a sequence plan (the block s-step CG's bases) makes the same products into the rows of an array
    plan = mc.api.engine_surface().matrices.sequence_plan(problem.A, problem.x, steps)
    rows = np.empty((steps + 1, plan.width))
    plan.run(np.zeros(steps), rows)
    planned = problem.vectors(steps, "planned")
    for k, y in enumerate(planned, start=1):
        y.data[...] = rows[k, :y.data.size].reshape(y.data.shape)
    got = [y.gather() for y in planned]
    equal_on_rank_0(comm, zip(expected, got), "sequence plan against repeated products")
    # again (the halo rows kept), from a vector a direct loop wrote (its halo stale): exchanged first
    start = problem.vectors(1, "start")[0]
    negate = mc.Kernel.from_source("def negate(a, b):\n" + "".join(f"    b[{j}] = -a[{j}]\n" for j in range(dim)))
    mc.par_loop(negate, problem.mesh.nodes, problem.x(mc.READ), start(mc.WRITE))
    problem.A.powers(start, single)
    again = [y.gather() for y in single]
    previous = start
    for y in powered:
        problem.A.mult(previous, y)
        previous = y
    expected = [y.gather() for y in powered]
    equal_on_rank_0(comm, zip(expected, again), "powers from a stale halo against repeated products")
    # assembled again with other values: the rows' values fetched again in place have the bits of rows built
    # afresh, and the plan made before multiplies by them
    from meshchain.engine import powers as kernel

    matrices = mc.api.engine_surface().matrices
    _, before = matrices.prepare_products(problem.A, steps)
    problem.k.data[...] = np.roll(problem.k.data_ro, 1, axis=0)
    problem.A.zero()
    width = problem.mesh.cell2node.arity * dim
    mc.par_loop(copy_kernel(width, width), problem.mesh.cells, problem.A(mc.INC, (problem.mesh.cell2node,) * 2),
                problem.k(mc.READ))
    pattern, after = matrices.prepare_products(problem.A, steps)
    fresh = kernel._build(matrices, problem.A, pattern, steps)
    fields = ("indptr", "split", "indices", "values", "targets", "ends")
    parallel_assert(after is before and all(np.array_equal(getattr(after, f), getattr(fresh, f)) for f in fields),
                    "rows whose values were fetched again equal rows built afresh", comm=comm)
    previous = problem.x
    for y in single:
        problem.A.mult(previous, y)
        previous = y
    expected = [y.gather() for y in single]
    plan.run(np.zeros(steps), rows)
    for k, y in enumerate(planned, start=1):
        y.data[...] = rows[k, :y.data.size].reshape(y.data.shape)
    equal_on_rank_0(comm, zip(expected, [y.gather() for y in planned]), "the plan after new values")


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), steps=st.integers(1, 8))
def test_powers_of_a_matrix_free_operator_equal_repeated_applications(comm, mesh, dim, seed, steps):
    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    op = matrix_free(problem, dim)
    single = problem.vectors(steps, "single")
    previous = problem.x
    for y in single:
        op.apply(previous, y)
        previous = y
    expected = [y.gather() for y in single]
    powered = problem.vectors(steps, "powered")
    mc.matrix_powers(op, problem.x, powered)
    got = [y.gather() for y in powered]
    chain = mc.stats().chains["element-by-element.powers"]
    equal_on_rank_0(comm, zip(expected, got), "matrix-free powers against repeated applications")
    if comm.size > 1:
        assert chain.mode == "ca" and chain.executions == 1
        assert chain.segments == 1  # one grouped exchange for all s applications


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_bad_input_is_refused_on_every_rank(comm):
    mc.reset_runtime(comm=comm)
    problem = Problem(structured_quads(4, 3), dim=1, seed=3)
    d = problem.mesh
    y = problem.vectors(2, "y")
    wide = mc.Dat(d.nodes, 2, None, "wide")
    on_cells = mc.Dat(d.cells, 1, None, "on_cells")
    rectangular = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "rectangular", col_dim=2)

    def products(wanted):
        mc.api.engine_surface().matrices.products(problem.A, wanted)

    cases = [(lambda: problem.A.powers(problem.x, []), "at least one output"),
             (lambda: problem.A.powers(problem.x, [y[0], y[0]]), "distinct"),
             (lambda: problem.A.powers(problem.x, [problem.x]), "distinct"),
             (lambda: problem.A.powers(problem.x, [wide]), "dim"),
             (lambda: problem.A.powers(on_cells, y), "on_cells"),
             (lambda: rectangular.powers(problem.x, y), "square"),
             (lambda: mc.matrix_powers("A", problem.x, y), "Mat or a meshchain.LinearOperator"),
             (lambda: products([(problem.x, y, [0.0])]), "1 shifts for 2 products"),
             (lambda: products([(problem.x, y, [0.0, 0.0], [1.0, 0.0])]), "no vector two before it"),
             (lambda: products([(problem.x, y, None, [0.0])]), "1 pulls for 2 products")]
    for call, message in cases:
        with pytest.raises(mc.MeshchainError, match=message):
            call()
    problem.A.powers(problem.x, y)  # the session goes on


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_an_assembled_matrix_keeps_its_values_when_a_chain_adds_halo_layers(comm):
    """Deeper halo layers renumber the halo columns; the values move with them (before, the
    matrix said it had been assembled before a repartition and refused to multiply)."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(30, seed=4), dim=2, seed=5)
    before = problem.vectors(1, "before")[0]
    problem.A.mult(problem.x, before)
    depth = mc.get_runtime().layout.depth
    mc.matrix_powers(matrix_free(problem, 2), problem.x, problem.vectors(4, "deep"))  # a CA chain, 4 layers deep
    assert mc.get_runtime().layout.depth > depth
    after = problem.vectors(1, "after")[0]
    problem.A.mult(problem.x, after)
    again = problem.vectors(1, "again")[0]
    problem.A.zero()  # assembled again on the deeper layout: the scatters are worked out anew
    width = problem.mesh.cell2node.arity * 2
    mc.par_loop(copy_kernel(width, width), problem.mesh.cells,
                problem.A(mc.INC, (problem.mesh.cell2node, problem.mesh.cell2node)), problem.k(mc.READ))
    problem.A.mult(problem.x, again)
    gathered = [v.gather() for v in (before, after, again)]
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[1], gathered[0])
        np.testing.assert_array_equal(gathered[2], gathered[0])


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("steps", [2, 5])
def test_powers_send_one_message_per_neighbour_for_all_products(comm, steps, monkeypatch):
    import collections

    from test_chains_mpi import CountingComm

    counting = CountingComm(comm, monkeypatch)
    mc.reset_runtime(comm=counting)
    problem = Problem(jittered_delaunay(40, seed=2), dim=1, seed=8)
    warm = problem.vectors(steps, "warm")
    problem.A.powers(problem.x, warm)  # builds the halo layers and fetches the halo rows once
    start, again = problem.vectors(2, "start")
    problem.A.mult(warm[-1], start)  # owned rows only: the next product from them exchanges
    problem.A.mult(warm[-1], again)
    counting.sends.clear()
    problem.A.powers(start, problem.vectors(steps, "y"))
    sends = collections.Counter(dest for dest, _ in counting.sends)
    assert set(sends.values()) <= {1}, sends  # one message to each neighbour for all the products
    counting.sends.clear()
    previous = again
    for y in problem.vectors(steps, "single"):
        problem.A.mult(previous, y)
        previous = y
    singles = collections.Counter(dest for dest, _ in counting.sends)
    # s products send s messages to each depth-1 neighbour; the s-deep halo may have a few more
    # neighbours (ranks only a deeper layer reaches), each sent one message too
    assert set(singles) <= set(sends) and all(count == steps for count in singles.values())


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("scaled", [False, True])
def test_shifted_and_scaled_products_equal_scipys(comm, scaled):
    """The s-step bases' products, ``y_k = (S A S - θ_k I) y_(k-1) + γ_k y_(k-2)`` for two
    sequences of different lengths in one exchange (the first with the pulls ``γ`` of complex
    conjugate Newton shifts, the second without), against SciPy on the gathered matrix (the
    scaled rows are worked out once per call, so their sums may round otherwise: 1e-12)."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(40, seed=6), dim=2, seed=9)
    d = problem.mesh
    rng = np.random.default_rng(1)
    scale = mc.Dat(d.nodes, 2, rng.uniform(0.5, 2.0, (d.nodes.size, 2)), "scale")
    other = mc.Dat(d.nodes, 2, rng.standard_normal((d.nodes.size, 2)), "other")
    shifts, pulls = [0.75, -1.5, 2.0, 0.25], [0.0, 0.5, 0.0, 3.0]
    first, second = problem.vectors(4, "first"), problem.vectors(2, "second")
    mc.api.engine_surface().matrices.products(problem.A, [(problem.x, first, shifts, pulls), (other, second, shifts)],
                                              scale=scale if scaled else None)
    A, got = problem.A.to_scipy(), [y.gather() for y in first + second]
    starts, s = [problem.x.gather(), other.gather()], scale.gather()
    if comm.rank == 0:
        S = s.ravel() if scaled else np.ones(A.shape[0])
        want = []
        for start, count, gammas in zip(starts, (4, 2), (pulls, [0.0, 0.0])):
            before, y = None, start.ravel()
            for k in range(count):
                before, y = y, S * (A @ (S * y)) - shifts[k] * y + (gammas[k] * before if gammas[k] else 0.0)
                want.append(y)
        for have, expected in zip(got, want):
            np.testing.assert_allclose(have.ravel(), expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_a_sequence_plan_runs_shifted_and_scaled_products_again_and_again(comm):
    """A plan's products ``(S A S - θ_k I) y_(k-1)`` against SciPy on the gathered matrix,
    run three times with other shifts, ``x`` changed in between (its halo exchanged again)
    and once the scale; too few shifts or too small an array are refused; the plan is kept
    with the matrix, also when its values change (assembled again: its rows' values fetched
    again, ``S A S`` worked out again); a plan whose dat's storage moved (deeper halo layers
    added since) is refused."""
    mc.reset_runtime(comm=comm)
    problem = Problem(jittered_delaunay(40, seed=6), dim=2, seed=9)
    d = problem.mesh
    rng = np.random.default_rng(1)
    scale = mc.Dat(d.nodes, 2, rng.uniform(0.5, 2.0, (d.nodes.size, 2)), "scale")
    matrices = mc.api.engine_surface().matrices
    plan = matrices.sequence_plan(problem.A, problem.x, 3, scale=scale)
    assert matrices.sequence_plan(problem.A, problem.x, 3, scale=scale) is plan  # kept with the matrix's rows
    rows = np.empty((4, plan.width))

    def products_equal_scipys(shifts):
        A, s = problem.A.to_scipy(), scale.gather()
        plan.run(np.array(shifts), rows)
        got = []
        for k in range(1, 4):
            y = problem.vectors(1, f"got{k}")[0]
            y.data[...] = rows[k, :y.data.size].reshape(y.data.shape)
            got.append(y.gather())
        start = problem.x.gather()
        if comm.rank == 0:
            y = start.ravel()
            for k in range(3):
                y = s.ravel() * (A @ (s.ravel() * y)) - shifts[k] * y
                np.testing.assert_allclose(got[k].ravel(), y, rtol=1e-12, atol=1e-12 * np.abs(y).max())

    for shifts in ([0.75, -1.5, 2.0], [0.0, 0.5, 0.25], [1.0, 0.0, -0.5]):
        products_equal_scipys(shifts)
        problem.x.data[...] *= -2.0  # written in place: its halo is stale, the next run exchanges it
        if shifts[0] == 0.0:
            scale.data[...] *= 1.5  # so is the scale's: the next run exchanges it and scales the matrix again
    for shifts, out in ((np.zeros(2), rows), (np.zeros(3), rows[:3]), (np.zeros(3), rows[:, :-1]),
                        (np.zeros(3), rows.astype(np.float32))):  # too few shifts, rows, columns; not float64
        with pytest.raises(mc.DataShapeError, match="SequencePlan.run"):
            plan.run(shifts, out)
    bump = mc.Kernel.from_source("def bump(a):\n" + "".join(f"    a[{i}, {i}] += 1.0\n" for i in range(6)))
    mc.par_loop(bump, d.cells, problem.A(mc.INC, (d.cell2node, d.cell2node)))
    assert matrices.sequence_plan(problem.A, problem.x, 3, scale=scale) is plan  # new values: the same plan ...
    products_equal_scipys([0.5, -1.0, 0.0])  # ... multiplying by them (halo rows' values fetched again)
    problem.A.zero()
    mc.par_loop(bump, d.cells, problem.A(mc.INC, (d.cell2node, d.cell2node)))  # assembled again: other values
    products_equal_scipys([0.0, 0.0, 0.0])
    if comm.size > 1:
        matrices.prepare_products(problem.A, 6)  # deeper halo layers: every dat's storage moves
        with pytest.raises(mc.DeclarationError, match="storage moved"):
            plan.run(np.zeros(3), rows)


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), steps=st.integers(1, 6))
def test_a_sequence_plan_has_the_bits_of_powers_on_float_data(comm, mesh, dim, seed, steps):
    """On float data (sums rounded), a sequence plan's shifted products (on several ranks
    computed partly while the exchange's messages travel, every product's rows that need no
    received value first) have the bits of ``sequences`` (the exchange, then each product);
    the owned rows are ordered so that each product's rows before and after the messages are
    one run each."""
    from meshchain.engine.powers import rows_before_arrival, sequences

    mc.reset_runtime(comm=comm)
    problem = Problem(mesh, dim=dim, seed=seed)
    rng = np.random.default_rng(seed)
    problem.x.data[...] = rng.standard_normal(problem.x.data.shape)
    problem.k.data[...] *= rng.uniform(0.5, 1.5, problem.k.data.shape)
    problem.A.zero()
    mc.par_loop(copy_kernel(problem.mesh.cell2node.arity * dim, problem.mesh.cell2node.arity * dim),
                problem.mesh.cells, problem.A(mc.INC, (problem.mesh.cell2node, problem.mesh.cell2node)),
                problem.k(mc.READ))
    shifts = rng.uniform(-1.0, 1.0, steps)
    matrices = mc.api.engine_surface().matrices
    want = problem.vectors(steps, "want")
    sequences(matrices, problem.A, [(problem.x, want, shifts)])
    plan = matrices.sequence_plan(problem.A, problem.x, steps)
    problem.x.data[...] *= 1.0  # written: its halo is stale, the plan's run exchanges it ...
    plan.host.reshape(-1)[plan.rows.count(0):] = np.nan  # ... over values a row run before the messages came would read
    rows = np.full((steps + 1, plan.width), np.nan)
    plan.run(shifts, rows)
    have = problem.vectors(steps, "have")
    for k, y in enumerate(have, start=1):
        y.data[...] = rows[k, :y.data.size].reshape(y.data.shape)
    equal_on_rank_0(comm, [(w.gather(), h.gather()) for w, h in zip(want, have)],
                    "sequence plan against sequences on float data")
    indptr, _, indices, targets = plan.rows.unsigned
    _, at = rows_before_arrival(indptr, indices, targets, plan.counts, plan.rows.count(0), plan.width)
    assert (np.diff(at) <= 2).all(), np.diff(at)  # (first, end) pairs: at most one run each


@settings(max_examples=40, deadline=None, derandomize=True)
@given(rows=st.integers(1, 30), owned=st.integers(0, 30), steps=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_rows_before_arrival_need_no_received_value(rows, owned, steps, seed):
    """Each product's rows split into those computed before the messages arrive and after,
    each row once; run on a vector whose entries from ``owned`` on are NaN (not arrived),
    the rows computed before read no NaN, and the rows of both parts equal the whole product."""
    from meshchain.backends.sparse import csr_sequence, csr_spans
    from meshchain.engine.powers import rows_before_arrival

    rng = np.random.default_rng(seed)
    width = rows
    owned = min(owned, width)
    lengths = rng.integers(0, 5, rows)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    indices = rng.integers(0, width, indptr[-1]).astype(np.int64)
    values = rng.standard_normal(indptr[-1])
    targets = rng.permutation(width)[:rows].astype(np.int64)
    counts = np.sort(rng.integers(0, rows + 1, steps))[::-1].astype(np.int64)
    shifts = rng.standard_normal(steps)
    spans, at = rows_before_arrival(indptr, indices, targets, counts, owned, width)

    def rows(lo, hi):
        return [r for first, end in spans[lo:hi].reshape(-1, 2) for r in range(first, end)]

    early = np.full((steps + 1, width), np.nan)
    early[0, :owned] = rng.standard_normal(owned)
    for k in range(steps):
        assert sorted(rows(at[2 * k], at[2 * k + 2])) == list(range(counts[k]))  # every row of the product once
        before = spans[at[2 * k]:at[2 * k + 1]]
        csr_spans(indptr, indices, values, targets, before, early[k], early[k + 1], shifts[k])
        assert not np.isnan(early[k + 1, targets[rows(at[2 * k], at[2 * k + 1])]]).any()
    whole = np.zeros((steps + 1, width))
    whole[0] = rng.standard_normal(width)
    whole[0, :owned] = early[0, :owned]
    split = whole.copy()
    csr_sequence(indptr, indices, values, targets, counts, shifts, whole)
    for k in range(steps):
        for lo, hi in ((at[2 * k], at[2 * k + 1]), (at[2 * k + 1], at[2 * k + 2])):
            csr_spans(indptr, indices, values, targets, spans[lo:hi], split[k], split[k + 1], shifts[k])
    assert split.tobytes() == whole.tobytes()


@settings(max_examples=25, deadline=None, derandomize=True)
@given(rows=st.integers(1, 12), seed=st.integers(0, 2**31 - 1))
def test_the_powers_product_has_the_bits_of_the_owned_then_halo_products(rows, seed):
    """``csr_rows`` (the matrix powers product, one running sum per row) and ``csr_owned`` then
    ``csr_halo`` (the solvers' product, the halo entries added to the owned sum one by one, as
    PETSc's MPIAIJ product adds them) give the same bits on float data."""
    from meshchain.backends.sparse import csr_halo, csr_owned, csr_rows

    rng = np.random.default_rng(seed)
    n_owned, n_cols = rows + 2, rows + 6
    owned = [np.sort(rng.choice(n_owned, rng.integers(0, n_owned + 1), replace=False)) for _ in range(rows)]
    halo = [np.sort(rng.choice(np.arange(n_owned, n_cols), rng.integers(0, 5), replace=False)) for _ in range(rows)]
    indices = np.concatenate([np.concatenate([o, h]) for o, h in zip(owned, halo)]).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum([len(o) + len(h) for o, h in zip(owned, halo)])]).astype(np.int64)
    split = indptr[:-1] + np.array([len(o) for o in owned], dtype=np.int64)
    values, x = rng.standard_normal(len(indices)), rng.standard_normal(n_cols)
    expected = np.zeros(rows)
    csr_owned(indptr, split, indices, values, x, expected)
    csr_halo(indptr, split, indices, values, x, expected)
    found = np.zeros(rows)
    csr_rows(indptr, indices, values, np.arange(rows), rows, x, found, 0.0)
    assert found.tobytes() == expected.tobytes()
