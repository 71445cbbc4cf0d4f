"""The CUDA backend: its generated source runs in the host emulation
(``backend="cuda-emulation"``), and on a GPU through CuPy where one is present
(``backend="cupy"``, the tests parametrised over :data:`devices.DEVICE_BACKENDS`), and must
match the reference backend; the same source must compile with nvcc; kernels outside the
translatable subset are refused clearly."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends.cuda.codegen import loop_source
from meshchain.backends.cuda.device import EmulatedDevice
from meshchain.backends.cuda.emulation import host_fuses
from meshchain.ir.loop import make_loop
from meshchain.meshes import naca0012

from chain_programs import Program, programs
from devices import DEVICE_BACKENDS, EMULATION, GPU, device_class, needs_a_device, needs_gxx
from test_airfoil import final_state
from test_backends_property import build, kernel_source, loop_specs, run_on

ROOT = Path(__file__).resolve().parents[1]
THREADS = st.sampled_from([1, 2, 32, 128])
INCREMENTS = st.sampled_from(["atomic", "colour"])
pytestmark = needs_a_device


# --- the emulation against the reference --------------------------------------------------------


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=loop_specs(), threads=THREADS, increments=INCREMENTS)
def test_device_matches_reference_on_random_loops(backend, spec, threads, increments):
    """Every argument kind, access mode, dtype and dim; small integer data, so bit-exact."""
    assert_device_gives_the_bits_of(backend, "reference", spec, threads, increments)


def assert_device_gives_the_bits_of(backend, host: str, spec, threads, increments) -> None:
    """``spec`` run on the device ``backend`` gives the bits (and dtypes) of the ``host`` backend."""
    mc.configure(gpu_threads=threads, gpu_increments=increments)
    expected = run_on(host, spec)
    actual = run_on(backend, spec)
    for want, got in zip(expected, actual):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@st.composite
def unsigned_loop_specs(draw, extremes=False):
    """:func:`loop_specs` on uint32 and uint64 data (the small values wrap to the top of the
    range when negative), with the global MIN and MAX turned into INC unless ``extremes``:
    ``min(uint, int)`` is a float in Numba, and a negative float stored into an unsigned value
    is undefined (compiling them is defined)."""
    n_iter, targets, maps, args = draw(loop_specs())
    dtypes = st.sampled_from([np.uint32, np.uint64])
    args = [dict(a, dtype=draw(dtypes), mode=mc.INC if a["mode"] in (mc.MIN, mc.MAX) and not extremes else a["mode"])
            for a in args]
    return n_iter, targets, maps, args


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=unsigned_loop_specs(), threads=THREADS, increments=INCREMENTS)
def test_device_matches_numba_on_random_loops_over_unsigned_data(backend, spec, threads, increments):
    """Unsigned reads, arithmetic (int64, as Numba types it), wrapping stores and increments
    (the reference backend's NumPy scalars refuse to wrap, so Numba is the host here)."""
    assert all(np.dtype(a["dtype"]).kind == "u" for a in spec[3])
    assert_device_gives_the_bits_of(backend, "numba", spec, threads, increments)


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("increments", ["atomic", "colour"])
def test_device_runs_airfoil_like_the_reference(backend, increments):
    mesh = naca0012(8, 12)
    rms_ref, q_ref = final_state("reference", mesh, 10)
    mc.configure(gpu_threads=32, gpu_increments=increments)
    rms, q = final_state(backend, mesh, 10)
    np.testing.assert_allclose(rms, rms_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(q, q_ref, rtol=1e-12, atol=1e-15)
    assert not np.allclose(q, q[0]), "the flow must have changed"


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=programs(max_loops=5), tile_size=st.sampled_from([None, 7]), threads=THREADS)
def test_device_chains_and_tiles_match_the_reference(backend, spec, tile_size, threads):
    mc.configure(backend="reference")
    reference = Program(spec)
    reference.run(None)
    expected = reference.results()
    mc.configure(backend=backend, gpu_threads=threads)
    program = Program(spec)
    program.run(True, tile_size=tile_size)
    for want, got in zip(expected, program.results()):
        np.testing.assert_array_equal(got, want)


# --- host/device synchronisation -------------------------------------------------------------


class Transfers:
    """Counts whole-array copies between host and device."""

    def __init__(self, monkeypatch, device=EmulatedDevice):
        self.up = self.down = 0
        upload, download, refresh = device.upload, device.download, device.refresh

        def counted(method, field):
            def wrapper(device, *args):
                setattr(self, field, getattr(self, field) + 1)
                return method(device, *args)
            return wrapper

        monkeypatch.setattr(device, "upload", counted(upload, "up"))
        monkeypatch.setattr(device, "refresh", counted(refresh, "up"))
        monkeypatch.setattr(device, "download", counted(download, "down"))


@mc.kernel
def scale_into(a, b):
    b[0] = 2.0 * a[0] + b[0]


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_dats_stay_on_the_device_until_the_host_reads_them(backend, monkeypatch):
    mc.configure(backend=backend, gpu_threads=32)
    cells = mc.Set(10, "cells")
    a = mc.Dat(cells, 1, np.arange(10.0), "a")
    b = mc.Dat(cells, 1, None, "b")
    transfers = Transfers(monkeypatch, device_class(backend))
    for _ in range(5):
        mc.par_loop(scale_into, cells, a(mc.READ), b(mc.RW))
    mc.flush()
    uploads = transfers.up
    assert transfers.down == 0 and uploads <= 3  # a, b and the empty element list: once each
    assert mc.get_runtime().storage(b).device.state == "device"
    np.testing.assert_array_equal(b.data_ro[:, 0], 10.0 * np.arange(10.0))
    assert transfers.down == 1 and mc.get_runtime().storage(b).device.state == "both"  # read-only: the device copy stays valid
    mc.par_loop(scale_into, cells, a(mc.READ), b(mc.RW))
    mc.flush()
    assert transfers.up == uploads
    b.data[:] = 1.0  # handed out for writing: the device copy is stale
    assert mc.get_runtime().storage(b).device.state == "host"
    mc.par_loop(scale_into, cells, a(mc.READ), b(mc.RW))
    np.testing.assert_array_equal(b.data[:, 0], 1.0 + 2.0 * np.arange(10.0))
    assert transfers.up == uploads + 1


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_switching_back_to_numba_sees_the_device_results(backend):
    mc.configure(backend=backend, gpu_threads=32)
    cells = mc.Set(6, "cells")
    a, b = mc.Dat(cells, 1, np.ones(6), "a"), mc.Dat(cells, 1, None, "b")
    mc.par_loop(scale_into, cells, a(mc.READ), b(mc.RW))
    mc.configure(backend="numba")
    mc.par_loop(scale_into, cells, a(mc.READ), b(mc.RW))
    np.testing.assert_array_equal(b.data[:, 0], 4.0)


@mc.kernel
def multiply_add(a, b, c, y):
    y[0] = a[0] * b[0] + c[0]


def rounded_once(a, b, c) -> np.ndarray:
    """``a * b + c`` rounded once, as a fused multiply-add gives it (from exact rationals)."""
    return np.array([float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)])


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
def test_the_device_fuses_multiplies_and_adds_only_with_fp_contract(backend):
    """By default the device rounds the product and the sum apart, as the CPU backends do (NVRTC
    would fuse them); with ``fp_contract=True`` the GPU fuses them, and so does the emulation
    where the processor can (x86-64 with FMA: ``-mfma``)."""
    rng = np.random.default_rng(5)
    a, b, c = rng.random(2000), rng.random(2000), -rng.random(2000)
    apart, once = a * b + c, rounded_once(a, b, c)
    assert not np.array_equal(apart, once)  # data on which fusing shows
    for contract in (False, True):
        mc.configure(backend=backend, fp_contract=contract)
        cells = mc.Set(a.size, "cells")
        dats = [mc.Dat(cells, 1, values, name) for values, name in ((a, "a"), (b, "b"), (c, "c"))]
        y = mc.Dat(cells, 1, None, "y")
        mc.par_loop(multiply_add, cells, *(d(mc.READ) for d in dats), y(mc.WRITE))
        got = y.data_ro[:, 0]
        if not contract:
            np.testing.assert_array_equal(got, apart)
        elif backend == "cupy" or host_fuses():
            np.testing.assert_array_equal(got, once)
        else:  # no instruction to fuse with: either rounding is allowed
            assert np.all((got == apart) | (got == once))


