"""Mixed spaces (``mc.MixedSet``, ``mc.MixedDat``, ``mc.MixedMap``, PyOP2's): a loop whose
kernel takes several dats as one flat view equals the same loop with one argument per dat,
on 1-4 ranks, loop by loop, in chains, communication-avoiding and sparse-tiled, on every
backend; mixed arithmetic equals NumPy; mixed dats checkpoint; bad input raises."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import meshchain as mc
from devices import DEVICE_BACKENDS
from chain_programs import (GLOBAL_NAMES, RUNS, Program, assert_same_on_ranks, assert_same_results, programs,
                            results_of)
from test_backends_property import kernel_source

NO_CHECKS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

class MixedProgram(Program):
    """A random program in which some arguments of a loop are taken together as one mixed
    argument (``grouped``): those with one mode that are all direct, or all reached through
    whole maps (a :class:`mc.MixedMap` of theirs). Its kernel is the program's kernel with
    those parameters read and written through one flat view; without ``grouped``, the
    program itself, the oracle."""

    def __init__(self, spec, *, grouped=True, method="kway"):
        program, self.seed = spec
        self.grouped, self.loop_specs_of_spec = grouped, program[1]
        self.groups = [self._groups(position, args) for position, (_, args) in enumerate(program[1])]
        assert any(self.groups), "a program without a mixed argument tests nothing"
        super().__init__(program, method=method)

    def _groups(self, position, specs) -> list:
        """Lists of argument positions taken together (one list per mixed argument): the
        arguments of one kind always, a lone one at random (always in the first loop that
        has candidates, so that every program has a mixed argument)."""
        rng = np.random.default_rng(self.seed + position)
        kinds = candidate_kinds(specs)
        first = all(not candidate_kinds(args) for _, args in self.loop_specs_of_spec[:position])
        return [members for members in kinds.values() if len(members) > 1 or first or rng.random() < 0.5]

    def _args(self, position, objects=None):
        args = super()._args(position, objects)
        if not self.grouped:
            return args
        firsts = {members[0]: members for members in self.groups[position]}
        taken = {k for members in self.groups[position] for k in members}
        grouped = []
        for k, arg in enumerate(args):
            if k in firsts:
                parts = [args[i] for i in firsts[k]]
                space = mc.MixedDat([p.data for p in parts], name=f"mixed{position}_{k}")
                path = None if parts[0].map is None else mc.MixedMap([p.map for p in parts], f"mmap{position}_{k}")
                grouped.append(space(arg.access, path))
            elif k not in taken:
                grouped.append(arg)
        return grouped

    def _kernel(self, position):
        args = super()._args(position)
        source = kernel_source(args, name=f"loop{position}")
        if self.grouped:
            source = flat_view_source(source, args, self.groups[position])
        return mc.Kernel.from_source(source)


def candidate_kinds(specs) -> dict:
    """The arguments that can be taken together, by kind: (mode, direct), positions."""
    kinds: dict = {}
    for k, (name, mode, map_name, index) in enumerate(specs):
        if name not in GLOBAL_NAMES and index is None:
            kinds.setdefault((mode, map_name is None), []).append(k)
    return kinds


def flat_view_source(source: str, args, groups) -> str:
    """``source`` with the parameters of each group read and written through one flat view
    (named after the group's first parameter), components in the group's order."""
    where = {}  # parameter -> (flat view, offset, view shape)
    for members in groups:
        offset = 0
        for k in members:
            shape = args[k].view_shape
            where[f"a{k}"] = (f"m{members[0]}", offset, shape)
            offset += int(np.prod(shape))

    def flat(match):
        name, index = match.group(1), match.group(2)
        if name not in where:
            return match.group(0)
        view, offset, shape = where[name]
        ix = [int(i) for i in index.split(",")]
        at = ix[0] * shape[1] + ix[1] if len(shape) == 2 else ix[0]
        return f"{view}[{offset + at}]"

    header, body = source.split("\n", 1)
    params = [p for p in re.findall(r"a\d+", header) if p not in where or where[p][0] == f"m{p[1:]}"]
    params = [where[p][0] if p in where else p for p in params]
    return f"def {header[4:header.index('(')]}({', '.join(params)}):\n" + re.sub(r"\b(a\d+)\[([^\]]+)\]", flat, body)


@st.composite
def mixed_programs(draw, max_loops=5):
    program = draw(programs(max_loops=max_loops).filter(lambda p: any(candidate_kinds(args) for _, args in p[1])))
    return program, draw(st.integers(0, 2**16))


def outcome(spec, runs, *, comm=None, grouped=True, backend="numba"):
    """The results of ``spec`` run twice in each way of ``runs``, one after the other in one session."""
    return results_of(lambda: MixedProgram(spec, grouped=grouped), runs, comm=comm, backend=backend)


def oracle(spec, runs):
    """The program with one argument per dat, loop by loop on one process."""
    return outcome(spec, [(None, None)] * len(runs), comm=MPI.COMM_SELF, grouped=False, backend="reference")


@settings(max_examples=5, **NO_CHECKS)
@given(spec=mixed_programs(), backend=st.sampled_from(["reference", "numba"]), runs=st.permutations(RUNS))
def test_mixed_arguments_equal_one_argument_per_dat(spec, backend, runs):
    assert_same_results(outcome(spec, runs, backend=backend), oracle(spec, runs), f"{backend}, {runs}")


@pytest.mark.parametrize("device", DEVICE_BACKENDS)
@settings(max_examples=2, **NO_CHECKS)
@given(spec=mixed_programs(max_loops=4), runs=st.permutations(RUNS[:3]))
def test_mixed_arguments_on_the_device_equal_one_argument_per_dat(device, spec, runs):
    assert_same_results(outcome(spec, runs, backend=device), oracle(spec, runs), f"{device}, {runs}")


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=900)
@settings(max_examples=2, **NO_CHECKS)
@given(spec=mixed_programs(max_loops=4), runs=st.permutations(RUNS[:1] + RUNS[2:]))
def test_mixed_chains_on_ranks_equal_one_argument_per_dat_on_one(comm, spec, runs):
    expected, got = oracle(spec, runs), outcome(spec, runs, comm=comm)
    assert_same_on_ranks(comm, got, expected, f"{runs}")


def test_a_flat_view_source_rewrites_only_the_grouped_parameters():
    mc.reset_runtime()
    s = mc.Set(2, "s")
    a, b, c = (mc.Dat(s, dim, None, name) for dim, name in ((2, "a"), (1, "b"), (3, "c")))
    args = [a(mc.READ), b(mc.INC), c(mc.READ)]
    source = "def k(a0, a1, a2):\n    s = a0[1] + a2[2]\n    a1[0] += s\n"
    assert flat_view_source(source, args, [[0, 2]]) == "def k(m0, a1):\n    s = m0[1] + m0[4]\n    a1[0] += s\n"


# --- arithmetic, values, checkpoints ----------------------------------------------------------------


def small_space():
    cells, nodes = mc.Set(3, "cells"), mc.Set(4, "nodes")
    return cells, nodes, mc.MixedSet([nodes, cells, nodes], "space")


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), dims=st.tuples(*[st.integers(1, 3)] * 3), a=st.integers(-3, 3))
def test_mixed_arithmetic_equals_numpy_component_by_component(seed, dims, a):
    mc.reset_runtime()
    _, _, space = small_space()
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-5, 6, size=(s.size, d)).astype(float) for s, d in zip(space, dims)]
    ys = [rng.integers(-5, 6, size=(s.size, d)).astype(float) for s, d in zip(space, dims)]
    x, y = mc.MixedDat(space, dims, xs, "x"), mc.MixedDat(space, dims, ys, "y")
    assert x.inner(y) == sum(float((p * q).sum()) for p, q in zip(xs, ys))
    assert x.norm == pytest.approx(np.sqrt(sum(float((p * p).sum()) for p in xs)))
    x.axpy(a, y)
    x += y
    x *= 2
    x -= y
    expected = [(p + a * q + q) * 2 - q for p, q in zip(xs, ys)]
    for got, want in zip(x.data_ro, expected):
        np.testing.assert_array_equal(got, want)
    z = mc.MixedDat(space, dims, None, "z")
    x.copy(z)
    for got, want in zip(z.data_ro, expected):
        np.testing.assert_array_equal(got, want)
    z.zero()
    assert z.norm == 0.0


def test_flat_data_fills_the_components_in_order_and_gather_returns_them():
    mc.reset_runtime()
    _, _, space = small_space()
    x = mc.MixedDat(space, (1, 2, 1), np.arange(4 + 6 + 4.0), "x")
    parts = x.gather()
    assert [p.ravel().tolist() for p in parts] == [[0, 1, 2, 3], list(range(4, 10)), [10, 11, 12, 13]]
    assert [d.name for d in x.split] == ["x[0]", "x[1]", "x[2]"]
    assert x.dims == (1, 2, 1) and x.dataset is space and len(space) == 3


def test_a_mixed_dat_of_existing_dats_shares_them():
    mc.reset_runtime()
    cells, nodes, _ = small_space()
    u, p = mc.Dat(nodes, 2, None, "u"), mc.Dat(cells, 1, None, "p")
    up = mc.MixedDat([u, p], name="up")
    up += 1.0
    assert u.data_ro.sum() == 8.0 and p.data_ro.sum() == 3.0
    assert [s.name for s in up.dataset] == ["nodes", "cells"]


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_a_mixed_dat_checkpoints_and_restores_its_components(comm, tmp_path_factory):
    mc.reset_runtime(comm=comm)
    from meshchain.meshes import structured_quads

    mesh = structured_quads(3, 2).declare()
    space = mc.MixedSet([mesh.nodes, mesh.cells], "space")
    x = mc.MixedDat(space, (2, 1), [np.arange(24.0).reshape(12, 2), np.arange(6.0)], "x")
    mc.partition("kway", seed_set=mesh.cells)
    path = comm.bcast(str(tmp_path_factory.mktemp("mixed") / "x.h5") if comm.rank == 0 else None)
    mc.checkpoint(path, [x])
    x.zero()
    mc.restore(path, [x])
    parts = x.gather()
    if comm.rank == 0:
        assert parts[0].ravel().tolist() == list(range(24)) and parts[1].ravel().tolist() == list(range(6))


def test_a_mixed_loop_reads_and_increments_through_a_mixed_map():
    mc.reset_runtime()
    cells, nodes = mc.Set(2, "cells"), mc.Set(3, "nodes")
    c2n = mc.Map(cells, nodes, 2, [[0, 1], [1, 2]], "c2n")
    c2c = mc.Map(cells, cells, 1, [[0], [1]], "c2c")
    space = mc.MixedSet([nodes, cells])
    src = mc.MixedDat(space, (1, 2), [np.array([1.0, 2.0, 4.0]), np.array([[10.0, 20.0], [30.0, 40.0]])], "src")
    dst = mc.MixedDat(space, (1, 2), None, "dst")
    total = mc.Dat(cells, 1, None, "total")
    both = mc.MixedMap([c2n, c2c], "both")

    @mc.kernel
    def spread(v, w, t):
        s = 0.0
        for k in range(4):
            s += v[k]
            w[k] += v[k]
        t[0] = s

    mc.par_loop(spread, cells, src(mc.READ, both), dst(mc.INC, both), total(mc.WRITE))
    assert total.data_ro.ravel().tolist() == [1 + 2 + 10 + 20, 2 + 4 + 30 + 40]
    assert dst.split[0].data_ro.ravel().tolist() == [1.0, 4.0, 4.0]
    assert dst.split[1].data_ro.tolist() == [[10.0, 20.0], [30.0, 40.0]]
    assert mc.stats().loops["spread"].calls == 1  # the loop keeps the user's kernel's name


@pytest.mark.parametrize("build, error, message", [
    (lambda sp, m: mc.MixedSet([], "e"), mc.DataShapeError, "non-empty sequence of meshchain.Set"),
    (lambda sp, m: mc.MixedSet([sp[0], "nodes"]), mc.DataShapeError, "meshchain.Set"),
    (lambda sp, m: mc.MixedMap([m, mc.Map(sp[0], sp[0], 1, [[0], [1], [2], [3]])]), mc.MapError, "start from one set"),
    (lambda sp, m: mc.MixedDat(sp, (1, 2)), mc.DataShapeError, "2 dims for 3 component sets"),
    (lambda sp, m: mc.MixedDat(sp, 1, np.zeros(5)), mc.DataShapeError, "one flat array of 11 values"),
    (lambda sp, m: mc.MixedDat([mc.Dat(sp[0], 1), mc.Dat(sp[1], 1, dtype=np.int64)]), mc.DataShapeError, "one dtype"),
    (lambda sp, m: mc.MixedDat(sp)(mc.MIN), mc.AccessModeError, "READ, WRITE, RW or INC"),
    (lambda sp, m: mc.MixedDat(sp)(mc.READ, m), mc.SetMismatchError, "must be a meshchain.MixedMap"),
    (lambda sp, m: mc.MixedDat(sp)(mc.READ, mc.MixedMap([m])), mc.SetMismatchError, "points to"),
])
def test_bad_mixed_input_raises(build, error, message):
    mc.reset_runtime()
    cells, nodes, space = small_space()
    c2n = mc.Map(cells, nodes, 1, [[0], [1], [2]], "c2n")
    with pytest.raises(error, match=message):
        build(space, c2n)


def test_a_kernel_with_the_wrong_count_of_parameters_is_named_and_a_mixed_set_is_no_iteration_set():
    mc.reset_runtime()
    cells, nodes, space = small_space()
    x = mc.MixedDat(mc.MixedSet([cells, cells]), 1, None, "x")
    two = mc.Kernel.from_source("def two(a, b):\n    a[0] = 1.0\n")
    with pytest.raises(mc.ArgumentCountError, match="kernel 'two' takes 2 argument"):
        mc.par_loop(two, cells, x(mc.WRITE))
    one = mc.Kernel.from_source("def one(a):\n    a[0] = 1.0\n")
    with pytest.raises(mc.SetMismatchError, match="iteration set must be a meshchain.Set, got MixedSet"):
        mc.par_loop(one, space, x(mc.WRITE))


# --- block matrices ----------------------------------------------------------------------------------


def element_kernel(rows: int, cols: int):
    """``element(a, f, k)``: adds the cell's element matrix ``k[:rows * cols]`` into the block
    and its last ``rows`` values into the flat right-hand side ``f``."""
    lines = ["def element(a, f, k):"]
    lines += [f"    a[{i}, {j}] += k[{i * cols + j}]" for i in range(rows) for j in range(cols)]
    lines += [f"    f[{i}] += k[{rows * cols + i}]" for i in range(rows)]
    return mc.Kernel.from_source("\n".join(lines) + "\n")


def scalar_numbers(maps, dims, sizes) -> np.ndarray:
    """Per cell, the global scalar number (in bmat's order) of each row of its element block."""
    offsets = np.cumsum([0, *(s * d for s, d in zip(sizes, dims))])
    parts = [(m[:, :, None] * d + np.arange(d)[None, None, :]).reshape(len(m), -1) + offsets[i]
             for i, (m, d) in enumerate(zip(maps, dims))]
    return np.concatenate(parts, axis=1)


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 5), kinds=st.lists(st.sampled_from(["nodes", "cells"]), min_size=2, max_size=3),
       dims=st.tuples(*[st.integers(1, 2)] * 3), seed=st.integers(0, 1000))
