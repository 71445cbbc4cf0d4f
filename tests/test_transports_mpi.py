"""Halo-exchange transports through the whole library: every transport gives the bits of
``"p2p"`` on random meshes, loops and chains (1-4 ranks); an applied calibration takes the calibrated
fastest; ``mc.stats()`` names the transport; bad choices are refused on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
import meshchain.comm.transports as transports
from meshchain.comm.transports import TRANSPORTS

from chain_programs import Program, programs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::meshchain.MeshchainWarning")


def run_with(comm, spec, transport, mode):
    mc.reset_runtime(comm=comm)
    mc.configure(transport=transport)
    program = Program(spec)
    program.run(mode, executions=2)
    return program.results(), mc.stats()


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5), mode=st.sampled_from([None, True, False]))
def test_every_transport_gives_the_bits_of_p2p(comm, spec, mode):
    reference, _ = run_with(comm, spec, "p2p", mode)
    for transport in TRANSPORTS[1:]:
        results, stats = run_with(comm, spec, transport, mode)
        if comm.size > 1:
            assert stats.transport == transport
        if comm.rank == 0:
            for got, want in zip(results, reference):
                np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_an_applied_calibration_switches_to_the_transport_it_measured_fastest(comm, tmp_path_factory):
    cache = tmp_path_factory.mktemp(f"calibration{comm.rank}")
    mc.reset_runtime(comm=comm, cache_dir=str(cache))
    measured = mc.model.calibrate(save=False, repeats=3, sizes=(8, 4096))
    assert mc.get_runtime().config.transport == "auto" and measured.applied == {}
    calibration = mc.model.apply(measured)
    assert calibration.applied["transport"] == ("persistent", measured.transport)
    assert mc.get_runtime().config.transport == measured.transport
    assert f"applied transport {measured.transport} (was persistent)" in calibration.describe()
    assert set(calibration.transport_times) == set(transports.available_transports(comm))
    assert calibration.transport == min(calibration.transport_times, key=calibration.transport_times.get)
    spec = (("quads", 4, 4), (("cells", (("na", mc.INC, "cell2node", 0),)),
                              ("cells", (("na", mc.READ, "cell2node", 1), ("ca", mc.RW, None, None)))))
    program = Program(spec)
    program.run(None, executions=2)  # the second loop reads what the first incremented: an exchange
    assert sum(loop.exchanges for loop in mc.stats().loops.values()) > 0
    assert mc.stats().transport == calibration.transport
    assert comm.allgather(mc.stats().transport) == [calibration.transport] * comm.size


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_transport_and_progress_are_agreed_at_partition_and_read_without_mpi(comm, monkeypatch):
    """One broadcast at mc.partition agrees on both; reading them afterwards calls no MPI
    (before, the first plan's build broadcast each, from a property getter)."""
    mc.reset_runtime(comm=comm, transport="auto", progress="auto")
    session = mc.get_runtime()
    assert session.communication.reported("transport") == "auto (chosen when the mesh is partitioned)"
    Program((("quads", 4, 4), (("cells", (("ca", mc.RW, None, None),)),)))  # declares and partitions
    chosen = (session.transport, session.progress)
    assert chosen[0] in TRANSPORTS and comm.allgather(chosen) == [chosen] * comm.size

    class NoMPI:
        def __getattr__(self, name):
            raise AssertionError(f"an MPI call ({name}) while reading the communication settings")

    monkeypatch.setattr(session, "comm", NoMPI())
    assert (session.transport, session.progress) == chosen
    assert session.communication.reported("progress") == chosen[1]


@pytest.mark.mpi(nprocs=(1, 2, 3), timeout=120)
def test_unknown_transport_is_refused_on_every_rank_and_nothing_changes(comm):
    mc.reset_runtime(comm=comm)
    mc.configure(transport="p2p")
    with pytest.raises(mc.ConfigurationError, match="carrier pigeon"):
        mc.configure(transport="carrier pigeon")
    assert mc.get_runtime().config.transport == "p2p"


@pytest.mark.mpi(nprocs=(2,), timeout=120)
@pytest.mark.parametrize("missing", ["neighbour", "rma"])
def test_a_transport_this_mpi_lacks_is_refused_on_every_rank(comm, missing, monkeypatch):
    real = transports._missing
    monkeypatch.setattr(transports, "_missing",
                        lambda name, mpi, comm=None: "a feature this test takes away" if name == missing
                        else real(name, mpi, comm))
    mc.reset_runtime(comm=comm)
    mc.configure(transport="persistent")
    with pytest.raises(mc.ConfigurationError, match="a feature this test takes away"):
        mc.configure(transport=missing)
    assert mc.get_runtime().config.transport == "persistent"
    assert comm.allgather("refused") == ["refused"] * comm.size  # every rank got here: no hang


def test_cupy_backend_refuses_host_transports():
    with pytest.raises(mc.ConfigurationError, match="p2p"):
        mc.configure(backend="cuda-emulation", transport="rma")
    assert mc.get_runtime().config.backend != "cuda-emulation"