# --- the translator ------------------------------------------------------------------------------

SCALE = 0.5
WEIGHTS = (1.0, -2.0, 3.0)
TABLE = np.array([[1, 2], [3, 4]], dtype=np.int64)


def helper_norm(v, k):
    s = 0.0
    for i in range(len(v)):
        s += v[i] * v[i]
    return math.sqrt(s) + k


def helper_store(v, x):
    v[0] = x


@mc.kernel
def everything(x, cell, total, low):
    """Every construct of the subset, on whole-map, direct and global views."""
    t = np.zeros((2, 3))
    acc = 0
    for r in range(2):
        for k in range(3):
            t[r, k] = x[r, k % 2] * WEIGHTS[k]
    for i in range(5, 0, -2):
        acc += i
    n = 0
    while True:
        n += 1
        if n > 3:
            break
        if n == 2:
            continue
        acc -= n
    value = t[1][2] - t[-1, 0] if acc > 0 else -1.0
    q = int(cell[0]) // 3 + int(cell[0]) % 3 - (-7) // 2 + (-7) % 3 + 2 ** 3
    f = cell[0] // 0.75 + cell[0] % 0.75 + cell[0] ** 0.5
    value += min(q, f, 4.0) + max(abs(-q), 1) + float(TABLE[1, 0]) * SCALE + round(f)
    value += math.exp(-abs(f)) + np.sin(f) + math.floor(f) + np.floor(f) + math.atan2(f, 1.0) + math.pi
    value += helper_norm(t[0], 1.0) if 0 < f <= 10 and not f > 9 else 0.0
    cell[1] = value
    helper_store(t[1], 7.0)
    cell[2] = t[1, 0] + len(x) + x.shape[1] + (1 if f > 1 or q < 0 else 0)
    total[0] += value
    low[0] = min(low[0], value)


