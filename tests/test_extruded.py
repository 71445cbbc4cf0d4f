"""Extruded sets (``mc.ExtrudedSet``, PyOP2's ``ExtrudedSet``) and maps with ``offset=``: random
programs over prisms extruded from random triangle meshes, over every layer and every region
(bottom, top, interior horizontal facets), equal the same programs written on plain sets with
explicit maps built here by hand; loop by loop, in chains, communication-avoiding and
sparse-tiled, on every backend and on 1-4 ranks; bad input raises."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import meshchain as mc
from devices import DEVICE_BACKENDS
from chain_programs import RUNS, assert_same_results
from meshchain.meshes import jittered_delaunay, structured_tris
from meshchain.types.extruded import in_region
from meshchain.types.maps import ExtrudedMap
from helpers import example_module
from test_backends_property import kernel_source

NO_CHECKS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
REGIONS = (mc.ALL, mc.ON_BOTTOM, mc.ON_TOP, mc.ON_INTERIOR_FACETS)
CELL_DATS, NODE_DATS = {"q": 1, "w": 2}, {"z": 1, "y": 2}


def flat_rows(bottom, offset, layers):
    """Every layer's rows of an extruded map, written out element by element (the oracle's maps)."""
    rows = []
    for column in bottom:
        for layer in range(layers):
            rows.append([v + layer * o for v, o in zip(column, offset)])
    return np.array(rows, dtype=np.int64).reshape(-1, len(offset))


@st.composite
def cell_arg(draw):
    kind = draw(st.sampled_from(["direct", "c2n", "c2n_whole", "c2c", "c2c_whole"]))
    if kind == "direct":
        return draw(st.sampled_from(sorted(CELL_DATS))), draw(st.sampled_from([mc.READ, mc.WRITE, mc.RW, mc.INC])), kind
    dats = NODE_DATS if kind.startswith("c2n") else CELL_DATS
    index = draw(st.integers(0, 5)) if kind == "c2n" else 0
    return draw(st.sampled_from(sorted(dats))), draw(st.sampled_from([mc.READ, mc.INC])), (kind, index)


@st.composite
def extruded_loop(draw):
    if draw(st.booleans()):
        args = draw(st.lists(st.tuples(st.sampled_from(sorted(NODE_DATS)),
                                       st.sampled_from([mc.READ, mc.WRITE, mc.RW, mc.INC]), st.just("direct")),
                             min_size=1, max_size=2, unique_by=lambda a: a[0]))
        return "nodes", mc.ALL, tuple(args)
    args = draw(st.lists(cell_arg(), min_size=1, max_size=4, unique_by=lambda a: a[0]))
    return "cells", draw(st.sampled_from(REGIONS)), tuple(args)


@st.composite
def extruded_programs(draw, max_loops=5):
    mesh = draw(st.sampled_from([("tris", 2, 2), ("tris", 3, 1), ("delaunay", 12, 3), ("delaunay", 20, 5)]))
    layers = draw(st.integers(1, 4))
    return mesh, layers, tuple(draw(st.lists(extruded_loop(), min_size=1, max_size=max_loops)))


class ExtrudedProgram:
    """A program over prisms extruded from a triangle mesh; ``flat``: the same program on plain
    sets, with the extruded maps and the regions' maps written out by :func:`flat_rows`."""

    def __init__(self, spec, *, flat=False):
        (kind, a, b), self.layers, self.loops = spec
        base = structured_tris(a, b) if kind == "tris" else jittered_delaunay(a, seed=b)
        self.flat, L = flat, self.layers
        n, nv = base.ncell, base.nnode
        bottom = np.concatenate([base.cells * (L + 1), base.cells * (L + 1) + 1], axis=1)
        if flat:
            self.cells, self.nodes = mc.Set(n * L, "cells"), mc.Set(nv * (L + 1), "nodes")
            self._declare_flat_maps(bottom, n)
        else:
            self.cells = mc.ExtrudedSet(mc.Set(n, "tri"), L, "cells")
            self.nodes = mc.ExtrudedSet(mc.Set(nv, "vertices"), L + 1, "nodes")
            self.c2n = mc.Map(self.cells, self.nodes, 6, bottom, "c2n", offset=[1] * 6)
            self.c2c = mc.Map(self.cells, self.cells, 1, np.arange(n)[:, None] * L, "c2c", offset=1)
        rng = np.random.default_rng(5)
        self.dats = {name: mc.Dat(s, dim, rng.integers(-4, 5, size=(s.size, dim)), name, dtype=np.int64)
                     for dats, s in ((CELL_DATS, self.cells), (NODE_DATS, self.nodes)) for name, dim in dats.items()}
        mc.partition("kway", seed_set=self.cells)
        self.kernels = [mc.Kernel.from_source(kernel_source(self._seen(p), name=f"loop{p}"))
                        for p in range(len(self.loops))]

    def _seen(self, position):
        """The arguments as the kernel sees them (on interior facets, whole maps list two layers)."""
        set_name, region, _ = self.loops[position]
        if self.flat:
            return self._args(position)
        return in_region(self.cells if set_name == "cells" else self.nodes, self._args(position), region)[1]

    def _declare_flat_maps(self, bottom, n):
        L = self.layers
        c2n, c2c = flat_rows(bottom, [1] * 6, L), flat_rows(np.arange(n)[:, None] * L, [1], L)
        self.c2n = mc.Map(self.cells, self.nodes, 6, c2n, "c2n")
        self.c2c = mc.Map(self.cells, self.cells, 1, c2c, "c2c")
        self.regions = {}
        for region, ids in ((mc.ON_BOTTOM, np.arange(n) * L), (mc.ON_TOP, np.arange(n) * L + L - 1),
                            (mc.ON_INTERIOR_FACETS, (np.arange(n)[:, None] * L + np.arange(L - 1)).reshape(-1))):
            s = mc.Set(len(ids), region)
            upper = ids + 1 if region == mc.ON_INTERIOR_FACETS else ids
            to_cells = mc.Map(s, self.cells, 2, np.stack([ids, upper], axis=1), f"{region}2c")
            to_nodes = mc.Map(s, self.nodes, 12, np.concatenate([c2n[ids], c2n[np.minimum(upper, n * L - 1)]], axis=1),
                              f"{region}2n")
            self.regions[region] = s, to_cells, to_nodes

    def _args(self, position):
        iterset, region, specs = self.loops[position]
        return [self._arg(name, mode, path, region) for name, mode, path in specs]

    def _arg(self, name, mode, path, region):
        dat = self.dats[name]
        if path == "direct":
            if self.flat and name in CELL_DATS and region != mc.ALL:
                return dat(mode, self.regions[region][1][0])
            return dat(mode)
        kind, index = path
        whole = kind.endswith("_whole")
        if not self.flat or region == mc.ALL:
            m = self.c2n if kind.startswith("c2n") else self.c2c
            return dat(mode, m if whole else m[index])
        _, to_cells, to_nodes = self.regions[region]
        m = to_nodes if kind.startswith("c2n") else to_cells
        if whole and region == mc.ON_INTERIOR_FACETS:
            return dat(mode, m)
        if whole:  # the region's map also lists the cell above: a whole-map argument sees the layer's own rows
            return dat(mode, self._own_rows(region, m))
        return dat(mode, m[index])

    def _own_rows(self, region, m):
        key = ("own", region, m.name)
        if key not in self.regions:
            self.regions[key] = mc.Map(m.source, m.target, m.arity // 2, m.values[:, : m.arity // 2], f"{m.name}.own")
        return self.regions[key]

    def record(self):
        for position, (set_name, region, _) in enumerate(self.loops):
            iterset = self.cells if set_name == "cells" else self.nodes
            if self.flat and region != mc.ALL:
                mc.par_loop(self.kernels[position], self.regions[region][0], *self._args(position), name=f"loop{position}")
            else:
                mc.par_loop(self.kernels[position], iterset, *self._args(position), name=f"loop{position}",
                            region=region)

    def run(self, mode, tile_size, *, executions=2):
        for _ in range(executions):
            if mode is None:
                self.record()
                mc.flush()
            else:
                with mc.loop_chain("extruded", ca=mode, tile_size=tile_size):
                    self.record()

    def results(self):
        return [d.gather() for d in self.dats.values()]


def outcome(spec, runs, *, comm=None, flat=False, backend="numba", block_size=2048, **options):
    """``block_size`` small: blocks end inside columns (the generated column loop's edges);
    ``options``: more of the runtime's settings."""
    mc.reset_runtime(comm=comm, backend=backend, block_size=block_size, **options)
    program = ExtrudedProgram(spec, flat=flat)
    for mode, tile_size in runs:
        program.run(mode, tile_size)
    return program.results()


def oracle(spec, runs):
    """The program on plain sets with explicit maps, loop by loop on one process."""
    return outcome(spec, [(None, None)] * len(runs), comm=MPI.COMM_SELF, flat=True, backend="reference")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # int64 sums may wrap, alike everywhere
@settings(max_examples=8, **NO_CHECKS)
@given(spec=extruded_programs(), backend=st.sampled_from(["reference", "numba"]), runs=st.permutations(RUNS),
       block_size=st.sampled_from([3, 2048]))
def test_extruded_programs_equal_their_flattened_loops(spec, backend, runs, block_size):
    assert_same_results(outcome(spec, runs, backend=backend, block_size=block_size), oracle(spec, runs),
                        f"{backend}, {runs}, blocks of {block_size}")


@pytest.mark.parametrize("block_size", [1, 3, 5])
def test_blocks_that_end_inside_columns_equal_the_flattened_loops(block_size):
    """The generated column loop stops at its block's end when a block ends inside a column."""
    spec = (("delaunay", 12, 3), 4, (("cells", mc.ALL, (("y", mc.INC, ("c2n", 3)), ("q", mc.READ, "direct"))),
                                     ("cells", mc.ALL, (("z", mc.READ, ("c2n_whole", 0)), ("w", mc.RW, "direct")))))
    runs = list(RUNS)
    assert_same_results(outcome(spec, runs, block_size=block_size), oracle(spec, runs), f"blocks of {block_size}")


@pytest.mark.parametrize("device", DEVICE_BACKENDS)
@settings(max_examples=2, **NO_CHECKS)
@given(spec=extruded_programs(max_loops=3), runs=st.permutations(RUNS[:3]))
def test_extruded_programs_on_the_device_equal_their_flattened_loops(device, spec, runs):
    assert_same_results(outcome(spec, runs, backend=device), oracle(spec, runs), f"{device}, {runs}")


def uneven_offsets_outcome(backend):
    """Loops over every layer through a map whose columns move by different offsets (1 and 2),
    per index and whole, read and increment, on rows of 2 values."""
    mc.reset_runtime(backend=backend)
    cells = mc.ExtrudedSet(mc.Set(3, "tri"), 4, "cells")
    nodes = mc.ExtrudedSet(mc.Set(3, "v"), 9, "nodes")
    c2n = mc.Map(cells, nodes, 2, [[0, 1], [9, 10], [18, 19]], "c2n", offset=[1, 2])
    z = mc.Dat(nodes, 2, np.arange(54.0).reshape(27, 2), "z")
    u, b = mc.Dat(nodes, 2, None, "u"), mc.Dat(cells, 2, None, "b")
    gather = mc.Kernel.from_source("def gather(b, z, y):\n    for k in range(2):\n"
                                   "        b[k] = z[0, k] + 10.0 * z[1, k] + 100.0 * y[k]\n")
    scatter = mc.Kernel.from_source("def scatter(b, u, v):\n    for k in range(2):\n"
                                    "        u[0, k] += b[k]\n        u[1, k] += 2.0 * b[k]\n        v[k] += 0.5\n")
    mc.par_loop(gather, cells, b(mc.WRITE), z(mc.READ, c2n), z(mc.READ, c2n[1]))
    mc.par_loop(scatter, cells, b(mc.READ), u(mc.INC, c2n), u(mc.INC, c2n[0]))
    return [b.data.copy(), u.data.copy()]


@pytest.mark.parametrize("backend", ["numba", *DEVICE_BACKENDS])
def test_maps_whose_columns_move_by_different_offsets_equal_the_reference(backend):
    assert_same_results(uneven_offsets_outcome(backend), uneven_offsets_outcome("reference"), backend)


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=900)
@settings(max_examples=3, **NO_CHECKS)
@given(spec=extruded_programs(max_loops=4), runs=st.permutations(RUNS))
def test_extruded_chains_on_ranks_equal_the_flattened_loops_on_one(comm, spec, runs):
    """... and every rank's local numbering keeps the arithmetic (the loops over every layer find
    their targets per layer by arithmetic on every rank, at every halo depth the chains built)."""
    expected, got = oracle(spec, runs), outcome(spec, runs, comm=comm)
    maps = [m for m in mc.get_runtime().mesh.declarations.declared()[1] if isinstance(m, ExtrudedMap)]
    assert comm.allreduce(all(mc.get_runtime().layout.follows_layers(m) for m in maps), op=MPI.LAND)
    same = comm.rank != 0 or all(np.array_equal(a, b) for a, b in zip(got, expected))
    if comm.allreduce(not same, op=MPI.LOR):  # every rank fails alike, so hypothesis shrinks on all of them
        if comm.rank == 0:
            assert_same_results(got, expected, f"{comm.size} ranks, {runs}")
        pytest.fail(f"the dats gathered on rank 0 differ from the flattened loops' ({runs})")


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
def test_a_rank_whose_numbering_breaks_the_layers_reads_the_stored_rows(comm, monkeypatch):
    """Where a rank's local numbering breaks the arithmetic (here: said so on the last rank), that
    rank runs the loops over every layer through the stored rows; the results do not change (with
    the boundary run as tasks, which find the rows each iteration touches from what the loop is given)."""
    from meshchain.engine.assemble import _Builder
    from meshchain.partition.layout import MeshLayout

    original, choose = MeshLayout.follows_layers, _Builder._layers_here
    broken = lambda layout, m: comm.rank != comm.size - 1 and original(layout, m)  # noqa: E731
    monkeypatch.setattr(MeshLayout, "follows_layers", broken)
    chosen = []
    monkeypatch.setattr(_Builder, "_layers_here", lambda builder, loop: chosen.append(choose(builder, loop)) or chosen[-1])
    spec = (("delaunay", 20, 5), 3, (("cells", mc.ALL, (("y", mc.INC, ("c2n", 3)), ("q", mc.READ, "direct"))),
                                     ("cells", mc.ALL, (("z", mc.READ, ("c2n_whole", 0)), ("w", mc.RW, "direct"))),
                                     ("cells", mc.ALL, (("q", mc.INC, ("c2c_whole", 0)), ("y", mc.READ, ("c2n", 0))))))
    runs = list(RUNS)
    got = outcome(spec, runs, comm=comm, boundary="tasks")  # boundary tasks find the rows each iteration touches
    by_arithmetic = [any(spec.layers for spec in loop.specs) for loop in chosen]
    expected = oracle(spec, runs)  # on every rank: leaving the distributed runtime is collective
    if comm.rank == 0:
        assert_same_results(got, expected, f"{comm.size} ranks, the last one through the stored rows")
    assert chosen and (not any(by_arithmetic) if comm.rank == comm.size - 1 else all(by_arithmetic))
    loop = make_loop_over_every_layer()
    assert loop.with_stored_rows.recorded is loop and not any(s.layers for s in loop.with_stored_rows.specs)
    assert loop.with_stored_rows.with_stored_rows is loop.with_stored_rows.with_stored_rows


