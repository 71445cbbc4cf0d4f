"""Distributed execution: N ranks give the serial answer (run by the MPI harness).

Each test runs on every rank under ``mpiexec -n N``. Serial references are computed in
the same processes with a runtime on ``COMM_SELF``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.meshes import naca0012, structured_quads

from helpers import equal_on_rank_0, host_rows, layout_of
from test_backends_property import build, kernel_source, loop_specs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


def declare_quads(nx, ny, *, method="rib", depth=1, partition=True):
    mesh = structured_quads(nx, ny)
    d = mesh.declare()
    if partition:
        mc.partition(method, coords=d.coords, depth=depth)
    return mesh, d


def owned_global_ids(s):
    layout = layout_of(s)
    return np.arange(s.size) if layout is None else layout.global_ids[: layout.n_owned]


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
@pytest.mark.parametrize("method", ["block", "rib", "kway"])
def test_every_element_owned_exactly_once(comm, method):
    _, d = declare_quads(9, 7, method=method)
    for s in (d.nodes, d.cells, d.facets, d.bfacets):
        owned = np.concatenate(comm.allgather(owned_global_ids(s)))
        assert np.array_equal(np.sort(owned), np.arange(s.size)), s.name


def brute_force_layers(mesh_maps, owned, depth):
    """Data and exec layers by plain set arithmetic over the global maps (DESIGN §3 with OP2's
    exec / non-exec split): a row reaching data of layer < k runs at layer k; the targets of
    the rows run at layer k (at k = 1 also of the owned rows) are data of layer k. A set no
    map starts from (only direct loops run over it) runs every element from its data layer."""
    data = {s: {int(e): 0 for e in ids} for s, ids in owned.items()}
    execs = {s: {int(e): 0 for e in ids} for s, ids in owned.items()}
    for k in range(1, depth + 1):
        before = {s: set(layer) for s, layer in data.items()}
        run_here = {s: set(execs[s]) if k == 1 else set() for s in owned}
        for source, target, rows in mesh_maps:
            for e, row in enumerate(rows):
                if e not in execs[source] and any(int(t) in before[target] for t in row):
                    execs[source][e] = k
                    data[source].setdefault(e, k)
                    run_here[source].add(e)
        for source, target, rows in mesh_maps:
            for e in run_here[source]:
                for t in rows[e]:
                    data[target].setdefault(int(t), k)
    sources = {source for source, _, _ in mesh_maps}
    for s in owned:
        if s not in sources:
            execs[s] = dict(data[s])
    return data, execs


def assert_layers_match(sets, mesh_maps, depth):
    want_data, want_exec = brute_force_layers(mesh_maps, {s: owned_global_ids(s) for s in sets}, depth)
    for s in sets:
        layout = layout_of(s)
        got_data = dict(zip(layout.global_ids.tolist(), layout.data_layers.tolist()))
        got_exec = {g: e for g, e in zip(layout.global_ids.tolist(), layout.exec_layers.tolist()) if e <= depth}
        assert got_data == want_data[s], s.name
        assert got_exec == want_exec[s], s.name
        run = layout.exec_layers[layout.n_owned:]
        assert np.all(np.diff(run) >= 0), "the exec halo must be ordered by exec layer (prefixes)"
        assert np.all(np.diff(layout.levels) <= 0), "owned elements must be sorted by decreasing level"


def mesh_maps_of(mesh, d):
    rows = {
        d.cell2node: mesh.cells, d.facet2node: mesh.facets, d.facet2cell: mesh.facet_cells,
        d.bfacet2node: mesh.boundary_facets, d.bfacet2cell: mesh.boundary_facet_cells.reshape(-1, 1),
    }
    return [(m.source, m.target, r) for m, r in rows.items()]


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=120)
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_halo_layers_equal_brute_force_search(comm, depth):
    mesh, d = declare_quads(7, 6, method="rib", depth=depth)
    assert_layers_match((d.nodes, d.cells, d.facets, d.bfacets), mesh_maps_of(mesh, d), depth)


@pytest.mark.mpi(nprocs=(4,), timeout=120)
def test_a_map_from_a_set_to_itself_keeps_halos_small(comm):
    """One-hop layers: a cells -> cells neighbour map adds neighbours, not the whole mesh."""
    mesh = structured_quads(40, 40)
    d = mesh.declare()
    right = np.minimum(np.arange(mesh.ncell) + 1, mesh.ncell - 1).reshape(-1, 1)
    c2c = mc.Map(d.cells, d.cells, 1, right, "c2c")
    mc.partition("rib", coords=d.coords)
    layout = layout_of(d.cells)
    assert len(layout.global_ids) - layout.n_owned < 0.5 * layout.n_owned, (layout.n_owned, len(layout.global_ids))
    maps = mesh_maps_of(mesh, d) + [(d.cells, d.cells, right)]
    assert_layers_match((d.nodes, d.cells, d.facets, d.bfacets), maps, 1)
    v = mc.Dat(d.cells, 1, np.arange(mesh.ncell), "v", dtype=np.int64)
    acc = mc.Dat(d.cells, 1, None, "acc", dtype=np.int64)

    @mc.kernel
    def spread(a, b, c):
        b[0] += a[0]
        c[0] += 2 * a[0]

    mc.par_loop(spread, d.cells, v(mc.READ), acc(mc.INC), acc(mc.INC, c2c[0]))
    got = acc.gather()
    if comm.rank == 0:
        expected = np.arange(mesh.ncell).astype(np.int64)
        np.add.at(expected, right[:, 0], 2 * np.arange(mesh.ncell))
        np.testing.assert_array_equal(got[:, 0], expected)


def run_random_loop(spec, comm, method):
    mc.reset_runtime(comm=comm)
    iterset, loop_args, objects = build(spec)
    mc.partition(method, seed_set=iterset)
    kernel = mc.Kernel.from_source(kernel_source(loop_args))
    for _ in range(2):
        mc.par_loop(kernel, iterset, *loop_args)
    return [o.value if o.is_global else o.gather() for o in objects]


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=loop_specs(), method=st.sampled_from(["block", "kway"]))
def test_random_loops_match_serial_bit_for_bit(comm, spec, method):
    expected = run_random_loop(spec, self_comm(), method)
    actual = run_random_loop(spec, comm, method)
    # gathered dats live on rank 0; a mismatch fails every rank, so hypothesis shrinks in step
    pairs = [(want, got) for want, got in zip(expected, actual) if got is not None]
    equal_on_rank_0(comm, pairs, f"{spec!r}, {method}")


@st.composite
def quad_meshes_and_chains(draw):
    nx, ny = draw(st.integers(2, 9)), draw(st.integers(2, 9))
    steps = draw(st.lists(st.sampled_from(["flux", "bump", "nodal", "total"]), min_size=1, max_size=6))
    return nx, ny, steps


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=quad_meshes_and_chains(), method=st.sampled_from(["rib", "kway", "block"]))
def test_loop_sequences_on_meshes_match_serial(comm, case, method):
    """Sequences of loops (halo validity carried across loops) on real meshes."""
    expected = run_sequence(case, self_comm(), method)
    actual = run_sequence(case, comm, method)
    for want, got in zip(expected, actual):
        if got is not None:
            np.testing.assert_array_equal(got, want)


@mc.kernel
def facet_flux(v1, v2, a1, a2):
    d = v2[0] - v1[0]
    a1[0] += 3 * d + 1
    a2[0] -= d


@mc.kernel
def bump_cells(a, v):
    v[0] = v[0] + a[0] % 5


@mc.kernel
def nodal(vs, n):
    for i in range(4):
        n[i, 0] += vs[0] + i


@mc.kernel
def total_square(a, t, lo, hi):
    t[0] += a[0] * a[0]
    lo[0] = min(lo[0], a[0])
    hi[0] = max(hi[0], a[0])


def run_sequence(case, comm, method):
    nx, ny, steps = case
    mc.reset_runtime(comm=comm)
    mesh = structured_quads(nx, ny)
    d = mesh.declare()
    v = mc.Dat(d.cells, 1, np.arange(mesh.ncell) % 7, "v", dtype=np.int64)
    acc = mc.Dat(d.cells, 1, None, "acc", dtype=np.int64)
    n = mc.Dat(d.nodes, 1, None, "n", dtype=np.int64)
    t, lo, hi = (mc.Global(1, 0, name, dtype=np.int64) for name in ("t", "lo", "hi"))
    mc.partition(method, coords=d.coords)
    for step in steps:
        if step == "flux":
            mc.par_loop(facet_flux, d.facets, v(mc.READ, d.facet2cell[0]), v(mc.READ, d.facet2cell[1]),
                        acc(mc.INC, d.facet2cell[0]), acc(mc.INC, d.facet2cell[1]))
        elif step == "bump":
            mc.par_loop(bump_cells, d.cells, acc(mc.READ), v(mc.RW))
        elif step == "nodal":
            mc.par_loop(nodal, d.cells, v(mc.READ), n(mc.INC, d.cell2node))
        else:
            mc.par_loop(total_square, d.cells, acc(mc.READ), t(mc.INC), lo(mc.MIN), hi(mc.MAX))
    return [v.gather(), acc.gather(), n.gather(), t.value, lo.value, hi.value]


def airfoil_history(comm, iters):
    from test_airfoil import airfoil

    mc.reset_runtime(comm=comm)
    problem = airfoil.declare(naca0012(10, 15))
    return np.array([rms for _, rms in airfoil.run(problem, iters, report_every=5, out=None)])


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=300)
def test_airfoil_matches_serial_rms(comm):
    serial = airfoil_history(self_comm(), 40)
    distributed = airfoil_history(comm, 40)
    np.testing.assert_allclose(distributed, serial, rtol=1e-12, atol=0)
    assert np.all(np.isclose(np.array(comm.allgather(distributed[-1])), distributed[-1], rtol=0, atol=0))


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
@pytest.mark.parametrize("mode", ["every_rank", "root_only", "block"])
def test_input_modes_agree(comm, mode):
    mesh = structured_quads(6, 5)
    values = np.arange(mesh.ncell, dtype=np.float64) * 1.5
    if mode == "every_rank":
        given_values = values
    elif mode == "root_only":
        given_values = values if comm.rank == 0 else None
    else:
        chunks = np.array_split(values, comm.size)
        given_values = mc.Block(chunks[comm.rank])
    d = mesh.declare()
    q = mc.Dat(d.cells, 1, given_values, "q")
    mc.partition("rib", coords=d.coords)
    layout = layout_of(d.cells)
    np.testing.assert_array_equal(q.data[:, 0], values[layout.global_ids[: layout.n_owned]])
    gathered = q.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[:, 0], values)


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
@pytest.mark.parametrize("mode", ["every_rank", "root_only", "block"])
def test_input_modes_agree_after_partitioning(comm, mode, monkeypatch):
    """A dat declared on a partitioned mesh gets its owned and halo rows from any input mode;
    given the whole array on every rank, each rank takes its rows from it, with no messages."""
    from meshchain.engine import declare

    fetched = []
    fetch_rows = declare.fetch_rows
    monkeypatch.setattr(declare, "fetch_rows", lambda *a: fetched.append(1) or fetch_rows(*a))
    mesh = structured_quads(7, 5)
    values = np.arange(2 * mesh.ncell, dtype=np.float64).reshape(-1, 2) * 1.5
    field = np.arange(24.0).reshape(6, 4)
    d, grid = mesh.declare(), mc.Grid((6, 4), "g")
    mc.partition("rib", coords=d.coords)  # the grid in blocks
    given = {"every_rank": (values, field), "root_only": (values, field) if comm.rank == 0 else (None, None),
             "block": (mc.Block(np.array_split(values, comm.size)[comm.rank]),
                       mc.Block(np.array_split(field.reshape(-1, 1), comm.size)[comm.rank]))}[mode]
    q, u = mc.Dat(d.cells, 2, given[0], "q"), mc.Dat(grid, 1, given[1], "u")
    np.testing.assert_array_equal(host_rows(q), values[layout_of(d.cells).global_ids])  # halos included
    np.testing.assert_array_equal(host_rows(u)[:, 0], field.ravel()[layout_of(grid).global_ids])
    gathered = q.gather(), u.gather()
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[0], values)
        np.testing.assert_array_equal(gathered[1][:, 0], field.ravel())
    assert len(fetched) == (0 if mode == "every_rank" else 2)
    if mode == "every_rank":
        with pytest.raises(mc.DataShapeError, match=r"expected \(35, 2\)"):  # the whole array checked, every rank
            mc.Dat(d.cells, 2, values[:, :1].copy(), "bad")


@pytest.mark.mpi(nprocs=(2, 4), timeout=120)
def test_each_rank_keeps_only_its_part_after_rib(comm):
    """rank 0 passes the mesh, the others None: after partitioning nobody holds all of it."""
    mesh = structured_quads(40, 40)
    root = comm.rank == 0
    nodes, cells = mc.Set(mesh.nnode, "nodes"), mc.Set(mesh.ncell, "cells")
    c2n = mc.Map(cells, nodes, 4, mesh.cells if root else None, "c2n")
    x = mc.Dat(nodes, 2, mesh.coords if root else None, "x")
    q = mc.Dat(cells, 1, np.ones(mesh.ncell) if root else None, "q")
    mc.partition("rib", coords=x)
    for s, arrays in ((nodes, [host_rows(x)]), (cells, [host_rows(q), c2n.values])):
        local = len(layout_of(s).global_ids)
        assert local < 0.75 * s.size, (s.name, local, s.size)
        assert all(len(a) == local for a in arrays)
    assert sum(comm.allgather(cells.n_owned)) == cells.size


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_writing_data_invalidates_halos(comm):
    """Owned values changed by the user reach the neighbours' halos before the next loop."""
    def run(c):
        mc.reset_runtime(comm=c)
        mesh, d = declare_quads(5, 4, partition=False)
        v = mc.Dat(d.cells, 1, np.arange(mesh.ncell), "v", dtype=np.int64)
        acc = mc.Dat(d.cells, 1, None, "acc", dtype=np.int64)
        mc.partition("rib", coords=d.coords)
        layout = layout_of(d.cells)
        owned = layout.global_ids[: layout.n_owned] if layout is not None else np.arange(mesh.ncell)
        v.data[:, 0] = owned * owned  # written through .data: halo copies are stale now
        mc.par_loop(facet_flux, d.facets, v(mc.READ, d.facet2cell[0]), v(mc.READ, d.facet2cell[1]),
                    acc(mc.INC, d.facet2cell[0]), acc(mc.INC, d.facet2cell[1]))
        return acc.gather()

    expected, actual = run(self_comm()), run(comm)
    if comm.rank == 0:
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_exchange_statistics(comm):
    _, d = declare_quads(8, 8, partition=False)
    v = mc.Dat(d.cells, 1, None, "v")
    acc = mc.Dat(d.cells, 1, None, "acc")
    mc.partition("rib", coords=d.coords)
    mc.par_loop(bump_cells, d.cells, acc(mc.READ), v(mc.RW))  # v's halo is now stale
    mc.par_loop(facet_flux, d.facets, v(mc.READ, d.facet2cell[0]), v(mc.READ, d.facet2cell[1]),
                acc(mc.INC, d.facet2cell[0]), acc(mc.INC, d.facet2cell[1]))
    flux = mc.stats().loops["facet_flux"]
    assert flux.exchanges == 1
    assert flux.messages == len([n for n in layout_of(d.cells).neighbours if layout_of(d.cells).exports.get(n)])
    assert flux.bytes_sent == 8 * sum(len(np.concatenate(x)) for x in layout_of(d.cells).exports.values())
    assert flux.core_iterations + flux.halo_iterations <= flux.iterations
    layout = layout_of(d.facets)
    assert flux.halo_iterations_by_layer == [layout.exec_ends[1] - layout.exec_ends[0]]
    assert mc.stats().loops["bump_cells"].exchanges == 0
    combined = mc.stats(all_ranks=True)
    total = combined.loops["facet_flux"]
    assert total.messages == sum(comm.allgather(flux.messages))
    assert total.halo_iterations_by_layer == [sum(comm.allgather(flux.halo_iterations_by_layer[0]))]
    mine = mc.stats().caches["plans"]
    assert combined.caches["plans"].misses == sum(comm.allgather(mine.misses)) > 0
    assert combined.caches["plans"].hits == sum(comm.allgather(mine.hits))


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_arrays_that_differ_between_ranks_are_refused_on_every_rank(comm):
    nodes = mc.Set(4, "nodes")
    with pytest.raises(mc.DataShapeError, match="differs between ranks"):
        mc.Dat(nodes, 1, np.full(4, float(comm.rank)), "x")


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_the_same_array_on_every_rank_is_agreed_in_one_allreduce_and_differences_refused(comm, monkeypatch):
    """A dat given the same whole array on every rank, before and after partitioning, is
    agreed by one small Allreduce (no gathered descriptions, no second agreement) and holds
    the rows the long way gives; the same array under another name or dtype on one rank
    goes the long way and is refused on every rank."""
    from meshchain.engine import declare

    calls = []
    for name in ("values_if_different", "block_rows_or_whole", "check_agreement"):
        original = getattr(declare, name)
        monkeypatch.setattr(declare, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    mesh = structured_quads(7, 5)
    values = np.arange(2 * mesh.ncell, dtype=np.float64).reshape(-1, 2) * 1.5
    _, d = declare_quads(7, 5, partition=False)
    calls.clear()
    before = mc.Dat(d.cells, 2, values, "before")
    assert calls == ["values_if_different"]
    mc.partition("rib", coords=d.coords)
    calls.clear()
    after = mc.Dat(d.cells, 2, values, "after")
    assert calls == ["values_if_different"]
    for q in (before, after):
        np.testing.assert_array_equal(host_rows(q)[:layout_of(d.cells).n_owned],
                                      values[layout_of(d.cells).global_ids[:layout_of(d.cells).n_owned]])
    np.testing.assert_array_equal(host_rows(after), values[layout_of(d.cells).global_ids])  # halos included
    with pytest.raises(mc.DataShapeError, match="differs between ranks"):
        mc.Dat(d.cells, 2, values, f"named{comm.rank}")
    with pytest.raises(mc.DataShapeError, match="differs between ranks"):
        mc.Dat(d.cells, 2, values, "typed", dtype=np.float32 if comm.rank == 1 else np.float64)
    last = mc.Dat(d.cells, 2, values, "last")  # the ranks still declare in step; the refused ones count for none
    assert mc.get_runtime().store.get(last).tag == mc.get_runtime().store.get(after).tag + 1


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_dats_declared_without_data_are_zeros_and_refuse_differences_on_every_rank(comm):
    """A temporary (no data on any rank) is zeros with the halo valid; one rank's bad dtype,
    or a name differing between ranks, raises on every rank; data on rank 0 only still works."""
    _, d = declare_quads(6, 5, partition=False)
    before = mc.Dat(d.cells, 2, None, "before", dtype=np.float32)
    assert host_rows(before).shape[1] == 2 and not host_rows(before).any()
    mc.partition("rib", coords=d.coords)
    storage = mc.get_runtime().store.get
    t = mc.Dat(d.cells, 3, None, "t", dtype=np.int32)
    assert storage(t).host.dtype == np.int32 and storage(t).host.shape == (len(layout_of(d.cells).global_ids), 3)
    assert not storage(t).host.any() and storage(t).valid_depth == storage(before).valid_depth
    with pytest.raises(mc.DataShapeError, match="is not a NumPy dtype|not supported"):
        mc.Dat(d.cells, 1, None, "bad", dtype="not a dtype" if comm.rank == 1 else np.float64)
    with pytest.raises(mc.DataShapeError, match="differs between ranks"):
        mc.Dat(d.cells, 1, None, f"named{comm.rank}")
    rooted = mc.Dat(d.cells, 1, np.arange(float(d.cells.size)) if comm.rank == 0 else None, "rooted")
    np.testing.assert_array_equal(host_rows(rooted)[:layout_of(d.cells).n_owned, 0],
                                  layout_of(d.cells).global_ids[:layout_of(d.cells).n_owned])
    after = mc.Dat(d.cells, 1, None, "after")  # the ranks still declare in step
    assert storage(after).tag == storage(rooted).tag + 1
    for _ in range(5000):  # a temporary per step: the record of declarations stays short, the tags in step
        last = mc.Dat(d.cells, 1, None, "temporary")
    assert storage(last).tag == storage(after).tag + 5000
    assert len(mc.get_runtime().mesh.declarations._declared) <= 4096


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_par_loop_before_partition_is_refused(comm):
    _, d = declare_quads(3, 3, partition=False)
    a, v = mc.Dat(d.cells, 1, None, "a"), mc.Dat(d.cells, 1, None, "v")
    with pytest.raises(mc.LoopError, match="not partitioned; call mc.partition"):
        mc.par_loop(bump_cells, d.cells, a(mc.READ), v(mc.RW))


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_depth_beyond_what_can_be_built_is_refused(comm):
    _, d = declare_quads(3, 3, partition=False)
    with pytest.raises(mc.ConfigurationError, match="depth must be an integer in"):
        mc.partition("rib", coords=d.coords, depth=99)
    mc.partition("rib", coords=d.coords, depth=2)
    with pytest.raises(mc.DeclarationError, match="already called"):
        mc.partition("rib", coords=d.coords)


@pytest.mark.mpi(nprocs=(2, 3), timeout=180)
def test_deeper_halos_built_on_demand_keep_values_and_results(comm):
    """Layers added after partitioning equal the brute-force layers, dats keep their values,
    and loops still give the serial answer."""

    def run(c, extend):
        mc.reset_runtime(comm=c)
        mesh, d = declare_quads(7, 6, partition=False)
        v = mc.Dat(d.cells, 1, np.arange(mesh.ncell) % 5, "v", dtype=np.int64)
        acc = mc.Dat(d.cells, 1, None, "acc", dtype=np.int64)
        mc.partition("rib", coords=d.coords)
        flux = lambda: mc.par_loop(facet_flux, d.facets, v(mc.READ, d.facet2cell[0]),  # noqa: E731
                                   v(mc.READ, d.facet2cell[1]), acc(mc.INC, d.facet2cell[0]),
                                   acc(mc.INC, d.facet2cell[1]))
        flux()
        owned_before = acc.gather()
        if extend:
            mc.get_runtime().ensure_depth(3)
        assert_same = acc.gather()
        mc.par_loop(bump_cells, d.cells, acc(mc.READ), v(mc.RW))
        flux()
        return mesh, d, (owned_before, assert_same), acc.gather()

    _, _, _, expected = run(self_comm(), False)
    mesh, d, (before, after_extension), actual = run(comm, True)
    assert layout_of(d.cells).depth == 3
    if comm.rank == 0:
        np.testing.assert_array_equal(after_extension, before)
        np.testing.assert_array_equal(actual, expected)
    assert_layers_match((d.nodes, d.cells, d.facets, d.bfacets), mesh_maps_of(mesh, d), 3)


@pytest.mark.mpi(nprocs=(1, 2), timeout=120)
def test_rib_with_a_seed_set_other_than_the_coordinates_set_says_why_on_every_rank(comm):
    """On one process too (it was accepted there: a script refused when it first ran on several ranks)."""
    mc.reset_runtime(comm=comm)
    _, d = declare_quads(3, 3, partition=False)
    with pytest.raises(mc.ConfigurationError, match="bisects the coordinates, which belong to set"):
        mc.partition("rib", coords=d.coords, seed_set=d.cells)
    mc.partition("rib", coords=d.coords)  # still usable: the coordinates' own set is the seed set


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_ranks_sharing_a_cache_compile_a_new_loop_once(comm, tmp_path):
    """Ranks that share a cache directory do not all compile a new loop: one compiles it and
    the others, waiting on its lock, load it from Numba's disk cache (the same bits)."""
    directory = comm.bcast(str(tmp_path / "cache"), root=0)
    mc.reset_runtime(comm=comm, cache_dir=directory)
    try:
        mesh, d = declare_quads(8, 8)
        u = mc.Dat(d.nodes, 1, np.arange(d.nodes.size, dtype=float), "u")
        bump = mc.Kernel.from_source("def shared_compile_bump(u):\n    u[0] = 2.0 * u[0] + 1.0\n")
        comm.Barrier()  # every rank reaches the compilation together
        mc.par_loop(bump, d.nodes, u(mc.RW))
        got = u.gather()
        loop = mc.stats().loops["shared_compile_bump"]
        counts = comm.allgather((loop.compilations, loop.cache_hits))
    finally:
        mc.reset_runtime(comm=comm)
    if comm.rank == 0:
        np.testing.assert_array_equal(got[:, 0], 2.0 * np.arange(mesh.nnode) + 1.0)
    compiled_here = [compilations - hits for compilations, hits in counts]  # entry points not found on disk
    assert sum(compiled_here) == max(compiled_here) and sum(hits for _, hits in counts) >= comm.size - 1, counts
