"""Load imbalance measured and removed: Airfoil with a costly wall model, then ``mc.rebalance()``.

Airfoil (``meshchain.apps.airfoil``) partitioned by blocks of node numbers: the NACA0012
O-mesh numbers its nodes ring by ring from the aerofoil outwards, so rank 0 owns the whole
wall. A stand-in for a wall model (a loop over the wall's boundary edges only, with
``--wall-work`` arithmetic operations per edge, like AWM-Olsen's absorbing layers that
run on some ranks only) makes rank 0 the slowest, and every other rank waits for its
messages. ``mc.stats(all_ranks=True)`` shows the imbalance (max/mean of each rank's
compute seconds); ``mc.rebalance("rib", coords=...)`` weighs every node by the measured
cost of the iterations it owns and repartitions: the rms history does not change, the
imbalance and the time per iteration drop.

Usage::

    mpiexec -n 2 python examples/rebalance.py                 # 2 ranks, naca0012(60, 90)
    mpiexec -n 4 python examples/rebalance.py --size 100 150 --iters 40 --wall-work 20000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import meshchain as mc
from meshchain.apps import airfoil
from meshchain.meshes import naca0012

WALL_MODEL = """
def wall_model(x1, x2, shear):
    dx = x1[0] - x2[0]
    dy = x1[1] - x2[1]
    s = 0.0
    for k in range({work}):
        s = s * 0.5 + dx * dx + dy * dy
    shear[0] = s
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, metavar=("I", "J"), default=(60, 90), help="naca0012(I, J)")
    parser.add_argument("--iters", type=int, default=20, help="iterations before and after rebalancing")
    parser.add_argument("--wall-work", type=int, default=20000, help="operations per wall edge per iteration")
    return parser.parse_args(argv)


def declare_wall(problem, mesh, work: int):
    """The wall's boundary edges as a set of their own, a map to their nodes, the model's kernel."""
    wall = np.flatnonzero(np.asarray(mesh.bound).reshape(-1) == 1)
    walls = mc.Set(len(wall), "walls")
    wall2node = mc.Map(walls, problem.p_x.dataset, 2, np.asarray(mesh.bedge)[wall], "wall2node")
    shear = mc.Dat(walls, 1, None, "shear")
    kernel = mc.Kernel.from_source(WALL_MODEL.format(work=work))
    return lambda: mc.par_loop(kernel, walls, problem.p_x(mc.READ, wall2node[0]), problem.p_x(mc.READ, wall2node[1]),
                               shear(mc.WRITE))


def run(problem, wall_model, iters: int, comm) -> float:
    """``iters`` iterations (each stage a CA chain, then the wall model); seconds per iteration."""
    mc.stats(reset=True)
    if comm is not None:
        comm.Barrier()
    began = time.perf_counter()
    for _ in range(iters):
        rms = airfoil.iterate(problem, ca=True)
        wall_model()
    mc.flush()
    if comm is not None:
        comm.Barrier()
    return (time.perf_counter() - began) / iters, rms


def main(argv=None) -> None:
    args = parse_args(argv)
    session = mc.get_runtime()
    comm, rank = session.comm, session.rank
    mesh = naca0012(*args.size)
    problem = airfoil.declare(mesh, partition=False)
    wall_model = declare_wall(problem, mesh, args.wall_work)
    mc.partition("block", coords=problem.p_x)
    run(problem, wall_model, 2, comm)  # compile, build plans
    before, _ = run(problem, wall_model, args.iters, comm)
    stats = mc.stats(all_ranks=True)
    result = mc.rebalance("rib", coords=problem.p_x)
    run(problem, wall_model, 2, comm)  # plans for the new partition
    after, rms_after = run(problem, wall_model, args.iters, comm)
    balanced = mc.stats(all_ranks=True)
    if rank == 0:
        for label, seconds, record in (("before", before, stats), ("after", after, balanced)):
            wall = record.imbalance.get("wall_model")
            chain = record.imbalance.get("chain stage")
            print(f"{label:>6} mc.rebalance: {seconds * 1e3:8.2f} ms per iteration; imbalance (max/mean of compute) "
                  f"wall_model {wall.compute_ratio if wall else float('nan'):.2f}, stage chain "
                  f"{chain.compute_ratio if chain else float('nan'):.2f}; waiting per rank (s) "
                  f"{' '.join(f'{w:.3f}' for w in chain.wait) if chain else '-'}")
        if result is not None:
            print("measured cost per iteration: " + ", ".join(f"{n} {c * 1e9:.0f} ns" for n, c in result.costs.items()))
            print(f"weights per rank before the move: max/mean {result.imbalance:.2f}")
        print(f"speed-up {before / after:.2f}x; rms after {2 * args.iters + 4} iterations {rms_after:.15e} "
              f"(the same as without rebalancing, to round-off)")


if __name__ == "__main__":
    main()
