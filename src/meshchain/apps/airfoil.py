"""OP2's Airfoil: 2D inviscid Euler flow around a NACA0012 aerofoil, written with meshchain.

This is the solver library of OP2's Airfoil application (``apps/c/airfoil`` in OP2-Common):
its constants, its five kernels, the declaration of its sets, maps and dats, and its time
loop. The command-line driver is ``examples/airfoil.py``.

The five kernels and the constants follow OP2's ``airfoil.cpp`` exactly, operation
order included. OP2 assigns single-precision literals to its double constants
(``gam = 1.4f`` ...), so the constants below are the float32 values of those literals.

One iteration (:func:`iterate`) is ``save_soln`` over the cells, then two stages
(predictor and corrector, :func:`stage`), each of four loops::

    adt_calc   cells   reads p_x (through pcell), p_q; writes p_adt
    res_calc   edges   reads p_x, p_q, p_adt (through pedge, pecell); increments p_res
    bres_calc  bedges  reads p_x, p_q, p_adt, p_bound; increments p_res
    update     cells   reads p_qold, p_adt; writes p_q; zeroes p_res; increments rms

A stage can run as one loop chain named ``"stage"`` (``ca=True``: communication-avoiding,
``ca=False``: loop by loop, ``ca="auto"``), optionally sparse-tiled (``tile_size``).

Workload interface
------------------
:func:`setup`, :func:`step`, :data:`CHAIN`, :func:`loops_in_chain` and :func:`checksum`
run Airfoil as a profiling workload (see :mod:`meshchain.apps`): the main set is the
cells, the chain is one stage (4 loops).

Examples
--------
>>> import meshchain as mc
>>> from meshchain.apps import airfoil
>>> from meshchain.meshes import naca0012
>>> problem = airfoil.declare(naca0012(4, 6))
>>> history = airfoil.run(problem, 4, report_every=2, out=None)
>>> [it for it, _ in history], all(rms > 0 for _, rms in history)
([2, 4], True)
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import numpy as np

import meshchain as mc
from meshchain.meshes import AirfoilBlocks, AirfoilMesh, naca0012

from . import _check_chain_mode, _total_size

__all__ = [
    "gam", "gm1", "cfl", "eps", "mach", "alpha", "qinf",
    "save_soln", "adt_calc", "res_calc", "bres_calc", "update",
    "Airfoil", "declare", "reset", "stage", "record_stage", "iterate", "run", "open_output",
    "CHAIN", "setup", "step", "loops_in_chain", "checksum",
]


def _single(value: float) -> float:
    """The double value of a C ``float`` literal, as in ``double gam = 1.4f;``."""
    return float(np.float32(value))


gam = _single(1.4)
gm1 = gam - _single(1.0)
cfl = _single(0.9)
eps = _single(0.05)
mach = _single(0.4)
alpha = float(np.float32(3.0) * np.arctan(np.float32(1.0)) / np.float32(45.0))
_p, _r = _single(1.0), _single(1.0)
_u = math.sqrt(gam * _p / _r) * mach
_e = _p / (_r * gm1) + 0.5 * _u * _u
qinf = (_r, _r * _u, 0.0, _r * _e)


@mc.kernel
def save_soln(q, qold):
    for n in range(4):
        qold[n] = q[n]


@mc.kernel
def adt_calc(x1, x2, x3, x4, q, adt):
    ri = 1.0 / q[0]
    u = ri * q[1]
    v = ri * q[2]
    c = math.sqrt(gam * gm1 * (ri * q[3] - 0.5 * (u * u + v * v)))

    dx = x2[0] - x1[0]
    dy = x2[1] - x1[1]
    adt[0] = abs(u * dy - v * dx) + c * math.sqrt(dx * dx + dy * dy)

    dx = x3[0] - x2[0]
    dy = x3[1] - x2[1]
    adt[0] += abs(u * dy - v * dx) + c * math.sqrt(dx * dx + dy * dy)

    dx = x4[0] - x3[0]
    dy = x4[1] - x3[1]
    adt[0] += abs(u * dy - v * dx) + c * math.sqrt(dx * dx + dy * dy)

    dx = x1[0] - x4[0]
    dy = x1[1] - x4[1]
    adt[0] += abs(u * dy - v * dx) + c * math.sqrt(dx * dx + dy * dy)

    adt[0] = adt[0] / cfl


@mc.kernel
def res_calc(x1, x2, q1, q2, adt1, adt2, res1, res2):
    dx = x1[0] - x2[0]
    dy = x1[1] - x2[1]

    ri = 1.0 / q1[0]
    p1 = gm1 * (q1[3] - 0.5 * ri * (q1[1] * q1[1] + q1[2] * q1[2]))
    vol1 = ri * (q1[1] * dy - q1[2] * dx)

    ri = 1.0 / q2[0]
    p2 = gm1 * (q2[3] - 0.5 * ri * (q2[1] * q2[1] + q2[2] * q2[2]))
    vol2 = ri * (q2[1] * dy - q2[2] * dx)

    mu = 0.5 * (adt1[0] + adt2[0]) * eps

    f = 0.5 * (vol1 * q1[0] + vol2 * q2[0]) + mu * (q1[0] - q2[0])
    res1[0] += f
    res2[0] -= f
    f = 0.5 * (vol1 * q1[1] + p1 * dy + vol2 * q2[1] + p2 * dy) + mu * (q1[1] - q2[1])
    res1[1] += f
    res2[1] -= f
    f = 0.5 * (vol1 * q1[2] - p1 * dx + vol2 * q2[2] - p2 * dx) + mu * (q1[2] - q2[2])
    res1[2] += f
    res2[2] -= f
    f = 0.5 * (vol1 * (q1[3] + p1) + vol2 * (q2[3] + p2)) + mu * (q1[3] - q2[3])
    res1[3] += f
    res2[3] -= f


@mc.kernel
def bres_calc(x1, x2, q1, adt1, res1, bound):
    dx = x1[0] - x2[0]
    dy = x1[1] - x2[1]

    ri = 1.0 / q1[0]
    p1 = gm1 * (q1[3] - 0.5 * ri * (q1[1] * q1[1] + q1[2] * q1[2]))

    if bound[0] == 1:
        res1[1] += +p1 * dy
        res1[2] += -p1 * dx
    else:
        vol1 = ri * (q1[1] * dy - q1[2] * dx)

        ri = 1.0 / qinf[0]
        p2 = gm1 * (qinf[3] - 0.5 * ri * (qinf[1] * qinf[1] + qinf[2] * qinf[2]))
        vol2 = ri * (qinf[1] * dy - qinf[2] * dx)

        mu = adt1[0] * eps

        f = 0.5 * (vol1 * q1[0] + vol2 * qinf[0]) + mu * (q1[0] - qinf[0])
        res1[0] += f
        f = 0.5 * (vol1 * q1[1] + p1 * dy + vol2 * qinf[1] + p2 * dy) + mu * (q1[1] - qinf[1])
        res1[1] += f
        f = 0.5 * (vol1 * q1[2] - p1 * dx + vol2 * qinf[2] - p2 * dx) + mu * (q1[2] - qinf[2])
        res1[2] += f
        f = 0.5 * (vol1 * (q1[3] + p1) + vol2 * (qinf[3] + p2)) + mu * (q1[3] - qinf[3])
        res1[3] += f


@mc.kernel
def update(qold, q, res, adt, rms):
    adti = 1.0 / adt[0]
    for n in range(4):
        delta = adti * res[n]
        q[n] = qold[n] - delta
        res[n] = 0.0
        rms[0] += delta * delta


@dataclass
class Airfoil:
    """The sets, maps and dats of one Airfoil problem."""

    nodes: mc.Set
    edges: mc.Set
    bedges: mc.Set
    cells: mc.Set
    pedge: mc.Map
    pecell: mc.Map
    pbedge: mc.Map
    pbecell: mc.Map
    pcell: mc.Map
    p_bound: mc.Dat
    p_x: mc.Dat
    p_q: mc.Dat
    p_qold: mc.Dat
    p_adt: mc.Dat
    p_res: mc.Dat
    rms: mc.Global


def declare(mesh: AirfoilMesh | AirfoilBlocks, *, method: str = "rib", partition: bool = True) -> Airfoil:
    """Declare Airfoil's sets, maps and dats on ``mesh`` with the free-stream initial state,
    and partition them over the MPI ranks (nothing to do on one process; ``partition=False``:
    the caller declares more and calls ``mc.partition(method, coords=problem.p_x)`` itself)."""
    declared = mesh.declare()  # sets, maps, p_x and p_bound, named as in OP2's airfoil.cpp
    cells = declared.cells
    q0 = mesh.per_cell(qinf)  # whole, or this rank's rows of a mesh read in blocks
    problem = Airfoil(
        **{f.name: getattr(declared, f.name) for f in dataclasses.fields(declared)},
        p_q=mc.Dat(cells, 4, q0, "p_q"),
        p_qold=mc.Dat(cells, 4, None, "p_qold"),
        p_adt=mc.Dat(cells, 1, None, "p_adt"),
        p_res=mc.Dat(cells, 4, None, "p_res"),
        rms=mc.Global(1, 0.0, "rms"),
    )
    if partition:
        mc.partition(method, coords=problem.p_x)
    return problem


def reset(a: Airfoil) -> None:
    """Back to the free-stream initial state (to time repeated runs on the same data)."""
    a.p_q.data[:] = np.array(qinf)
    for dat in (a.p_qold, a.p_adt, a.p_res):
        dat.data[:] = 0.0
    a.rms.value = 0.0


def stage(a: Airfoil, *, ca=None, tile_size=None) -> None:
    """One predictor or corrector stage: adt_calc, res_calc, bres_calc, update; as one loop
    chain named ``"stage"`` unless ``ca`` is None (``tile_size``: sparse-tile the chain)."""
    if ca is None:
        record_stage(a)
        return
    with mc.loop_chain("stage", ca=ca, tile_size=tile_size):
        record_stage(a)


def record_stage(a: Airfoil, rms=None) -> None:
    """Record one stage's four loops (adt_calc, res_calc, bres_calc, update), zeroing
    ``a.rms`` before ``update``; or summing into ``rms``, a new Global (a captured step
    cannot set a value between its loops)."""
    mc.par_loop(adt_calc, a.cells,
                a.p_x(mc.READ, a.pcell[0]), a.p_x(mc.READ, a.pcell[1]),
                a.p_x(mc.READ, a.pcell[2]), a.p_x(mc.READ, a.pcell[3]),
                a.p_q(mc.READ), a.p_adt(mc.WRITE))
    mc.par_loop(res_calc, a.edges,
                a.p_x(mc.READ, a.pedge[0]), a.p_x(mc.READ, a.pedge[1]),
                a.p_q(mc.READ, a.pecell[0]), a.p_q(mc.READ, a.pecell[1]),
                a.p_adt(mc.READ, a.pecell[0]), a.p_adt(mc.READ, a.pecell[1]),
                a.p_res(mc.INC, a.pecell[0]), a.p_res(mc.INC, a.pecell[1]))
    mc.par_loop(bres_calc, a.bedges,
                a.p_x(mc.READ, a.pbedge[0]), a.p_x(mc.READ, a.pbedge[1]),
                a.p_q(mc.READ, a.pbecell[0]), a.p_adt(mc.READ, a.pbecell[0]),
                a.p_res(mc.INC, a.pbecell[0]), a.p_bound(mc.READ))
    if rms is None:
        rms = a.rms
        rms.value = 0.0
    mc.par_loop(update, a.cells,
                a.p_qold(mc.READ), a.p_q(mc.WRITE), a.p_res(mc.RW), a.p_adt(mc.READ), rms(mc.INC))


def captured_iteration(a: Airfoil, *, ca=False, tile_size=None):
    """One iteration as a step captured with ``mc.capture`` (see :mod:`meshchain.engine.capture`):
    its nine loops one chain (``ca``, ``tile_size``: its options), each stage's rms summed into
    a Global made inside the step (zero again at every replay). ``step()`` returns the last."""

    @mc.capture(name="iteration", ca=ca, tile_size=tile_size)
    def step():
        mc.par_loop(save_soln, a.cells, a.p_q(mc.READ), a.p_qold(mc.WRITE))
        for _ in range(2):
            rms = mc.Global(1, 0.0, "rms")
            record_stage(a, rms)
        return rms

    return step


def iterate(a: Airfoil, *, ca=None, tile_size=None) -> float:
    """One Airfoil iteration (save_soln, then two stages); returns OP2's rms."""
    mc.par_loop(save_soln, a.cells, a.p_q(mc.READ), a.p_qold(mc.WRITE))
    for _ in range(2):
        stage(a, ca=ca, tile_size=tile_size)
    return math.sqrt(float(a.rms.value[0]) / a.cells.size)