def test_a_block_matrix_equals_scipys_bmat_of_its_blocks_and_multiplies_like_it(comm, n, kinds, dims, seed):
    from meshchain.meshes import structured_quads

    mc.reset_runtime(comm=comm)
    mesh = structured_quads(n, n - 1)
    d = mesh.declare()
    cells_map = mc.Map(d.cells, d.cells, 1, np.arange(mesh.ncell)[:, None], "c2c")
    chosen = {"nodes": (d.nodes, d.cell2node, mesh.cells), "cells": (d.cells, cells_map, np.arange(mesh.ncell)[:, None])}
    sets, maps, values = zip(*(chosen[k] for k in kinds))
    dims = dims[:len(kinds)]
    space, both = mc.MixedSet(sets, "space"), mc.MixedMap(maps, "both")
    rows = sum(m.arity * dim for m, dim in zip(maps, dims))
    rng = np.random.default_rng(seed)
    k_values = rng.integers(-4, 5, size=(mesh.ncell, rows * rows + rows)).astype(np.float64)  # exact in any order
    k = mc.Dat(d.cells, rows * rows + rows, k_values, "k")
    mc.partition("kway", seed_set=d.cells, seed=seed)
    A = mc.Mat(space, space, [(both, both)], "A", dim=dims)
    f = mc.MixedDat(space, dims, None, "f")
    mc.par_loop(element_kernel(rows, rows), d.cells, A(mc.INC, (both, both)), f(mc.INC, both), k(mc.READ))
    x_values = [rng.integers(-3, 4, size=(s.size, dim)).astype(np.float64) for s, dim in zip(sets, dims)]
    x, y = mc.MixedDat(space, dims, x_values, "x"), mc.MixedDat(space, dims, None, "y")
    A.mult(x, y)
    gathered, product, rhs = A.to_scipy(), y.gather(), f.gather()
    A.zero_rows([0, 1], 5.0, component=len(kinds) - 1)
    zeroed = A.to_scipy()
    if comm.rank == 0:
        numbers = scalar_numbers(values, dims, [s.size for s in sets])
        total = sum(s.size * dim for s, dim in zip(sets, dims))
        blocks = k_values[:, :rows * rows].reshape(-1, rows, rows)
        expected = sp_matrix(blocks, numbers, total)
        assert abs(gathered - expected).max() == 0.0
        flat_x = np.concatenate([v.ravel() for v in x_values])
        np.testing.assert_array_equal(np.concatenate([p.ravel() for p in product]), expected @ flat_x)
        f_expected = np.zeros(total)
        np.add.at(f_expected, numbers.ravel(), k_values[:, rows * rows:].ravel())
        np.testing.assert_array_equal(np.concatenate([p.ravel() for p in rhs]), f_expected)
        last = total - sets[-1].size * dims[-1]
        zero = [last + r for r in range(2 * dims[-1])]
        expected = expected.tolil()
        expected[zero, :] = 0.0
        for r in zero:
            expected[r, r] = 5.0
        assert abs(zeroed - expected.tocsr()).max() == 0.0