@pytest.mark.mpi(nprocs=(2,), timeout=600)
def test_extruded_chains_on_ranks_on_the_device_emulation_equal_the_flattened_loops(comm):
    """The CUDA source's layer arithmetic in local numbering: 2 ranks of the device emulation,
    loop by loop, in chains and CA."""
    spec = (("delaunay", 20, 5), 3, (("cells", mc.ALL, (("y", mc.INC, ("c2n", 3)), ("q", mc.READ, "direct"))),
                                     ("cells", mc.ALL, (("z", mc.READ, ("c2n_whole", 0)), ("w", mc.RW, "direct"))),
                                     ("cells", mc.ALL, (("q", mc.INC, ("c2c_whole", 0)), ("y", mc.READ, ("c2n", 0))))))
    runs = list(RUNS[:3])
    got = outcome(spec, runs, comm=comm, backend="cuda-emulation")
    expected = oracle(spec, runs)  # on every rank: leaving the distributed runtime is collective
    if comm.rank == 0:
        assert_same_results(got, expected, f"{comm.size} ranks of the device emulation")


def make_loop_over_every_layer():
    """A loop over every layer of a small extruded set through an extruded map, by arithmetic."""
    from meshchain.ir.loop import make_loop

    cells = mc.ExtrudedSet(mc.Set(3, "tri"), 4, "cells")
    nodes = mc.ExtrudedSet(mc.Set(3, "v"), 9, "nodes")
    c2n = mc.Map(cells, nodes, 2, [[0, 1], [9, 10], [18, 19]], "c2n", offset=[1, 2])
    z, b = mc.Dat(nodes, 1, None, "z"), mc.Dat(cells, 1, None, "b")
    k = mc.Kernel.from_source("def f(m, z, y):\n    m[0] = z[0, 0] + z[1, 0] + y[0]\n")
    return make_loop(k, cells, (b(mc.WRITE), z(mc.READ, c2n), z(mc.READ, c2n[1])), layered=True)


