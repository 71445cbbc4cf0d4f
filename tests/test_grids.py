"""Structured grids: loops over grids and their interiors with stencils of any shape equal a
NumPy slicing oracle and the reference backend, through inlined and called kernels; bad
input is refused naming the objects."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc

from devices import DEVICE_BACKENDS

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


@st.composite
def problems(draw):
    """A grid shape, an interior width, a stencil within it, weights, dim and dtype."""
    ndim = draw(st.sampled_from([2, 3]))
    width = draw(st.integers(0, 2))
    shape = tuple(draw(st.sampled_from([1, 2, 3, 5, 7, 11])) + (2 * width if draw(st.booleans()) else 0)
                  for _ in range(ndim))
    offsets = draw(st.lists(st.tuples(*[st.integers(-width, width)] * ndim), min_size=1, max_size=6, unique=True))
    weights = draw(st.lists(st.integers(-3, 3), min_size=len(offsets), max_size=len(offsets)))
    dim = draw(st.sampled_from([1, 2]))
    dtype = draw(st.sampled_from([np.int64, np.float64]))
    inline = draw(st.booleans())
    return shape, width, offsets, weights, dim, dtype, inline


def weighted_kernel(weights, dim: int, inline: bool):
    """``out[c] = sum_k w_k s[k, c]``: constant indices (inlined) or a loop over k (called)."""
    if inline:
        lines = ["def weighted(s, out):"]
        for c in range(dim):
            terms = " + ".join(f"{w} * s[{k}, {c}]" for k, w in enumerate(weights))
            lines.append(f"    out[{c}] = {terms}")
    else:
        lines = ["def weighted(s, out):", f"    w = {tuple(weights)!r}", f"    for c in range({dim}):",
                 "        total = 0 * s[0, c]", f"        for k in range({len(weights)}):",
                 "            total += w[k] * s[k, c]", "        out[c] = total"]
    return mc.Kernel.from_source("\n".join(lines) + "\n")


def oracle(values, shape, width, offsets, weights):
    """NumPy slicing: the weighted stencil on the interior, zeros elsewhere."""
    out = np.zeros_like(values)
    if any(n <= 2 * width for n in shape):
        return out  # no interior point
    inner = tuple(slice(width, n - width) for n in shape)
    for point, w in zip(offsets, weights):
        moved = tuple(slice(width + d, n - width + d) for d, n in zip(point, shape))
        out[inner] += w * values[moved]
    return out


def run(backend, shape, width, offsets, weights, dim, dtype, inline, **options):
    mc.reset_runtime(backend=backend, **options)
    g = mc.Grid(shape, "g")
    values = np.arange(np.prod(shape) * dim, dtype=np.int64).reshape(shape + (dim,)) % 7 - 3
    u = mc.Dat(g, dim, values.astype(dtype), "u", dtype=dtype)
    v = mc.Dat(g, dim, None, "v", dtype=dtype)
    stencil = mc.Stencil(offsets, "s")
    mc.par_loop(weighted_kernel(weights, dim, inline), g.interior(width), u(mc.READ, stencil), v(mc.WRITE))
    return values, v.data_ro.reshape(shape + (dim,)).copy()


@settings(max_examples=18, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_stencil_loops_equal_numpy_slicing_and_the_reference(problem):
    shape, width, offsets, weights, dim, dtype, inline = problem
    values, numba = run("numba", *problem)
    _, reference = run("reference", *problem)
    expected = oracle(values.astype(dtype), shape, width, offsets, weights)
    np.testing.assert_array_equal(numba, expected)
    np.testing.assert_array_equal(reference, expected)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(problem=problems())
def test_the_gpu_backend_runs_stencil_loops_through_derived_maps(backend, problem):
    """The cupy backend (and its host emulation) has no index-arithmetic path: grid loops
    reach it lowered to maps, with the same results."""
    shape, width, offsets, weights, dim, dtype, _ = problem  # local tuples are not CUDA: constant indices
    values, computed = run(backend, shape, width, offsets, weights, dim, dtype, True)
    np.testing.assert_array_equal(computed, oracle(values.astype(dtype), shape, width, offsets, weights))


def test_jacobi_chain_equals_sweep_by_sweep_and_numpy():
    mc.reset_runtime()
    n = 13
    g = mc.Grid((n, n + 4), "g")
    start = np.random.default_rng(1).integers(0, 100, size=(n, n + 4)).astype(np.int64)
    a, b = mc.Dat(g, 1, start, "a", dtype=np.int64), mc.Dat(g, 1, start, "b", dtype=np.int64)
    star = mc.Stencil([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], "star")

    @mc.kernel
    def sweep(s, out):
        out[0] = 4 * s[0, 0] - s[1, 0] - s[2, 0] - s[3, 0] - s[4, 0]

    with mc.loop_chain("jacobi"):
        for _ in range(3):
            mc.par_loop(sweep, g.interior(1), a(mc.READ, star), b(mc.WRITE))
            mc.par_loop(sweep, g.interior(1), b(mc.READ, star), a(mc.WRITE))
    expected = start.copy()
    other = start.copy()
    for _ in range(6):
        other[1:-1, 1:-1] = (4 * expected[1:-1, 1:-1] - expected[:-2, 1:-1] - expected[2:, 1:-1]
                             - expected[1:-1, :-2] - expected[1:-1, 2:])
        expected, other = other, expected
    np.testing.assert_array_equal(a.data_ro.reshape(start.shape), expected)


@pytest.mark.parametrize("backend, arithmetic", [("numba", True), ("reference", True), ("cuda-emulation", False)])
def test_statistics_count_the_iterations_run_by_index_arithmetic(backend, arithmetic):
    """On one process every grid-loop iteration finds its points by arithmetic, except on the
    cupy backends (through derived maps); mesh loops never do."""
    mc.reset_runtime(backend=backend)
    g, cells = mc.Grid((6, 7), "g"), mc.Set(4, "cells")
    u, v, q = mc.Dat(g, 1, np.arange(42.0), "u"), mc.Dat(g, 1, None, "v"), mc.Dat(cells, 1, None, "q")
    star = mc.Stencil([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], "star")
    ones = mc.Kernel.from_source("def ones(a):\n    a[0] = 1.0\n")
    mean = mc.Kernel.from_source("def mean(s, out):\n"
                                 "    out[0] = 0.2 * (s[0, 0] + s[1, 0] + s[2, 0] + s[3, 0] + s[4, 0])\n")
    for _ in range(3):
        mc.par_loop(mean, g.interior(1), u(mc.READ, star), v(mc.WRITE))
    mc.par_loop(ones, cells, q(mc.WRITE))
    loops = mc.stats().loops
    assert loops["mean"].iterations == 3 * 4 * 5
    assert loops["mean"].arithmetic_iterations == (3 * 4 * 5 if arithmetic else 0)
    assert loops["ones"].arithmetic_iterations == 0


def test_grid_dats_take_grid_shaped_data_and_refuse_other_shapes():
    mc.reset_runtime()
    g = mc.Grid((3, 4), "g")
    assert mc.Dat(g, 2, np.ones((3, 4, 2)), "ok").data.shape == (12, 2)
    assert mc.Dat(g, 1, np.ones((3, 4)), "ok1").data.shape == (12, 1)
    with pytest.raises(mc.DataShapeError, match=r"'bad'.*\(3, 4, 2\)"):
        mc.Dat(g, 2, np.ones((4, 3, 2)), "bad")


def test_bad_grid_input_is_refused_naming_the_objects():
    mc.reset_runtime()
    g, h = mc.Grid((5, 5), "g"), mc.Grid((5, 5), "h")
    nodes = mc.Set(3, "nodes")
    u, v, w = mc.Dat(g, 1, None, "u"), mc.Dat(g, 1, None, "v"), mc.Dat(h, 1, None, "w")
    star = mc.Stencil([(0, 0), (-1, 0), (1, 0)], "star")

    @mc.kernel
    def first(s, out):
        out[0] = s[0, 0]

    with pytest.raises(mc.SetMismatchError, match=r"stencil 'star' reaches 1.*g.interior\(1\)"):
        mc.par_loop(first, g, u(mc.READ, star), v(mc.WRITE))
    with pytest.raises(mc.SetMismatchError, match=r"'w'\) lives on 'h', not on the grid 'g'"):
        mc.par_loop(first, g.interior(1), u(mc.READ, star), w(mc.WRITE))
    with pytest.raises(mc.SetMismatchError, match="not on a Grid"):
        mc.Dat(nodes, 1, None, "n")(mc.READ, star)
    with pytest.raises(mc.SetMismatchError, match="3-d offsets"):
        u(mc.READ, mc.Stencil([(0, 0, 1)], "deep"))
    with pytest.raises(mc.AccessModeError, match="READ only"):
        u(mc.INC, star)
    with pytest.raises(mc.DeclarationError, match="2 or 3 integers"):
        mc.Grid((4,), "line")
    with pytest.raises(mc.DeclarationError, match="at least 1"):
        mc.Grid((4, 0), "empty")
    with pytest.raises(mc.DeclarationError, match="offsets"):
        mc.Stencil([], "none")


def test_an_interior_wider_than_the_grid_runs_no_point():
    mc.reset_runtime()
    g = mc.Grid((3, 3), "g")
    v = mc.Dat(g, 1, np.full((3, 3), 5.0), "v")

    @mc.kernel
    def clear(out):
        out[0] = 0.0

    mc.par_loop(clear, g.interior(2), v(mc.WRITE))
    assert g.interior(2).size == 0 and v.data_ro.min() == 5.0
    mc.par_loop(clear, g.interior(1), v(mc.WRITE))
    assert v.data_ro.sum() == 40.0


@pytest.mark.parametrize("shape", [(9, 13), (5, 6, 7)])
@pytest.mark.parametrize("block_size", [1, 7, 64])
@pytest.mark.parametrize("threads", [1, 2])  # one thread: consecutive blocks run as one range of lines
def test_blocks_that_start_and_end_inside_interior_lines_cover_every_point_once(shape, block_size, threads):
    offsets = [(0,) * len(shape)] + [tuple(1 if d == axis else 0 for d in range(len(shape))) for axis in range(len(shape))]
    weights = list(range(1, len(offsets) + 1))
    problem = (shape, 1, offsets, weights, 1, np.int64, True)
    values, got = run("numba", *problem, block_size=block_size, threads=threads)
    assert mc.get_runtime().config.block_size == block_size
    np.testing.assert_array_equal(got, oracle(values, shape, 1, offsets, weights))


def jacobi_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "jacobi.py"
    spec = importlib.util.spec_from_file_location("example_jacobi", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def jacobi_numpy(size, sweeps, weights, seed):
    u = np.random.default_rng(seed).random(size)
    for _ in range(sweeps):
        new = u.copy()
        new[1:-1, 1:-1] = (weights[0] * u[1:-1, 1:-1] + weights[1] * u[:-2, 1:-1] + weights[2] * u[2:, 1:-1]
                           + weights[3] * u[1:-1, :-2] + weights[4] * u[1:-1, 2:])
        u = new
    return u


@pytest.mark.parametrize("steps", [1, 3])
def test_the_jacobi_example_sums_what_numpy_computes(steps):
    example = jacobi_example()
    mc.reset_runtime()
    weights = [0.6, 0.1, 0.05, 0.15, 0.1]
    args = example.parse_args(["--size", "17", "23", "--sweeps", "12", "--steps", str(steps),
                               "--weights", *map(str, weights), "--seed", "3"])
    _, checksum = example.run(args)
    assert checksum == pytest.approx(float(jacobi_numpy((17, 23), 12, weights, 3).sum()), rel=1e-12)
    for bad in (["--sweeps", "3"], ["--sweeps", "12", "--steps", "4"], ["--ratio", "0"]):
        with pytest.raises(SystemExit):
            example.parse_args(bad)


# --- block decompositions (the layout on several ranks is tested in test_grids_mpi.py) ---


@given(shape=st.tuples(st.integers(1, 40), st.integers(1, 40)), nranks=st.integers(1, 12))
@settings(max_examples=60, deadline=None)
def test_chosen_blocks_cut_the_fewest_links_of_all_fitting_decompositions(shape, nranks):
    from meshchain.partition.grids import choose_blocks

    fitting = [(p, nranks // p) for p in range(1, nranks + 1)
               if nranks % p == 0 and p <= shape[0] and nranks // p <= shape[1]]
    if not fitting:
        with pytest.raises(mc.ConfigurationError, match="cannot be cut"):
            choose_blocks(shape, nranks)
        return
    cut = lambda b: (b[0] - 1) * shape[1] + (b[1] - 1) * shape[0]  # noqa: E731
    chosen = choose_blocks(shape, nranks)
    assert chosen in fitting and cut(chosen) == min(cut(b) for b in fitting)


@pytest.mark.parametrize("blocks, message", [((2, 2), "product is the rank count 2"), ((2,), "give 2 positive"),
                                             ((1, 0), "give 2 positive"), ((2, 1), "exceeds the grid")])
def test_given_blocks_are_checked_against_the_grid_and_the_rank_count(blocks, message):
    from meshchain.partition.grids import checked_blocks

    grid = mc.Grid((1, 8), "narrow")
    with pytest.raises(mc.ConfigurationError, match=message):
        checked_blocks(grid, blocks, 2)
    assert checked_blocks(grid, (1, 2), 2) == (1, 2)


def test_repartition_refuses_a_live_grid_but_not_one_kept_only_by_a_reference_cycle():
    """A grid the program no longer references, held only by a reference cycle until the
    collector runs, is no part of it: ``mc.repartition`` and ``mc.rebalance`` then go on (on
    one process they move nothing); a live grid is refused."""
    import gc

    gc.disable()
    try:
        cycle = [mc.Grid((4, 4), "dropped")]
        cycle.append(cycle)  # kept alive by the cycle alone once the name goes
        del cycle
        mc.repartition("block")
        assert mc.rebalance() is None
        kept = mc.Grid((4, 4), "kept")
        with pytest.raises(mc.ConfigurationError, match="structured grid\\(s\\) 'kept' keep their block"):
            mc.repartition("block")
        with pytest.raises(mc.ConfigurationError, match="mc.rebalance moves mesh elements"):
            mc.rebalance()
        del kept
    finally:
        gc.enable()
