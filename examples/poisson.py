"""P1 finite elements for -Δu = f with a manufactured solution: assemble a mc.Mat, solve with mc.solve.

The boundary conditions go through a ``mc.Subset`` of the nodes (``problem.wall``): a loop over it
flags the Dirichlet nodes, and ``A.zero_rows(wall)`` gives their rows a unit diagonal.

The kernels and the problem live in ``meshchain.apps.poisson``; this script refines the mesh,
solves on each, and prints the error and its rate of convergence (2 for P1 in this norm).

Usage::

    python examples/poisson.py                                   # triangles, 16 32 64
    python examples/poisson.py --cell tetra --sizes 4 8 16        # GeoFEM's cube, tetrahedra
    python examples/poisson.py --method pipecg --pc sgs
    mpiexec -n 4 python examples/poisson.py --method pipecg       # unchanged under MPI

Every line: ``<n> <unknowns> <iterations> <true residual> <error> <rate>``.
"""

from __future__ import annotations

import argparse
import math
import sys

import meshchain as mc
from meshchain.apps import poisson
from meshchain.linalg import METHODS, PRECONDITIONERS
from meshchain.meshes import structured_tets, structured_tris


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", choices=("triangle", "tetra"), default="triangle",
                        help="unit square of triangles or unit cube of tetrahedra (default triangle)")
    parser.add_argument("--sizes", nargs="+", type=int, help="cells per side, one solve each "
                        "(default 16 32 64 for triangles, 4 8 16 for tetrahedra)")
    parser.add_argument("--method", choices=METHODS, default="cg", help="Krylov method (default cg)")
    parser.add_argument("--pc", choices=[str(p) for p in PRECONDITIONERS], default="jacobi",
                        help="preconditioner (default jacobi)")
    parser.add_argument("--rtol", type=float, default=1e-10, help="relative tolerance (default 1e-10)")
    parser.add_argument("--partition", choices=("rib", "kway", "block"), default="kway")
    return parser.parse_args(argv)


def mesh_for(cell: str, n: int):
    return structured_tris(n, n) if cell == "triangle" else structured_tets(n, n, n)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = args.sizes or ([16, 32, 64] if args.cell == "triangle" else [4, 8, 16])
    pc = None if args.pc == "None" else args.pc
    rank = mc.get_runtime().rank
    previous = None
    for n in sizes:
        mc.reset_runtime()  # a new mesh: on several ranks it is declared and partitioned afresh
        problem = poisson.declare(mesh_for(args.cell, n), method=args.partition)
        info = poisson.solve(problem, method=args.method, pc=pc, rtol=args.rtol)
        err = poisson.error(problem)
        rate = "" if previous is None else f"{math.log2(previous / err):.2f}"
        if rank == 0:
            print(f"{n} {problem.mesh.nodes.size} {info.iterations} {info.true_residual:.3e} {err:.4e} {rate}",
                  flush=True)
        if not info.converged:
            print(f"rank {rank}: {args.method} did not converge: {info.reason}", file=sys.stderr)
            return 1
        previous = err
    return 0


if __name__ == "__main__":
    sys.exit(main())