def test_the_layers_of_a_column_are_contiguous_and_a_map_moves_by_its_offset():
    mc.reset_runtime()
    cells = mc.ExtrudedSet(mc.Set(2, "tri"), 3, "cells")
    nodes = mc.ExtrudedSet(mc.Set(3, "v"), 4, "nodes")
    c2n = mc.Map(cells, nodes, 2, [[0, 4], [8, 5]], "c2n", offset=[1, 2])
    assert isinstance(c2n, mc.types.ExtrudedMap) and c2n.offset == (1, 2)
    assert c2n.values.tolist() == [[0, 4], [1, 6], [2, 8], [8, 5], [9, 7], [10, 9]]
    assert c2n.facets.values.tolist() == [[0, 4, 1, 6], [1, 6, 2, 8], [2, 8, 2, 8],
                                          [8, 5, 9, 7], [9, 7, 10, 9], [10, 9, 10, 9]]
    assert cells.bottom.indices.tolist() == [0, 3] and cells.top.indices.tolist() == [2, 5]
    assert cells.interior_facets.indices.tolist() == [0, 1, 3, 4]
    assert mc.ExtrudedSet(mc.Set(2, "b"), 1, "one").interior_facets.size == 0


def test_regions_visit_the_bottom_the_top_and_each_pair_of_adjacent_layers():
    mc.reset_runtime()
    cells = mc.ExtrudedSet(mc.Set(2, "tri"), 3, "cells")
    own = mc.Map(cells, cells, 1, [[0], [3]], "own", offset=1)
    hits = mc.Dat(cells, 1, None, "hits", dtype=np.int64)
    k = mc.Kernel.from_source("def hit(h):\n    h[0] += 1\n")
    mc.par_loop(k, cells, hits(mc.INC), region=mc.ON_BOTTOM)
    mc.par_loop(k, cells, hits(mc.INC), region=mc.ON_TOP)
    assert hits.data[:, 0].tolist() == [1, 0, 1, 1, 0, 1]
    pair = mc.Kernel.from_source("def pair(h):\n    h[0, 0] += 10\n    h[1, 0] += 100\n")
    mc.par_loop(pair, cells, hits(mc.INC, own), region=mc.ON_INTERIOR_FACETS)
    assert hits.data[:, 0].tolist() == [11, 110, 101, 11, 110, 101]


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
def test_rank_blocks_of_the_bottom_layer_equal_the_whole_array(comm):
    bottom = np.arange(5)[:, None] * 2
    mine = np.array_split(bottom, comm.size)[comm.rank]
    found = []
    for values in (bottom, mc.Block(mine)):
        mc.reset_runtime(comm=comm)
        cells = mc.ExtrudedSet(mc.Set(5, "tri"), 2, "cells")
        m = mc.Map(cells, cells, 1, values, "m", offset=1)
        d = mc.Dat(cells, 1, np.arange(10.0), "d")
        out = mc.Dat(cells, 1, None, "out")
        mc.partition("kway", seed_set=cells)
        mc.par_loop(mc.Kernel.from_source("def f(o, t):\n    o[0] = t[1, 0] - t[0, 0]\n"), cells, out(mc.WRITE),
                    d(mc.READ, m), region=mc.ON_INTERIOR_FACETS)
        found.append(out.gather())
    if comm.rank == 0:
        assert found[0][:, 0].tolist() == [1.0, 0.0] * 5
        np.testing.assert_array_equal(found[0], found[1])