def sp_matrix(blocks, numbers, total):
    import scipy.sparse as sp

    rows = np.repeat(numbers[:, :, None], numbers.shape[1], axis=2).ravel()
    cols = np.repeat(numbers[:, None, :], numbers.shape[1], axis=1).ravel()
    return sp.csr_matrix((blocks.ravel(), (rows, cols)), shape=(total, total))


def test_a_rectangular_block_multiplies_dats_of_its_two_dims():
    mc.reset_runtime()
    cells, nodes = mc.Set(2, "cells"), mc.Set(3, "nodes")
    c2n = mc.Map(cells, nodes, 2, [[0, 1], [1, 2]], "c2n")
    c2c = mc.Map(cells, cells, 1, [[0], [1]], "c2c")
    B = mc.Mat(cells, nodes, [(c2c, c2n)], "B", dim=1, col_dim=2)
    assert B(mc.INC, (c2c, c2n)).view_shape == (1, 4)
    fill = mc.Kernel.from_source("def fill(b):\n    for j in range(4):\n        b[0, j] += j + 1.0\n")
    mc.par_loop(fill, cells, B(mc.INC, (c2c, c2n)))
    x = mc.Dat(nodes, 2, np.arange(6.0).reshape(3, 2), "x")
    y = mc.Dat(cells, 1, None, "y")
    B.mult(x, y)
    dense = B.to_scipy().toarray()
    assert dense.tolist() == [[1, 2, 3, 4, 0, 0], [0, 0, 1, 2, 3, 4]]
    np.testing.assert_array_equal(y.data_ro.ravel(), dense @ np.arange(6.0))
    with pytest.raises(mc.DataShapeError, match="needs float64 dats of dim 2"):
        B.mult(mc.Dat(nodes, 1, None, "x1"), y)
    with pytest.raises(mc.DataShapeError, match="no diagonal"):
        B.zero_rows([0], 1.0)
    square = mc.Mat(nodes, nodes, [(c2n, c2n)], "S", dim=1, col_dim=2)
    with pytest.raises(mc.SolverError, match="rectangular"):
        mc.solve(square, mc.Dat(nodes, 1, None), mc.Dat(nodes, 1, None))


