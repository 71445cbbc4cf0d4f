"""Matrices assembled on the mesh: ``A.to_scipy()`` equals a SciPy assembly of the same
element matrices on 1-4 ranks, ``zero_rows`` and ``mult`` as specified, bad use refused."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from helpers import layout_of
from meshchain.meshes import jittered_delaunay, structured_quads

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


def copy_kernel(rows: int, cols: int):
    """``copy(a, k)``: adds the cell's element matrix ``k`` (flattened) into the block."""
    lines = ["def copy(a, k):"] + [f"    a[{i}, {j}] += k[{i * cols + j}]" for i in range(rows) for j in range(cols)]
    return mc.Kernel.from_source("\n".join(lines) + "\n")


def reference(cells: np.ndarray, blocks: np.ndarray, n: int, dim: int) -> sp.csr_matrix:
    """SciPy assembly of ``blocks[e]`` (shape (arity * dim, arity * dim)) through ``cells``."""
    arity = cells.shape[1]
    scalar = (cells[:, :, None] * dim + np.arange(dim)[None, None, :]).reshape(len(cells), arity * dim)
    rows = np.repeat(scalar[:, :, None], arity * dim, axis=2).ravel()
    cols = np.repeat(scalar[:, None, :], arity * dim, axis=1).ravel()
    return sp.csr_matrix((blocks.ravel(), (rows, cols)), shape=(n * dim, n * dim))


