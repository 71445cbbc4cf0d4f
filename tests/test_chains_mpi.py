"""Loop chains on several ranks: communication-avoiding == per-loop == serial, and one
grouped message per neighbour per chain (run by the MPI harness)."""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
import meshchain.comm.exchange as halo_exchange
from meshchain.comm.exchange import GROUPED_TAG
from meshchain.engine import replay
from meshchain.meshes import naca0012, structured_tris

from chain_programs import Program, programs, segments_needed

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::meshchain.MeshchainWarning")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import synthetic_chain  # noqa: E402


START_REQUESTS = halo_exchange.start_requests
# CountingComm sees Isend and starts of persistent sends, so the tests that count messages
# pin a transport that sends that way (an applied calibration may choose neighbour or rma)
COUNTED_TRANSPORT = "persistent"


class CountingComm:
    """A communicator that counts the point-to-point sends started through it, independently
    of meshchain's statistics: every ``Isend``, and every start of a persistent send made by
    its ``Send_init`` (meshchain starts persistent requests in one place,
    ``meshchain.comm.exchange.start_requests``, which is wrapped while the test runs);
    everything else goes to the real communicator."""

    def __init__(self, comm, monkeypatch):
        self._comm = comm
        self.sends: list[tuple[int, int]] = []  # (destination, tag)
        self._persistent: dict = {}  # id(request) -> (request, destination, tag)
        def counted_start(requests):
            for request in requests:
                found = self._persistent.get(id(request))
                if found is not None and found[0] is request:
                    self.sends.append(found[1:])
            START_REQUESTS(requests)

        monkeypatch.setattr(halo_exchange, "start_requests", counted_start)

    def Isend(self, buffer, dest, tag=0):  # noqa: N802 - mpi4py's name
        self.sends.append((dest, tag))
        return self._comm.Isend(buffer, dest=dest, tag=tag)

    def Send_init(self, buffer, dest, tag=0):  # noqa: N802 - mpi4py's name
        request = self._comm.Send_init(buffer, dest=dest, tag=tag)
        self._persistent[id(request)] = (request, dest, tag)
        return request

    def __getattr__(self, name):
        return getattr(self._comm, name)


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def run_program(spec, comm, mode, *, tile_size=None):
    mc.reset_runtime(comm=comm, transport=COUNTED_TRANSPORT)
    program = Program(spec)
    program.run(mode, tile_size=tile_size)
    return program.results(), mc.stats()


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=600)
@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs())
def test_random_chains_ca_equals_per_loop_equals_serial(comm, spec, monkeypatch):
    serial, _ = run_program(spec, self_comm(), True)
    per_loop, _ = run_program(spec, comm, None)
    counting = CountingComm(comm, monkeypatch)
    ca, stats = run_program(spec, counting, True)
    for want, got_loop, got_ca in zip(serial, per_loop, ca):
        if got_ca is not None:  # gathered dats live on rank 0 only
            np.testing.assert_array_equal(got_loop, want)
            np.testing.assert_array_equal(got_ca, want)
    chain = stats.chains["random"]
    assert chain.mode == "ca" and chain.executions == 2
    # direct loops on every kind of set run redundantly in the halo: a split only where a
    # global reduced by one loop is used by a later one
    assert chain.segments == 2 * segments_needed(spec[1]), (chain.segments, chain.diagnostics)
    grouped = collections.Counter(dest for dest, tag in counting.sends if tag == GROUPED_TAG)
    assert all(count <= chain.segments for count in grouped.values()), (grouped, chain.segments)
    assert sum(grouped.values()) == chain.messages


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5))
def test_random_chains_auto_and_off_equal_serial(comm, spec):
    serial, _ = run_program(spec, self_comm(), None)
    for mode in (False, "auto"):
        got, stats = run_program(spec, comm, mode)
        assert stats.chains["random"].mode in ("ca", "per-loop")
        for want, value in zip(serial, got):
            if value is not None:
                np.testing.assert_array_equal(value, want)


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=600)
@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=5), mode=st.sampled_from([None, True, False]), tiled=st.booleans(),
       interior=st.sampled_from(["static", "dynamic"]))
