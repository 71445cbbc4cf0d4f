"""Inputs as PyOP2 and OP2's C API take them (flat data, flat map values, whole numbers given as
floats), and inputs that must be refused, never truncated or ignored (issue 35, item 5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshchain as mc


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 6), dim=st.integers(1, 4), dtype=st.sampled_from([np.float64, np.float32, np.int32, np.int64]))
def test_flat_dat_data_equals_the_rows(rows, dim, dtype):
    mc.reset_runtime()
    s = mc.Set(rows, "s")
    values = np.arange(rows * dim).astype(dtype)
    flat = mc.Dat(s, dim, values, "flat")
    shaped = mc.Dat(s, dim, values.reshape(rows, dim), "shaped")
    assert flat.dtype == shaped.dtype == np.dtype(dtype)
    assert np.array_equal(flat.data_ro, shaped.data_ro)


def test_flat_map_values_equal_the_rows():
    mc.reset_runtime()
    cells, nodes = mc.Set(3, "cells"), mc.Set(4, "nodes")
    rows = np.array([[0, 1], [1, 2], [2, 3]])
    flat = mc.Map(cells, nodes, 2, rows.ravel(), "flat")
    x = mc.Dat(nodes, 1, np.arange(4.0), "x")
    total = mc.Dat(cells, 1, None, "total")
    add = mc.Kernel.from_source("def add(a, b, t):\n    t[0] = a[0] + b[0]\n")
    mc.par_loop(add, cells, x(mc.READ, flat[0]), x(mc.READ, flat[1]), total(mc.WRITE))
    assert total.data_ro[:, 0].tolist() == [1.0, 3.0, 5.0]
    with pytest.raises(mc.MapError, match=r"expected \(3, 2\) \(or 6 values flat\)"):
        mc.Map(cells, nodes, 2, rows.ravel()[:5], "short")


def test_whole_numbers_given_as_floats_are_converted_and_others_refused():
    mc.reset_runtime()
    s = mc.Set(3, "s")
    ids = mc.Dat(s, 1, [1.0, 2.0, 3.0], "ids", dtype=np.int32)
    assert ids.data_ro.dtype == np.int32 and ids.data_ro[:, 0].tolist() == [1, 2, 3]
    for bad, why in (([1.5, 2.0, 3.0], "1.5 is not an integer"), ([np.nan, 2.0, 3.0], "nan is not an integer"),
                     ([2.0**40, 0.0, 0.0], "values do not fit in int32")):
        with pytest.raises(mc.DataShapeError, match=why):
            mc.Dat(s, 1, bad, "bad", dtype=np.int32)
    m = mc.Map(s, s, 1, np.array([2.0, 0.0, 1.0]), "m")
    assert mc.get_runtime().map_values(m).tolist() == [[2], [0], [1]]


def test_an_integer_global_needs_no_value():
    mc.reset_runtime()
    for dtype in (np.int32, np.int64):
        g = mc.Global(2, dtype=dtype)
        assert g.value.dtype == np.dtype(dtype) and g.value.tolist() == [0, 0]
    with pytest.raises(mc.DataShapeError, match="0.5 is not an integer"):
        mc.Global(1, 0.5, "half", dtype=np.int32)


def test_a_global_value_cannot_be_written_to_unknowingly():
    mc.reset_runtime()
    g = mc.Global(1, 3.0, "g")
    with pytest.raises(ValueError, match="read-only"):
        g.value[0] = 10.0
    g.value = 10.0
    assert g.value.tolist() == [10.0]


@pytest.mark.parametrize("name", [2, "", "not an identifier", b"k"])
def test_a_kernel_name_must_be_an_identifier(name):
    def k(a):
        a[0] = 1.0

    with pytest.raises(mc.KernelError, match="name must be a Python identifier"):
        mc.kernel(k, name=name)
    with pytest.raises(mc.KernelError, match="name must be a Python identifier"):
        mc.Kernel.from_source("def k(a):\n    a[0] = 1.0\n", name=name)


@pytest.mark.parametrize("offsets", [[(0, 0), (0.5, 0)], [(0, 0), (1.0, 0)], [(True, 0)], [(0, "1")]])
def test_stencil_offsets_must_be_integers_not_truncated(offsets):
    with pytest.raises(mc.DeclarationError, match="offsets must be a non-empty list of 2- or 3-integer"):
        mc.Stencil(offsets, "s")
    assert mc.Stencil([(np.int64(1), 0), (0, -1)], "s").offsets == ((1, 0), (0, -1))
