"""Random loop chains on random meshes, shared by the serial and MPI chain tests.

A program is a mesh choice and a list of loops; each loop iterates over a set of the
mesh and accesses dats directly or through the mesh's maps with random modes, and
sometimes a global. All data are int64, so every execution order the library may
choose gives the same bits.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import meshchain as mc
from meshchain.meshes import jittered_delaunay, structured_quads, structured_tris

from test_backends_property import kernel_source

# iteration set -> maps that start there (name, target set)
MAPS = {
    "cells": [("cell2node", "nodes")],
    "facets": [("facet2node", "nodes"), ("facet2cell", "cells")],
    "bfacets": [("bfacet2node", "nodes"), ("bfacet2cell", "cells")],
    "nodes": [],
}
DATS = {"nodes": ("na", "nb"), "cells": ("ca", "cb"), "facets": ("fa",), "bfacets": ()}
GLOBAL_USES = (("r", mc.READ), ("g", mc.INC), ("lo", mc.MIN), ("hi", mc.MAX))
GLOBAL_NAMES = {name for name, _ in GLOBAL_USES}


@st.composite
def meshes(draw):
    kind = draw(st.sampled_from(["quads", "tris", "delaunay"]))
    if kind == "delaunay":
        return kind, draw(st.integers(12, 60)), draw(st.integers(0, 1000))
    return kind, draw(st.integers(2, 8)), draw(st.integers(2, 8))


@st.composite
def loops(draw):
    iterset = draw(st.sampled_from(list(MAPS)))
    choices = [(name, None, None) for name in DATS[iterset]]
    for map_name, target in MAPS[iterset]:
        choices += [(name, map_name, target) for name in DATS[target]]
    picked = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=4, unique_by=lambda c: c[0]))
    args = []
    for dat, map_name, _ in picked:
        if map_name is None:
            mode = draw(st.sampled_from([mc.READ, mc.WRITE, mc.RW, mc.INC]))
            args.append((dat, mode, None, None))
        else:  # indirect writes must be increments (WRITE/RW need an exclusive map)
            mode = draw(st.sampled_from([mc.READ, mc.INC]))
            index = draw(st.one_of(st.none(), st.integers(0, 3)))
            args.append((dat, mode, map_name, index))
    if draw(st.booleans()):
        args.append(draw(st.sampled_from(GLOBAL_USES)) + (None, None))
    return iterset, tuple(args)


def segments_needed(loop_specs) -> int:
    """The segments a communication-avoiding execution of the loops needs, counted from the
    program alone: every set's halo can run redundantly, so the only dependence that needs
    an exchange inside a chain is a global reduced by one loop and used by a later one of
    the same segment (its reduction over ranks must finish in between). Walked from the
    end, as the inspector plans."""
    reductions = (mc.INC, mc.MIN, mc.MAX)
    count, used_later = 1, set()
    for _, args in reversed(loop_specs):
        uses = [(name, mode) for name, mode, _, _ in args if name in GLOBAL_NAMES]
        if any(mode in reductions and name in used_later for name, mode in uses):
            count, used_later = count + 1, set()
        used_later |= {name for name, _ in uses}
    return count


@st.composite
def programs(draw, max_loops=8):
    return draw(meshes()), tuple(draw(st.lists(loops(), min_size=1, max_size=max_loops)))


def make_mesh(spec):
    kind, a, b = spec
    if kind == "delaunay":
        return jittered_delaunay(a, seed=b)
    return structured_quads(a, b) if kind == "quads" else structured_tris(a, b)


class Program:
    """A program declared on the current runtime (call after ``mc.reset_runtime``)."""

    def __init__(self, spec, *, method="kway"):
        mesh_spec, self.loop_specs = spec
        self.itersets = {}  # loop position -> the set it runs over, when not the set its spec names
        mesh = make_mesh(mesh_spec)
        d = mesh.declare()
        self.sets = {"nodes": d.nodes, "cells": d.cells, "facets": d.facets, "bfacets": d.bfacets}
        self.maps = {"cell2node": d.cell2node, "facet2node": d.facet2node, "facet2cell": d.facet2cell,
                     "bfacet2node": d.bfacet2node, "bfacet2cell": d.bfacet2cell}
        rng = np.random.default_rng(7)
        self.dats = {}
        for set_name, names in DATS.items():
            for k, name in enumerate(names):
                size = self.sets[set_name].size
                self.dats[name] = mc.Dat(self.sets[set_name], 1 + k, rng.integers(-4, 5, size=(size, 1 + k)), name,
                                         dtype=np.int64)
        self.globals = {"r": mc.Global(1, 3, "r", dtype=np.int64), "g": mc.Global(1, 0, "g", dtype=np.int64),
                        "lo": mc.Global(1, 10**9, "lo", dtype=np.int64), "hi": mc.Global(1, -(10**9), "hi", dtype=np.int64)}
        self.coords = d.coords
        self.declare_more()
        mc.partition(method, coords=d.coords if method == "rib" else None, seed_set=d.cells if method != "rib" else None)
        self.kernels = [self._kernel(i) for i in range(len(self.loop_specs))]

    def declare_more(self):
        """Declare what a variant of the program needs before the mesh is partitioned."""

    def _args(self, position, objects=None):
        """The arguments of loop ``position`` (``objects``: name -> the dat or global to use)."""
        objects = {**self.dats, **self.globals} if objects is None else objects
        _, specs = self.loop_specs[position]
        args = []
        for name, mode, map_name, index in specs:
            if name in self.globals or map_name is None:
                args.append(objects[name](mode))
            else:
                m = self.maps[map_name]
                args.append(objects[name](mode, m if index is None else m[min(index, m.arity - 1)]))
        return args

    def _kernel(self, position):
        source = kernel_source(self._args(position), name=f"loop{position}")
        return mc.Kernel.from_source(source)

    def record(self, objects=None):
        for position, (iterset, _) in enumerate(self.loop_specs):
            mc.par_loop(self.kernels[position], self.itersets.get(position, self.sets[iterset]),
                        *self._args(position, objects), name=f"loop{position}")

    def objects(self) -> dict:
        """Name -> the current dat or global."""
        return {**self.dats, **self.globals}

    def renew(self):
        """Replace every dat and global with a new one declared alike, holding its values (as a
        user who makes new objects per step does; plans are bound to the new objects)."""
        for name, old in self.dats.items():
            self.dats[name] = mc.Dat(old.dataset, old.dim, old.gather(), name, dtype=old.dtype)
        for name, old in self.globals.items():
            self.globals[name] = mc.Global(1, old.value, name, dtype=old.dtype)

    def run(self, mode, *, executions=2, tile_size=None, renew=False, captured=False):
        """``mode``: None (no chain), or the chain's ``ca`` (True, False, "auto");
        ``tile_size``: the chain's sparse tiling; ``renew``: new objects before every execution
        (:meth:`renew`); ``captured``: each execution calls a step captured with ``mc.capture``
        (its objects passed as arguments; ``mode`` None runs it with ``ca=False``)."""
        if captured and getattr(self, "step", None) is None:
            self.step = mc.capture(lambda pairs: self.record(dict(pairs)), name="random",
                                   ca=False if mode is None else mode, tile_size=tile_size)
        for _ in range(executions):
            if renew:
                self.renew()
            if captured:
                self.step(tuple(self.objects().items()))
            elif mode is None:
                self.record()
                mc.flush()
            else:
                with mc.loop_chain("random", ca=mode, tile_size=tile_size):
                    self.record()

    def results(self):
        values = [d.gather() for d in self.dats.values()]
        return values + [g.value for g in self.globals.values()]


#: How a program runs: loop by loop (None), in a chain (False), communication-avoiding (True), tiled.
RUNS = ((None, None), (False, None), (True, None), (True, 3))


def results_of(make_program, runs, *, comm=None, backend="numba"):
    """The results of the program ``make_program()`` declares on a new runtime, run twice in
    each way of ``runs`` (``(mode, tile_size)``), one after the other in one session (a chain
    then starts from halos that loops left behind)."""
    mc.reset_runtime(comm=comm, backend=backend)
    program = make_program()
    for mode, tile_size in runs:
        program.run(mode, tile_size=tile_size)
    return program.results()


def assert_same_results(got, expected, what):
    assert len(got) == len(expected)
    for position, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(a, b, err_msg=f"{what}: result {position}")


def assert_same_on_ranks(comm, got, expected, what):
    """Every result on rank 0 (the dats are gathered there); the globals on every rank."""
    if comm.rank == 0:
        assert_same_results(got, expected, f"{comm.size} ranks, {what}")
    else:
        assert_same_results(got[-len(GLOBAL_USES):], expected[-len(GLOBAL_USES):], f"{comm.size} ranks, {what}: globals")