def test_new_objects_each_execution_reuse_the_plans_bit_for_bit_on_ranks(comm, spec, mode, tiled, interior):
    """New dats and globals declared alike before every execution: the bits of the objects
    reused; no plan is built again (a tiled chain's plan cannot take other objects: it is),
    with the interior run as one call or in chunks on threads. The executions captured as a
    step (``mc.capture``) and replayed give the same bits, replayed step by step in Python and
    as one compiled call from the first replay (``engine/replay.py``, where the plan allows)."""
    tile_size = 8 if tiled and mode is True else None
    results = []
    for renew in (False, True):
        mc.reset_runtime(comm=comm, interior=interior)
        program = Program(spec)
        program.run(mode, executions=3, renew=renew, tile_size=tile_size)  # every state of the halos seen
        mc.stats(reset=True)
        program.run(mode, executions=3, renew=renew, tile_size=tile_size)
        plans = mc.stats().caches["plans"]
        if tile_size is None or not renew:
            assert plans.misses == 0 and plans.hits > 0, (renew, plans)
        results.append(program.results())
    for compile_after in (replay.COMPILE_AFTER, 0):  # captured: one capture, five replays, the same bits
        mc.reset_runtime(comm=comm, interior=interior)
        program = Program(spec)
        saved, replay.COMPILE_AFTER = replay.COMPILE_AFTER, compile_after
        try:
            program.run(mode, executions=6, tile_size=tile_size, captured=True)
        finally:
            replay.COMPILE_AFTER = saved
        assert (program.step.captures, program.step.replays) == (1, 5)
        results.append(program.results())
    for other in results[1:]:
        for want, got in zip(results[0], other):
            if got is not None:
                np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_globals_made_per_step_and_read_later_keep_their_own_reductions(comm):
    """A plan bound to a new global while the last one's reduction over ranks is in flight
    (its value not read yet) finishes that reduction first: each global keeps its own sum."""
    mc.reset_runtime(comm=comm)
    d = structured_tris(6, 6).declare()
    x = mc.Dat(d.nodes, 1, np.arange(d.nodes.size, dtype=np.float64), "x")
    mc.partition("kway", seed_set=d.cells)
    total = mc.Kernel.from_source("def total(a, s):\n    s[0] += a[0]\n")
    double = mc.Kernel.from_source("def double(a):\n    a[0] = 2.0 * a[0]\n")
    sums = []
    for step in range(6):
        if step == 2:  # every state of x's halo seen
            mc.stats(reset=True)
        s = mc.Global(1, 0.0, "s")
        mc.par_loop(total, d.nodes, x(mc.READ), s(mc.INC))
        mc.par_loop(double, d.nodes, x(mc.RW))
        mc.flush()
        sums.append(s)
    n = d.nodes.size
    assert mc.stats().caches["plans"].misses == 0  # the plans bound to each new global
    assert [g.value[0] for g in sums] == [n * (n - 1) / 2 * 2**k for k in range(6)]


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_reduction_nobody_read_is_finished_when_the_session_closes(comm):
    """An ``Iallreduce`` still in flight at the end (a global never read) is waited for when the
    plans are released (at exit too): no request outlives the session (MPICH otherwise warns of
    "pending references" to its communicator at MPI_Finalize)."""
    session = mc.reset_runtime(comm=comm)
    d = structured_tris(4, 4).declare()
    x = mc.Dat(d.nodes, 1, np.ones(d.nodes.size), "x")
    mc.partition("kway", seed_set=d.cells)
    s = mc.Global(1, 0.0, "s")
    mc.par_loop(mc.Kernel.from_source("def total(a, s):\n    s[0] += a[0]\n"), d.nodes, x(mc.READ), s(mc.INC))
    mc.flush()
    pending = session.store.get(s).pending
    assert pending is not None and pending.request is not None  # in flight: nobody read s
    session.close()
    assert pending.request is None
    mc.reset_runtime(comm=comm)


def synthetic(comm, nchains, *, ca=True, executions=3, size=(12, 12), tile_size=None):
    mc.reset_runtime(comm=comm, transport=COUNTED_TRANSPORT)
    problem = synthetic_chain.declare(structured_tris(*size), dtype=np.int64)
    synthetic_chain.run(problem, nchains, executions, ca=ca, tile_size=tile_size)
    return problem


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("nchains", [1, 2, 4, 8])
def test_synthetic_chain_sends_one_message_per_neighbour(comm, nchains, monkeypatch):
    counting = CountingComm(comm, monkeypatch)
    problem = synthetic(counting, nchains, executions=1)
    before = mc.stats().chains["synthetic"]
    counting.sends.clear()
    synthetic_chain.run(problem, nchains, 1, ca=True)
    after = mc.stats().chains["synthetic"]
    sends = collections.Counter(dest for dest, _ in counting.sends)
    # pres changed before the chain: one grouped message to every neighbour, nothing else
    assert sends and set(sends.values()) == {1}, sends
    assert {tag for _, tag in counting.sends} == {GROUPED_TAG}
    assert after.messages - before.messages == len(sends)
    assert after.segments - before.segments == 1 and after.depth == 2
    assert not after.diagnostics
    # loop by loop: update exchanges pres once, then every edge_flux exchanges res
    assert after.per_loop_messages - before.per_loop_messages == (nchains + 1) * len(sends)


