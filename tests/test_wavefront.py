"""Chains of loops over one structured grid, tiled as a wavefront (``tile_size`` on a chain of
grid loops): the inspector keeps every dependence of the untiled order, and tiled chains give
the untiled bits on both CPU backends, for any tile size, in chains and captured steps."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends.numba_codegen import loop_source
from meshchain.inspector.wavefront import SlabLoop, lags, wavefront_plan

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = ("a", "b", "c")


# --- the inspector on its own ------------------------------------------------------------------


@st.composite
def slab_chains(draw):
    """Loops over slabs of one grid (each its own interior: first slab and slab count), each
    reading some dats at some reach and writing some."""
    per_slab = draw(st.integers(1, 4))
    loops = []
    for _ in range(draw(st.integers(1, 5))):
        first = draw(st.integers(0, 2))
        slabs = draw(st.integers(1, 6))
        start = draw(st.integers(0, per_slab - 1)) if draw(st.booleans()) else 0  # a part starting inside a slab
        end = max(start + 1, slabs * per_slab - (draw(st.integers(0, per_slab - 1)) if draw(st.booleans()) else 0))
        reads = draw(st.dictionaries(st.sampled_from(KEYS), st.integers(0, 2), max_size=3))
        writes = frozenset(draw(st.sets(st.sampled_from(KEYS), max_size=2)))
        loops.append(SlabLoop(start, end, per_slab, first, reads, writes))
    return loops, draw(st.integers(1, 4))


def assert_dependences_kept(plan, loops):
    """Every pair of accesses to one slab of one dat by loops ``i < j`` that conflict (a write
    and a read, or two writes) runs in chain order: loop ``i``'s in an earlier tile, or in the
    same tile (where the loops run in chain order)."""
    for i, earlier in enumerate(loops):
        for j in range(i + 1, len(loops)):
            for key in KEYS:
                reads_i, writes_i = _touches(earlier, plan.tiles_of(i), key)
                reads_j, writes_j = _touches(loops[j], plan.tiles_of(j), key)
                for before, after in ((writes_i, reads_j), (reads_i, writes_j), (writes_i, writes_j)):
                    for slab in before.keys() & after.keys():
                        assert max(before[slab]) <= min(after[slab]), (i, j, key, slab, before[slab], after[slab])


def _touches(loop, tiles, key) -> tuple[dict, dict]:
    """Slab of dat ``key`` -> the tiles in which the loop reads it, and in which it writes it."""
    reads: dict = {}
    writes: dict = {}
    reach = loop.reads.get(key)
    for element, tile in zip(range(loop.start, loop.end), tiles):
        slab = loop.slab(element)
        if reach is not None:
            for near in range(slab - reach, slab + reach + 1):
                reads.setdefault(near, []).append(tile)
        if key in loop.writes:
            writes.setdefault(slab, []).append(tile)
    return reads, writes


@settings(max_examples=150, **SETTINGS)
@given(problem=slab_chains())
def test_the_wavefront_keeps_every_dependence_of_the_untiled_order(problem):
    loops, slabs_per_tile = problem
    plan = wavefront_plan(loops, slabs_per_tile=slabs_per_tile)
    for position, loop in enumerate(loops):  # every iteration once, in order, tiles one after another
        assert plan.iterations[position].tolist() == list(range(loop.start, loop.end))
        assert np.all(np.diff(plan.tiles_of(position)) >= 0)
    assert plan.ncolours == plan.ntiles and plan.tile_order.tolist() == list(range(plan.ntiles))
    assert_dependences_kept(plan, loops)


def test_lags_follow_the_reach_of_each_dependence():
    sweep = SlabLoop(0, 9, 3, 1, {"u": 1}, frozenset({"v"}))
    back = SlabLoop(0, 9, 3, 1, {"v": 2}, frozenset({"u"}))
    scale = SlabLoop(0, 9, 3, 1, {"w": 0}, frozenset({"w"}))  # touches nothing of the others
    overwrite = SlabLoop(0, 9, 3, 1, {}, frozenset({"v"}))
    # back reads v, which sweep writes, 2 slabs away: 2 behind; overwrite writes v, which back reads 2 slabs
    # away: 2 behind back
    assert lags([sweep, back, scale, overwrite]) == [0, 2, 0, 4]


# --- tiled grid chains against untiled ones -------------------------------------------------


@st.composite
def grid_chains(draw):
    """A grid (2-D or 3-D), and 1-4 loops over its interiors: each reads one or two dats through
    a stencil within its width and writes (WRITE, RW or INC) one other dat."""
    ndim = draw(st.sampled_from([2, 3]))
    shape = tuple(draw(st.integers(3, 9)) for _ in range(ndim))
    loops = []
    for _ in range(draw(st.integers(1, 4))):
        width = draw(st.integers(0, 2))
        written = draw(st.sampled_from(KEYS))
        read = draw(st.lists(st.sampled_from([k for k in KEYS if k != written]), min_size=1, max_size=2, unique=True))
        stencils = [draw(st.lists(st.tuples(*[st.integers(-width, width)] * ndim), min_size=1, max_size=4, unique=True))
                    for _ in read]
        mode = draw(st.sampled_from(["WRITE", "RW", "INC"]))
        loops.append((width, written, tuple(read), tuple(tuple(s) for s in stencils), mode))
    return shape, loops, draw(st.integers(1, 300))


def _kernel(stencils, mode: str):
    """``out = sum of weighted stencil points`` (WRITE), ``out = out / 2 + ...`` (RW) or ``out += ...`` (INC)."""
    terms = " + ".join(f"{0.5 + 0.25 * k:.2f} * s{r}[{k}, 0]" for r, points in enumerate(stencils)
                       for k in range(len(points)))
    params = ", ".join(f"s{r}" for r in range(len(stencils)))
    body = {"WRITE": f"out[0] = {terms}", "RW": f"out[0] = 0.5 * out[0] + {terms}", "INC": f"out[0] += {terms}"}[mode]
    return mc.Kernel.from_source(f"def k({params}, out):\n    {body}\n")


def run_grid_chain(shape, loops, *, backend="numba", tile_size=None, chain=True, captured=False, repeats=2, threads=1):
    """The dats' values after ``repeats`` executions of the chain."""
    mc.reset_runtime(backend=backend, threads=threads, cache_dir=mc.get_runtime().config.cache_dir)
    grid = mc.Grid(shape, "g")
    rng = np.random.default_rng(7)
    dats = {key: mc.Dat(grid, 1, rng.random(int(np.prod(shape))), key) for key in KEYS}
    prepared = [(_kernel(stencils, mode), grid.interior(width), written, read,
                 [mc.Stencil(points, f"s{n}") for n, points in enumerate(stencils)], getattr(mc, mode))
                for width, written, read, stencils, mode in loops]

    def body():
        for kernel, interior, written, read, stencils, mode in prepared:
            reads = [dats[key](mc.READ, stencil) for key, stencil in zip(read, stencils)]
            mc.par_loop(kernel, interior, *reads, dats[written](mode))

    if captured:
        step = mc.capture(body, name="wave", tile_size=tile_size)
        step()
        step.repeat(repeats - 1)
    else:
        for _ in range(repeats):
            if chain:
                with mc.loop_chain("wave", tile_size=tile_size):
                    body()
            else:
                body()
    return {key: dat.data_ro.copy() for key, dat in dats.items()}, mc.stats()


