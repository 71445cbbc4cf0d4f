"""The CUDA backend on several ranks, in the host emulation and, where a GPU is present, on
it (the ranks share it): halos are packed and unpacked on the device and cross to the
host as one staged copy each way per exchange (never a whole-dat copy), loop by loop and
in communication-avoiding chains, with the same results as the reference on one rank; or
are handed to MPI on the device (``gpu_halos="direct"``, where the MPI library is
CUDA-aware or the device is the emulation)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import meshchain as mc
from meshchain.backends.cuda.device import EmulatedDevice
from meshchain.backends.cuda.halo import DeviceExchange, halo_mode
from meshchain.meshes import naca0012

from chain_programs import Program, programs
from devices import DEVICE_BACKENDS, device_class, needs_a_device, needs_gxx

pytestmark = [needs_a_device,
              pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")]


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


class Staging:
    """Counts, on this rank, whole-dat downloads, staged copies each way, and the runs of
    device exchanges with the number of dats in each."""

    def __init__(self, monkeypatch, device=EmulatedDevice):
        self.downloads = self.copies_out = self.copies_in = 0
        self.exchanged = []  # dats per exchange
        for name, field in (("download", "downloads"), ("copy_out", "copies_out"), ("copy_in", "copies_in")):
            monkeypatch.setattr(device, name, self._counted(getattr(device, name), field))
        begin = DeviceExchange.begin  # exchanges are planned once and run again: count the runs

        def counted_exchange(exchange, *args, **kwargs):
            begin(exchange, *args, **kwargs)
            self.exchanged.append(len(exchange.items))
        monkeypatch.setattr(DeviceExchange, "begin", counted_exchange)

    def _counted(self, method, field):
        def wrapper(device, *args):
            setattr(self, field, getattr(self, field) + 1)
            return method(device, *args)
        return wrapper


def everywhere(comm, flag: bool) -> bool:
    from mpi4py import MPI

    return bool(comm.allreduce(int(flag), op=MPI.MIN))


def run_program(spec, comm, mode, cache_dir, backend, **options):
    mc.reset_runtime(comm=comm, backend=backend, gpu_threads=32, cache_dir=cache_dir, **options)
    program = Program(spec)
    program.run(mode)
    return program


def sent_bytes(stats) -> int:
    return sum(s.bytes_sent for s in stats.loops.values()) + sum(c.bytes_sent for c in stats.chains.values())


def halo_settings(backend) -> tuple:
    """``gpu_halos`` settings to run: "direct" too where MPI takes the device's buffers (the
    emulated device's are host memory)."""
    from meshchain.backends.cuda.halo import mpi_is_cuda_aware

    return ("auto", "direct") if backend == "cuda-emulation" or mpi_is_cuda_aware() else ("auto", "staged")


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
@pytest.mark.parametrize("backend", DEVICE_BACKENDS)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5))
def test_device_chains_on_ranks_equal_the_serial_reference(comm, backend, spec, meshchain_cache_dir, monkeypatch):
    reference = run_program(spec, self_comm(), None, meshchain_cache_dir, "reference")
    reference.run(None)  # as often as the runs below
    serial = reference.results()
    outcomes = []
    first, second = halo_settings(backend)
    for mode, halos in ((None, first), (True, first), (True, second)):
        program = run_program(spec, comm, mode, meshchain_cache_dir, backend, gpu_halos=halos)
        staged = halo_mode(halos, mc.get_runtime().backend.device)
        mc.stats(reset=True)
        staging = Staging(monkeypatch, device_class(backend))
        program.run(mode)  # a second time, counted: data already on the device
        sent = sent_bytes(mc.stats())
        downloads = staging.downloads  # before results(), which downloads
        got = program.results()
        equal = all(g is None or np.array_equal(g, w) for g, w in zip(got, serial))
        # one copy out and one copy in at most per exchange, whatever its dats; none when direct
        copies_fit = (staging.copies_out <= len(staging.exchanged) and staging.copies_in <= len(staging.exchanged)
                      and (staging.copies_out > 0) == (staged and sent > 0))
        outcomes.append((mode, halos, equal, downloads, copies_fit, staging.copies_out, staging.exchanged))
        monkeypatch.undo()
    assert everywhere(comm, all(o[2] for o in outcomes)), outcomes
    assert everywhere(comm, all(o[3] == 0 for o in outcomes)), outcomes
    assert everywhere(comm, all(o[4] for o in outcomes)), outcomes


@pytest.mark.mpi(nprocs=(2,), timeout=300)
@pytest.mark.parametrize("device", DEVICE_BACKENDS)
@pytest.mark.parametrize("increments", ["atomic", "colour"])
def test_device_airfoil_chained_stages_on_two_ranks(comm, meshchain_cache_dir, device, increments, monkeypatch):
    from test_airfoil import airfoil

    histories = []
    for communicator, backend, ca in ((self_comm(), "reference", None), (comm, device, True)):
        mc.reset_runtime(comm=communicator, backend=backend, gpu_threads=32, cache_dir=meshchain_cache_dir,
                         gpu_halos="staged", gpu_increments=increments)
        problem = airfoil.declare(naca0012(8, 12))
        staging = Staging(monkeypatch, device_class(device))
        histories.append(np.array([rms for _, rms in airfoil.run(problem, 6, report_every=2, out=None, ca=ca)]))
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-12, atol=0)
    assert mc.stats().chains["stage"].mode == "ca"
    # each rank has one neighbour, which it sends to and receives from in every exchange:
    # exactly one staged copy each way per exchange, also for those that carry several dats
    # (the first chain's exchange brings both x and q)
    counts = (staging.copies_out, staging.copies_in, len(staging.exchanged))
    assert everywhere(comm, counts[0] == counts[1] == counts[2] > 0), counts
    assert everywhere(comm, max(staging.exchanged) >= 2), staging.exchanged