def vertex_chain(comm, nchains, *, ca=True, executions=3):
    from meshchain.apps import vertex

    mc.reset_runtime(comm=comm, transport=COUNTED_TRANSPORT)
    problem = vertex.declare(structured_tris(12, 12), dtype=np.int64)
    vertex.run(problem, nchains, executions, ca=ca)
    return problem


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("nchains", [1, 2, 4])
def test_vertex_centred_chain_is_one_segment_with_one_message_per_neighbour(comm, nchains, monkeypatch):
    """Edge fluxes incremented into the nodes, then a direct update of the nodes, k times: the
    node updates run redundantly on the nodes' halo, so the chain needs ONE grouped message
    per neighbour, k layers deep, where loop by loop exchanges before every flux."""
    from meshchain.apps import vertex

    counting = CountingComm(comm, monkeypatch)
    problem = vertex_chain(counting, nchains, executions=1)
    before = mc.stats().chains["vertex"]
    counting.sends.clear()
    vertex.run(problem, nchains, 1, ca=True)
    after = mc.stats().chains["vertex"]
    sends = collections.Counter(dest for dest, _ in counting.sends)
    assert sends and set(sends.values()) == {1}, sends
    assert {tag for _, tag in counting.sends} == {GROUPED_TAG}
    assert after.messages - before.messages == len(sends)
    assert after.segments - before.segments == 1 and after.depth == nchains
    assert not after.diagnostics
    per_loop = after.per_loop_messages - before.per_loop_messages  # every flux exchanges u
    assert per_loop > 0 and per_loop % nchains == 0
    got = vertex.checksum(problem)  # 2 executions
    expected = vertex.checksum(vertex_chain(self_comm(), nchains, ca=None, executions=2))
    assert got == (expected if comm.rank == 0 else None)


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
def test_synthetic_chain_matches_serial_in_every_mode(comm):
    expected = synthetic(self_comm(), 4, ca=None)
    want = [expected.res.gather(), expected.flux.gather()]
    for ca in (None, False, True, "auto"):
        problem = synthetic(comm, 4, ca=ca)
        got = [problem.res.gather(), problem.flux.gather()]
        if comm.rank == 0:
            for w, g in zip(want, got):
                np.testing.assert_array_equal(g, w)


def airfoil_history(comm, iters, ca, tile_size=None):
    from test_airfoil import airfoil

    mc.reset_runtime(comm=comm)
    problem = airfoil.declare(naca0012(10, 15))
    history = airfoil.run(problem, iters, report_every=5, out=None, ca=ca, tile_size=tile_size)
    return np.array([rms for _, rms in history]), mc.stats()


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
def test_airfoil_with_chained_stages_prints_the_same_rms(comm):
    serial, _ = airfoil_history(self_comm(), 30, None)
    chained, stats = airfoil_history(comm, 30, True)
    np.testing.assert_allclose(chained, serial, rtol=1e-12, atol=0)
    stage = stats.chains["stage"]
    assert stage.executions == 60 and stage.mode == "ca"
    assert stage.exchanges <= stage.per_loop_exchanges


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_chains_from_a_configuration_file(comm, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"chains{comm.rank}") / "chains.toml"
    path.write_text('[[chain]]\nname = "configured"\nloops = ["update", "edge_flux"]\nrepeat = 3\nmax_halo = 4\n')
    expected = synthetic(self_comm(), 3, ca=None)
    want = expected.flux.gather()
    mc.reset_runtime(comm=comm, chains=path)
    problem = synthetic_chain.declare(structured_tris(12, 12), dtype=np.int64)
    synthetic_chain.run(problem, 3, 3, ca=None)  # the science code has no loop_chain block
    got = problem.flux.gather()
    stats = mc.stats().chains["configured"]
    assert stats.executions == 3 and stats.loops == 18 and stats.segments == 3
    if comm.rank == 0:
        np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_max_halo_one_splits_the_chain_and_says_why(comm):
    expected = synthetic(self_comm(), 2, ca=None, executions=1)
    want = expected.flux.gather()
    mc.reset_runtime(comm=comm)
    problem = synthetic_chain.declare(structured_tris(12, 12), dtype=np.int64)
    mc.par_loop(synthetic_chain.advance, problem.nodes, problem.pres(mc.RW))
    with pytest.warns(mc.MeshchainWarning, match=r"\[chain-") if comm.rank == 0 else _nothing():
        with mc.loop_chain("limited", ca=True, max_halo=1):
            synthetic_chain.record(problem, 2)
    got = problem.flux.gather()
    stats = mc.stats().chains["limited"]
    assert stats.segments > 1 and stats.depth <= 1
    assert any("allowed: 1" in d for d in stats.diagnostics), stats.diagnostics
    if comm.rank == 0:
        np.testing.assert_array_equal(got, want)


