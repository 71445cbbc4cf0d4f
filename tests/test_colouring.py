"""The block-colouring invariant, checked directly on ``touched_keys`` / ``colour_blocks``.

Hypothesis draws an iteration set, one or two target sets, maps into them, the (map, column)
pairs a loop writes through, a sub-range of the iterations and a block size.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.inspector import colour_blocks, touched_keys

FAST = settings(max_examples=60, deadline=None)


@st.composite
def problems(draw):
    """(maps, writes, start, end, block_size) on a random small mesh."""
    n = draw(st.integers(0, 60))
    iterset = mc.Set(n, "it")
    targets = [mc.Set(draw(st.integers(1, 20)), f"t{i}") for i in range(draw(st.integers(1, 2)))]
    maps = []
    for i in range(draw(st.integers(1, 3))):
        target = targets[draw(st.integers(0, len(targets) - 1))]
        arity = draw(st.integers(1, 3))
        seed = draw(st.integers(0, 2**32 - 1))
        values = np.random.default_rng(seed).integers(0, target.size, size=(n, arity))
        maps.append(mc.Map(iterset, target, arity, values, f"m{i}"))
    writes = []
    for _ in range(draw(st.integers(0, 3))):
        m = draw(st.sampled_from(maps))
        writes.append((m, draw(st.one_of(st.none(), st.integers(0, m.arity - 1)))))
    start = draw(st.integers(0, n))
    end = draw(st.integers(start, n))
    block_size = draw(st.one_of(st.integers(1, 8), st.sampled_from([n + 1, 10 * n + 1000])))
    return writes, start, end, block_size


def keys_of(writes):
    """``touched_keys``'s description of ``(map, column)`` pairs: values, column, target, rows."""
    return [(m.values, index, id(m.target), m.target.size) for m, index in writes]


def written_elements(writes, e):
    """The (target set, element) pairs iteration ``e`` writes, computed from the maps themselves."""
    out = set()
    for m, index in writes:
        columns = range(m.arity) if index is None else [index]
        out.update((id(m.target), int(m.values[e, c])) for c in columns)
    return out