@pytest.mark.parametrize("make, message", [
    (lambda c, b: mc.ExtrudedSet(c, 2, "twice"), "plain meshchain.Set"),
    (lambda c, b: mc.ExtrudedSet(b, 0, "none"), "layers"),
    (lambda c, b: mc.Map(b, b, 1, [[0], [1]], "m", offset=1), "not one"),
    (lambda c, b: mc.Map(c, b, 1, [[0], [1], [1], [0], [1], [1]], "m", offset=1), "one row per column"),
    (lambda c, b: mc.Map(c, b, 2, [[0, 1], [1, 0]], "m", offset=[1, 2, 3]), "offset must be 2 integers"),
    (lambda c, b: mc.Map(c, c, 1, [[0], [4]], "m", offset=1), "out of range"),
    (lambda c, b: mc.par_loop(mc.Kernel.from_source("def f(x):\n    x[0] = 1.0\n"), b,
                              mc.Dat(b, 1, None, "d")(mc.WRITE), region=mc.ON_TOP), "needs a loop over an mc.ExtrudedSet"),
    (lambda c, b: mc.par_loop(mc.Kernel.from_source("def f(x):\n    x[0] = 1.0\n"), c,
                              mc.Dat(c, 1, None, "d")(mc.WRITE), region="sideways"), "is not one of"),
    (lambda c, b: mc.par_loop(mc.Kernel.from_source("def f(x):\n    x[0, 0] = 1.0\n"), c,
                              mc.Dat(c, 1, None, "d")(mc.WRITE, mc.Map(c, c, 1, np.arange(6)[:, None], "plain")),
                              region=mc.ON_INTERIOR_FACETS), "needs a map declared with offset="),
])
def test_bad_extrusions_raise(make, message):
    mc.reset_runtime()
    base = mc.Set(2, "base")
    cells = mc.ExtrudedSet(base, 3, "cells")
    with pytest.raises(mc.MeshchainError, match=message):
        make(cells, base)