class _nothing:  # noqa: N801
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- sparse tiling composed with the communication-avoiding executor ---------------------------


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=6), tile_size=st.integers(1, 200))
def test_random_tiled_chains_equal_serial(comm, spec, tile_size):
    serial, _ = run_program(spec, self_comm(), None)
    tiled, stats = run_program(spec, comm, True, tile_size=tile_size)
    for want, got in zip(serial, tiled):
        if got is not None:
            np.testing.assert_array_equal(got, want)
    chain = stats.chains["random"]
    # a rank may own none of a small set's elements, so count tiled groups over all ranks
    assert chain.mode == "ca" and comm.allreduce(chain.tiled_groups) >= 1


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("tile_size", [1, 24, 10**6])
def test_tiled_synthetic_chain_sends_what_untiled_sends_and_matches_serial(comm, tile_size):
    want = synthetic(self_comm(), 3, ca=None).flux.gather()
    synthetic(comm, 3)
    untiled_messages = mc.stats().chains["synthetic"].messages
    problem = synthetic(comm, 3, tile_size=tile_size)
    chain = mc.stats().chains["synthetic"]
    got = problem.flux.gather()
    assert chain.messages == untiled_messages and chain.tiled_groups >= 3  # a core and a rest phase per step
    assert chain.tile_inspections <= chain.tiled_groups // 3 + 1
    if comm.rank == 0:
        np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_tiled_airfoil_stages_on_ranks_give_the_serial_rms(comm):
    serial, _ = airfoil_history(self_comm(), 20, None)
    tiled, stats = airfoil_history(comm, 20, True, tile_size=48)
    np.testing.assert_allclose(tiled, serial, rtol=1e-12, atol=0)
    assert stats.chains["stage"].tiled_groups > 0


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_chain_run_loop_by_loop_refuses_tiling_and_says_why(comm):
    want = synthetic(self_comm(), 2, ca=None).flux.gather()
    with pytest.warns(mc.MeshchainWarning, match=r"\[tiling-refused\]") if comm.rank == 0 else _nothing():
        problem = synthetic(comm, 2, ca=False, tile_size=16)
    chain = mc.stats().chains["synthetic"]
    assert chain.mode == "per-loop" and chain.tiled_groups == 0
    assert any("[tiling-refused]" in d and "loop by loop" in d for d in chain.diagnostics)
    got = problem.flux.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(got, want)


# --- core ranges when no owned row reaches the halo ------------------------------------------


def edges_only_vertex_chain(comm, nchains, *, ca=True, executions=2):
    """The vertex-centred chain on a mesh declared as nodes, edges and ``e2n`` only, the edges
    partitioned (METIS, fixed seed) and every node owned by the lowest rank among the owners
    of the edges that reach it. Rank 0 then owns every node its own edges touch: no owned
    edge reaches its halo, and only other ranks' edges, run in its exec halo, reach its nodes."""
    from meshchain.apps import vertex

    mc.reset_runtime(comm=comm)
    mesh = structured_tris(12, 12)
    rng = np.random.default_rng(0)
    nodes, edges = mc.Set(mesh.nnode, "nodes"), mc.Set(mesh.nfacet, "edges")
    problem = vertex.VertexChain(
        nodes=nodes, edges=edges, e2n=mc.Map(edges, nodes, 2, mesh.facets, "e2n"),
        w=mc.Dat(edges, 1, rng.integers(-2, 3, size=(mesh.nfacet, 1)), "w", dtype=np.int64),
        u=mc.Dat(nodes, 2, rng.integers(-3, 4, size=(mesh.nnode, 2)), "u", dtype=np.int64),
        res=mc.Dat(nodes, 2, None, "res", dtype=np.int64),
        acc=mc.Dat(nodes, 1, None, "acc", dtype=np.int64))
    mc.partition("kway", seed_set=edges)
    vertex.run(problem, nchains, executions, ca=ca)
    return problem


