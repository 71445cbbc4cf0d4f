"""MIN and MAX into dats, directly and through maps (PyOP2's ``dat(op2.MAX, map)``): equal to
NumPy's ``minimum.at``/``maximum.at`` on every backend, on several ranks, and in a
communication-avoiding chain whose next loop reads the result through the map."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshchain as mc
from devices import DEVICE_BACKENDS
from meshchain.meshes import jittered_delaunay, structured_quads


@mc.kernel
def facet_extremes(v1, v2, low1, low2, high1, high2):
    jump = abs(v1[0] - v2[0])
    low1[0] = min(low1[0], jump)
    low2[0] = min(low2[0], jump)
    high1[0] = max(high1[0], jump)
    high2[0] = max(high2[0], jump)


@mc.kernel
def facet_extremes_whole(v, low, high):
    jump = abs(v[0, 0] - v[1, 0])
    for r in range(2):
        low[r, 0] = min(low[r, 0], jump)
        high[r, 0] = max(high[r, 0], jump)


@mc.kernel
def spread(low1, low2, out):
    out[0] = low1[0] + low2[0]


def expected(values, facet2cell, ncell):
    jumps = np.abs(values[facet2cell[:, 0]] - values[facet2cell[:, 1]])
    low, high = np.full(ncell, 5.0), np.full(ncell, -5.0)
    np.minimum.at(low, facet2cell[:, 0], jumps)
    np.minimum.at(low, facet2cell[:, 1], jumps)
    np.maximum.at(high, facet2cell[:, 0], jumps)
    np.maximum.at(high, facet2cell[:, 1], jumps)
    return low, high, jumps


def program(mesh, *, whole: bool, ca=None, comm=None):
    """The extremes of each cell's facet jumps, then a loop over facets reading them through the
    map; gathered on rank 0 (None elsewhere)."""
    d = mesh.declare()
    rng = np.random.default_rng(mesh.ncell)
    values = mc.Dat(d.cells, 1, rng.random(mesh.ncell), "values")
    low = mc.Dat(d.cells, 1, np.full(mesh.ncell, 5.0), "low")
    high = mc.Dat(d.cells, 1, np.full(mesh.ncell, -5.0), "high")
    out = mc.Dat(d.facets, 1, None, "out")
    if comm is not None:
        mc.partition("rib", coords=d.coords)
    f2c = d.facet2cell

    def record():
        if whole:
            mc.par_loop(facet_extremes_whole, d.facets, values(mc.READ, f2c), low(mc.MIN, f2c), high(mc.MAX, f2c))
        else:
            mc.par_loop(facet_extremes, d.facets, values(mc.READ, f2c[0]), values(mc.READ, f2c[1]),
                        low(mc.MIN, f2c[0]), low(mc.MIN, f2c[1]), high(mc.MAX, f2c[0]), high(mc.MAX, f2c[1]))
        mc.par_loop(spread, d.facets, low(mc.READ, f2c[0]), low(mc.READ, f2c[1]), out(mc.WRITE))

    if ca is None:
        record()
    else:
        with mc.loop_chain("extremes", ca=ca):
            record()
    return low.gather(), high.gather(), out.gather()


@settings(max_examples=15, deadline=None)
@given(nx=st.integers(2, 7), ny=st.integers(2, 6), whole=st.booleans())
def test_minmax_through_maps_equals_numpy_on_random_meshes(nx, ny, whole):
    mc.reset_runtime(backend="reference")
    mesh = jittered_delaunay(nx * ny + 4, seed=nx * 10 + ny)
    check(mesh, program(mesh, whole=whole))


@pytest.mark.parametrize("backend", ["numba", *DEVICE_BACKENDS])
@pytest.mark.parametrize("whole", [False, True])
def test_minmax_through_maps_on_the_compiled_backends(backend, whole):
    mc.reset_runtime(backend=backend)
    mesh = structured_quads(7, 5)
    check(mesh, program(mesh, whole=whole))


def check(mesh, results):
    low, high, out = results
    f2c = np.asarray(mesh.facet_cells)
    want_low, want_high, _ = expected(np.random.default_rng(mesh.ncell).random(mesh.ncell), f2c, mesh.ncell)
    np.testing.assert_array_equal(low[:, 0], want_low)
    np.testing.assert_array_equal(high[:, 0], want_high)
    np.testing.assert_array_equal(out[:, 0], want_low[f2c[:, 0]] + want_low[f2c[:, 1]])


@mc.kernel
def row_extremes(w, low, high):
    for r in range(3):
        low[r, 0] = min(low[r, 0], w[0] * (r + 1))
        high[r, 0] = max(high[r, 0], w[0] * (r + 1))


def repeated_targets(comm=None, ca=None):
    """MIN and MAX through a map of arity 3 whose rows reach a target two or three times (rows
    ``[a, a, b]``, ``[a, a, a]``): a plain write-back of each row kept the last position's value
    on every backend. Gathered on rank 0 (None elsewhere), with NumPy's answer."""
    rng = np.random.default_rng(7)
    nodes, edges = mc.Set(10, "nodes"), mc.Set(24, "edges")
    rows = rng.integers(0, 10, (24, 3))
    rows[::3, 1] = rows[::3, 0]  # a target twice in a row
    rows[1::6, :] = rows[1::6, :1]  # three times
    e2n = mc.Map(edges, nodes, 3, rows, "e2n")
    weights = rng.uniform(-1.0, 1.0, 24)
    w = mc.Dat(edges, 1, weights, "w")
    low, high = mc.Dat(nodes, 1, np.full(10, 5.0), "low"), mc.Dat(nodes, 1, np.full(10, -5.0), "high")
    if comm is not None:
        mc.partition("block")
    if ca is None:
        mc.par_loop(row_extremes, edges, w(mc.READ), low(mc.MIN, e2n), high(mc.MAX, e2n))
    else:
        with mc.loop_chain("repeated", ca=ca):
            mc.par_loop(row_extremes, edges, w(mc.READ), low(mc.MIN, e2n), high(mc.MAX, e2n))
    contributions = weights[:, None] * np.arange(1, 4)[None, :]
    want_low, want_high = np.full(10, 5.0), np.full(10, -5.0)
    np.minimum.at(want_low, rows.ravel(), contributions.ravel())
    np.maximum.at(want_high, rows.ravel(), contributions.ravel())
    return low.gather(), high.gather(), want_low, want_high


