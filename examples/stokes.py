"""Stokes flow, stabilised P1-P1: a block system on a mixed space, solved by PETSc with a Schur field split.

Velocity (dim 2) and pressure (dim 1) live on the nodes of a triangle mesh of the unit square:
``mc.MixedSet([nodes, nodes])``, unknowns a ``mc.MixedDat``, the matrix a block ``mc.Mat`` assembled
by one loop whose kernel fills a 9 x 9 element block (six velocity rows, three pressure rows)
through a ``mc.MixedMap``. The wall is a ``mc.Subset``; ``K.zero_rows(wall, component=0)`` sets its
velocity rows. PETSc solves it (``method="petsc"``) with FGMRES around a Schur-complement field split
over the two components (``meshchain.apps.stokes.SCHUR``); needs petsc4py.

The kernels and the problem live in ``meshchain.apps.stokes``; this script refines the mesh, solves
on each, and prints the errors and their rates (velocity 2, pressure about 1.5).

Usage::

    python examples/stokes.py                        # 8 16 32 cells per side
    python examples/stokes.py --sizes 16 32 64 --beta 0.1
    mpiexec -n 3 python examples/stokes.py           # unchanged under MPI

Every line: ``<n> <unknowns> <iterations> <velocity error> <rate> <pressure error> <rate>``.
"""

from __future__ import annotations

import argparse
import math
import sys

import meshchain as mc
from meshchain.apps import stokes
from meshchain.meshes import structured_tris


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[8, 16, 32], help="cells per side, one solve each")
    parser.add_argument("--beta", type=float, default=0.2, help="the pressure stabilisation (default 0.2)")
    parser.add_argument("--rtol", type=float, default=1e-10, help="relative tolerance (default 1e-10)")
    parser.add_argument("--partition", choices=("rib", "kway", "block"), default="kway")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = mc.get_runtime().rank
    previous = None
    for n in args.sizes:
        mc.reset_runtime()  # a new mesh: on several ranks it is declared and partitioned afresh
        problem = stokes.declare(structured_tris(n, n), beta=args.beta, method=args.partition)
        info = stokes.solve(problem, rtol=args.rtol)
        errors = stokes.errors(problem)
        rates = ["" if previous is None else f"{math.log2(p / e):.2f}" for p, e in zip(previous or errors, errors)]
        if rank == 0:
            print(f"{n} {3 * problem.mesh.nodes.size} {info.iterations} {errors[0]:.4e} {rates[0]} {errors[1]:.4e} "
                  f"{rates[1]}", flush=True)
        if not info.converged:
            print(f"rank {rank}: the Stokes solve did not converge: {info.reason}", file=sys.stderr)
            return 1
        previous = errors
    return 0


if __name__ == "__main__":
    sys.exit(main())