@needs_gxx
@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_host_backend_after_the_emulated_gpu_sees_current_values_and_keeps_device_copies_current(
        comm, meshchain_cache_dir, monkeypatch):
    # the last loop leaves "ca" and "na" written on the device, "na" with a stale halo; the
    # reference backend then reads "na" through a map. Its plans bring each dat the device
    # holds newer to the host once, when they are built (never again on later runs), and its
    # host exchange passes the received halo rows on to the device copy, which stays current
    spec = (("quads", 6, 5), (("cells", (("ca", mc.RW, None, None), ("na", mc.READ, "cell2node", None))),
                              ("nodes", (("na", mc.RW, None, None),))))
    reference = run_program(spec, self_comm(), None, meshchain_cache_dir, "reference")
    reference.run(None)
    serial = reference.results()
    program = run_program(spec, comm, None, meshchain_cache_dir, "cuda-emulation")
    counts = {"download": 0, "scatter": 0}
    for name in counts:
        def counted(device, *args, _name=name, _method=getattr(EmulatedDevice, name)):
            counts[_name] += 1
            return _method(device, *args)
        monkeypatch.setattr(EmulatedDevice, name, counted)
    mc.configure(backend="reference")
    program.run(None)
    first = dict(counts)
    got = program.results()
    assert everywhere(comm, all(g is None or np.array_equal(g, w) for g, w in zip(got, serial))), (got, serial)
    assert everywhere(comm, first["download"] == 2), first  # "ca" and "na", whole, once each
    assert everywhere(comm, first["scatter"] > 0), first  # received halo rows reach the device copy
    program.run(None)
    program.results()
    assert everywhere(comm, counts["download"] == first["download"]), counts


@needs_gxx
@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_the_emulation_catches_messages_posted_before_their_staged_copy(comm, meshchain_cache_dir):
    # a mutation of DeviceExchange.post that forgets to wait for the copy to the host: the
    # emulated copy stream holds the copy back, so stale bytes are sent and the halos go wrong
    spec = (("quads", 6, 5), (("nodes", (("na", mc.RW, None, None),)),
                              ("cells", (("ca", mc.RW, None, None), ("na", mc.READ, "cell2node", None)))))
    reference = run_program(spec, self_comm(), None, meshchain_cache_dir, "reference")
    serial = reference.results()
    right = run_program(spec, comm, None, meshchain_cache_dir, "cuda-emulation").results()

    class Hasty(EmulatedDevice):
        def wait(self, event):
            if sys._getframe(1).f_code.co_name != "post":
                super().wait(event)
    mc.reset_runtime(comm=comm, backend="cuda-emulation", gpu_threads=32, cache_dir=meshchain_cache_dir)
    mc.get_runtime().backend.device.__class__ = Hasty
    program = Program(spec)
    program.run(None)
    wrong = program.results()
    same = lambda got: all(g is None or np.array_equal(g, w) for g, w in zip(got, serial))  # noqa: E731
    assert everywhere(comm, same(right)), (right, serial)
    assert not everywhere(comm, same(wrong)), "a missing wait went unnoticed"


@needs_gxx
@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_calibration_that_chose_polling_runs_device_exchanges_without_a_poller(comm, meshchain_cache_dir,
                                                                              tmp_path_factory):
    # host exchanges were measured fastest with a polling thread; device exchanges have no
    # poller protocol (a poller once raised AttributeError inside the communication and
    # aborted the job): applied, the calibration switches the host backend to polling and
    # leaves the device backend's mode as it was (and says so); an explicit "poll" is refused
    import dataclasses

    cache = comm.bcast(str(tmp_path_factory.mktemp("polling")) if comm.rank == 0 else None)
    mc.reset_runtime(comm=comm, cache_dir=cache)
    polling = dataclasses.replace(mc.model.calibrate(save=False, repeats=1, sizes=(8, 64)), progress="poll")
    spec = (("quads", 6, 5), (("nodes", (("na", mc.RW, None, None),)),
                              ("cells", (("ca", mc.RW, None, None), ("na", mc.READ, "cell2node", None)))))
    serial = run_program(spec, self_comm(), None, meshchain_cache_dir, "reference").results()
    mc.reset_runtime(comm=comm, backend="numba", cache_dir=cache)
    assert mc.model.apply(polling).applied["progress"] == ("none", "poll")
    Program(spec).run(None)
    assert mc.stats().progress == "poll"  # the host backend takes the applied calibration's choice
    mc.reset_runtime(comm=comm, backend="cuda-emulation", gpu_threads=32, cache_dir=cache)
    assert mc.model.apply(polling).applied["progress"] == ("none", "none")
    program = Program(spec)
    program.run(None)
    assert mc.stats().progress == "none"
    got = program.results()
    assert everywhere(comm, all(g is None or np.array_equal(g, w) for g, w in zip(got, serial))), (got, serial)
    with pytest.raises(mc.ConfigurationError, match="progress mode 'poll' is not available"):
        mc.configure(progress="poll")
    assert mc.get_runtime().config.progress == "none"  # refused: the session keeps its (applied) options