def run(a: Airfoil, iters: int, *, report_every: int = 100, out=sys.stdout, ca=None,
        tile_size=None, repartition_at: int | None = None, repartition_method: str = "rib",
        weights=None, start: int = 0, checkpoint: str | None = None,
        checkpoint_every: int | None = None, on_iteration=None, captured: bool = False) -> list[tuple[int, float]]:
    """Run iterations ``start + 1 .. iters``; print and return ``(iter, rms)`` every ``report_every``.
    ``ca``: run each stage as a loop chain (True, False or "auto"; None: no chain);
    ``tile_size``: sparse-tile each stage chain; ``repartition_at``: after that iteration,
    move the mesh to a new partition (``mc.repartition(repartition_method)``, the nodes'
    coordinates for ``"rib"``, ``weights`` per node if given); the rms history does not change.
    ``checkpoint``: a path to save the state to (:func:`save_state`) every ``checkpoint_every``
    iterations; a run restored from it (:func:`restore_state`, ``start`` = its iteration)
    prints the same rms history as an uninterrupted one. ``on_iteration``: called with the
    iteration number after each one (e.g. :func:`open_output`'s writer). ``captured``: each
    iteration replays a captured step (:func:`captured_iteration`; ``ca`` None runs it loop by loop)."""
    history = []
    step = captured_iteration(a, ca=False if ca is None else ca, tile_size=tile_size) if captured else None
    for it in range(start + 1, iters + 1):
        if step is not None:
            rms = math.sqrt(float(step().value[0]) / a.cells.size)
        else:
            rms = iterate(a, ca=ca, tile_size=tile_size)
        if it % report_every == 0:
            history.append((it, rms))
            if out is not None:
                print("%d %.15e" % (it, rms), file=out, flush=True)
        if it == repartition_at:
            mc.repartition(repartition_method, coords=a.p_x if repartition_method == "rib" else None,
                           weights=weights)
        if checkpoint is not None and checkpoint_every and it % checkpoint_every == 0:
            save_state(a, checkpoint, it)
        if on_iteration is not None:
            on_iteration(it)
    return history


