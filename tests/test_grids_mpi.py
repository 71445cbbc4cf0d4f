"""Structured grids on several ranks: block decompositions, ghost layers of any depth with
corners, communication-avoiding sweeps; every result equals one process bit for bit
(integer-valued data), and bad input fails on every rank with a clear message."""

from __future__ import annotations

import numpy as np
import pytest

import meshchain as mc
from helpers import failure_on_every_rank
from meshchain.partition.grids import box_offsets

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

STAR = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)]


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def weighted_sum(weights):
    """A kernel ``out = sum_k weights[k] * s[k]`` for a stencil of ``len(weights)`` points."""
    body = " + ".join(f"{w} * s[{k}, c]" for k, w in enumerate(weights))
    return mc.Kernel.from_source(f"def apply(s, out):\n    for c in range(out.shape[0]):\n        out[c] = {body}\n")


@mc.kernel
def copy(a, b):
    for c in range(a.shape[0]):
        b[c] = a[c]


def sweeps(comm, shape, offsets, steps, *, ca, blocks=None, dim=1, chains=1, seed=0, **options):
    """``chains`` chains of ``steps`` sweeps ``v = sum w_k u[p + o_k]`` over the interior the
    stencil needs, each followed by ``u = v`` on the whole grid; ``u.gather()``. ``options``
    go to :func:`mc.reset_runtime`."""
    mc.reset_runtime(comm=comm, **{"transport": "persistent", **options})
    rng = np.random.default_rng(seed)
    width = max(max(abs(c) for c in o) for o in offsets)
    grid = mc.Grid(shape, "g")
    inner = grid.interior(width)
    start = rng.integers(-3, 4, size=(grid.size, dim))
    u = mc.Dat(grid, dim, start, "u", dtype=np.int64)
    v = mc.Dat(grid, dim, start, "v", dtype=np.int64)
    stencil = mc.Stencil(offsets, "s")
    kernel = weighted_sum(rng.integers(-1, 2, size=len(offsets)).tolist())
    mc.partition("block", blocks=blocks)
    for _ in range(chains):
        with mc.loop_chain("sweeps", ca=ca):
            for _ in range(steps):
                mc.par_loop(kernel, inner, u(mc.READ, stencil), v(mc.WRITE))
                mc.par_loop(copy, grid, v(mc.READ), u(mc.WRITE))
    return u.gather()


def oracle(shape, offsets, steps, *, dim=1, chains=1, seed=0):
    """The same sweeps by NumPy slicing."""
    rng = np.random.default_rng(seed)
    width = max(max(abs(c) for c in o) for o in offsets)
    size = int(np.prod(shape))
    u = rng.integers(-3, 4, size=(size, dim)).reshape(tuple(shape) + (dim,))
    weights = rng.integers(-1, 2, size=len(offsets))
    inside = tuple(slice(width, n - width) for n in shape)
    for _ in range(steps * chains):
        new = u.copy()
        new[inside] = sum(w * u[tuple(slice(width + o, n - width + o) for o, n in zip(off, shape))]
                          for w, off in zip(weights, offsets))
        u = new
    return u.reshape(size, dim)


CASES = [  # shape, offsets, steps, blocks
    ((9, 11), STAR, 3, None),
    ((13, 7), box_offsets(1, 2), 4, None),                          # corners: the nine-point box
    ((12, 10), [(0, 0), (-2, 0), (2, 1), (0, -2), (1, 2)], 3, None),  # reach 2, asymmetric
    ((1 + 12, 1 + 4), STAR, 2, None),
    ((7, 6, 5), [(0, 0, 0), (-1, 0, 0), (0, 1, 0), (0, 0, -1), (1, 1, 1)], 2, None),
    ((17, 5), STAR, 6, (4, 1)),  # blocks 4 lines thin, ghosts 6 deep: reach past the next rank
]


@pytest.mark.mpi(nprocs=(2, 4), timeout=300)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ca", [False, True])
def test_grid_sweeps_on_ranks_equal_one_process_and_numpy(comm, case, ca):
    check_sweeps(comm, case, ca)


@pytest.mark.mpi(nprocs=(3,), timeout=300)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_communication_avoiding_grid_sweeps_on_three_ranks_equal_numpy(comm, case):
    """3 ranks (uneven blocks) communication-avoiding; loop by loop runs on 2 and 4 ranks."""
    check_sweeps(comm, case, True)


def check_sweeps(comm, case, ca):
    shape, offsets, steps, blocks = CASES[case]
    if blocks is not None and np.prod(blocks) != comm.size:
        blocks = (comm.size,) + (1,) * (len(shape) - 1)
    got = sweeps(comm, shape, offsets, steps, ca=ca, blocks=blocks, dim=2, chains=2, seed=case)
    if comm.rank == 0:
        want = oracle(shape, offsets, steps, dim=2, chains=2, seed=case)
        np.testing.assert_array_equal(got, want)
        if comm.size == 2:  # one process alone does the same whatever the launch's size: checked once
            np.testing.assert_array_equal(sweeps(self_comm(), shape, offsets, steps, ca=ca, dim=2, chains=2,
                                                 seed=case), want)


