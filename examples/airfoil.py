"""OP2's Airfoil: 2D inviscid Euler flow around a NACA0012 aerofoil, written with meshchain.

The five kernels and the constants follow OP2's ``airfoil.cpp`` exactly, operation
order included. OP2 assigns single-precision literals to its double constants
(``gam = 1.4f`` ...), so the constants below are the float32 values of those literals.

Usage::

    python examples/airfoil.py                      # generated 720000-cell mesh, 1000 iterations
    python examples/airfoil.py --mesh new_grid.dat  # OP2 ASCII mesh
    python examples/airfoil.py --size 100 150 --iters 200 --backend reference

Every 100 iterations it prints one line ``<iter> <rms>`` (rms as ``%.15e``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

import meshchain as mc
from meshchain.meshes import AirfoilMesh, naca0012, read_op2_ascii


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


def declare(mesh: AirfoilMesh, *, method: str = "rib") -> Airfoil:
    """Declare Airfoil's sets, maps and dats on ``mesh`` with the free-stream initial state,
    and partition them over the MPI ranks (nothing to do on one process)."""
    declared = mesh.declare()  # sets, maps, p_x and p_bound, named as in OP2's airfoil.cpp
    cells = declared.cells
    q0 = np.tile(np.array(qinf, dtype=np.float64), (mesh.ncell, 1))
    problem = Airfoil(
        **{f.name: getattr(declared, f.name) for f in dataclasses.fields(declared)},
        p_q=mc.Dat(cells, 4, q0, "p_q"),
        p_qold=mc.Dat(cells, 4, None, "p_qold"),
        p_adt=mc.Dat(cells, 1, None, "p_adt"),
        p_res=mc.Dat(cells, 4, None, "p_res"),
        rms=mc.Global(1, 0.0, "rms"),
    )
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


def record_stage(a: Airfoil) -> None:
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
    a.rms.value = 0.0
    mc.par_loop(update, a.cells,
                a.p_qold(mc.READ), a.p_q(mc.WRITE), a.p_res(mc.RW), a.p_adt(mc.READ), a.rms(mc.INC))


def iterate(a: Airfoil, *, ca=None, tile_size=None) -> float:
    """One Airfoil iteration (save_soln, then two stages); returns OP2's rms."""
    mc.par_loop(save_soln, a.cells, a.p_q(mc.READ), a.p_qold(mc.WRITE))
    for _ in range(2):
        stage(a, ca=ca, tile_size=tile_size)
    return math.sqrt(float(a.rms.value[0]) / a.cells.size)


def run(a: Airfoil, iters: int, *, report_every: int = 100, out=sys.stdout, ca=None,
        tile_size=None) -> list[tuple[int, float]]:
    """Run ``iters`` iterations; print and return ``(iter, rms)`` every ``report_every``.
    ``ca``: run each stage as a loop chain (True, False or "auto"; None: no chain);
    ``tile_size``: sparse-tile each stage chain."""
    history = []
    for it in range(1, iters + 1):
        rms = iterate(a, ca=ca, tile_size=tile_size)
        if it % report_every == 0:
            history.append((it, rms))
            if out is not None:
                print("%d %.15e" % (it, rms), file=out, flush=True)
    return history


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", help="OP2 ASCII mesh (new_grid.dat format); default: generated NACA0012 O-mesh")
    parser.add_argument("--size", nargs=2, type=int, metavar=("I", "J"), default=(400, 600),
                        help="generated mesh size, as OP2's generator (default 400 600: 720000 cells)")
    parser.add_argument("--iters", type=int, default=1000, help="iterations (default 1000)")
    parser.add_argument("--backend", choices=("numba", "reference"), help="execution backend")
    parser.add_argument("--threads", type=int, help="threads for the numba backend")
    parser.add_argument("--partition", choices=("rib", "kway", "block"), default="rib",
                        help="how to distribute the mesh under mpiexec (default rib)")
    parser.add_argument("--chain", choices=("none", "ca", "per-loop", "auto"), default="none",
                        help="run each stage as a loop chain: communication-avoiding, loop by loop, or auto")
    parser.add_argument("--tile-size", type=int, help="sparse-tile each stage chain (needs --chain ca or auto)")
    parser.add_argument("--timing", action="store_true", help="print time per iteration and mc.stats() to stderr")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    options = {k: v for k, v in (("backend", args.backend), ("threads", args.threads)) if v is not None}
    if options:
        mc.configure(**options)
    mesh = read_op2_ascii(args.mesh) if args.mesh else naca0012(*args.size)
    problem = declare(mesh, method=args.partition)
    ncell = mesh.ncell
    del mesh  # after partitioning each rank keeps only its part
    rank = mc.get_runtime().comm.rank if mc.get_runtime().comm is not None else 0
    start = time.perf_counter()
    ca = {"none": None, "ca": True, "per-loop": False, "auto": "auto"}[args.chain]
    if args.tile_size is not None and ca is None:
        ca = True  # tiling needs a chain
    run(problem, args.iters, out=sys.stdout if rank == 0 else None, ca=ca, tile_size=args.tile_size)
    elapsed = time.perf_counter() - start
    stats = mc.stats()
    if args.timing and rank == 0:
        print(f"{elapsed / max(args.iters, 1) * 1e3:.3f} ms per iteration ({ncell} cells)", file=sys.stderr)
        print(stats, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