def check_plan(plan, writes, start, end, block_size):
    starts = plan.block_starts
    nblocks = plan.nblocks
    # every iteration in exactly one block: consecutive blocks of block_size tile [start, end)
    assert (plan.start, plan.end) == (start, end)
    assert starts[0] == start and starts[-1] == end and len(starts) == nblocks + 1
    sizes = np.diff(starts)
    assert np.all(sizes >= 1) and np.all(sizes[:-1] == block_size) and np.all(sizes <= block_size)
    assert nblocks == -(-(end - start) // block_size)
    # block_order: a permutation of the blocks, sorted by colour, stable inside a colour
    order, colours = plan.block_order, plan.block_colours
    assert sorted(order.tolist()) == list(range(nblocks))
    assert len(colours) == nblocks and (nblocks == 0 or colours.min() >= 0)
    assert np.all(np.diff(colours[order]) >= 0)
    # colour_offsets: colour c is order[offsets[c]:offsets[c+1]]; every colour is used
    offsets = plan.colour_offsets
    assert offsets[0] == 0 and offsets[-1] == nblocks and np.all(np.diff(offsets) >= 1)
    assert plan.ncolours == (int(colours.max()) + 1 if nblocks else 0)
    for c in range(plan.ncolours):
        members = order[offsets[c]:offsets[c + 1]]
        assert np.all(colours[members] == c)
        assert np.all(np.diff(members) > 0)
    # the invariant: blocks of one colour never write a common element
    for c in range(plan.ncolours):
        seen = set()
        for b in order[offsets[c]:offsets[c + 1]]:
            touched = set().union(*(written_elements(writes, e) for e in range(starts[b], starts[b + 1])))
            assert not (seen & touched), f"colour {c}: block {b} shares {seen & touched}"
            seen |= touched


@FAST
@given(problem=problems())
def test_colouring_invariant(problem):
    writes, start, end, block_size = problem
    touch, nkeys = touched_keys(start, end, keys_of(writes))
    plan = colour_blocks(start, end, block_size=block_size, touch=touch, nkeys=nkeys)
    check_plan(plan, writes, start, end, block_size)
    if not writes:
        assert plan.ncolours == (1 if end > start else 0)


@FAST
@given(problem=problems())
def test_touched_keys(problem):
    writes, start, end, _ = problem
    touch, nkeys = touched_keys(start, end, keys_of(writes))
    columns = sum(m.arity if i is None else 1 for m, i in writes)
    assert touch.shape == (end - start, columns) and touch.flags.c_contiguous
    assert nkeys == sum({id(m.target): m.target.size for m, _ in writes}.values())
    if touch.size:
        assert touch.min() >= 0 and touch.max() < nkeys
    # two iterations share a key exactly when they write a common element of a common set
    for e in range(start, min(end, start + 12)):
        for f in range(e, min(end, start + 12)):
            shared_keys = bool(set(touch[e - start]) & set(touch[f - start]))
            assert shared_keys == bool(written_elements(writes, e) & written_elements(writes, f))


@FAST
@given(problem=problems())
def test_colouring_is_deterministic(problem):
    writes, start, end, block_size = problem
    plans = []
    for _ in range(2):
        touch, nkeys = touched_keys(start, end, keys_of(writes))
        plans.append(colour_blocks(start, end, block_size=block_size, touch=touch.copy(), nkeys=nkeys))
    for field in ("block_starts", "block_order", "colour_offsets", "block_colours"):
        np.testing.assert_array_equal(getattr(plans[0], field), getattr(plans[1], field))


@pytest.mark.parametrize("block_size", [1, 3, 100])
def test_empty_range(block_size):
    touch = np.zeros((0, 2), dtype=np.int64)
    plan = colour_blocks(5, 5, block_size=block_size, touch=touch, nkeys=4)
    assert (plan.nblocks, plan.ncolours) == (0, 0)
    assert plan.block_starts.tolist() == [5] and plan.colour_offsets.tolist() == [0]


def test_more_than_64_colours():
    """Every block writes element 0, so each needs its own colour (exercises the 64-bit passes)."""
    n = 150
    touch = np.zeros((n, 1), dtype=np.int64)
    plan = colour_blocks(0, n, block_size=1, touch=touch, nkeys=1)
    assert plan.ncolours == n
    assert sorted(plan.block_colours.tolist()) == list(range(n))


def test_independent_blocks_share_one_colour():
    touch = np.arange(12, dtype=np.int64).reshape(12, 1)
    plan = colour_blocks(0, 12, block_size=4, touch=touch, nkeys=12)
    assert plan.ncolours == 1 and plan.block_order.tolist() == [0, 1, 2]


def test_session_colouring_matches_colour_blocks():
    """The session's cached colouring is colour_blocks over the loop's indirect writes, per block size."""
    from meshchain.ir.loop import make_loop

    nodes, edges = mc.Set(30, "nodes"), mc.Set(80, "edges")
    e2n = mc.Map(edges, nodes, 2, np.random.default_rng(1).integers(0, 30, size=(80, 2)), "e2n")
    x, w = mc.Dat(nodes, 1, None, "x"), mc.Dat(edges, 1, None, "w")
    k = mc.Kernel.from_source("def k(a, b, c):\n    a[0] += c[0]\n    b[0] += c[0]\n")
    loop = make_loop(k, edges, (x(mc.INC, e2n[0]), x(mc.INC, e2n[1]), w(mc.READ)))
    touch, nkeys = touched_keys(0, 80, keys_of([(e2n, 0), (e2n, 1)]))
    runtime = mc.get_runtime()
    for block_size in (4, 16):
        mc.configure(block_size=block_size)
        expected = colour_blocks(0, 80, block_size=block_size, touch=touch, nkeys=nkeys)
        plan = runtime.colouring(loop, 0, 80)
        assert plan.ncolours > 1
        check_plan(plan, [(e2n, 0), (e2n, 1)], 0, 80, block_size)
        for field in ("block_starts", "block_order", "colour_offsets", "block_colours"):
            np.testing.assert_array_equal(getattr(plan, field), getattr(expected, field))
        assert runtime.colouring(loop, 0, 80) is plan
