"""Pipelined CG methods inside compiled calls, against their Python loops, cg and PETSc.

``pipecg``, ``pipecr`` and ``groppcg`` with an assembled matrix, ``pc=None`` or ``"jacobi"`` and
no ``monitor`` run their iterations inside compiled calls (:mod:`meshchain.linalg.compiled`:
``pipecg_iterations``, ``pipecr_iterations``, ``groppcg_iterations``), each sum of an iteration
an ``MPI_Iallreduce`` in flight while the operator (groppcg: or the preconditioner) is
applied. Per job (``mpiexec -n R``, ``--network shm|tcp``) on the P1 Poisson problem of
:mod:`meshchain.apps.poisson` (``structured_tets``, about ``--per-rank`` unknowns per rank),
whole solves from ``x = 0`` to ``--rtol`` with Jacobi (set-up, iterations, the true residual at
exit) in interleaved rounds, median of ``--repeats``, slowest rank, per method:

* **cg**: meshchain's ``cg``, the reference a user compares with;
* **compiled**: ``mc.solve(..., method=method)`` as a user calls it;
* **loop**: the same with a ``monitor`` that does nothing, which makes it run its Python loop
  over compiled passes (how every solve of it ran before); the same bits (``same_bits``);
* **PETSc**: ``KSPSolve`` of KSPPIPECG, KSPPIPECR or KSPGROPPCG with PCJACOBI on the same matrix
  (``A.to_petsc()``), set up once.

Usage::

    .venv/bin/python benchmarks/pipelined.py                  # 1 and 2 ranks, shm and tcp
    .venv/bin/python benchmarks/pipelined.py --ranks 2 --network tcp --per-rank 2000

Writes ``benchmarks/results/pipelined.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import petsc_solver, poisson_problem, solve_row, solver_arguments, solver_main  # noqa: E402

METHODS = ("pipecg", "pipecr", "groppcg")


def worker(config: dict) -> dict:
    """One job: per pipelined method, the four variants' whole solves (module docstring)."""
    import meshchain as mc

    comm, ranks, problem = poisson_problem(config["per_rank"])
    rows = []
    for method in config["methods"]:
        def ours(method: str, monitor=None):
            problem.u.data[...] = 0.0
            info = mc.solve(problem.A, problem.u, problem.b, method=method, pc="jacobi", rtol=config["rtol"],
                            monitor=monitor)
            return info.iterations, info.residual_history

        variants = {"cg": lambda: ours("cg"), "compiled": lambda m=method: ours(m),
                    "loop": lambda m=method: ours(m, lambda i, norm: None),
                    "PETSc": petsc_solver(problem, method, "jacobi", config["rtol"])}
        row = solve_row(comm, variants, config["repeats"], ("compiled", "loop"), method=method,
                        unknowns=problem.mesh.nodes.size)
        rows.append(row)
    return {"ranks": ranks, "rows": rows} if comm is None or comm.rank == 0 else {}


def table(results: list) -> str:
    lines = ["| network | ranks | unknowns | method | its (cg, PETSc) | cg ms | compiled ms | loop ms "
             "| compiled ÷ loop | PETSc ms | compiled ÷ PETSc | compiled ÷ cg | same bits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for row in result["rows"]:
            ms = {name: row[name]["seconds"] * 1e3 for name in ("cg", "compiled", "loop", "PETSc")}
            lines.append(
                f"| {result['network']} | {result['ranks']} | {row['unknowns']} | {row['method']} "
                f"| {row['compiled']['iterations']} ({row['cg']['iterations']}, {row['PETSc']['iterations']}) "
                f"| {ms['cg']:.2f} | {ms['compiled']:.2f} | {ms['loop']:.2f} | {ms['compiled'] / ms['loop']:.2f} "
                f"| {ms['PETSc']:.2f} | {ms['compiled'] / ms['PETSc']:.2f} | {ms['compiled'] / ms['cg']:.2f} "
                f"| {'yes' if row['same_bits'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = solver_arguments(__doc__.splitlines()[0], repeats=11, out=str(HERE / "results" / "pipelined.json"))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    args = parser.parse_args(argv)
    return solver_main(__file__, args, worker, table, "pipelined CG", "Jacobi", methods=args.methods)


if __name__ == "__main__":
    sys.exit(main())