@pytest.mark.parametrize("device", DEVICE_BACKENDS)
def test_translated_constructs_compute_what_python_computes(device):
    rng = np.random.default_rng(3)
    results = {}
    for backend in ("reference", device):
        mc.reset_runtime(backend=backend, gpu_threads=32, cache_dir=mc.get_runtime().config.cache_dir)
        nodes, cells = mc.Set(9, "nodes"), mc.Set(7, "cells")
        c2n = mc.Map(cells, nodes, 2, np.random.default_rng(1).integers(0, 9, (7, 2)), "c2n")
        x = mc.Dat(nodes, 2, rng.uniform(0.1, 3, (9, 2)) if backend == "reference" else results["x"], "x")
        cell = mc.Dat(cells, 3, np.tile(np.arange(1.0, 8.0)[:, None], (1, 3)), "cell")
        total, low = mc.Global(1, 0.0, "total"), mc.Global(1, 1e9, "low")
        mc.par_loop(everything, cells, x(mc.READ, c2n), cell(mc.RW), total(mc.INC), low(mc.MIN))
        results.setdefault("x", x.data.copy())
        results[backend] = (cell.data.copy(), total.value, low.value)
    for want, got in zip(results["reference"], results[device]):
        np.testing.assert_allclose(got, want, rtol=1e-13)


UNSUPPORTED = {
    "print(a[0])": "print()",
    "b[0] = a[0].real": "the attribute",
    "b[0] = [1.0, 2.0][0]": "the expression",
    "b[0] = a[0:1][0]": "slice",
    "b[0] = float('1.5')": "the constant '1.5'",
    "for v in a:\n        b[0] += v": "iterating over",
    "for i in range(0, 3, int(a[0])):\n        b[0] += i": "range step",
    "t = np.zeros(int(a[0]))\n    b[0] = t[0]": "array allocation",
    "c = a\n    b[0] = c[0]": "using the array 'a' as a value",
    "b[0] = a.sum()": "the call",
    "assert a[0] > 0\n    b[0] = 1.0": "assert statement",
    "t = np.zeros(2)\n    b[0] = t[5]": "index 5 is outside",
    "b[0] = {1: 2.0}[1]": "the expression",
    "b[0] = a[0] or 1.0": "'and'/'or' on numbers used as a value",
}


@needs_gxx
@pytest.mark.parametrize("body", sorted(UNSUPPORTED))
def test_constructs_outside_the_subset_are_refused_with_kernel_line_and_construct(body):
    source = f"def odd(a, b):\n    {body}\n"
    kernel = mc.Kernel.from_source(source, namespace={"np": np})
    mc.configure(backend=EMULATION)
    cells = mc.Set(3, "cells")
    a, b = mc.Dat(cells, 1, None, "a"), mc.Dat(cells, 1, None, "b")
    with pytest.raises(mc.MeshchainError) as error:
        mc.par_loop(kernel, cells, a(mc.READ), b(mc.WRITE))
        mc.flush()
    message = str(error.value)
    line = 3 if body.startswith("t = np.zeros(2)") else 2  # where the construct is
    assert "'odd'" in message and f":{line}:" in message and UNSUPPORTED[body] in message, message


