"""Dat arithmetic (PyOP2's ``x += y``, ``x.axpy(a, y)``, ``x.inner(y)``, ...) as lazy loops: random
programs of operations equal NumPy on one process and on several ranks, inside loop chains (CA)
too; bad operands are refused on every rank."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meshchain as mc
from devices import DEVICE_BACKENDS
from meshchain.meshes import structured_quads

OPS = ("iadd", "isub", "imul", "idiv", "iadd_scalar", "imul_scalar", "axpy", "copy", "zero", "add", "neg")


# a program: (operation, target, operand, scalar) over three vectors 0, 1, 2
programs = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2), st.integers(0, 2),
                              st.sampled_from([-1.5, 0.5, 2.0, 3.0])), min_size=1, max_size=8)


def run_program(program, dats, arrays, *, inner_each=True):
    """Apply ``program`` to meshchain dats and to NumPy arrays alike; returns the inner products
    each computed along the way (``inner_each=False``: after the last operation only, so that
    the operations stay pending until then)."""
    found = []
    with np.errstate(over="ignore", invalid="ignore"):  # (NumPy's side of a program that overflows: see numpys)
        for op, t, o, a in program:
            _apply(op, t, o, a, dats, arrays)
            if inner_each:
                found.append((dats[t].inner(dats[o]), float(np.sum(arrays[t] * arrays[o]))))
        if not inner_each:
            found = [(dats[k].inner(dats[(k + 1) % 3]), float(np.sum(arrays[k] * arrays[(k + 1) % 3])))
                     for k in range(3)]
    return found


def _apply(op, t, o, a, dats, arrays) -> None:
    """One operation of a program, on the dats and on the arrays."""
    x, y, X, Y = dats[t], dats[o], arrays[t], arrays[o]
    if op == "iadd":
        x += y
        X += Y
    elif op == "isub":
        x -= y
        X -= Y
    elif op == "imul":
        x *= y
        X *= Y
    elif op == "idiv":
        x /= a  # by a scalar: no division by a zero entry
        X /= a
    elif op == "iadd_scalar":
        x += a
        X += a
    elif op == "imul_scalar":
        x *= a
        X *= a
    elif op == "axpy":
        x.axpy(a, y)
        X += a * Y
    elif op == "copy":
        x.copy(y)
        Y[...] = X
    elif op == "zero":
        x.zero()
        X[...] = 0
    elif op == "add":
        dats[t] = x + y * a
        arrays[t] = X + Y * a
    elif op == "neg":
        dats[t] = -x
        arrays[t] = -X


def numpys(want):
    """What equals NumPy's ``want`` to 1e-12, NaN too: a program that squares a vector again and
    again overflows to inf and then NaN, in NumPy as here (hypothesis found one)."""
    return pytest.approx(want, rel=1e-12, abs=1e-12, nan_ok=True)


EVERY_OPERATION = [(op, i % 3, (i + 1) % 3, 2.0) for i, op in enumerate(OPS)] + [("iadd", 1, 1, 0), ("axpy", 2, 2, 0.5)]


@settings(max_examples=25, deadline=None)
@given(program=programs, n=st.integers(1, 40), dim=st.integers(1, 3))
def test_random_programs_equal_numpy(program, n, dim):
    check_program(program, n, dim, "reference")  # no compiling: many programs


@settings(max_examples=25, deadline=None)
@given(program=programs, n=st.integers(1, 40))
def test_programs_left_pending_equal_numpy_and_scalars_are_reused_only_when_free(program, n):
    """The operations stay pending until the inner products at the end, so a scalar operand's
    Global that the session keeps is in use by a pending loop when the next scalar comes (a
    new one is made then); run again with an inner product after each operation, the kept
    ones are reused, and no plan is built the second time through."""
    s = mc.Set(n, "s")
    rng = np.random.default_rng(n)
    arrays = [rng.random((n, 2)) + 0.5 for _ in range(3)]
    dats = [mc.Dat(s, 2, a.copy(), f"v{i}") for i, a in enumerate(arrays)]
    for got, want in run_program(program, dats, arrays, inner_each=False):
        assert got == numpys(want)
    for got, want in run_program(program, dats, arrays):
        assert got == numpys(want)
    mc.stats(reset=True)
    for got, want in run_program(program, dats, arrays):
        assert got == numpys(want)
    if not any(op in ("add", "neg") for op, *_ in program):  # (these make new dats)
        assert mc.stats().caches["plans"].misses == 0
    for dat, array in zip(dats, arrays):
        np.testing.assert_allclose(dat.data_ro, array, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["numba", *DEVICE_BACKENDS])
def test_a_scalar_kept_by_the_session_is_not_changed_under_a_pending_loop(backend):
    """``x *= 2`` left pending, then ``y *= 3``: the second scalar is not the first's Global
    given another value (that would run the first loop at once); both stay pending. Once
    nothing is pending, the kept one is given the next value: the loop made last time is
    recorded again (nothing found by structure, no plan rebound), and runs with the new value
    on a device backend too."""
    mc.configure(backend=backend)
    runtime = mc.get_runtime()
    s = mc.Set(4, "s")
    x, y = mc.Dat(s, 1, np.ones(4), "x"), mc.Dat(s, 1, np.ones(4), "y")
    x *= 2.0
    y *= 3.0
    assert len(runtime.trace) == 2
    assert x.data_ro[:, 0].tolist() == [2.0] * 4 and y.data_ro[:, 0].tolist() == [3.0] * 4
    x *= 5.0
    first = runtime.trace.entries[-1][0]
    mc.flush()
    x *= 7.0
    assert runtime.trace.entries[-1][0] is first
    assert x.data_ro[:, 0].tolist() == [70.0] * 4
    with mc.loop_chain("scaled"):  # inside a chain block: new scalars, nothing forced before the block ends
        x *= 0.5
        x *= 0.5
        assert len(runtime.trace) == 2
    assert x.data_ro[:, 0].tolist() == [17.5] * 4


def test_many_pending_scalars_stay_pending_and_right():
    """With more loops pending than the session looks through, each scalar is a new Global
    (none is refilled, nothing is forced) and the values are those of the operations in order."""
    runtime = mc.get_runtime()
    s = mc.Set(3, "s")
    x = mc.Dat(s, 1, np.ones(3), "x")
    factors = [1.5, 2.0, 0.5, 3.0] * 6
    for factor in factors:
        x *= factor
    assert len(runtime.trace) == len(factors)
    assert x.data_ro[:, 0].tolist() == [float(np.prod(factors))] * 3


def test_a_scalar_made_inside_a_captured_step_is_not_refilled_outside_it():
    """A captured step's ``x *= 3`` reads the scalar it was captured with at every replay,
    whatever scalars the program uses between the replays."""
    s = mc.Set(4, "s")
    x, y = mc.Dat(s, 1, np.ones(4), "x"), mc.Dat(s, 1, np.ones(4), "y")

    @mc.capture
    def triple():
        x.__imul__(3.0)

    expected = 1.0
    for factor in (2.0, 5.0, 0.5):
        triple()
        expected *= 3.0
        y *= factor  # outside the step: a scalar kept by the session
        y.inner(y)
    assert (triple.captures, triple.replays) == (1, 2)
    assert x.data_ro[:, 0].tolist() == [expected] * 4 and y.data_ro[:, 0].tolist() == [5.0] * 4


@pytest.mark.parametrize("backend", ["numba", *DEVICE_BACKENDS])
def test_every_operation_on_the_compiled_backends_equals_numpy(backend):
    check_program(EVERY_OPERATION, 37, 2, backend)


def check_program(program, n: int, dim: int, backend: str) -> None:
    mc.reset_runtime(backend=backend)
    s = mc.Set(n, "s")
    rng = np.random.default_rng(n * 10 + dim)
    arrays = [rng.random((n, dim)) + 0.5 for _ in range(3)]
    dats = [mc.Dat(s, dim, a.copy(), f"v{i}") for i, a in enumerate(arrays)]
    for got, want in run_program(program, dats, arrays):
        assert got == numpys(want)
    for dat, array in zip(dats, arrays):
        np.testing.assert_allclose(dat.data_ro, array, rtol=1e-12, atol=1e-12)
    assert dats[0].norm == numpys(math.sqrt(np.sum(arrays[0] ** 2)))


def test_integer_dats_take_integers_and_refuse_truncation():
    mc.reset_runtime(backend="reference")
    s = mc.Set(4, "s")
    i = mc.Dat(s, 1, [1, 2, 3, 4], "i", dtype=np.int64)
    f = mc.Dat(s, 1, np.ones(4), "f")
    i += 2
    i *= i
    assert i.data_ro[:, 0].tolist() == [9, 16, 25, 36] and i.inner(i) == 81 + 256 + 625 + 1296
    assert isinstance(i.inner(i), int)
    half = i * 0.5  # a new float dat, as NumPy gives
    assert half.dtype == np.float64 and half.data_ro[:, 0].tolist() == [4.5, 8.0, 12.5, 18.0]
    for bad, match in ((lambda: i.__iadd__(f), "would truncate"), (lambda: i.__imul__(0.5), "0.5 is not an integer"),
                       (lambda: i.__itruediv__(2), "would truncate"), (lambda: f.copy(i), "would truncate")):
        with pytest.raises(mc.DataShapeError, match=match):
            bad()
    big = mc.Dat(s, 1, [4_000_000_000, 1, 2, 3], "big", dtype=np.int64)  # its int64 sum of squares wraps
    assert big.norm == np.linalg.norm(big.data_ro[:, 0])  # summed as float64 (math.sqrt raised ValueError)
    u = mc.Dat(s, 1, np.arange(4, dtype=np.uint32), "u")
    w = mc.Dat(s, 1, np.ones(4, dtype=np.uint32), "w")
    assert (u - w).dtype == np.uint32  # a Dat operand: as NumPy
    for bad in (lambda: -u, lambda: u * -1, lambda: u.axpy(-1, w), lambda: i.__imul__(2**70)):
        with pytest.raises(mc.DataShapeError, match=r"Dat '[ui]' holds u?int\d+, which cannot hold a = "):
            bad()  # (they named the session's internal Global 'scalar')


def test_bad_operands_are_refused():
    mc.reset_runtime()
    s, t = mc.Set(3, "s"), mc.Set(3, "t")
    x = mc.Dat(s, 2, None, "x")
    with pytest.raises(mc.SetMismatchError, match="lives on 's' but 'y' on 't'"):
        x += mc.Dat(t, 2, None, "y")
    with pytest.raises(mc.DataShapeError, match="has dim 2 but 'z' has dim 1"):
        x.axpy(1.0, mc.Dat(s, 1, None, "z"))
    with pytest.raises(mc.DataShapeError, match="takes a Dat or a real number"):
        x *= "2"
    with pytest.raises(mc.DataShapeError, match="takes a Dat or a real number"):
        x += True


def test_globals_combine_their_values():
    mc.reset_runtime()
    g, h = mc.Global(2, [1.0, 2.0], "g"), mc.Global(2, [3.0, 4.0], "h")
    g += h
    g *= 2
    g.axpy(0.5, h)
    assert g.value.tolist() == [9.5, 14.0] and g.inner(h) == 9.5 * 3 + 14 * 4
    assert g.norm == pytest.approx(math.hypot(9.5, 14.0))
    g.copy(h)
    h.zero()
    assert h.value.tolist() == [0.0, 0.0]
    with pytest.raises(mc.DataShapeError, match="has dim 2 but 'k' has dim 1"):
        g += mc.Global(1, 1.0, "k")
    total = g + 2 * g - g / 2  # new Globals, as for dats (a plain TypeError before)
    assert isinstance(total, mc.Global) and total.value.tolist() == [9.5 * 2.5, 14.0 * 2.5] and g.value[0] == 9.5
    assert (-g).value.tolist() == [-9.5, -14.0]
    counts = mc.Global(1, 3, "counts", dtype=np.int64)
    assert (counts + 1).dtype == np.int64 and (counts / 2).dtype == np.float64  # NumPy's dtypes
    with pytest.raises(mc.DataShapeError, match="has dim 2 but 'k' has dim 1"):
        g + mc.Global(1, 1.0, "k")


@pytest.mark.mpi(nprocs=(2, 3), timeout=240)
@pytest.mark.parametrize("ca", [None, True])
def test_programs_on_ranks_equal_numpy_and_chains_too(comm, ca):
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(9, 7)
    d = mesh.declare()
    rng = np.random.default_rng(3)
    arrays = [rng.random((mesh.ncell, 2)) + 0.5 for _ in range(3)]
    dats = [mc.Dat(d.cells, 2, a.copy(), f"v{i}") for i, a in enumerate(arrays)]
    mc.partition("rib", coords=d.coords)
    program = [("iadd", 0, 1, 0), ("axpy", 1, 2, -1.5), ("imul_scalar", 2, 0, 2.0), ("copy", 0, 2, 0),
               ("isub", 1, 0, 0), ("imul", 0, 1, 0), ("add", 2, 1, 0.5)]
    if ca is None:
        found = run_program(program, dats, arrays)
    else:
        with mc.loop_chain("arithmetic", ca=ca):  # the inner products force each step: chains of one segment
            found = run_program(program, dats, arrays)
    for got, want in found:
        assert got == pytest.approx(want, rel=1e-12)
    assert len(set(comm.allgather(found[-1][0]))) == 1  # the same value on every rank
    for dat, array in zip(dats, arrays):
        gathered = dat.gather()
        if comm.rank == 0:
            np.testing.assert_allclose(gathered, array, rtol=1e-12)