def assert_same(want, got):
    for key in KEYS:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@settings(max_examples=12, **SETTINGS)
@given(problem=grid_chains())
def test_tiled_grid_chains_give_the_untiled_bits(problem):
    shape, loops, tile_size = problem
    want, _ = run_grid_chain(shape, loops, chain=False)
    got, stats = run_grid_chain(shape, loops, tile_size=tile_size)
    assert_same(want, got)
    chain = stats.chains["wave"]
    assert not [d for d in chain.diagnostics if "tiling-refused" in d]
    runs = any(all(n > 2 * width for n in shape) for width, *_ in loops)  # some loop has interior points
    assert (chain.tiled_groups, chain.tile_inspections) == ((2, 1) if runs else (0, 0))  # planned once


@settings(max_examples=4, **SETTINGS)
@given(problem=grid_chains())
def test_the_reference_backend_runs_the_wavefront_too(problem):
    shape, loops, tile_size = problem
    want, _ = run_grid_chain(shape, loops, backend="reference", chain=False)
    got, stats = run_grid_chain(shape, loops, backend="reference", tile_size=tile_size)
    assert_same(want, got)
    assert stats.chains["wave"].tiled_groups == (2 if any(all(n > 2 * w for n in shape) for w, *_ in loops) else 0)


@pytest.mark.parametrize("tile_size", [1, 7, 10**6])
def test_a_captured_tiled_sweep_repeated_in_one_call_gives_the_untiled_bits(tile_size, monkeypatch):
    from meshchain.engine import plans

    compiled = []
    run_times = plans.Plan.run_times
    monkeypatch.setattr(plans.Plan, "run_times", lambda plan, times: compiled.append(run_times(plan, times))
                        or compiled[-1])
    sweep = ((1, "b", ("a",), (((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)),), "WRITE"),
             (1, "a", ("b",), (((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)),), "WRITE"))
    want, _ = run_grid_chain((12, 9), sweep, chain=False, repeats=6)
    got, stats = run_grid_chain((12, 9), sweep, tile_size=tile_size, captured=True, repeats=6)
    assert_same(want, got)
    assert stats.chains["wave"].tiles >= 1 and compiled == [True]  # the tiled step's replays in one compiled call


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two Numba threads")
def test_on_several_threads_a_grid_chain_runs_untiled_on_all_of_them_and_says_why():
    sweep = ((1, "b", ("a",), (((0, 0), (-1, 0), (1, 0)),), "WRITE"), (1, "a", ("b",), (((0, 0), (0, 1)),), "RW"))
    want, _ = run_grid_chain((30, 20), sweep, chain=False)
    with pytest.warns(mc.MeshchainWarning, match="wavefront runs on one thread, and loops here run on 2"):
        got, stats = run_grid_chain((30, 20), sweep, tile_size=40, threads=2)
    assert_same(want, got)
    assert stats.chains["wave"].tiled_groups == 0


