"""Failures on several ranks: a kernel that fails on some ranks only raises the same error on
every rank (no abort, no rank left waiting), discards only what depended on it, and the
session carries on; compile errors are agreed on the same way."""

from __future__ import annotations

import numpy as np
import pytest

import meshchain as mc
from meshchain.meshes import structured_quads

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


@mc.kernel
def pick(a, b):
    b[0] = a[int(a[0])]  # an index outside the view where a[0] is not 0


@mc.kernel
def flux(a1, a2, r1, r2):
    r1[0] += a2[0]
    r2[0] += a1[0]


@mc.kernel
def copy(a, b):
    b[0] = a[0]


def declare(comm, *, bad_cell: int | None, backend: str = "reference"):
    mc.reset_runtime(comm=comm, backend=backend, trace_length=100)
    mesh = structured_quads(6, 5)
    d = mesh.declare()
    values = np.zeros(mesh.ncell)
    if bad_cell is not None:
        values[bad_cell] = 7.0
    a = mc.Dat(d.cells, 1, values, "a")
    b = mc.Dat(d.cells, 1, None, "b")
    r = mc.Dat(d.cells, 1, None, "r")
    other = mc.Dat(d.cells, 1, np.arange(mesh.ncell, dtype=np.float64), "other")
    copied = mc.Dat(d.cells, 1, None, "copied")
    mc.partition("rib", coords=d.coords)
    return d, a, b, r, other, copied


@pytest.mark.mpi(nprocs=(2, 3), timeout=180)
@pytest.mark.parametrize("backend", ["reference", "numba"])
def test_a_kernel_failing_on_one_rank_raises_the_same_error_everywhere(comm, backend):
    d, a, b, r, other, copied = declare(comm, bad_cell=0, backend=backend)
    mc.par_loop(pick, d.cells, a(mc.READ), b(mc.WRITE))                                   # fails on one rank
    mc.par_loop(flux, d.facets, b(mc.READ, d.facet2cell[0]), b(mc.READ, d.facet2cell[1]),
                r(mc.INC, d.facet2cell[0]), r(mc.INC, d.facet2cell[1]))                      # depends on it
    mc.par_loop(copy, d.cells, other(mc.READ), copied(mc.WRITE))                            # does not
    with pytest.raises(mc.KernelRuntimeError) as raised:
        mc.flush()
    messages = comm.allgather(str(raised.value).split(" (reported by rank")[0])
    assert len(set(messages)) == 1 and "kernel 'pick'" in messages[0], messages
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "were discarded: flux" in notes and "still pending: copy" in notes
    assert [entry.loop.name for entry in mc.get_runtime().trace] == ["copy"]
    # the session carries on: the independent loop runs, and so do new loops
    gathered = copied.gather()
    a.data[:] = 0.0
    mc.par_loop(pick, d.cells, a(mc.READ), b(mc.WRITE))
    mc.par_loop(flux, d.facets, b(mc.READ, d.facet2cell[0]), b(mc.READ, d.facet2cell[1]),
                r(mc.INC, d.facet2cell[0]), r(mc.INC, d.facet2cell[1]))
    total = mc.Global(1, 0.0, "total")
    mc.par_loop(mc.Kernel.from_source("def s(x, t):\n    t[0] += x[0]\n"), d.cells, r(mc.READ), total(mc.INC))
    assert total.value[0] == 0.0
    if comm.rank == 0:
        np.testing.assert_array_equal(gathered[:, 0], np.arange(d.cells.size, dtype=np.float64))


@mc.kernel
def untypable(a):
    a[0] = a[0] + "text"  # Numba cannot type this: compiling fails


@pytest.mark.mpi(nprocs=(2,), timeout=180)
def test_a_kernel_that_cannot_compile_raises_everywhere_and_keeps_its_cause(comm):
    from numba.core.errors import NumbaError

    mc.reset_runtime(comm=comm, backend="numba")
    cells = mc.Set(8, "cells")
    q = mc.Dat(cells, 1, None, "q")
    mc.partition("block", seed_set=cells)
    mc.par_loop(untypable, cells, q(mc.RW))
    with pytest.raises(mc.CompilationError, match="untypable") as raised:
        mc.flush()
    assert isinstance(raised.value.__cause__, NumbaError), "the compiler's own error is kept as the cause"
    assert comm.allreduce(1) == comm.size  # nobody was left waiting
    mc.par_loop(copy, cells, q(mc.READ), mc.Dat(cells, 1, None, "out")(mc.WRITE))
    mc.flush()


@pytest.mark.mpi(nprocs=(2,), timeout=180)
def test_ranks_agree_after_a_run_only_where_a_loop_can_fail(comm):
    """Compiled loops whose indices are proven in bounds raise nothing while they run: their
    plans skip the agreement (one Allreduce per execution); loops with index checks (debug,
    or indices the analysis cannot prove) and the reference backend keep it. The decision
    depends only on the loop and the configuration, so every rank takes the same."""
    def agrees(backend, kernel, dim=1, **options):
        mc.reset_runtime(comm=comm, backend=backend, **options)
        cells = mc.Set(8, "cells")
        q = mc.Dat(cells, dim, np.zeros((8, dim)), "q")
        mc.partition("block", seed_set=cells)
        mc.par_loop(kernel, cells, q(mc.RW))
        mc.flush()
        (plan,) = mc.get_runtime().pipeline.plans.values()
        return plan._agree

    checked = mc.Kernel.from_source("def checked(a):\n    a[int(a[0])] += 1.0\n")
    proven = mc.Kernel.from_source("def proven(a):\n    a[0] += 1.0\n")
    flattened = mc.Kernel.from_source("def flattened(k):\n    for i in range(3):\n        for j in range(3):\n"
                                      "            k[3 * i + j] += 1.0\n")  # an element matrix stored flat
    decisions = (agrees("numba", proven), agrees("numba", proven, debug=True), agrees("numba", checked),
                 agrees("reference", proven), agrees("numba", flattened, dim=9))
    assert decisions == (False, True, True, True, False)
    assert comm.allgather(decisions) == [decisions] * comm.size


@pytest.mark.mpi(nprocs=(2,), timeout=120)
def test_objects_of_an_earlier_session_are_refused_on_every_rank(comm):
    """A session on several ranks starts with no declarations: an object declared in the
    previous one is refused with a message saying why, on every rank (nothing hangs)."""
    mc.reset_runtime(comm=comm)
    cells = mc.Set(8, "cells")
    old, older = mc.Dat(cells, 1, None, "old"), mc.Dat(cells, 1, None, "older")
    mc.partition("block", seed_set=cells)
    mc.reset_runtime(comm=comm)
    fresh_cells = mc.Set(8, "cells")
    fresh = mc.Dat(fresh_cells, 1, None, "fresh")
    mc.partition("block", seed_set=fresh_cells)
    with pytest.raises(mc.DeclarationError, match="Dat 'old' belongs to another meshchain session"):
        mc.par_loop(copy, cells, old(mc.READ), older(mc.WRITE))
    with pytest.raises(mc.DeclarationError, match="belongs to another meshchain session"):
        old.data_ro
    with pytest.raises(mc.DeclarationError, match="Set 'cells' is not part of this session's mesh"):
        mc.Dat(cells, 1, None, "new_on_old")
    mc.par_loop(copy, fresh_cells, fresh(mc.READ), mc.Dat(fresh_cells, 1, None, "out")(mc.WRITE))
    mc.flush()