def test_bad_block_matrix_input_raises():
    mc.reset_runtime()
    cells, nodes, space = small_space()
    c2n = mc.Map(cells, nodes, 1, [[0], [1], [2]], "c2n")
    c2c = mc.Map(cells, cells, 1, [[0], [1], [2]], "c2c")
    m = mc.MixedMap([c2n, c2c, c2n], "m")
    with pytest.raises(mc.MapError, match="has 1 component maps where the space has 3"):
        mc.Mat(space, space, [(c2n, m)], "A")
    with pytest.raises(mc.DataShapeError, match="2 dims for 3 components"):
        mc.Mat(space, space, [(m, m)], "A", dim=(1, 2))
    A = mc.Mat(space, space, [(m, m)], "A")
    with pytest.raises(mc.AccessModeError, match=r"mc.INC \(add the blocks\) or mc.WRITE"):
        A(mc.READ, (m, m))
    with pytest.raises(mc.SetMismatchError, match="not one of its map pairs"):
        A(mc.INC, (m, mc.MixedMap([c2n, c2c, c2n])))
    with pytest.raises(mc.DataShapeError, match="component must be an int"):
        A.zero_rows([0], component=3)
    x = mc.MixedDat(space, 1, None, "x")
    with pytest.raises(mc.SetMismatchError, match="with dims"):
        A.mult(x, mc.MixedDat(space, 2, None, "y"))