def test_a_grid_chain_with_a_reduction_runs_untiled_and_says_why():
    mc.reset_runtime(threads=1, cache_dir=mc.get_runtime().config.cache_dir)
    grid = mc.Grid((6, 5), "g")
    u = mc.Dat(grid, 1, np.arange(30.0), "u")
    total = mc.Global(1, 0.0, "total")
    add = mc.Kernel.from_source("def add(a, t):\n    t[0] += a[0]\n")
    with pytest.warns(mc.MeshchainWarning, match="reduces into global 'total'"):
        with mc.loop_chain("summed", tile_size=4):
            mc.par_loop(add, grid.interior(1), u(mc.READ), total(mc.INC))
    assert total.value.tolist() == [float(np.arange(30.0).reshape(6, 5)[1:-1, 1:-1].sum())]
    assert any("tiling-refused" in d for d in mc.stats().chains["summed"].diagnostics)


def test_a_tiled_grid_loop_runs_its_runs_line_by_line():
    mc.reset_runtime()
    grid = mc.Grid((6, 5), "g")
    u, v = mc.Dat(grid, 1, None, "u"), mc.Dat(grid, 1, None, "v")
    from meshchain.ir.loop import make_loop

    star = mc.Stencil([(0, 0), (-1, 0), (0, 1)], "star")
    loop = make_loop(_kernel([star.offsets], "WRITE"), grid.interior(1), (u(mc.READ, star), v(mc.WRITE)))
    source = loop_source(loop, boundscheck=False)
    tile = source[source.index("def _mc_tile("):source.index("def _mc_loop(")]
    assert "for _mc_q in range(_mc_lo // 3, (_mc_hi - 1) // 3 + 1):" in tile and "//" not in tile.split("_mc_g =")[1]


def test_the_wavefront_plan_serves_new_dats_and_holds_none():
    """A chain over a temporary dat per execution inspects its wavefront once; the plan keeps
    no dat of an earlier execution alive."""
    import gc
    import weakref

    mc.reset_runtime(threads=1, cache_dir=mc.get_runtime().config.cache_dir)
    grid = mc.Grid((10, 7), "g")
    u = mc.Dat(grid, 1, np.arange(70.0), "u")
    star = mc.Stencil([(0, 0), (-1, 0), (1, 0)], "star")
    smooth = _kernel([star.offsets], "WRITE")
    gone, sums = [], []
    for _ in range(4):
        temporary = mc.Dat(grid, 1, None, "t")
        with mc.loop_chain("temporary", tile_size=5):
            mc.par_loop(smooth, grid.interior(1), u(mc.READ, star), temporary(mc.WRITE))
            mc.par_loop(smooth, grid.interior(1), temporary(mc.READ, star), u(mc.RW))
        sums.append(float(u.data_ro.sum()))
        gone.append(weakref.ref(temporary))
        del temporary
    gc.collect()
    chain = mc.stats().chains["temporary"]
    assert chain.tiled_groups == 4 and chain.tile_inspections == 1
    assert all(ref() is None for ref in gone[:-1])  # the latest execution's dats stay bound to it, as untiled
    assert len(set(sums)) == 4  # u changed every time