@pytest.mark.mpi(nprocs=(1, 3), timeout=600)
@pytest.mark.parametrize("ca", ["off", "on"])
def test_the_column_model_conserves_heat_and_runs_unchanged_on_ranks(comm, ca, tmp_path_factory):
    """``examples/column_model.py``: the heat budget closes to rounding, the temperatures on
    ``comm`` equal one process's, and the ParaView series holds prisms (wedges) with them."""
    import meshio

    model = example_module("column_model")
    argv = ["--n", "120", "--layers", "6", "--steps", "30", "--every", "15", "--ca", ca]
    mc.reset_runtime(comm=MPI.COMM_SELF)
    serial = model.simulate(model.parse_args(argv), report=lambda line: None)
    directory = comm.bcast(str(tmp_path_factory.mktemp("column")) if comm.rank == 0 else None)
    mc.reset_runtime(comm=comm)
    found = model.simulate(model.parse_args([*argv, "--output", directory]), report=lambda line: None)
    assert found["budget_error"] < 1e-12 and serial["budget_error"] < 1e-12
    if comm.rank == 0:
        np.testing.assert_allclose(found["T"], serial["T"], rtol=1e-13, atol=1e-15)
        with meshio.xdmf.TimeSeriesReader(f"{directory}/column.xdmf") as reader:
            points, blocks = reader.read_points_cells()
            _, _, cell_data = reader.read_data(reader.num_steps - 1)
        assert blocks[0].type == "wedge" and blocks[0].data.shape == (found["T"].shape[0], 6)
        np.testing.assert_array_equal(cell_data["T"][0], found["T"])
        bottom, top = points[blocks[0].data[:, 0]], points[blocks[0].data[:, 3]]
        assert np.allclose(top[:, :2], bottom[:, :2]) and np.all(top[:, 2] > bottom[:, 2])  # columns stand upright
    mc.reset_runtime()


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
def test_extruded_dats_checkpoint_and_restore_on_any_number_of_ranks(comm, tmp_path_factory):
    path = comm.bcast(str(tmp_path_factory.mktemp("extruded") / "state.h5") if comm.rank == 0 else None)

    def declare(on):
        mc.reset_runtime(comm=on)
        cells = mc.ExtrudedSet(mc.Set(5, "tri"), 3, "cells")
        q = mc.Dat(cells, 2, np.arange(30.0).reshape(15, 2), "q")
        if on.size > 1:
            mc.partition("kway", seed_set=cells)
        return cells, q

    cells, q = declare(comm)
    mc.par_loop(mc.Kernel.from_source("def f(x):\n    x[1] = -x[0]\n"), cells, q(mc.RW), region=mc.ON_TOP)
    saved = q.gather()
    mc.checkpoint(path, [q])
    if comm.rank == 0:  # restored on one process
        _, again = declare(MPI.COMM_SELF)
        assert not np.array_equal(again.gather(), saved)
        mc.restore(path, [again])
        np.testing.assert_array_equal(again.gather(), saved)
        assert saved[2::3, 1].tolist() == (-saved[2::3, 0]).tolist()
    comm.Barrier()
    mc.reset_runtime()