@pytest.mark.mpi(nprocs=(2, 4), timeout=300)
@pytest.mark.parametrize("steps", [1, 2, 5, 12])
def test_ca_sweeps_exchange_once_with_ghosts_as_deep_as_the_steps(comm, steps):
    """PA1: a chain of ``s`` sweeps needs ghosts ``s`` lines deep (one layer per sweep, corners
    included) and one grouped exchange per neighbour; it equals sweep-by-sweep execution."""
    shape = (24, 20)
    per_sweep = sweeps(comm, shape, STAR, steps, ca=False, chains=2)
    got = sweeps(comm, shape, STAR, steps, ca=True, chains=2)
    chain = mc.stats().chains["sweeps"]
    assert chain.mode == "ca" and chain.segments == 2 and chain.depth == steps
    assert chain.exchanges <= 2 and chain.per_loop_exchanges >= 2 * (steps - 1)
    if comm.rank == 0:
        np.testing.assert_array_equal(got, per_sweep)


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_ghost_layers_are_one_line_per_layer_with_corners(comm):
    """On 2 x 1 blocks of a 10 x 6 grid, data layer ``k`` of rank 0 is grid line ``4 + k``
    (every column: corners included) and the interior's rows reach no deeper than their layer."""
    mc.reset_runtime(comm=comm)
    grid = mc.Grid((10, 6), "g")
    inner = grid.interior(1)
    mc.partition("block", blocks=(2, 1), depth=3)
    layout = mc.get_runtime().layout_of(grid)
    rows = layout.global_ids // 6
    lines = rows - 4 if comm.rank == 0 else 5 - rows
    assert np.array_equal(np.maximum(lines, 0), layout.data_layers)
    assert layout.n_owned == 30 and len(layout.global_ids) == 30 + 3 * 6
    interior = mc.get_runtime().layout_of(inner)
    assert interior.n_owned == 4 * 4
    halo_exec = interior.exec_layers[interior.n_owned:]
    assert halo_exec.min() == 2 and halo_exec.max() == 3  # a halo row d lines out runs from layer d + 1


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_grid_and_mesh_in_one_program_equal_one_process(comm):
    def run(c):
        mc.reset_runtime(comm=c)
        grid = mc.Grid((8, 9), "g")
        inner = grid.interior(1)
        cells = mc.Set(20, "cells")
        ring = mc.Map(cells, cells, 2, [[i, (i + 1) % 20] for i in range(20)], "ring")
        u = mc.Dat(grid, 1, np.arange(72) % 5, "u", dtype=np.int64)
        v = mc.Dat(grid, 1, np.arange(72) % 5, "v", dtype=np.int64)
        q = mc.Dat(cells, 1, np.arange(20), "q", dtype=np.int64)
        r = mc.Dat(cells, 1, None, "r", dtype=np.int64)
        total = mc.Global(1, 0, "total", dtype=np.int64)
        mc.partition("block")
        box = mc.Stencil(box_offsets(1, 2), "box")

        @mc.kernel
        def pair(a, out):
            out[0] = a[0, 0] - a[1, 0]

        @mc.kernel
        def add(a, t):
            t[0] += a[0]

        with mc.loop_chain("mixed", ca=True):
            mc.par_loop(weighted_sum([1] * 9), inner, u(mc.READ, box), v(mc.WRITE))
            mc.par_loop(pair, cells, q(mc.READ, ring), r(mc.WRITE))
            mc.par_loop(add, grid, v(mc.READ), total(mc.INC))
        return v.gather(), r.gather(), total.value

    want = run(self_comm())
    got = run(comm)
    if comm.rank == 0:
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert got[2] == want[2]


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_bad_grid_partitions_fail_on_every_rank_naming_the_object(comm):
    def declared(shape=(6, 5), blocks=None):
        mc.reset_runtime(comm=comm)
        grid = mc.Grid(shape, "field")
        grid.interior(1)
        mc.partition("block", blocks=blocks)
        return grid

    assert "blocks=(3, 1)" in failure_on_every_rank(comm, lambda: declared(blocks=(3, 1)))
    assert "'field'" in failure_on_every_rank(comm, lambda: declared((1, 5), blocks=(2, 1)))
    assert "field.interior(2) once before mc.partition" in failure_on_every_rank(comm, lambda: declared().interior(2))
    assert "'field'" in failure_on_every_rank(comm, lambda: declared() and mc.repartition("block"))
    for everywhere in (True, False):  # a dat whose data does not fit the grid, from every rank or rank 0
        mc.reset_runtime(comm=comm)
        grid = mc.Grid((6, 5), "field")
        data = np.zeros((7, 5)) if everywhere or comm.rank == 0 else None
        assert "'wrong'" in failure_on_every_rank(comm, lambda: mc.Dat(grid, 1, data, "wrong"))
    mc.reset_runtime(comm=comm)
    grid = mc.Grid((6, 5), "field")
    cells = mc.Set(4, "cells")
    mc.Map(cells, grid, 1, [[0], [1], [2], [3]], "c2g")
    assert "'c2g'" in failure_on_every_rank(comm, lambda: mc.partition("block"))


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("steps, ca", [(1, "off"), (3, "on"), (3, "auto")])
def test_the_jacobi_example_on_ranks_sums_what_numpy_computes(comm, steps, ca):
    from test_grids import jacobi_example, jacobi_numpy

    example = jacobi_example()
    mc.reset_runtime(comm=comm)
    args = example.parse_args(["--size", "19", "14", "--sweeps", "12", "--steps", str(steps), "--ca", ca, "--seed", "5"])
    _, checksum = example.run(args)
    assert checksum == pytest.approx(float(jacobi_numpy((19, 14), 12, [0.2] * 5, 5).sum()), rel=1e-12)


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_repartitioning_a_program_with_a_grid_is_refused_on_every_rank(comm):
    grid = mc.Grid((6, 6), "g")
    u = mc.Dat(grid, 1, np.arange(36.0), "u")
    mc.partition("block")
    with pytest.raises(mc.ConfigurationError, match="structured grid\\(s\\) 'g' keep their block decomposition"):
        mc.repartition("block")
    with pytest.raises(mc.ConfigurationError, match="mc.rebalance moves mesh elements"):
        mc.rebalance()
    gathered = u.gather()  # the grid is as it was: every rank still takes part
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[:, 0], np.arange(36.0))
