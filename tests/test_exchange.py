"""Halo exchanges planned once and run many times: compiled packing equals NumPy's fancy
indexing, and persistent requests move the right rows run after run (on 1 to 4 ranks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshchain.comm.exchange import TRANSPORTS, HaloExchange, HaloItem, variable_item
from meshchain.comm.packing import COMBINE, pack, row_table, scratch, typed_view, unpack, word_view

DTYPES = (np.float64, np.float32, np.int32, np.int64)


@st.composite
def packing_cases(draw):
    arrays = []
    for _ in range(draw(st.integers(1, 4))):
        dtype = draw(st.sampled_from(DTYPES))
        rows, dim = draw(st.integers(0, 30)), draw(st.integers(1, 5))
        arrays.append(np.arange(rows * dim, dtype=dtype).reshape(rows, dim) * 3 + 1)
    pieces = []
    for _ in range(draw(st.integers(0, 6))):
        view = draw(st.integers(0, len(arrays) - 1))
        if len(arrays[view]):
            rows = draw(st.lists(st.integers(0, len(arrays[view]) - 1), max_size=12))
            pieces.append((view, np.array(rows, dtype=np.int64)))
    return arrays, pieces


@settings(max_examples=80, deadline=None)
@given(case=packing_cases())
def test_packing_equals_numpy(case):
    arrays, pieces = case
    views = tuple(word_view(a) for a in arrays)
    table, words = row_table(pieces, [v.shape[1] for v in views])
    buffer = np.zeros(words, dtype=np.uint32)
    pack(buffer, views, table)
    expected = [arrays[v][rows].view(np.uint8).ravel() for v, rows in pieces if len(rows)]
    np.testing.assert_array_equal(buffer.view(np.uint8), np.concatenate(expected) if expected else np.zeros(0, np.uint8))
    copies = [a.copy() for a in arrays]
    for a in arrays:
        a[...] = 0
    unpack(buffer, views, table)
    for v, rows in pieces:
        np.testing.assert_array_equal(arrays[v][rows], copies[v][rows])


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
@pytest.mark.parametrize("grouped", [True, False])
def test_an_exchange_moves_the_right_rows_run_after_run(comm, grouped):
    """Each rank owns rows 0..5 of two dats and keeps halo rows 6.. for every other rank: it
    sends its rows 0, 2, 4 (dat a) and 1, 3 (dat b) to everybody. Values change between runs;
    the persistent requests carry the new ones."""
    rank, size = comm.rank, comm.size
    others = [r for r in range(size) if r != rank]
    a = np.zeros((6 + 3 * len(others), 2), dtype=np.float64)
    b = np.zeros((6 + 2 * len(others), 1), dtype=np.int32)
    exports_a = {r: np.array([0, 2, 4]) for r in others}
    exports_b = {r: np.array([1, 3]) for r in others}
    imports_a = {r: 6 + 3 * k + np.arange(3) for k, r in enumerate(others)}
    imports_b = {r: 6 + 2 * k + np.arange(2) for k, r in enumerate(others)}
    items = [HaloItem(a, exports_a, imports_a), HaloItem(b, exports_b, imports_b)]
    exchanges = [HaloExchange(comm, items, tag=0)] if grouped else [
        HaloExchange(comm, [item], tag=tag) for tag, item in enumerate(items, start=5)]
    for run in range(3):
        a[:6] = (100 * rank + 10 * run + np.arange(6))[:, None] * np.array([1.0, -1.0])
        b[:6, 0] = 1000 * rank + run + np.arange(6)
        for exchange in exchanges:
            exchange.begin()
        for exchange in exchanges:
            exchange.end()
        for k, r in enumerate(others):
            got_a = a[6 + 3 * k: 9 + 3 * k]
            want = (100 * r + 10 * run + np.array([0, 2, 4]))[:, None] * np.array([1.0, -1.0])
            np.testing.assert_array_equal(got_a, want)
            np.testing.assert_array_equal(b[6 + 2 * k: 8 + 2 * k, 0], 1000 * r + run + np.array([1, 3]))
    expected_messages = len(others) * (1 if grouped else 2)
    assert sum(x.messages for x in exchanges) == expected_messages
    assert sum(x.bytes_sent for x in exchanges) == len(others) * (3 * 16 + 2 * 4)
    for exchange in exchanges:
        exchange.close()
        assert exchange.requests == []


@st.composite
def combining_cases(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    arrays = [np.arange(rows * dim, dtype=dtype).reshape(rows, dim) * 3 - 20
              for rows, dim in draw(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 3)), min_size=1, max_size=2))]
    pieces = [(view, np.array(draw(st.lists(st.integers(0, len(arrays[view]) - 1), max_size=6)), dtype=np.int64))
              for view in draw(st.lists(st.integers(0, len(arrays) - 1), max_size=4))]
    return arrays, pieces, draw(st.sampled_from(sorted(COMBINE))), draw(st.integers(0, 1))


@settings(max_examples=60, deadline=None)
@given(case=combining_cases())
def test_combining_equals_numpy_in_order(case):
    """combine_<op> applies the buffer's values to the listed rows one after another, in the
    rows' dtype, wherever in the buffer they sit (``pad`` shifts them off 8-byte alignment)."""
    arrays, pieces, op, pad = case
    widths = [word_view(a).shape[1] for a in arrays]
    table, words = row_table(pieces, widths)
    table[:, 2] += pad
    contributions = [np.flip(a, axis=0) * 2 + 1 for a in arrays]  # what the buffer carries, row by row
    buffer = np.zeros(words + pad, dtype=np.uint32)
    pack(buffer, tuple(word_view(c) for c in contributions), table)
    want = [a.copy() for a in arrays]
    for v, rows in pieces:
        for row in rows:
            value = contributions[v][row]
            want[v][row] = {"sum": lambda old: old + value, "min": lambda old: np.minimum(old, value),
                            "max": lambda old: np.maximum(old, value)}[op](want[v][row])
    COMBINE[op](buffer, tuple(typed_view(a) for a in arrays), table, *scratch(arrays[0].dtype))
    for got, expected in zip(arrays, want):
        assert got.tobytes() == expected.tobytes()


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_items_of_variable_size_move_like_rows(comm, transport):
    """Each rank owns 4 CSR rows of global ids ``4 r .. 4 r + 3`` (row ``g`` has ``g % 3 + 1``
    entries ``10 g + k``) and imports the first two rows of every other rank."""
    rank, size = comm.rank, comm.size
    others = [r for r in range(size) if r != rank]
    local = [4 * rank + i for i in range(4)] + [4 * o + i for o in others for i in range(2)]
    lengths = np.array([g % 3 + 1 for g in local], dtype=np.int64)
    pointers = np.concatenate(([0], np.cumsum(lengths)))
    values = np.zeros((int(pointers[-1]), 1), dtype=np.float64)
    for row in range(4):
        values[pointers[row]: pointers[row + 1], 0] = 10 * local[row] + np.arange(lengths[row])
    exports = {o: np.array([0, 1]) for o in others}
    imports = {o: 4 + 2 * k + np.array([0, 1]) for k, o in enumerate(others)}
    exchange = HaloExchange(comm, [variable_item(values, pointers, exports, imports)], tag=5, transport=transport)
    try:
        exchange.begin()
        exchange.end()
    finally:
        exchange.close()
    expected = np.concatenate([10 * g + np.arange(g % 3 + 1) for g in local]).astype(np.float64)
    np.testing.assert_array_equal(values[:, 0], expected)