# --- block systems in PETSc ----------------------------------------------------------------------------


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
def test_a_block_system_solved_by_petsc_equals_scipys_direct_solve(comm):
    import scipy.sparse.linalg as spla

    from meshchain.apps import stokes
    from meshchain.meshes import structured_tris

    mc.reset_runtime(comm=comm)
    problem = stokes.declare(structured_tris(6, 6))
    info = stokes.solve(problem, rtol=1e-12)
    K, rhs, solution = problem.K.to_scipy(), problem.rhs.gather(), problem.up.gather()
    if comm.rank == 0:
        assert info.converged and info.method == "petsc" and info.pc == "fieldsplit"
        expected = spla.spsolve(K.tocsc(), np.concatenate([p.ravel() for p in rhs]))
        np.testing.assert_allclose(np.concatenate([p.ravel() for p in solution]), expected, rtol=0, atol=1e-8)
    with pytest.raises(mc.SolverError, match="never read the option fieldsplit_2_pc_type"):
        mc.solve(problem.K, problem.up, problem.rhs, method="petsc",
                 options={**stokes.SCHUR, "fieldsplit_2_pc_type": "lu"})
    with pytest.raises(mc.SolverError, match="solved with method='petsc'"):
        mc.solve(problem.K, problem.up, problem.rhs, method="gmres")
    with pytest.raises(mc.SolverError, match="x must be a MixedDat"):
        mc.solve(problem.K, problem.f, problem.rhs, method="petsc")


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
def test_the_petsc_matrix_and_vectors_of_a_block_matrix_multiply_as_it_does(comm):
    from meshchain.apps import stokes
    from meshchain.meshes import structured_tris

    mc.reset_runtime(comm=comm)
    problem = stokes.declare(structured_tris(5, 4))
    space, K = problem.space, problem.K
    rng = np.random.default_rng(3)
    x = mc.MixedDat(space, (2, 1), [rng.standard_normal((s.size, d)) for s, d in zip(space, (2, 1))], "x")
    y, z = mc.MixedDat(space, (2, 1), None, "y"), mc.MixedDat(space, (2, 1), None, "z")
    K.mult(x, y)
    A, xv = K.to_petsc(), K.petsc_vec(x)
    yv = xv.duplicate()
    A.mult(xv, yv)
    K.from_petsc_vec(yv, z)
    for a, b in zip(y.gather() or (), z.gather() or ()):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    nested = K.to_petsc(nest=True)
    assert nested.getType() == "nest"
    assert nested.convert("aij").equal(A)  # the nest's numbering is the one matrix's
    fields = K.petsc_fields()
    assert [name for name, _ in fields] == ["0", "1"]
    assert [index_set.getSize() for _, index_set in fields] == [2 * 30, 30]
    for obj in (A, nested, xv, yv, *(index_set for _, index_set in fields)):
        obj.destroy()