def test_a_loop_over_every_layer_reads_each_columns_map_row_once():
    """The numba backend's loop over an extruded set loads a column's bottom-layer map row
    once and finds every layer's targets by arithmetic: no map row is read per layer."""
    from meshchain.backends.numba_codegen import loop_source
    from meshchain.ir.loop import make_loop

    mc.reset_runtime()
    loop = make_loop_over_every_layer()
    k = loop.kernel
    assert [s.layers for s in loop.specs] == [(), (4, 1, 2), (4, 2)]
    block = loop_source(loop, boundscheck=False).split("def _mc_tile")[0]
    assert "_mc_m0[_mc_u" not in block and "_mc_m0[_mc_col, 1]" in block and "_mc_lay * _mc_np.uint64(2)" in block
    assert [s.layers for s in make_loop(k, loop.iterset, loop.args, layered=False).specs] == [()] * 3


def whole_columns_here(s) -> bool:
    """Whether every column of extruded set ``s`` this rank holds (owned, and with its halos)
    is whole on it."""
    layout = mc.get_runtime().layout.of(s)
    owned, held = layout.global_ids[:layout.n_owned] // s.layers, layout.global_ids // s.layers
    return all(np.all(np.unique(c, return_counts=True)[1] == s.layers) for c in (owned, held))


