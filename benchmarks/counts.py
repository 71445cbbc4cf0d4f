"""Iteration counts against PETSc's, and how much they mean: the nonsymmetric methods on
``examples/advection_diffusion.py``'s default mesh, with the right-hand side perturbed.

Issue 33 asks for iteration counts within one of PETSc's, same method and preconditioner,
same matrix. Where a method amplifies rounding, one count says little: this benchmark solves
each case with the example's right-hand side ``b`` and with ``--samples - 1`` copies of it
perturbed by ``--perturbation`` relative noise (1e-13: far below the accuracy of any data),
each by PETSc (driven by hand, the options of ``tests/test_nonsymmetric.py``) and by
``mc.solve``, and reports per case:

* the counts with ``b`` itself, PETSc's reason and each solve's *true* relative residual
  ``||b - A x|| / ||b||`` (PETSc's tested norm is the recursive one);
* over the perturbed copies: the mean, spread and range of each side's counts, and how many
  solves stopped as converged with a true residual above ten times the tolerance ("false
  convergence") or as diverged.

Per job (``mpiexec -n R``, ``R`` in ``--ranks``; shared memory: no timing here). Needs petsc4py
(``make test`` builds it).

Usage::

    .venv/bin/python benchmarks/counts.py                       # 1-3 ranks, 25 samples (about 30 s)
    .venv/bin/python benchmarks/counts.py --ranks 3 --samples 9

Writes ``benchmarks/results/counts.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import launch, machine, petsc_ksp, petsc_nonsymmetric, serve, user_environment, write_run  # noqa: E402

CASES = (("gmres", "jacobi"), ("gmres", "bjacobi-ilu"), ("pipegmres", "jacobi"), ("bicgstab", "jacobi"),
         ("bicgstab", "bjacobi-ilu"), ("pipebicgstab", "jacobi"), ("pipebicgstab", "bjacobi-ilu"))
FALSE = 10.0  # a converged solve whose true residual is above this many times the tolerance stopped falsely


def petsc_solve(problem, method: str, pc: str, rtol: float) -> dict:
    """PETSc's ``method`` on the problem from ``x = 0``: iterations, reason, true relative residual."""
    ksp_type, petsc_pc, options = petsc_nonsymmetric(method, pc)
    ksp, A, b = petsc_ksp(problem, ksp_type, options, rtol=rtol, maxiter=3000, pc=petsc_pc)
    x, r = b.duplicate(), b.duplicate()
    x.set(0.0)
    ksp.solve(b, x)
    A.mult(x, r)
    r.aypx(-1.0, b)
    result = {"iterations": ksp.getIterationNumber(), "diverged": ksp.getConvergedReason() < 0,
              "true": r.norm() / b.norm()}
    for obj in (ksp, x, r, b, A):
        obj.destroy()
    return result


def counts_worker(config: dict) -> dict:
    import warnings

    from mpi4py import MPI

    import meshchain as mc
    from meshchain.apps import advection_diffusion as ad
    from meshchain.meshes import jittered_delaunay

    warnings.filterwarnings("ignore", category=mc.MeshchainWarning)
    comm, rtol, rows = MPI.COMM_WORLD, config["rtol"], []
    for peclet in config["peclet"]:
        mc.reset_runtime(comm=comm)
        problem = ad.declare(jittered_delaunay(config["n"] ** 2, seed=0), peclet=peclet)
        exact = problem.b.data.copy()
        b_norm = np.sqrt(comm.allreduce(float(np.sum(exact ** 2))))
        for method, pc in CASES:
            solves = []
            for sample in range(config["samples"]):  # sample 0: the example's b itself
                noise = np.random.default_rng(sample + 1000 * comm.rank).standard_normal(exact.shape)
                problem.b.data[...] = exact * (1.0 + (config["perturbation"] * noise if sample else 0.0))
                theirs = petsc_solve(problem, method, pc, rtol)
                info = ad.solve(problem, method=method, pc=pc, rtol=rtol)
                ours = {"iterations": info.iterations, "diverged": info.reason.startswith("diverged"),
                        "true": info.true_residual / b_norm, "converged": info.converged}
                solves.append({"petsc": theirs, "meshchain": ours})
            problem.b.data[...] = exact
            rows.append({"peclet": peclet, "method": method, "pc": pc, "solves": solves})
    return {"rows": rows, "nodes": config["n"] ** 2}


WORKERS = {"counts": counts_worker}


# --- the table -----------------------------------------------------------------------------------


def summary(solves: list, side: str, rtol: float) -> dict:
    """Counts of one side over the perturbed solves (all but the first), and its stops."""
    counts = np.array([s[side]["iterations"] for s in solves[1:]], dtype=float)
    falsely = sum(1 for s in solves if not s[side]["diverged"] and s[side]["true"] > FALSE * rtol)
    return {"mean": counts.mean(), "sd": counts.std(), "low": int(counts.min()), "high": int(counts.max()),
            "false": falsely, "diverged": sum(1 for s in solves if s[side]["diverged"])}


def table(results: list, rtol: float, samples: int) -> str:
    lines = [f"| ranks | Péclet | method | pc | with b: PETSc (true) | meshchain (true) | perturbed: PETSc mean ± sd "
             f"[range] | meshchain | false stops of {samples}: PETSc / meshchain | diverged: PETSc / meshchain |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for row in result["rows"]:
            first = row["solves"][0]
            p, m = (summary(row["solves"], side, rtol) for side in ("petsc", "meshchain"))
            lines.append(
                f"| {result['ranks']} | {row['peclet']:g} | {row['method']} | {row['pc']} | "
                f"{first['petsc']['iterations']} ({first['petsc']['true']:.0e}) | "
                f"{first['meshchain']['iterations']} ({first['meshchain']['true']:.0e}) | "
                f"{p['mean']:.1f} ± {p['sd']:.1f} [{p['low']}, {p['high']}] | "
                f"{m['mean']:.1f} ± {m['sd']:.1f} [{m['low']}, {m['high']}] | {p['false']} / {m['false']} | "
                f"{p['diverged']} / {m['diverged']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--samples", type=int, default=25, help="solves per case: b itself and perturbed copies")
    parser.add_argument("--perturbation", type=float, default=1e-13, help="relative noise on b (default 1e-13)")
    parser.add_argument("--n", type=int, default=64, help="nodes per side of the example's mesh (default 64)")
    parser.add_argument("--peclet", nargs="+", type=float, default=[1.0, 100.0])
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--out", default=str(HERE / "results" / "counts.json"))
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve(WORKERS[args.worker], json.loads(args.config))
    if args.samples < 2:
        parser.error("--samples must be at least 2 (b itself and one perturbed copy)")
    config = {"samples": args.samples, "perturbation": args.perturbation, "n": args.n, "peclet": args.peclet,
              "rtol": args.rtol}
    info, began, results = machine(), time.perf_counter(), []
    for ranks in args.ranks:
        print(f"[counts] {ranks} ranks ...", file=sys.stderr, flush=True)
        result = launch(__file__, ["counts"], ranks, "shm", user_environment(), config, args.timeout, "counts")
        results.append(dict(result, ranks=ranks))
    total = time.perf_counter() - began
    print(f"{info['cpu']}; {info['mpi']}; `jittered_delaunay({args.n}**2, seed=0)`, rtol {args.rtol:g}, "
          f"{args.samples - 1} copies of b with {args.perturbation:g} relative noise; true residuals relative "
          f"to ||b||; a false stop: converged with a true residual above {FALSE:g} x rtol; whole run "
          f"{total:.0f} s.\n")
    print(table(results, args.rtol, args.samples))
    write_run(args.out, info, config, total, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
