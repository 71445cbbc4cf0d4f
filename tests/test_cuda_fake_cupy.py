"""``backend="cupy"`` without a GPU: :class:`~meshchain.backends.cuda.device.CupyDevice`'s
own code (asynchronous launches timed by events, the copy stream, pinned staging, the
halo exchanges on ranks) runs against a NumPy stand-in for CuPy (``fake_cupy.py``) whose
kernels are the generated source in the host emulation, and must match the reference."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import meshchain as mc
from meshchain.meshes import naca0012

import fake_cupy
from chain_programs import programs
from test_airfoil import final_state
from test_backends_property import loop_specs, run_on
from test_cuda_mpi import everywhere, run_program, self_comm

pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++"),
              pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")]


@pytest.fixture
def fake_gpu(monkeypatch, meshchain_cache_dir):
    fake_cupy.install(monkeypatch, meshchain_cache_dir)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(spec=loop_specs())
def test_the_cupy_device_runs_random_loops_like_the_reference(fake_gpu, spec):
    mc.configure(gpu_threads=32)
    for want, got in zip(run_on("reference", spec), run_on("cupy", spec), strict=True):
        np.testing.assert_array_equal(got, want, strict=True)  # dtypes too


@pytest.mark.parametrize("increments", ["atomic", "colour"])
def test_the_cupy_device_runs_airfoil_and_times_launches_by_events(fake_gpu, increments):
    mesh = naca0012(8, 12)
    rms_ref, q_ref = final_state("reference", mesh, 6)
    mc.configure(gpu_threads=32, gpu_increments=increments)
    rms, q = final_state("cupy", mesh, 6)
    np.testing.assert_allclose(rms, rms_ref, rtol=1e-12, atol=0)
    np.testing.assert_allclose(q, q_ref, rtol=1e-12, atol=1e-15)
    device = mc.get_runtime().backend.device
    assert device._timings, "launches are timed asynchronously, accounted when stats are read"
    loops = mc.stats().loops
    assert not device._timings
    assert all(loops[name].time_compute > 0 for name in ("adt_calc", "res_calc", "update"))


@pytest.mark.mpi(nprocs=(2,), timeout=300)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=4))
def test_the_cupy_device_exchanges_halos_on_ranks(comm, spec, meshchain_cache_dir, monkeypatch):
    fake_cupy.install(monkeypatch, meshchain_cache_dir)
    reference = run_program(spec, self_comm(), None, meshchain_cache_dir, "reference")
    reference.run(None)
    serial = reference.results()
    results = []
    for mode in (None, True):
        program = run_program(spec, comm, mode, meshchain_cache_dir, "cupy")
        program.run(mode)
        results.append(program.results())
    assert everywhere(comm, all(g is None or np.array_equal(g, w)
                                for got in results for g, w in zip(got, serial))), (results, serial)


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_direct_halos_need_a_cuda_aware_mpi(comm, meshchain_cache_dir, monkeypatch):
    fake_cupy.install(monkeypatch, meshchain_cache_dir)
    mc.reset_runtime(comm=comm, backend="cupy", cache_dir=meshchain_cache_dir)
    with pytest.raises(mc.ConfigurationError, match="gpu_halos='direct' needs a CUDA-aware MPI"):
        mc.configure(gpu_halos="direct")
    assert mc.get_runtime().config.gpu_halos == "auto"