@pytest.mark.parametrize("backend", ["reference", "numba", *DEVICE_BACKENDS])
def test_minmax_through_a_map_row_that_repeats_a_target_keeps_the_extreme(backend):
    mc.reset_runtime(backend=backend)
    low, high, want_low, want_high = repeated_targets()
    np.testing.assert_array_equal(low[:, 0], want_low)
    np.testing.assert_array_equal(high[:, 0], want_high)


@pytest.mark.mpi(nprocs=(2, 3), timeout=240)
@pytest.mark.parametrize("ca", [None, True])
def test_minmax_through_a_map_row_that_repeats_a_target_on_ranks(comm, ca):
    mc.reset_runtime(comm=comm)
    low, high, want_low, want_high = repeated_targets(comm, ca)
    if comm.rank == 0:
        np.testing.assert_array_equal(low[:, 0], want_low)
        np.testing.assert_array_equal(high[:, 0], want_high)


def test_minmax_arguments_may_repeat_but_not_mix():
    mc.reset_runtime()
    s = mc.Set(2, "s")
    low = mc.Dat(s, 1, None, "low")
    m = mc.Map(s, s, 2, [[0, 1], [1, 0]], "m")
    k = mc.Kernel.from_source("def k(a, b):\n    a[0] = min(a[0], 1.0)\n    b[0] = max(b[0], 1.0)\n")
    with pytest.raises(mc.AccessModeError, match="every use MIN, or MAX"):
        mc.par_loop(k, s, low(mc.MIN, m[0]), low(mc.MAX, m[1]))


@pytest.mark.mpi(nprocs=(2, 3), timeout=240)
@pytest.mark.parametrize("ca", [None, True])
def test_minmax_through_maps_on_ranks_equal_numpy(comm, ca):
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(9, 8)
    results = program(mesh, whole=False, ca=ca, comm=comm)
    if comm.rank == 0:
        check(mesh, results)
