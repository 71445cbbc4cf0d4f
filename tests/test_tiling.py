"""Sparse tiling on one process: the inspector's colouring invariant checked directly on its
output, and tiled == untiled == the serial reference, bit for bit on integer data (random
meshes, chains and access modes; tile sizes from 1 to the whole set; 1 and 2 threads).
The same on several ranks is in ``test_chains_mpi.py``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import meshchain as mc
from meshchain.core.errors import ConfigurationError, MeshchainError
from meshchain.inspector.tiling import TileLoop, chain_footprints, check_colouring, tile_chain
from meshchain.meshes import naca0012, structured_tris

from chain_programs import Program, programs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import airfoil  # noqa: E402
import synthetic_chain  # noqa: E402

THREADS = sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)})
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# --- the inspector on its own ------------------------------------------------------------------


@st.composite
def tile_problems(draw):
    nkeys = draw(st.integers(1, 40))
    loops = []
    for _ in range(draw(st.integers(1, 5))):
        size, ncols, start = draw(st.integers(0, 30)), draw(st.integers(0, 3)), draw(st.integers(0, 4))
        keys = draw(arrays(np.int64, (size, ncols), elements=st.integers(0, nkeys - 1)))
        loops.append(TileLoop(start, start + size, keys))
    seed = draw(st.one_of(st.none(), st.integers(0, len(loops) - 1)))
    return loops, nkeys, draw(st.integers(1, 35)), seed, draw(st.sampled_from(["natural", "grown"]))


def tile_keys(plan, loops, tile) -> set:
    keys = set()
    for position, loop in enumerate(loops):
        its = plan.iterations[position][plan.starts[position][tile] : plan.starts[position][tile + 1]]
        keys.update(loop.keys[its - loop.start].ravel().tolist())
    return keys


def assert_legal(plan, loops) -> None:
    """The invariant, by brute force and independently of ``check_colouring``."""
    colours = plan.tile_colours
    for c in range(plan.ncolours):  # same-colour tiles touch disjoint keys
        owner = {}
        for tile in plan.tile_order[plan.colour_offsets[c] : plan.colour_offsets[c + 1]]:
            assert colours[tile] == c
            for key in tile_keys(plan, loops, tile):
                assert owner.setdefault(key, tile) == tile, f"tiles {owner[key]} and {tile} share key {key}"
    tiles = [plan.tiles_of(position) for position in range(len(loops))]
    for position, loop in enumerate(loops):  # every iteration exactly once, and the runs list them
        assert sorted(plan.iterations[position].tolist()) == list(range(loop.start, loop.end))
        offsets, lo, hi = plan.runs[position]
        for tile in range(plan.ntiles):
            ranges = [range(lo[r], hi[r]) for r in range(offsets[tile], offsets[tile + 1])]
            listed = plan.iterations[position][plan.starts[position][tile] : plan.starts[position][tile + 1]]
            assert [e for run in ranges for e in run] == listed.tolist()
    for a in range(len(loops)):  # conflicting iterations run in chain order
        for b in range(a + 1, len(loops)):
            for i, row in enumerate(loops[a].keys):
                for j, other in enumerate(loops[b].keys):
                    if set(row.tolist()) & set(other.tolist()):
                        ta, tb = tiles[a][i], tiles[b][j]
                        assert ta == tb or colours[ta] < colours[tb], (a, i, b, j)


@settings(max_examples=150, **SETTINGS)
@given(problem=tile_problems())
def test_inspector_output_satisfies_the_colouring_invariant(problem):
    loops, nkeys, tile_size, seed, partition = problem
    plan = tile_chain(loops, nkeys=nkeys, tile_size=tile_size, seed=seed, partition=partition)
    assert_legal(plan, loops)
    check_colouring(plan, loops)
    seed = plan.seed
    assert np.all(np.diff(plan.starts[seed]) <= tile_size)


def test_colouring_check_rejects_an_illegal_plan():
    edges = np.array([[i, i + 1] for i in range(6)])
    loops = [TileLoop(0, 6, edges), TileLoop(0, 7, np.arange(7)[:, None])]
    plan = tile_chain(loops, nkeys=7, tile_size=2, seed=0)
    check_colouring(plan, loops)
    one_colour = dataclasses.replace(plan, tile_colours=np.zeros(plan.ntiles, dtype=np.int64))
    with pytest.raises(MeshchainError, match="colour 0"):
        check_colouring(one_colour, loops)
    with pytest.raises(AssertionError):
        assert_legal(one_colour, loops)


def test_inspector_refuses_bad_input():
    loops = [TileLoop(0, 2, np.array([[0], [1]]))]
    with pytest.raises(MeshchainError, match="tile_size"):
        tile_chain(loops, nkeys=2, tile_size=0)
    with pytest.raises(MeshchainError, match="lie in"):
        tile_chain(loops, nkeys=1, tile_size=1)
    with pytest.raises(MeshchainError, match="seed"):
        tile_chain(loops, nkeys=2, tile_size=1, seed=3)
    with pytest.raises(MeshchainError, match="partition"):
        tile_chain(loops, nkeys=2, tile_size=1, partition="metis")


@pytest.mark.parametrize("partition", ["natural", "grown"])
@pytest.mark.parametrize("tile_size", [1, 16, 200, 10**6])
def test_inspector_on_the_synthetic_chain_is_legal_and_grown_tiles_are_compact(tile_size, partition):
    problem = synthetic_chain.declare(structured_tris(24, 16), dtype=np.int64)
    synthetic_chain.record(problem, 2)
    entries = mc.get_runtime().trace.take()  # recorded, not run: only their footprints are wanted
    layout = mc.get_runtime().layout
    footprints, nkeys = chain_footprints([(loop, 0, loop.iterset.size) for loop, _ in entries],
                                         values=layout.values, rows=lambda s: s.size)
    plan = tile_chain(footprints, nkeys=nkeys, tile_size=tile_size, partition=partition)
    check_colouring(plan, footprints)
    assert nkeys == problem.nodes.size  # res and flux are written, on the nodes; pres and cw only read
    assert plan.ntiles >= -(-problem.edges.size // tile_size)
    if tile_size == 16:
        seed_nodes = [len(tile_keys(plan, footprints[plan.seed : plan.seed + 1], t)) for t in range(plan.ntiles)]
        if partition == "grown":  # a blob of 16 edges has few nodes
            assert np.median(seed_nodes) < 16
        else:  # natural runs follow the numbering: every seed tile is one stretch of it
            assert all(np.all(np.diff(plan.iterations[plan.seed][plan.starts[plan.seed][t]:
                                                              plan.starts[plan.seed][t + 1]]) == 1)
                       for t in range(plan.ntiles))


# --- tiled execution ---------------------------------------------------------------------------


def run_program(spec, *, backend="numba", threads=None, tile_size=None, chain=True, cache_dir=None):
    mc.reset_runtime(backend=backend, threads=threads, cache_dir=cache_dir)
    program = Program(spec)
    program.run(True if chain else None, tile_size=tile_size)
    return program.results(), mc.stats()


def assert_same(want, got):
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(b, a)


@settings(max_examples=4, **SETTINGS)
@given(spec=programs(max_loops=6), tile_size=st.integers(1, 400), threads=st.sampled_from(THREADS))
def test_tiled_chains_equal_untiled_and_the_reference(spec, tile_size, threads, meshchain_cache_dir):
    reference, _ = run_program(spec, backend="reference", chain=False, cache_dir=meshchain_cache_dir)
    untiled, _ = run_program(spec, cache_dir=meshchain_cache_dir)
    tiled, stats = run_program(spec, threads=threads, tile_size=tile_size, cache_dir=meshchain_cache_dir)
    assert_same(reference, untiled)
    assert_same(reference, tiled)
    chain = stats.chains["random"]
    assert chain.tile_size == tile_size and chain.tiled_groups >= 2 and chain.tiles >= 1
    assert chain.tile_inspections <= chain.tiled_groups // 2  # the second execution reuses the plans


@settings(max_examples=5, **SETTINGS)
@given(spec=programs(max_loops=4), tile_size=st.integers(1, 60))
def test_reference_backend_tiles_too(spec, tile_size, meshchain_cache_dir):
    want, _ = run_program(spec, backend="reference", chain=False, cache_dir=meshchain_cache_dir)
    got, stats = run_program(spec, backend="reference", tile_size=tile_size, cache_dir=meshchain_cache_dir)
    assert_same(want, got)
    assert stats.chains["random"].tiled_groups >= 2


@pytest.mark.parametrize("threads", THREADS)
def test_tiled_synthetic_chain_equals_untiled(threads):
    results = {}
    for tile_size in (None, 1, 37, 512, 10**6):
        mc.reset_runtime(threads=threads, cache_dir=mc.get_runtime().config.cache_dir)
        problem = synthetic_chain.declare(structured_tris(30, 20), dtype=np.int64)
        synthetic_chain.run(problem, 3, 3, tile_size=tile_size)
        results[tile_size] = problem.flux.data.copy(), problem.res.data.copy()
        if tile_size is not None:
            chain = mc.stats().chains["synthetic"]
            assert chain.tiled_groups == 3 and chain.tile_inspections == 1
    for tile_size, (flux, res) in results.items():
        np.testing.assert_array_equal(flux, results[None][0], err_msg=f"tile_size={tile_size}")
        np.testing.assert_array_equal(res, results[None][1], err_msg=f"tile_size={tile_size}")


def test_tiled_airfoil_stages_give_the_untiled_rms():
    histories = {}
    for tile_size in (None, 64, 1000):
        cache = mc.get_runtime().config.cache_dir
        mc.reset_runtime(cache_dir=cache)
        a = airfoil.declare(naca0012(40, 30))
        histories[tile_size] = airfoil.run(a, 20, report_every=5, out=None, ca=True, tile_size=tile_size)
    for tile_size, history in histories.items():
        np.testing.assert_allclose([r for _, r in history], [r for _, r in histories[None]], rtol=1e-12)
    assert mc.stats().chains["stage"].tiles > 1


# --- the user contract -------------------------------------------------------------------------


@mc.kernel
def total(a, g):
    g[0] += a[0]


@mc.kernel
def spread(b, g):
    b[0] = g[0]


def test_a_global_read_after_its_reduction_splits_the_tiles_and_says_why(backend):
    s = mc.Set(50, "s")
    a = mc.Dat(s, 1, np.arange(50), "a", dtype=np.int64)
    b = mc.Dat(s, 1, None, "b", dtype=np.int64)
    g = mc.Global(1, 0, "g", dtype=np.int64)
    with pytest.warns(mc.MeshchainWarning, match=r"\[tiling-split\].*'spread' reads global 'g'"):
        with mc.loop_chain("split", tile_size=8):
            mc.par_loop(total, s, a(mc.READ), g(mc.INC))
            mc.par_loop(spread, s, b(mc.WRITE), g(mc.READ))
    assert b.data_ro.ravel().tolist() == [sum(range(50))] * 50
    chain = mc.stats().chains["split"]
    assert chain.tiled_groups == 2 and any("[tiling-split]" in d for d in chain.diagnostics)


def test_reductions_of_a_tiled_chain_are_deferred_and_exact(backend):
    s = mc.Set(100, "s")
    a = mc.Dat(s, 1, np.arange(100) - 50, "a", dtype=np.int64)
    b = mc.Dat(s, 1, None, "b", dtype=np.int64)
    g = mc.Global(1, 7, "g", dtype=np.int64)
    lo = mc.Global(1, 10**6, "lo", dtype=np.int64)
    with mc.loop_chain("deferred", tile_size=9):
        mc.par_loop(spread, s, b(mc.WRITE), g(mc.READ))       # sees g before the chain
        mc.par_loop(total, s, a(mc.READ), g(mc.INC))
        mc.par_loop(low, s, a(mc.READ), lo(mc.MIN))
    assert b.data_ro.ravel().tolist() == [7] * 100
    assert g.value.tolist() == [7 + sum(range(-50, 50))] and lo.value.tolist() == [-50]
    assert mc.stats().chains["deferred"].tiled_groups == 1


@mc.kernel
def low(a, m):
    m[0] = min(m[0], a[0])


def test_tile_size_comes_from_the_chain_configuration(tmp_path):
    path = tmp_path / "chains.toml"
    path.write_text('[[chain]]\nname = "pair"\nloops = ["update", "edge_flux"]\ntile_size = 16\n')
    mc.configure(chains=path)
    problem = synthetic_chain.declare(structured_tris(10, 10), dtype=np.int64)
    synthetic_chain.run(problem, 1, 2, ca=None)
    chain = mc.stats().chains["pair"]
    assert chain.tile_size == 16 and chain.tiled_groups == 2 and chain.tiles >= problem.edges.size // 16


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "64"])
def test_tile_size_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigurationError, match="tile_size must be a positive integer"):
        mc.loop_chain("bad", tile_size=bad)


def test_tiling_statistics_appear_in_the_report():
    problem = synthetic_chain.declare(structured_tris(10, 10), dtype=np.int64)
    synthetic_chain.run(problem, 2, 2, tile_size=32)
    chain = mc.stats().chains["synthetic"]
    assert chain.tiles > 1 and chain.tile_colours >= 1 and chain.time_tile_inspect > 0
    assert "tiles" in str(mc.stats())
