"""Inputs as PyOP2 and OP2's C API take them (flat data, flat map values, whole numbers given as
floats), and inputs that must be refused, never truncated or ignored (issue 35, item 5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import meshchain as mc
from devices import DEVICE_BACKENDS


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


@settings(max_examples=20, deadline=None)
@given(dim=st.integers(1, 4), value=st.floats(-1e6, 1e6), name=st.sampled_from([None, "g", "sum"]))
def test_the_quick_declarations_equal_the_checked_ones(dim, value, name):
    """A Global of a Python float and a Dat of zeros (what a step declares per reduction or as
    a temporary) skip the checks: the same objects as those declared the checked way."""
    mc.reset_runtime()
    quick, checked = mc.Global(dim, value, name), mc.Global(dim, np.float64(value), name, dtype="float64")
    assert (quick.name, quick.dim, quick.dtype) == (checked.name, checked.dim, checked.dtype)
    assert quick.value.dtype == checked.value.dtype and np.array_equal(quick.value, checked.value)
    s = mc.Set(3, "s")
    zeros, typed = mc.Dat(s, dim, None, name), mc.Dat(s, dim, None, name, dtype=np.float64)
    assert zeros.dtype == typed.dtype and np.array_equal(zeros.data_ro, typed.data_ro)
    assert zeros.data_ro.shape == (3, dim)


_SCALARS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-1e6, 1e6).map(np.float64),
                     st.integers(-2**70, 2**70), st.integers(-5, 5), st.booleans(),
                     st.integers(-5, 5).map(np.int32), st.floats(-5, 5).map(np.float32))
_DTYPE_SPELLINGS = st.sampled_from([None, np.float64, np.float32, np.int32, np.int64, np.uint32, np.uint64, "int32",
                                    "float64", np.dtype(np.uint64), float, int, np.int16, "complex128"])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e300 as float32: inf, both ways
@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 3), value=_SCALARS, dtype=_DTYPE_SPELLINGS)
@example(count=1, value=2**70, dtype=np.float64).via("an int wider than int64: refused, not rounded")
@example(count=2, value=2**63, dtype=np.uint64).via("the top of uint64's range")
def test_a_scalar_stored_quickly_equals_the_checked_storage(count, value, dtype):
    """A Global of one scalar takes a quick path where the value needs no more checks: the
    same array, dtype and bits as the checks make; the values it cannot vouch for (other kinds,
    values that do not fit, unsupported dtypes) go through the checks, which accept or refuse."""
    from meshchain.types._checks import as_storage, resolve_dtype, scalar_storage

    quick = scalar_storage(count, value, dtype)
    try:
        chosen = resolve_dtype(value, dtype, "g")
        checked = as_storage(np.full(count, value) if np.ndim(value) == 0 else value, chosen, (count,), "g", fix="")
    except mc.DataShapeError:
        assert quick is None
        return
    if quick is not None:
        assert quick.dtype == checked.dtype and quick.shape == checked.shape and quick.flags.c_contiguous
        assert quick.tobytes() == checked.tobytes()


@pytest.mark.parametrize("dim", [0, -1, True, 1.0, "2"])
def test_bad_dims_are_refused_on_the_quick_path_too(dim):
    mc.reset_runtime()
    with pytest.raises(mc.DataShapeError, match="dim must be"):
        mc.Global(dim, 0.0, "g")
    with pytest.raises(mc.DataShapeError, match="dim must be"):
        mc.Dat(mc.Set(2, "s"), dim, None, "d")


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


# --- unsigned integer dtypes (ids, masks): loops, reductions, exchanges, I/O -------------------------

@mc.kernel
def mark(ids, mask):
    mask[0] = ids[0] | 1


@mc.kernel
def count_edges(a, b):
    a[0] += 1
    b[0] += 1


@mc.kernel
def extremes(ids, low, high):
    low[0] = min(low[0], ids[0])
    high[0] = max(high[0], ids[0])


def unsigned_program(dtype):
    """Masks, degrees through a map (INC) and MIN/MAX of ids, on a small mesh; the results."""
    from meshchain.meshes import structured_quads

    mesh = structured_quads(6, 5)
    d = mesh.declare()
    big = np.iinfo(dtype).max - 1000  # near the top of the range: not representable as a signed int of that size
    ids = mc.Dat(d.cells, 1, big - np.arange(mesh.ncell, dtype=dtype), "ids", dtype=dtype)
    mask = mc.Dat(d.cells, 1, None, "mask", dtype=dtype)
    degree = mc.Dat(d.cells, 1, None, "degree", dtype=dtype)
    low, high = mc.Global(1, big, "low", dtype=dtype), mc.Global(1, 0, "high", dtype=dtype)
    mc.partition("rib", coords=d.coords)
    mc.par_loop(mark, d.cells, ids(mc.READ), mask(mc.WRITE))
    mc.par_loop(count_edges, d.facets, degree(mc.INC, d.facet2cell[0]), degree(mc.INC, d.facet2cell[1]))
    mc.par_loop(extremes, d.cells, ids(mc.READ), low(mc.MIN), high(mc.MAX))
    return {"mask": mask.gather(), "degree": degree.gather(), "low": low.value, "high": high.value,
            "dtype": mask.dtype, "big": big, "cells": mesh.ncell}


@pytest.mark.parametrize("backend", ["numba", "reference", *DEVICE_BACKENDS])
@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_unsigned_dats_and_globals_on_one_process(backend, dtype):
    mc.reset_runtime(backend=backend)
    got = unsigned_program(dtype)
    ids = got["big"] - np.arange(got["cells"], dtype=dtype)
    assert got["dtype"] == np.dtype(dtype) and got["mask"].dtype == np.dtype(dtype)
    assert np.array_equal(got["mask"][:, 0], ids | dtype(1))
    assert got["low"].tolist() == [int(ids.min())] and got["high"].tolist() == [int(ids.max())]
    mc.reset_runtime(backend=backend)
    signed = unsigned_program(np.int64)  # the same program on signed ids: the same degrees
    assert np.array_equal(got["degree"], signed["degree"]) and got["degree"].sum() > 0


@pytest.mark.mpi(nprocs=(2, 3), timeout=180)
def test_unsigned_dats_cross_ranks_unchanged(comm):
    from mpi4py import MPI

    for dtype in (np.uint32, np.uint64):
        mc.reset_runtime(comm=comm)
        many = unsigned_program(dtype)
        if comm.rank == 0:
            mc.reset_runtime(comm=MPI.COMM_SELF)  # rank 0 alone, for the reference
            one = unsigned_program(dtype)
            for key in ("mask", "degree"):
                assert np.array_equal(many[key], one[key]) and many[key].dtype == np.dtype(dtype)
            assert many["low"].tolist() == one["low"].tolist() and many["high"].tolist() == one["high"].tolist()
        comm.Barrier()


def test_unsigned_inputs_must_fit():
    mc.reset_runtime()
    s = mc.Set(3, "s")
    assert mc.Dat(s, 1, [0, 1, 2**32 - 1], "ok", dtype=np.uint32).data_ro[:, 0].tolist() == [0, 1, 2**32 - 1]
    with pytest.raises(mc.DataShapeError, match=r"values do not fit in uint32; pass dtype=np\.int64"):
        mc.Dat(s, 1, [-1, 0, 1], "negative", dtype=np.uint32)
    with pytest.raises(mc.DataShapeError, match=r"values do not fit in uint32; pass dtype=np\.uint64"):
        mc.Dat(s, 1, [0, 0, 2**40], "large", dtype=np.uint32)


def test_unsigned_dats_checkpoint_unchanged_and_are_described_as_unsigned_in_xdmf(tmp_path):
    import xml.etree.ElementTree as ET

    from meshchain.io.output import _data_item

    attribute = ET.Element("Attribute")
    _data_item(attribute, (4, 1), np.uint32, "step:/ids")
    item = attribute.find("DataItem")
    assert (item.get("DataType"), item.get("Precision")) == ("UInt", "4")
    mc.reset_runtime()
    s = mc.Set(4, "s")
    top = np.iinfo(np.uint64).max
    ids = mc.Dat(s, 1, np.array([top, 0, 7, top - 1], dtype=np.uint64), "ids", dtype=np.uint64)
    flags = mc.Global(1, 2**32 - 1, "flags", dtype=np.uint32)
    mc.checkpoint(tmp_path / "run.h5", [ids, flags])
    ids.data[:] = 0
    flags.value = 0
    mc.restore(tmp_path / "run.h5", [ids, flags])
    assert ids.data_ro[:, 0].tolist() == [top, 0, 7, top - 1] and flags.value.tolist() == [2**32 - 1]


@pytest.mark.parametrize("backend", ["numba", "reference", *DEVICE_BACKENDS])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # NumPy's scalars say so; Numba wraps
def test_a_negative_increment_of_an_unsigned_global_wraps_on_every_backend(backend):
    """Regression: Numba typed the inlined sum of an unsigned global as a float64 once a signed
    value was added to it, and stored the negative result out of range (4 - 15 gave 3)."""
    mc.reset_runtime(backend=backend)
    cells = mc.Set(3, "cells")
    ids = mc.Dat(cells, 2, np.array([[2**64 - 2, 2**64 - 4]] * 3, dtype=np.uint64), "ids", dtype=np.uint64)
    total = mc.Global(1, 4, "total", dtype=np.uint64)
    add = mc.Kernel.from_source("def add(i, t):\n    s = 0\n    s += i[0]\n    s += i[1]\n    t[0] += int(s) + 1\n")
    mc.par_loop(add, cells, ids(mc.READ), total(mc.INC))
    assert total.value.tolist() == [2**64 - 11]  # 4 + 3 * (-2 - 4 + 1), modulo 2**64


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40), extra=st.binary(max_size=7),
       where=st.integers(0, 10**6), bit=st.integers(0, 7))
def test_the_digest_changes_with_any_byte_and_any_order(values, extra, where, bit):
    """What declarations compare between ranks (:mod:`meshchain.comm.digest`): equal bytes give
    equal digests; one bit changed anywhere (the tail of bytes that are no whole word
    included), or two different words swapped, give another."""
    from meshchain.comm.digest import digest

    raw = np.array(values, dtype=np.uint64).tobytes() + extra
    assert digest(np.frombuffer(raw, dtype=np.uint8).copy()) == digest(raw)
    flipped = bytearray(raw)
    flipped[where % len(raw)] ^= 1 << bit
    assert digest(bytes(flipped)) != digest(raw)
    words = np.array(values, dtype=np.uint64)
    if len(set(values)) > 1:
        first, second = 0, next(k for k, v in enumerate(values) if v != values[0])
        swapped = words.copy()
        swapped[[first, second]] = swapped[[second, first]]
        assert digest(swapped) != digest(words)