def _state(a: Airfoil, iteration: int = 0) -> list:
    done = mc.Global(1, iteration, "iteration", dtype=np.int64)
    return [a.p_q, a.p_qold, a.p_adt, a.p_res, a.rms, done]


def save_state(a: Airfoil, path: str, iteration: int) -> None:
    """Checkpoint the flow state after ``iteration`` (collective, atomic; any rank count restores it)."""
    mc.checkpoint(path, _state(a, iteration))


def restore_state(a: Airfoil, path: str) -> int:
    """Load a state saved by :func:`save_state` (on any rank count); returns its iteration."""
    objects = _state(a)
    mc.restore(path, objects)
    return int(objects[-1].value[0])


@mc.kernel
def flow_variables(q, density, velocity, pressure):
    density[0] = q[0]
    velocity[0] = q[1] / q[0]
    velocity[1] = q[2] / q[0]
    pressure[0] = gm1 * (q[3] - 0.5 * (q[1] * q[1] + q[2] * q[2]) / q[0])


def open_output(a: Airfoil, directory: str, *, every: int = 100, keep_until: int | None = None):
    """A ParaView time series (:class:`meshchain.Output`, XDMF + HDF5) of the flow in
    ``directory``: per cell the density, velocity, pressure and the conserved variables ``q``.
    Returns ``write(iteration)``, which writes a step when ``iteration`` is a multiple of
    ``every`` (time = iteration); ``keep_until``: continue the series of a restarted run."""
    cells = a.cells
    fields = {"density": mc.Dat(cells, 1, None, "density"), "velocity": mc.Dat(cells, 2, None, "velocity"),
              "pressure": mc.Dat(cells, 1, None, "pressure"), "q": a.p_q}
    out = mc.Output(directory, coords=a.p_x, cells=a.pcell, name="airfoil", keep_until=keep_until)

    def write(iteration: int) -> None:
        if iteration % every:
            return
        mc.par_loop(flow_variables, cells, a.p_q(mc.READ), fields["density"](mc.WRITE),
                    fields["velocity"](mc.WRITE), fields["pressure"](mc.WRITE))
        out.write(iteration, fields)

    return write