def assert_levels_step_by_one(problem):
    """What the core ranges rely on: an owned edge is at most one level farther from the
    partition boundary than the nearest of its nodes (halo nodes are at level 0)."""
    from meshchain.partition.layout import MAX_LEVEL

    session = mc.get_runtime()
    nodes, edges = session.layout_of(problem.nodes), session.layout_of(problem.edges)
    node_level = np.zeros(len(nodes.global_ids), dtype=np.int64)
    node_level[: nodes.n_owned] = nodes.levels
    nearest = node_level[np.asarray(problem.e2n.values[: edges.n_owned], dtype=np.int64)].min(axis=1)
    cap = MAX_LEVEL + 1  # levels past MAX_LEVEL are all "interior"
    far = np.flatnonzero(np.minimum(edges.levels, cap) > np.minimum(nearest + 1, cap))
    assert not far.size, (f"rank {session.rank}: owned edges {edges.global_ids[far][:8].tolist()} at levels "
                          f"{edges.levels[far][:8].tolist()}, nearest node levels {nearest[far][:8].tolist()}")


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("nchains", [2, 3])
def test_chain_core_waits_for_nodes_the_exec_halo_writes_when_no_owned_edge_reaches_the_halo(comm, nchains):
    """Regression: halo levels stopped at level 1 when no owned row reached a halo element, so
    every owned edge stayed "interior", though the nodes that other ranks' edges (run in the
    exec halo) increment are at level 1. A chain's later flux then ran in the core, while the
    grouped exchange was in flight, on nodes the earlier node update only reaches after it."""
    from meshchain.apps import vertex

    expected = vertex.checksum(edges_only_vertex_chain(self_comm(), nchains, ca=None))
    problem = edges_only_vertex_chain(comm, nchains)
    session = mc.get_runtime()
    owned_nodes, owned_edges = session.layout_of(problem.nodes).n_owned, session.layout_of(problem.edges).n_owned
    reach = np.asarray(problem.e2n.values[:owned_edges])
    assert comm.allgather(bool((reach < owned_nodes).all()))[0]  # the case: rank 0's edges reach no halo node
    chain = mc.stats().chains["vertex"]
    assert chain.mode == "ca" and chain.depth == nchains
    assert vertex.checksum(problem) == (expected if comm.rank == 0 else None)
    assert_levels_step_by_one(problem)


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@pytest.mark.parametrize("kind, n", [("tris", 12), ("quads", 4), ("quads", 7)])
def test_vertex_chain_right_when_unused_maps_are_collected_before_its_halo_is_deepened(comm, kind, n):
    """Regression (the case first seen: a CA vertex chain wrong in a later session of a
    process, depending on when the garbage collector ran). The app declares the whole mesh
    but keeps only the nodes, edges and ``e2n``; the other maps are garbage once collected
    (a map and its indices form a cycle). Collected before the chain first runs, the deeper
    halo the chain needs is built from ``e2n`` alone: its layout has no owned edge next to
    the halo on rank 0, and (quads) some halo nodes of the first layout are no longer
    imported, so their rows must not be moved into the new one."""
    import gc

    from meshchain.apps import vertex
    from meshchain.meshes import structured_quads

    def mesh():
        return (structured_tris if kind == "tris" else structured_quads)(n, n)

    mc.reset_runtime(comm=self_comm())
    serial = vertex.declare(mesh(), dtype=np.int64)
    vertex.run(serial, 2, 2, ca=None)
    expected = vertex.checksum(serial)
    mc.reset_runtime(comm=comm, transport=COUNTED_TRANSPORT)
    problem = vertex.declare(mesh(), dtype=np.int64)
    gc.collect()  # on every rank: the cell and boundary-facet maps go now
    vertex.run(problem, 2, 2, ca=True)
    assert set(mc.get_runtime().layout.maps) == {problem.e2n.uid}  # deepened without them
    assert vertex.checksum(problem) == (expected if comm.rank == 0 else None)
    assert_levels_step_by_one(problem)
