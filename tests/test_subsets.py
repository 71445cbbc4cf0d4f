"""Subsets (``mc.Subset``, PyOP2's ``op2.Subset``): a loop over part of a set, with the
parent's dats reached directly and through the parent's maps, equals the parent's loop with
the other elements masked out; subsets of subsets; on 1-4 ranks loop by loop, in chains,
communication-avoiding and sparse-tiled, on every backend; bad input raises on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import meshchain as mc
from devices import DEVICE_BACKENDS
from chain_programs import RUNS, Program, assert_same_on_ranks, assert_same_results, programs, results_of
from meshchain.meshes import structured_quads
from test_backends_property import kernel_source

NO_CHECKS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def masked_source(source: str) -> str:
    """``source`` (a kernel) with a last parameter ``mask`` and its body run where ``mask[0]``."""
    header, *body = source.splitlines()
    lines = [header.replace("):", ", mask):"), "    if mask[0] != 0:", *("    " + line for line in body)]
    return "\n".join(lines) + "\n"


class SubsetProgram(Program):
    """A random program whose loops run over its sets, over random subsets of them, or over
    subsets of those (``levels``: 0, 1 or 2 per loop), with the parent sets' dats and maps.
    ``masked``: the oracle instead, every loop over the whole parent set with its kernel run
    only where a mask dat says the element is in the subset (direct WRITE becomes RW, so the
    other elements keep their values)."""

    def __init__(self, spec, *, masked=False, method="kway"):
        program, self.seed, self.levels = spec
        self.masked = masked
        super().__init__(program, method=method)

    def declare_more(self):
        rng = np.random.default_rng(self.seed)
        self.subsets, self.masks = {}, {}
        for name, s in self.sets.items():
            first = rng.permutation(s.size)[: rng.integers(0, s.size + 1)]
            second = rng.permutation(len(first))[: rng.integers(0, len(first) + 1)]
            one = mc.Subset(s, first, f"{name}1")
            self.subsets[name] = (s, one, mc.Subset(one, second, f"{name}2"))
            for level, ids in ((1, first), (2, first[second])):
                mask = np.zeros((s.size, 1), dtype=np.int64)
                mask[ids] = 1
                self.masks[name, level] = mc.Dat(s, 1, mask, f"mask_{name}{level}", dtype=np.int64)
        for position, ((set_name, _), level) in enumerate(zip(self.loop_specs, self.levels)):
            if level and not self.masked:
                self.itersets[position] = self.subsets[set_name][level]

    def _masking(self, position) -> bool:
        return self.masked and self.levels[position] > 0

    def _args(self, position, objects=None):
        args = super()._args(position, objects)
        if not self._masking(position):
            return args
        set_name = self.loop_specs[position][0]
        args = [a.data(mc.RW) if a.map is None and not a.data.is_global and a.access is mc.WRITE else a for a in args]
        return [*args, self.masks[set_name, self.levels[position]](mc.READ)]

    def _kernel(self, position):
        source = kernel_source(super()._args(position), name=f"loop{position}")
        return mc.Kernel.from_source(masked_source(source) if self._masking(position) else source)


@st.composite
def subset_programs(draw, max_loops=5):
    program = draw(programs(max_loops=max_loops))
    levels = draw(st.lists(st.sampled_from([0, 1, 1, 2]), min_size=len(program[1]), max_size=len(program[1])))
    return program, draw(st.integers(0, 2**16)), tuple(levels)


def outcome(spec, runs, *, comm=None, masked=False, backend="numba"):
    """The results of ``spec`` run twice in each way of ``runs``, one after the other in one session."""
    return results_of(lambda: SubsetProgram(spec, masked=masked), runs, comm=comm, backend=backend)


def oracle(spec, runs):
    """The masked parent loops, loop by loop on one process, as many times as ``runs`` runs."""
    return outcome(spec, [(None, None)] * len(runs), comm=MPI.COMM_SELF, masked=True, backend="reference")


@settings(max_examples=6, **NO_CHECKS)
@given(spec=subset_programs(), backend=st.sampled_from(["reference", "numba"]), runs=st.permutations(RUNS))
def test_loops_over_subsets_equal_the_parent_loops_masked(spec, backend, runs):
    assert_same_results(outcome(spec, runs, backend=backend), oracle(spec, runs), f"{backend}, {runs}")


@pytest.mark.parametrize("device", DEVICE_BACKENDS)
@settings(max_examples=2, **NO_CHECKS)
@given(spec=subset_programs(max_loops=4), runs=st.permutations(RUNS[:3]))
def test_loops_over_subsets_on_the_device_equal_the_parent_loops_masked(device, spec, runs):
    assert_same_results(outcome(spec, runs, backend=device), oracle(spec, runs), f"{device}, {runs}")


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=900)
@settings(max_examples=3, **NO_CHECKS)
@given(spec=subset_programs(max_loops=4), runs=st.permutations(RUNS[:1] + RUNS[2:]))
def test_subset_chains_on_ranks_equal_the_parent_loops_masked_on_one(comm, spec, runs):
    expected, got = oracle(spec, runs), outcome(spec, runs, comm=comm)
    assert_same_on_ranks(comm, got, expected, f"{runs}")


def quads():
    mesh = structured_quads(4, 3).declare()
    return mesh.cells, mesh.nodes, mesh.cell2node


def test_a_subset_reads_and_writes_its_parents_dats_directly_and_through_its_maps():
    cells, nodes, c2n = quads()
    chosen = np.array([7, 0, 10, 3])
    part = mc.Subset(cells, chosen, "part")
    q = mc.Dat(cells, 1, np.arange(12.0), "q")
    u = mc.Dat(nodes, 1, None, "u")
    lo = mc.Dat(nodes, 1, np.full(nodes.size, 99.0), "lo")
    mine = mc.Dat(part, 2, None, "mine")
    spread = mc.Kernel.from_source("def spread(a, b, low, own):\n    for i in range(4):\n        b[i, 0] += a[0]\n"
                                   "        low[i, 0] = min(low[i, 0], a[0])\n"
                                   "    own[0] = a[0]\n    own[1] = 2 * a[0]\n")
    mc.par_loop(spread, part, q(mc.READ), u(mc.INC, c2n), lo(mc.MIN, c2n), mine(mc.WRITE))
    expected_u, expected_lo = np.zeros(nodes.size), np.full(nodes.size, 99.0)
    values = c2n.values
    for c in chosen:
        for n in values[c]:
            expected_u[n] += c
            expected_lo[n] = min(expected_lo[n], c)
    np.testing.assert_array_equal(u.data[:, 0], expected_u)
    np.testing.assert_array_equal(lo.data[:, 0], expected_lo)
    np.testing.assert_array_equal(mine.gather(), np.stack([chosen, 2 * chosen], axis=1).astype(float))
    twice = mc.Kernel.from_source("def twice(a):\n    a[0] = 2 * a[0] + 1\n")
    inner = mc.Subset(part, [3, 1], "inner")  # cells 3 and 0
    mc.par_loop(twice, inner, q(mc.RW))
    expected_q = np.arange(12.0)
    expected_q[[3, 0]] = 2 * expected_q[[3, 0]] + 1
    np.testing.assert_array_equal(q.data[:, 0], expected_q)


def test_a_boolean_mask_and_whole_floats_choose_the_elements():
    cells, _, _ = quads()
    mask = np.zeros(cells.size, dtype=bool)
    mask[[2, 5]] = True
    assert mc.Subset(cells, mask, "m").indices.tolist() == [2, 5]
    assert mc.Subset(cells, [4.0, 1.0], "f").indices.tolist() == [4, 1]
    assert mc.Subset(cells, [], "none").size == 0


@pytest.mark.parametrize("indices, message", [
    ([1, 1], "listed 2 times"),
    ([0, 12], "outside [0, 12)"),
    ([-1], "outside [0, 12)"),
    ([0.5], "must be integers"),
    (np.ones((2, 2), dtype=int), "flat list"),
    (np.ones(3, dtype=bool), "one entry per element"),
])
def test_bad_indices_raise(indices, message):
    cells, _, _ = quads()
    with pytest.raises(mc.DeclarationError, match=message.replace("[", r"\[").replace(")", r"\)")):
        mc.Subset(cells, indices, "bad")


def test_a_subset_of_a_grid_or_of_no_set_is_refused():
    with pytest.raises(mc.DeclarationError, match="structured grid"):
        mc.Subset(mc.Grid((3, 3), "g"), [0], "s")
    with pytest.raises(mc.DeclarationError, match="must be a meshchain.Set"):
        mc.Subset([1, 2], [0], "s")


def test_a_dat_of_an_unrelated_set_or_map_still_names_the_mismatch():
    cells, nodes, c2n = quads()
    part = mc.Subset(nodes, [0, 1], "part")
    q = mc.Dat(cells, 1, None, "q")
    k = mc.Kernel.from_source("def k(a):\n    a[0] = 1.0\n")
    with pytest.raises(mc.SetMismatchError, match="lives on 'cells'"):
        mc.par_loop(k, part, q(mc.WRITE))
    u = mc.Dat(nodes, 1, None, "u")
    with pytest.raises(mc.SetMismatchError, match="whose source set is 'cells'"):
        mc.par_loop(mc.Kernel.from_source("def r(a):\n    b = a[0, 0]\n"), part, u(mc.READ, c2n))


@pytest.mark.mpi(nprocs=(3,), timeout=300)
def test_on_ranks_a_subset_follows_its_parent_and_bad_use_raises_on_every_rank(comm):
    cells, nodes, c2n = quads()
    part = mc.Subset(cells, np.arange(0, 12, 2), "even")
    mc.partition("kway", seed_set=cells)
    owned_parents = part.injection.values[: part.n_owned, 0]
    assert np.all(owned_parents < cells.n_owned)  # its owned elements' parents are owned here
    assert comm.allreduce(part.n_owned) == part.size
    with pytest.raises(mc.DeclarationError, match="after mc.partition"):
        mc.Subset(nodes, [0, 1], "late")
    mc.reset_runtime(comm=comm)
    cells, _, _ = quads()
    part = mc.Subset(cells, [0, 1], "part")
    with pytest.raises(mc.ConfigurationError, match="is a Subset"):
        mc.partition("kway", seed_set=part)


def test_zero_rows_of_a_subset_equals_zero_rows_of_its_ids():
    cells, nodes, c2n = quads()
    corners = mc.Subset(mc.Subset(nodes, [0, 4, 15, 19, 7], "some"), [4, 0, 2], "corners")  # nodes 7, 0, 15
    ones = mc.Kernel.from_source("def ones(a):\n    for i in range(4):\n        for j in range(4):\n"
                                 "            a[i, j] += 1.0 + i - j\n")
    matrices = []
    for rows in (corners, [7, 0, 15]):
        A = mc.Mat(nodes, nodes, [(c2n, c2n)], "A")
        mc.par_loop(ones, cells, A(mc.INC, (c2n, c2n)))
        A.zero_rows(rows, diagonal=3.0)
        matrices.append(A.to_scipy().toarray())
    np.testing.assert_array_equal(matrices[0], matrices[1])
    assert matrices[0][7].tolist() == [3.0 if j == 7 else 0.0 for j in range(nodes.size)]
    with pytest.raises(mc.DeclarationError, match="is not a subset of 'cells'"):
        mc.Mat(cells, cells, [(mc.Map(cells, cells, 1, np.arange(12)[:, None], "id"),) * 2], "B").zero_rows(corners)


STIFF = ("def stiff(a, x):\n    for i in range(4):\n        for j in range(4):\n"
         "            a[i, j] += (1.0 + i * j) * x[0] {mask}\n")


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
def test_a_matrix_assembled_over_a_subset_equals_the_parent_loop_masked(comm):
    """PyOP2 assembles boundary terms over a subset of the elements: the block rows and columns
    come from the parent's maps, composed with the subset's injection."""
    matrices = []
    for masked in (False, True):
        mc.reset_runtime(comm=comm)
        cells, nodes, c2n = quads()
        chosen = np.array([5, 0, 11, 6])
        part = mc.Subset(cells, chosen, "part")
        flags = np.zeros((cells.size, 1))
        flags[chosen] = 1.0
        x = mc.Dat(cells, 1, np.arange(1.0, 13.0), "x")
        mask = mc.Dat(cells, 1, flags, "mask")
        mc.partition("kway", seed_set=cells)
        A = mc.Mat(nodes, nodes, [(c2n, c2n)], "A")
        if masked:
            kernel = mc.Kernel.from_source(STIFF.format(mask="* m[0]").replace("(a, x)", "(a, x, m)"))
            mc.par_loop(kernel, cells, A(mc.INC, (c2n, c2n)), x(mc.READ), mask(mc.READ))
        else:
            mc.par_loop(mc.Kernel.from_source(STIFF.format(mask="")), part, A(mc.INC, (c2n, c2n)), x(mc.READ))
        matrices.append(A.to_scipy())
    if comm.rank == 0:
        np.testing.assert_array_equal(matrices[0].toarray(), matrices[1].toarray())
        assert matrices[0].toarray().any()


def repartitioned_program(comm):
    """Loops over subsets, a repartition by weights, the same loops again: the results."""
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(8, 6).declare()
    cells, nodes, c2n = mesh.cells, mesh.nodes, mesh.cell2node
    rng = np.random.default_rng(3)
    part = mc.Subset(cells, rng.permutation(cells.size)[:25], "part")
    wall = mc.Subset(nodes, rng.permutation(nodes.size)[:20], "wall")
    q = mc.Dat(cells, 1, np.arange(cells.size), "q", dtype=np.int64)
    u = mc.Dat(nodes, 1, np.arange(nodes.size) % 7, "u", dtype=np.int64)
    spread = mc.Kernel.from_source("def spread(a, b):\n    for i in range(4):\n        b[i, 0] += a[0] + i\n")
    bump = mc.Kernel.from_source("def bump(b):\n    b[0] = 2 * b[0] - 1\n")
    gather = mc.Kernel.from_source("def gather(b, a):\n    a[0] += b[0, 0] - b[2, 0]\n")
    mc.partition("kway", seed_set=cells)
    for step in range(2):
        with mc.loop_chain("step", ca=True):
            mc.par_loop(spread, part, q(mc.READ), u(mc.INC, c2n))
            mc.par_loop(bump, wall, u(mc.RW))
            mc.par_loop(gather, part, u(mc.READ, c2n), q(mc.INC))
        if step == 0:
            weights = 1.0 + (np.arange(cells.n_owned) % 3)
            mc.repartition("kway", weights=weights)
    return q.gather(), u.gather()


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_subsets_follow_a_repartition(comm):
    got, expected = repartitioned_program(comm), repartitioned_program(MPI.COMM_SELF)
    if comm.rank == 0:
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