# -- workload interface (see meshchain.apps) ---------------------------------------------

CHAIN = "stage"
"""The name of Airfoil's loop chain: one predictor or corrector stage."""

_STAGE_LOOPS = 4  # adt_calc, res_calc, bres_calc, update
_MIN_I = 8  # smallest generated mesh: naca0012(8, 12), 288 cells


def setup(*, per_rank: int, loops: int, method: str = "rib") -> Airfoil:
    """Generate a NACA0012 mesh with about ``per_rank`` cells per MPI rank, declare
    Airfoil on it and partition it.

    Parameters
    ----------
    per_rank : int, keyword-only
        Cells each rank should own. ``naca0012(I, J)`` has ``3 I J`` cells; ``J / I = 1.5``
        as in OP2's 400 x 600 mesh, so ``I = round(sqrt(per_rank * nranks / 4.5))``
        (at least 8) and ``J = round(1.5 I)``.
    loops : int, keyword-only
        Ignored: Airfoil's chain always has 4 loops (see :func:`loops_in_chain`).
    method : {"rib", "kway", "block"}, keyword-only
        Partitioner (see :func:`meshchain.partition`).

    Returns
    -------
    Airfoil
        The declared, partitioned problem in its free-stream initial state.

    Raises
    ------
    meshchain.ConfigurationError
        ``per_rank`` is not a positive integer.

    Examples
    --------
    >>> from meshchain.apps import airfoil
    >>> problem = airfoil.setup(per_rank=300, loops=4)
    >>> problem.cells.size  # naca0012(8, 12)
    288
    """
    return declare(naca0012(*_mesh_size(_total_size(per_rank))), method=method)


