"""One thread runs consecutive contiguous blocks as one range: the same elements, the same bits.

``_mc_loop_serial`` (the numba backend's loop on one thread) merges consecutive blocks of
its colour order that follow each other in memory, when the loop keeps nothing per block
(no reduction). Checked here against NumPy's own arithmetic (float data: the same bits),
against the reference backend (integer increments through maps, several colours), and
against the same loop on two threads (reductions, which keep one partial row per block).
The grid loops' case (blocks that start and end inside interior lines, one thread and two)
is in ``tests/test_grids.py``. Grid loops read and write one-component dats through
one-dimensional views (checked in the generated source here; their results in ``test_grids.py``).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends.numba_codegen import loop_source
from meshchain.ir.loop import make_loop

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

AXPBY = mc.Kernel.from_source("def axpby(a, b):\n    b[0] = 0.3 * a[0] + 0.7 * a[1]\n    b[1] = a[0] - 0.1 * a[1]\n")
SCATTER = mc.Kernel.from_source("def scatter(a, n):\n    n[0, 0] += a[0]\n    n[1, 0] += 2 * a[0]\n")
TOTAL = mc.Kernel.from_source("def total(a, s):\n    s[0] += a[0] * a[1]\n")


def test_only_loops_without_reductions_merge_their_blocks():
    mc.reset_runtime()
    cells = mc.Set(10, "cells")
    a, b = mc.Dat(cells, 2, None, "a"), mc.Dat(cells, 2, None, "b")
    s = mc.Global(1, 0.0, "s")
    merged = loop_source(make_loop(AXPBY, cells, (a(mc.READ), b(mc.WRITE))), boundscheck=False)
    per_block = loop_source(make_loop(TOTAL, cells, (a(mc.READ), s(mc.INC))), boundscheck=False)
    assert "contiguous blocks as one range" in merged
    assert "contiguous blocks as one range" not in per_block and "_mc_p1[_mc_b, 0]" in per_block


@SETTINGS
@given(size=st.integers(0, 300), block_size=st.sampled_from([1, 2, 7, 64, 1000]), seed=st.integers(0, 2**16))
def test_a_direct_loop_on_one_thread_gives_numpys_bits(size, block_size, seed):
    values = np.random.default_rng(seed).normal(size=(size, 2))
    mc.reset_runtime(threads=1, block_size=block_size)
    cells = mc.Set(size, "cells")
    a, b = mc.Dat(cells, 2, values, "a"), mc.Dat(cells, 2, None, "b")
    mc.par_loop(AXPBY, cells, a(mc.READ), b(mc.WRITE))
    expected = np.stack([0.3 * values[:, 0] + 0.7 * values[:, 1], values[:, 0] - 0.1 * values[:, 1]], axis=1)
    np.testing.assert_array_equal(b.data_ro, expected)


@SETTINGS
@given(size=st.integers(1, 200), nodes=st.integers(1, 40), block_size=st.sampled_from([1, 3, 16, 500]),
       seed=st.integers(0, 2**16))
def test_coloured_increments_on_one_thread_equal_the_reference(size, nodes, block_size, seed):
    rng = np.random.default_rng(seed)
    values, targets = rng.integers(-50, 50, size=(size, 1)), rng.integers(0, nodes, size=(size, 2))

    def run(backend, threads):
        mc.reset_runtime(backend=backend, block_size=block_size, **({} if threads is None else {"threads": threads}))
        edges, points = mc.Set(size, "edges"), mc.Set(nodes, "points")
        e2p = mc.Map(edges, points, 2, targets, "e2p")
        a = mc.Dat(edges, 1, values, "a", dtype=np.int64)
        n = mc.Dat(points, 1, None, "n", dtype=np.int64)
        mc.par_loop(SCATTER, edges, a(mc.READ), n(mc.INC, e2p))
        return n.data_ro.copy()

    np.testing.assert_array_equal(run("numba", 1), run("reference", None))


@SETTINGS
@given(size=st.integers(0, 300), block_size=st.sampled_from([1, 5, 64]), seed=st.integers(0, 2**16))
def test_a_reduction_keeps_its_partial_rows_per_block_on_one_thread(size, block_size, seed):
    values = np.random.default_rng(seed).normal(size=(size, 2))

    def run(threads):
        mc.reset_runtime(threads=threads, block_size=block_size)
        cells = mc.Set(size, "cells")
        a, s = mc.Dat(cells, 2, values, "a"), mc.Global(1, 0.0, "s")
        mc.par_loop(TOTAL, cells, a(mc.READ), s(mc.INC))
        return s.value.copy()

    one = run(1)
    np.testing.assert_array_equal(one, run(2))  # the same block partials, summed in block order
    np.testing.assert_allclose(one, [np.sum(values[:, 0] * values[:, 1])], rtol=1e-12, atol=1e-12)


def test_grid_loops_index_one_component_dats_through_flat_views_and_others_do_not():
    """A grid loop's one-component dats are read and written as ``_mc_flat<j>[row]`` (a stride
    LLVM knows); its two-component dat and a loop over a plain set keep ``_mc_d<j>[row, k]``."""
    mc.reset_runtime()
    g = mc.Grid((6, 7), "g")
    u, v, w = mc.Dat(g, 1, None, "u"), mc.Dat(g, 1, None, "v"), mc.Dat(g, 2, None, "w")
    star = mc.Stencil([(0, 0), (-1, 0), (0, 1)], "star")
    sweep = mc.Kernel.from_source("def sweep(s, o, t):\n"
                                  "    o[0] = s[0, 0] + s[1, 0] * s[2, 0]\n"
                                  "    t[1] = o[0]\n")
    grid_src = loop_source(make_loop(sweep, g.interior(1), (u(mc.READ, star), v(mc.WRITE), w(mc.WRITE))),
                           boundscheck=False)
    assert "_mc_flat0 = _mc_d0.reshape(_mc_d0.shape[0])" in grid_src and "_mc_flat0[_mc_g - " in grid_src
    assert "_mc_flat1[_mc_g] = " in grid_src and "_mc_d2[_mc_g, 1] = " in grid_src and "_mc_flat2" not in grid_src
    cells = mc.Set(10, "cells")
    a, b = mc.Dat(cells, 2, None, "a"), mc.Dat(cells, 2, None, "b")
    assert "_mc_flat" not in loop_source(make_loop(AXPBY, cells, (a(mc.READ), b(mc.WRITE))), boundscheck=False)