def declare(mesh, dim: int, seed: int, method: str):
    d = mesh.declare()
    rng = np.random.default_rng(seed)
    size = (d.cell2node.arity * dim) ** 2
    blocks = rng.integers(-4, 5, size=(mesh.ncell, size)).astype(np.float64)  # exact sums in any order
    k = mc.Dat(d.cells, size, blocks, "k")
    mc.partition(method, coords=d.coords, seed_set=None if method == "rib" else d.cells, seed=seed)
    A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A", dim=dim)
    width = d.cell2node.arity * dim
    mc.par_loop(copy_kernel(width, width), d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    return d, A, blocks.reshape(mesh.ncell, width, width)


MESHES = st.one_of(st.builds(jittered_delaunay, st.integers(6, 40), seed=st.integers(0, 99)),
                   st.builds(structured_quads, st.integers(1, 6), st.integers(1, 6)))


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=400)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mesh=MESHES, dim=st.sampled_from([1, 2]), seed=st.integers(0, 1000), method=st.sampled_from(["rib", "kway"]))
def test_assembly_equals_scipy_and_mult_equals_scipy_product(comm, mesh, dim, seed, method):
    mc.reset_runtime(comm=comm)
    d, A, blocks = declare(mesh, dim, seed, method)
    x_values = np.random.default_rng(seed + 1).standard_normal((mesh.nnode, dim))
    x = mc.Dat(d.nodes, dim, x_values, "x")
    y = mc.Dat(d.nodes, dim, None, "y")
    A.mult(x, y)
    gathered, product = A.to_scipy(), y.gather()
    if comm.rank == 0:
        expected = reference(mesh.cells, blocks, mesh.nnode, dim)
        assert abs(gathered - expected).max() == 0.0
        assert gathered.nnz == expected.nnz  # the sparsity holds every map pair and nothing more
        np.testing.assert_allclose(product.ravel(), expected @ x_values.ravel(), rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
def test_zero_rows_zeroes_every_component_and_sets_the_diagonal(comm):
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(5, 4)
    d, A, blocks = declare(mesh, 2, 3, "kway")
    matrices = mc.get_runtime().surface.matrices
    norms = [matrices.norm_inf(A)]  # ||A||_inf, kept until the values change (the solvers' bounds)
    rows = np.array([0, 7, 29])
    A.zero_rows(rows, diagonal=5.0)
    norms += [matrices.norm_inf(A), matrices.norm_inf(A)]
    gathered = A.to_scipy()
    diagonal = mc.Dat(d.nodes, 2, None, "diagonal")
    A.diagonal(diagonal)
    values = diagonal.gather()
    if comm.rank == 0:
        expected = reference(mesh.cells, blocks, mesh.nnode, 2).tolil()
        for r in rows:
            for c in range(2):
                expected[2 * r + c, :] = 0.0
                expected[2 * r + c, 2 * r + c] = 5.0
        assert abs(gathered - expected.tocsr()).max() == 0.0
        np.testing.assert_array_equal(values.ravel(), expected.tocsr().diagonal())
        before = abs(reference(mesh.cells, blocks, mesh.nnode, 2)).sum(axis=1).max()
        assert norms == [before, *[abs(expected.tocsr()).sum(axis=1).max()] * 2], norms


@pytest.mark.mpi(nprocs=(1, 2), timeout=200)
def test_assembling_twice_adds_and_zero_starts_again(comm):
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(3, 3)
    d, A, blocks = declare(mesh, 1, 0, "kway")
    k = mc.Dat(d.cells, 16, blocks.reshape(mesh.ncell, 16), "k again")
    mc.par_loop(copy_kernel(4, 4), d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    twice = A.to_scipy()
    A.zero()
    mc.par_loop(copy_kernel(4, 4), d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    once = A.to_scipy()
    if comm.rank == 0:
        expected = reference(mesh.cells, blocks, mesh.nnode, 1)
        assert abs(twice - 2 * expected).max() == 0.0
        assert abs(once - expected).max() == 0.0


@pytest.mark.mpi(nprocs=(1, 2), timeout=200)
def test_bad_matrix_use_is_refused_with_errors_naming_the_objects(comm):
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(3, 3)
    d, A, _ = declare(mesh, 1, 0, "kway")
    with pytest.raises(mc.AccessModeError, match=r"mc.INC \(add the blocks\) or mc.WRITE \(set their entries\)"):
        A(mc.READ, (d.cell2node, d.cell2node))
    with pytest.raises(mc.SetMismatchError, match="not one of its map pairs"):
        A(mc.INC, (d.facet2node, d.facet2node))
    with pytest.raises(mc.MapError, match="points to"):
        mc.Mat(d.cells, d.nodes, [(d.cell2node, d.cell2node)], "wrong rows")
    x_cells = mc.Dat(d.cells, 1, None, "on cells")
    y = mc.Dat(d.nodes, 1, None, "y")
    with pytest.raises(mc.SetMismatchError, match="'on cells' lives on"):
        A.mult(x_cells, y)
    with pytest.raises(mc.DataShapeError, match="same Dat"):
        A.mult(y, y)
    with pytest.raises(mc.DataShapeError, match="outside"):
        A.zero_rows([mesh.nnode + 3])

    @mc.kernel
    def overwrite(a):
        a[0, 0] = 1.0

    with pytest.raises(mc.AccessModeError, match="may only be incremented"):
        mc.par_loop(overwrite, d.cells, A(mc.INC, (d.cell2node, d.cell2node)))


def insert_kernel(arity: int, dim: int):
    """``insert(a, ids)``: sets entry (i, c; j, c') of the block to a function of the two nodes'
    global ids and the components: the same value from every cell that reaches the entry."""
    lines = ["def insert(a, ids):"] + [
        f"    a[{i * dim + c}, {j * dim + e}] = 100.0 * ids[{i}, 0] + ids[{j}, 0] + {0.1 * c + 0.01 * e}"
        for i in range(arity) for j in range(arity) for c in range(dim) for e in range(dim)]
    return mc.Kernel.from_source("\n".join(lines) + "\n")


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=300)
@pytest.mark.parametrize("dim", [1, 2])
def test_insertion_sets_entries_then_increments_add_to_them(comm, dim):
    mc.reset_runtime(comm=comm)
    mesh = jittered_delaunay(30, seed=4)
    d, A, blocks = declare(mesh, dim, 5, "rib")
    A.zero()
    ids = mc.Dat(d.nodes, 1, np.arange(mesh.nnode, dtype=np.float64), "ids")
    arity = d.cell2node.arity
    mc.par_loop(insert_kernel(arity, dim), d.cells, A(mc.WRITE, (d.cell2node, d.cell2node)), ids(mc.READ, d.cell2node))
    inserted = A.to_scipy()
    k = mc.Dat(d.cells, (arity * dim) ** 2, blocks.reshape(mesh.ncell, -1), "k again")
    mc.par_loop(copy_kernel(arity * dim, arity * dim), d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    both = A.to_scipy()
    if comm.rank == 0:
        added = reference(mesh.cells, blocks, mesh.nnode, dim)
        pattern = reference(mesh.cells, np.ones_like(blocks), mesh.nnode, dim)
        rows, cols = pattern.nonzero()
        want = sp.csr_matrix((100.0 * (rows // dim) + cols // dim + 0.1 * (rows % dim) + 0.01 * (cols % dim),
                              (rows, cols)), shape=pattern.shape)
        assert abs(inserted - want).max() < 1e-12
        assert abs(both - (want + added)).max() < 1e-12


@pytest.mark.mpi(nprocs=(1, 2), timeout=200)
def test_a_square_matrix_keeps_a_diagonal_entry_in_rows_no_element_reaches(comm):
    mc.reset_runtime(comm=comm)
    nodes, edges = mc.Set(5, "nodes"), mc.Set(3, "edges")
    e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2], [2, 3]], "e2n")  # node 4: no edge
    coords = mc.Dat(nodes, 2, np.array([[i, 0.0] for i in range(5)]), "coords")
    mc.partition("rib", coords=coords)
    A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
    mc.par_loop(copy_kernel(2, 2), edges, A(mc.INC, (e2n, e2n)),
                mc.Dat(edges, 4, np.tile([1.0, -1.0, -1.0, 1.0], (3, 1)), "k")(mc.READ))
    A.zero_rows([4, 0], diagonal=3.0)
    gathered = A.to_scipy()
    if comm.rank == 0:
        dense = gathered.toarray()
        assert dense[4].tolist() == [0, 0, 0, 0, 3.0] and dense[0].tolist() == [3.0, 0, 0, 0, 0]
        assert dense[2].tolist() == [0, -1.0, 2.0, -1.0, 0]
        assert gathered.nnz == 3 * 4 - 2 + 1  # the edges' entries, and node 4's diagonal


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_a_matrix_assembled_before_a_repartition_must_be_zeroed_and_assembled_again(comm):
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(4, 4)
    d, A, blocks = declare(mesh, 1, 2, "kway")
    x = mc.Dat(d.nodes, 1, np.arange(float(mesh.nnode)), "x")
    y = mc.Dat(d.nodes, 1, None, "y")
    A.mult(x, y)
    before = y.gather()
    mc.repartition("block")
    with pytest.raises(mc.DeclarationError, match="repartitioned.*zero"):
        A.mult(x, y)
    A.zero()
    k = mc.Dat(d.cells, 16, blocks.reshape(mesh.ncell, 16), "k after")
    mc.par_loop(copy_kernel(4, 4), d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    A.mult(x, y)
    gathered, after = A.to_scipy(), y.gather()
    if comm.rank == 0:
        assert abs(gathered - reference(mesh.cells, blocks, mesh.nnode, 1)).max() == 0.0
        np.testing.assert_allclose(after, before, rtol=1e-13)


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
@pytest.mark.parametrize("dim", [1, 2])
def test_a_matrix_keeps_its_values_when_deeper_halo_layers_order_its_owned_rows_otherwise(comm, dim):
    """A rank's owned elements are ordered by their distance from the halo, through the maps
    alive when the layout is built. A map collected between the partition and a deeper halo
    (here a map of probe pairs; in the test suite, whatever the garbage collector freed between
    two sessions on one mesh) reorders the owned nodes, and a matrix assembled before raised
    ``InternalError: owned rows moved`` at its next deeper use. Now its rows move by global id,
    as its columns and every dat's rows do: the same matrix after, and its powers SciPy's."""
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(10, 10)
    d = mesh.declare()
    rng = np.random.default_rng(0)
    width = d.cell2node.arity * dim
    blocks = rng.integers(-4, 5, size=(mesh.ncell, width * width)).astype(np.float64)
    k = mc.Dat(d.cells, width * width, blocks, "k")
    probes = mc.Set(40, "probes")
    pairs = mc.Map(probes, d.nodes, 2, rng.integers(0, mesh.nnode, (40, 2)), "pairs")
    mc.partition("rib", coords=d.coords)
    A = mc.Mat(d.nodes, d.nodes, [(d.cell2node, d.cell2node)], "A", dim=dim)
    mc.par_loop(copy_kernel(width, width), d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    owned = layout_of(d.nodes)
    before = owned.global_ids[:owned.n_owned].copy()
    del pairs, probes
    gc.collect()
    values = rng.integers(-3, 4, size=(mesh.nnode, dim)).astype(np.float64)
    x, ys = mc.Dat(d.nodes, dim, values, "x"), [mc.Dat(d.nodes, dim, None, f"y{i}") for i in range(3)]
    A.powers(x, ys)  # three halo layers
    owned = layout_of(d.nodes)
    reordered = comm.allreduce(int(not np.array_equal(owned.global_ids[:owned.n_owned], before)))
    assert reordered, "the owned nodes kept their order: this test tests nothing"
    gathered, powers = A.to_scipy(), [y.gather() for y in ys]
    if comm.rank == 0:
        expected = reference(mesh.cells, blocks.reshape(mesh.ncell, width, width), mesh.nnode, dim)
        assert abs(gathered - expected).max() == 0.0
        product = values.ravel()
        for power in powers:
            product = expected @ product
            np.testing.assert_array_equal(power.ravel(), product)  # integers: exact in any order


def test_assembling_again_reuses_the_generated_loop():
    mc.reset_runtime()
    mesh = structured_quads(3, 3)
    d, A, blocks = declare(mesh, 1, 0, "kway")
    k = mc.Dat(d.cells, 16, blocks.reshape(mesh.ncell, 16), "k")
    kernel = copy_kernel(4, 4)
    mc.par_loop(kernel, d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
    A.to_scipy()
    mc.stats(reset=True)
    for _ in range(3):
        A.zero()
        mc.par_loop(kernel, d.cells, A(mc.INC, (d.cell2node, d.cell2node)), k(mc.READ))
        A.to_scipy()
    record = mc.stats().loops["copy"]
    assert record.calls == 3 and record.time_compile == 0.0 and record.compilations == 0


SCALE = 1.0


@mc.kernel
def scaled(a):
    a[0, 0] += SCALE


def test_assembly_sees_a_changed_module_constant():
    global SCALE
    mc.reset_runtime()
    nodes, edges = mc.Set(2, "nodes"), mc.Set(1, "edges")
    e2n = mc.Map(edges, nodes, 2, [[0, 1]], "e2n")
    A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
    mc.par_loop(scaled, edges, A(mc.INC, (e2n, e2n)))
    first = A.to_scipy()[0, 0]
    SCALE = 3.0
    try:
        A.zero()
        mc.par_loop(scaled, edges, A(mc.INC, (e2n, e2n)))
        assert (first, A.to_scipy()[0, 0]) == (1.0, 3.0)
    finally:
        SCALE = 1.0
