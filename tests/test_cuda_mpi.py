"""The CUDA backend on several ranks, in the host emulation: halos are gathered and
scattered on the "device" (never a whole-dat copy to the host), loop by loop and in
communication-avoiding chains, with the same results as the reference on one rank."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import meshchain as mc
from meshchain.backends.cuda.device import EmulatedDevice
from meshchain.meshes import naca0012

from chain_programs import Program, programs

pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++"),
              pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")]


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


class Staging:
    """Counts, on this rank, whole-dat downloads and halo row gathers/scatters."""

    def __init__(self, monkeypatch):
        self.downloads = self.gathers = self.scatters = 0
        for name, field in (("download", "downloads"), ("gather", "gathers"), ("scatter", "scatters")):
            monkeypatch.setattr(EmulatedDevice, name, self._counted(getattr(EmulatedDevice, name), field))

    def _counted(self, method, field):
        def wrapper(device, *args):
            setattr(self, field, getattr(self, field) + 1)
            return method(device, *args)
        return wrapper


def everywhere(comm, flag: bool) -> bool:
    from mpi4py import MPI

    return bool(comm.allreduce(int(flag), op=MPI.MIN))


def run_program(spec, comm, mode, cache_dir, backend):
    mc.reset_runtime(comm=comm, backend=backend, gpu_threads=32, cache_dir=cache_dir)
    program = Program(spec)
    program.run(mode)
    return program


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5))
def test_emulated_gpu_chains_on_ranks_equal_the_serial_reference(comm, spec, meshchain_cache_dir, monkeypatch):
    reference = run_program(spec, self_comm(), None, meshchain_cache_dir, "reference")
    reference.run(None)  # as often as the runs below
    serial = reference.results()
    outcomes = []
    for mode in (None, True):
        program = run_program(spec, comm, mode, meshchain_cache_dir, "cuda-emulation")
        staging = Staging(monkeypatch)
        program.run(mode)  # a second time, counted: data already on the device
        downloads = staging.downloads
        got = program.results()
        equal = all(g is None or np.array_equal(g, w) for g, w in zip(got, serial))
        outcomes.append((equal, downloads == 0, staging.gathers, staging.scatters))
        monkeypatch.undo()
    assert everywhere(comm, all(equal for equal, *_ in outcomes)), outcomes
    assert everywhere(comm, all(no_download for _, no_download, *_ in outcomes)), outcomes
    moved = comm.allreduce(sum(g + s for *_, g, s in outcomes))
    exchanges = comm.allreduce(mc.stats().chains["random"].exchanges if "random" in mc.stats().chains else 0)
    assert moved > 0 or exchanges == 0, outcomes


@pytest.mark.mpi(nprocs=(2,), timeout=300)
@pytest.mark.parametrize("increments", ["atomic", "colour"])
def test_emulated_gpu_airfoil_chained_stages_on_two_ranks(comm, meshchain_cache_dir, increments):
    from test_airfoil import airfoil

    histories = []
    for communicator, backend, ca in ((self_comm(), "reference", None), (comm, "cuda-emulation", True)):
        mc.reset_runtime(comm=communicator, backend=backend, gpu_threads=32, cache_dir=meshchain_cache_dir,
                         gpu_increments=increments)
        problem = airfoil.declare(naca0012(8, 12))
        histories.append(np.array([rms for _, rms in airfoil.run(problem, 6, report_every=2, out=None, ca=ca)]))
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-12, atol=0)
    assert mc.stats().chains["stage"].mode == "ca"