@needs_gxx
def test_writing_a_read_argument_through_a_helper_is_an_access_mode_error():
    kernel = mc.Kernel.from_source("def bad(a, b):\n    helper_store(a, 1.0)\n    b[0] = 2.0\n",
                                   namespace={"helper_store": helper_store})
    mc.configure(backend=EMULATION)
    cells = mc.Set(3, "cells")
    a, b = mc.Dat(cells, 1, None, "a"), mc.Dat(cells, 1, None, "b")
    with pytest.raises(mc.AccessModeError, match="'v', an argument declared READ"):
        mc.par_loop(kernel, cells, a(mc.READ), b(mc.WRITE))
        mc.flush()


# --- nvcc: the generated source is valid CUDA ---------------------------------------------------


def _nvcc(tmp_path, text: str, name: str) -> None:
    path = tmp_path / f"{name}.cu"
    path.write_text(text)
    done = subprocess.run(["nvcc", "-arch=sm_80", "--std=c++17", "-cubin", "-o", str(path.with_suffix(".cubin")),
                           str(path)], capture_output=True, text=True)
    assert done.returncode == 0, f"nvcc failed on {path}:\n{done.stderr[-3000:]}"


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=st.one_of(loop_specs(), unsigned_loop_specs(extremes=True)), threads=THREADS, increments=INCREMENTS)
def test_random_loops_compile_with_nvcc(tmp_path, spec, threads, increments):
    iterset, args, _ = build(spec)
    loop = make_loop(mc.Kernel.from_source(kernel_source(args)), iterset, tuple(args))
    _nvcc(tmp_path, loop_source(loop, threads=threads, colour=increments == "colour").text, "random")


@needs_nvcc
def test_airfoil_and_the_construct_kernel_compile_with_nvcc(tmp_path):
    from meshchain.apps import airfoil

    problem = airfoil.declare(naca0012(4, 6))
    loops = []
    mc.get_runtime().trace.take()
    airfoil.record_stage(problem)
    loops = [loop for loop, _ in mc.get_runtime().trace.take()]
    nodes, cells = mc.Set(4, "nodes"), mc.Set(3, "cells")
    c2n = mc.Map(cells, nodes, 2, [[0, 1], [1, 2], [2, 3]], "c2n")
    x, cell = mc.Dat(nodes, 2, None, "x"), mc.Dat(cells, 3, None, "cell")
    total, low = mc.Global(1, 0.0, "total"), mc.Global(1, 0.0, "low")
    loops.append(make_loop(everything, cells, (x(mc.READ, c2n), cell(mc.RW), total(mc.INC), low(mc.MIN))))
    assert {loop.kernel.name for loop in loops} >= {"adt_calc", "res_calc", "bres_calc", "update", "everything"}
    for position, loop in enumerate(loops):
        for colour in (False, True):
            _nvcc(tmp_path, loop_source(loop, threads=256, colour=colour).text, f"{loop.kernel.name}_{colour}")


# --- configuration and the examples ---------------------------------------------------------------


def test_gpu_options_are_validated():
    with pytest.raises(mc.ConfigurationError, match="power of two"):
        mc.configure(gpu_threads=96)
    with pytest.raises(mc.ConfigurationError, match="gpu_increments"):
        mc.configure(gpu_increments="locks")


@pytest.mark.skipif(GPU, reason="a GPU is present")
def test_cupy_without_a_gpu_is_a_clear_error_and_keeps_the_old_backend():
    mc.configure(backend="numba")
    with pytest.raises(mc.BackendUnavailableError, match="backend='numba'"):
        mc.configure(backend="cupy")
    assert mc.get_runtime().config.backend == "numba"


@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@pytest.mark.parametrize("script, arguments", [
    ("airfoil.py", ["--size", "6", "8", "--iters", "2"]),
    ("synthetic_chain.py", ["--size", "6", "6", "--iters", "2", "--nchains", "2"]),
])
def test_examples_run_on_the_device(backend, script, arguments, meshchain_cache_dir):
    env = {"MESHCHAIN_CACHE_DIR": meshchain_cache_dir, "MESHCHAIN_GPU_THREADS": "32", "PATH": "/usr/bin:/bin"}
    if backend == "cupy":  # CuPy finds the CUDA toolkit through the environment
        env = {**os.environ, **env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *arguments, "--backend", backend],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