@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=600)
@pytest.mark.parametrize("method", ["kway", "rib", "repartition"])
def test_the_partition_keeps_columns_whole(comm, method):
    """Every layer of a column goes to one rank, and halos hold whole columns: for the seed set
    and the extruded sets that follow it, after ``kway``, ``rib`` and ``mc.repartition``."""
    model = example_module("column_model")
    mc.reset_runtime(comm=comm)
    m = model.declare(150, 5, 3)
    if method == "kway":
        mc.partition("kway", seed_set=m["cells"])
    else:
        mc.partition("rib", coords=m["xyz"])
    if method == "repartition":
        mc.repartition("kway")
    found = [whole_columns_here(s) for s in (m["cells"], m["sides"], m["xyz"].dataset)]
    assert comm.allreduce(all(found), op=MPI.LAND), found
    mc.reset_runtime()


@pytest.mark.parametrize("backend", ["reference", "numba", *DEVICE_BACKENDS])
def test_max_over_interior_facets_keeps_the_extreme_of_both_prisms_on_their_shared_level(backend):
    """On an interior facet the map's rows reach the middle level twice (the top of the prism
    below, the bottom of the one above): MAX kept the last of the two before, not the larger."""
    mc.reset_runtime(backend=backend)
    layers = 2
    columns, vertices = mc.Set(1, "triangles"), mc.Set(3, "vertices")
    cells, nodes = mc.ExtrudedSet(columns, layers, "cells"), mc.ExtrudedSet(vertices, layers + 1, "nodes")
    bottom = np.array([[0, 1, 2]]) * (layers + 1)
    c2n = mc.Map(cells, nodes, 6, np.concatenate([bottom, bottom + 1], axis=1), "c2n", offset=[1] * 6)
    high = mc.Dat(nodes, 1, np.zeros(3 * (layers + 1)), "high")
    marks = mc.Kernel.from_source("def marks(h):\n    for j in range(6):\n        h[j, 0] = max(h[j, 0], 1.0)\n"
                                  "        h[6 + j, 0] = max(h[6 + j, 0], 0.5)\n")
    mc.par_loop(marks, cells, high(mc.MAX, c2n), region=mc.ON_INTERIOR_FACETS)
    np.testing.assert_array_equal(high.data_ro[:, 0], np.tile([1.0, 1.0, 0.5], 3))  # per column: levels 0, 1, 2
