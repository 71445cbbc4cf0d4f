"""Steady advection-diffusion at two Péclet numbers, solved by each nonsymmetric Krylov method.

The nonsymmetric ``mc.Mat`` is solved by every method of ``mc.solve`` asked for and checked
against a direct solve.

The operator and its data live in ``meshchain.apps.advection_diffusion``: P1 diffusion plus
first-order upwind advection on the median dual (an M-matrix), ``u = 1`` on the inflow side
``x = 0`` and ``u = 0`` on the rest of the boundary, velocity ``(1, 0.5)``. For each cell
Péclet number ``|v| h / (2 eps)`` the problem is assembled afresh and solved by every method
from ``x = 0``; rank 0 solves the same (serially assembled) system with SciPy's ``spsolve``.

Usage::

    python examples/advection_diffusion.py                            # Pe 1 and 100, 64 x 64 nodes
    python examples/advection_diffusion.py --peclet 1 10 100 --n 128 --pc sgs
    python examples/advection_diffusion.py --methods gmres bicgstab --restart 50
    mpiexec -n 4 python examples/advection_diffusion.py               # unchanged under MPI

The default preconditioner is ``bjacobi-ilu`` (PETSc's default). With ``--pc jacobi``,
pipelined BiCGStab diverges at Pe = 100, as PETSc's KSPPIPEBCGS does on the same matrix (its
recurrences amplify rounding): the script says so and exits with 1.

Prints, per Péclet number, a ``#`` line with the problem, then one line per method:
``<peclet> <method> <iterations> <true residual> <error vs direct>`` (the error is
``max|x - x_direct| / max|x_direct|``, ``-`` with ``--no-direct``). Exits with 1 if a
method is unknown or did not converge.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import meshchain as mc
from meshchain.apps import advection_diffusion as ad
from meshchain.linalg import PRECONDITIONERS
from meshchain.meshes import jittered_delaunay, structured_tris

METHODS = ("gmres", "pipegmres", "bicgstab", "pipebicgstab")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help=f"Krylov methods of mc.solve (default {' '.join(METHODS)})")
    parser.add_argument("--peclet", nargs="+", type=float, default=[1.0, 100.0],
                        help="cell Péclet numbers |v| h / (2 eps), one problem each (default 1 100)")
    parser.add_argument("--n", type=int, default=64, help="nodes per side (default 64)")
    parser.add_argument("--mesh", choices=("delaunay", "structured"), default="delaunay",
                        help="jittered Delaunay triangles or a structured triangle grid (default delaunay)")
    parser.add_argument("--pc", choices=[str(p) for p in PRECONDITIONERS], default="bjacobi-ilu",
                        help="preconditioner (default jacobi)")
    parser.add_argument("--rtol", type=float, default=1e-8, help="relative tolerance (default 1e-8)")
    parser.add_argument("--maxiter", type=int, default=5000, help="iteration limit (default 5000)")
    parser.add_argument("--restart", type=int, default=30, help="restart length of the GMRES methods (default 30)")
    parser.add_argument("--partition", choices=("rib", "kway", "block"), default="kway")
    parser.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True,
                        help="compare with SciPy's spsolve on rank 0 (default on)")
    return parser.parse_args(argv)


def mesh_for(kind: str, n: int):
    """``n x n`` nodes: jittered Delaunay triangles or a structured grid of triangles."""
    return jittered_delaunay(n * n, seed=0) if kind == "delaunay" else structured_tris(n - 1, n - 1)


def direct_solution(problem) -> np.ndarray | None:
    """SciPy's solution of the serially assembled system, on rank 0 (None elsewhere)."""
    from scipy.sparse.linalg import spsolve

    system = ad.reference(problem)
    return None if system is None else spsolve(system[0].tocsc(), system[1])


def run_method(problem, method: str, args) -> mc.linalg.SolveInfo | str:
    """The solve's info, or why ``mc.solve`` refused the method (the same on every rank)."""
    extra = {"restart": args.restart} if "gmres" in method else {}
    pc = None if args.pc == "None" else args.pc
    try:
        return ad.solve(problem, method=method, pc=pc, rtol=args.rtol, maxiter=args.maxiter, **extra)
    except mc.SolverError as exc:
        return str(exc)


def error_vs(x: np.ndarray | None, direct: np.ndarray | None) -> str:
    if x is None or direct is None:
        return "-"
    return f"{np.abs(x.ravel() - direct).max() / np.abs(direct).max():.3e}"


def solve_all(problem, args, rank: int) -> bool:
    """Every method on ``problem``, a line each on rank 0; True if all converged."""
    direct = direct_solution(problem) if args.direct else None
    if rank == 0:
        bounds = "" if direct is None else f" direct u in [{direct.min():.3g}, {direct.max():.3g}]"
        print(f"# Pe={problem.peclet:g} eps={problem.diffusion:.3e} h={problem.h:.3e} "
              f"unknowns={problem.mesh.nodes.size}{bounds}", flush=True)
    ok = True
    for method in args.methods:
        info = run_method(problem, method, args)
        if isinstance(info, str):
            if rank == 0:
                print(f"{problem.peclet:g} {method} - - unavailable", flush=True)
                print(f"{method}: {info}", file=sys.stderr)
            ok = False
            continue
        x = problem.x.gather()
        if rank == 0:
            print(f"{problem.peclet:g} {method} {info.iterations} {info.true_residual:.3e} "
                  f"{error_vs(x, direct)}", flush=True)
            if not info.converged:
                print(f"{method} did not converge at Pe={problem.peclet:g}: {info.reason}", file=sys.stderr)
        ok = ok and info.converged
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    rank = mc.get_runtime().rank
    mesh = mesh_for(args.mesh, args.n)
    if rank == 0:
        print("peclet method iterations true_residual error_vs_direct", flush=True)
    ok = True
    for peclet in args.peclet:
        mc.reset_runtime()  # a new problem: on several ranks it is declared and partitioned afresh
        problem = ad.declare(mesh, peclet=peclet, method=args.partition)
        ok = solve_all(problem, args, rank) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