def _mesh_size(ncell: int) -> tuple[int, int]:
    """``(I, J)`` with ``J / I = 1.5`` such that ``naca0012(I, J)`` has about ``ncell``
    (``3 I J``) cells; at least ``(8, 12)``.

    >>> _mesh_size(720000)
    (400, 600)
    """
    i = max(_MIN_I, round(math.sqrt(ncell / 4.5)))
    return i, (3 * i + 1) // 2  # J = 1.5 I, halves rounded up


def step(problem: Airfoil, *, ca) -> None:
    """One Airfoil iteration: ``save_soln``, then the two stages, each run as
    ``mc.loop_chain("stage", ca=ca)``.

    Parameters
    ----------
    problem : Airfoil
        A problem from :func:`setup` (or :func:`declare`).
    ca : True, False or "auto", keyword-only
        The chain mode, as for :class:`meshchain.loop_chain`; None (no chain) is refused.

    Examples
    --------
    >>> import meshchain as mc
    >>> from meshchain.apps import airfoil
    >>> problem = airfoil.setup(per_rank=300, loops=4)
    >>> airfoil.step(problem, ca=True)
    >>> mc.stats().chains["stage"].executions >= 2  # the predictor and the corrector
    True
    """
    _check_chain_mode(ca)
    iterate(problem, ca=ca)


def loops_in_chain(loops: int) -> int:
    """The loops in Airfoil's chain: always 4 (adt_calc, res_calc, bres_calc, update),
    whatever ``loops`` asks for.

    Examples
    --------
    >>> from meshchain.apps import airfoil
    >>> airfoil.loops_in_chain(8)
    4
    """
    return _STAGE_LOOPS


def checksum(problem: Airfoil) -> float | None:
    """The sum of ``|q|`` over all cells and components, on rank 0 (None on other ranks).

    The same, to rounding, for every rank count and chain mode: the increments of
    ``res_calc`` are summed in an order that depends on the partition.

    Examples
    --------
    >>> from meshchain.apps import airfoil
    >>> problem = airfoil.setup(per_rank=300, loops=4)
    >>> total = airfoil.checksum(problem)  # free stream: 288 cells of |qinf|
    >>> abs(total - 288 * sum(abs(v) for v in airfoil.qinf)) < 1e-9
    True
    """
    q = problem.p_q.gather()
    return None if q is None else float(np.abs(q).sum())
