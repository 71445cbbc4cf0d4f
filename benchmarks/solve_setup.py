"""Repeated solves with one matrix: the preconditioner's set-up kept, as PETSc keeps it.

A time-stepping code solves with the same matrix at every step. PETSc sets its
preconditioner up once (``KSPSolve`` sets ``PCSetUp`` again only when the operator
changed); ``mc.solve`` keeps the set-up of ``"jacobi"``, ``"sgs"``, ``"bjacobi-ilu"`` and
``"chebyshev"`` with an assembled matrix while its values and layout are unchanged
(:mod:`meshchain.linalg.precond`). Per job (``mpiexec -n R``, ``--network shm|tcp``) on the
P1 Poisson problem of :mod:`meshchain.apps.poisson` (``structured_tets``, about
``--per-rank`` unknowns per rank), CG from ``x = 0`` to ``--rtol``, whole solves (set-up,
iterations, the true residual at exit) in interleaved rounds, median of ``--repeats``,
slowest rank:

* **kept**: ``mc.solve`` as a user calls it again and again;
* **set up every solve**: the same with nothing kept (``precond._KEPT = ()``, how every
  solve ran before);
* **PETSc**: ``KSPSolve`` of KSPCG with PCJACOBI, PCBJACOBI/PCILU (``bjacobi-ilu``) and
  PCSOR with ``-pc_sor_local_symmetric`` (``sgs``: one local symmetric Gauss-Seidel sweep)
  on the same matrix (``A.to_petsc()``), set up once; none for ``chebyshev`` (PETSc's
  Chebyshev is a KSP, not a PC).

Both meshchain variants take the same iterations and give the same bits (the JSON's
``same_bits``). Usage::

    .venv/bin/python benchmarks/solve_setup.py                   # 1 and 2 ranks, shm and tcp
    .venv/bin/python benchmarks/solve_setup.py --ranks 1 --per-rank 2000

Writes ``benchmarks/results/solve_setup.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import petsc_solver, poisson_problem, solve_row, solver_arguments, solver_main  # noqa: E402

PCS = ("jacobi", "sgs", "bjacobi-ilu", "chebyshev")
PETSC_PC = {"jacobi": ("jacobi", {}), "bjacobi-ilu": ("bjacobi", {}),
            "sgs": ("sor", {"pc_sor_local_symmetric": None})}
"""PETSc's PC (and options) for each of meshchain's, where PETSc has the same one."""


def worker(config: dict) -> dict:
    """One job: per preconditioner, the three variants' whole solves (module docstring)."""
    import meshchain as mc
    from meshchain.linalg import precond

    comm, ranks, problem = poisson_problem(config["per_rank"])
    kept = precond._KEPT
    rows = []
    for pc in PCS:
        def ours(keep: bool, pc=pc):
            precond._KEPT = kept if keep else ()
            try:
                problem.u.data[...] = 0.0
                info = mc.solve(problem.A, problem.u, problem.b, method="cg", pc=pc, rtol=config["rtol"])
            finally:
                precond._KEPT = kept
            return info.iterations, info.residual_history

        variants = {"kept": lambda: ours(True), "set up every solve": lambda: ours(False)}
        if pc in PETSC_PC:
            kind, options = PETSC_PC[pc]
            variants["PETSc"] = petsc_solver(problem, "cg", kind, config["rtol"], options)
        row = solve_row(comm, variants, config["repeats"], ("kept", "set up every solve"), pc=pc,
                        unknowns=problem.mesh.nodes.size)
        rows.append(row)
    return {"ranks": ranks, "rows": rows} if comm is None or comm.rank == 0 else {}


def table(results: list) -> str:
    lines = ["| network | ranks | unknowns | pc | its (PETSc) | set up every solve, ms | kept, ms | kept ÷ every solve "
             "| PETSc, ms | kept ÷ PETSc | same bits |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for row in result["rows"]:
            kept, every = row["kept"], row["set up every solve"]
            petsc = row.get("PETSc")
            theirs = f" ({petsc['iterations']})" if petsc else ""
            petsc_ms = f"{petsc['seconds'] * 1e3:.3f}" if petsc else ""
            to_petsc = f"{kept['seconds'] / petsc['seconds']:.2f}" if petsc else ""
            lines.append(
                f"| {result['network']} | {result['ranks']} | {row['unknowns']} | {row['pc']} "
                f"| {kept['iterations']}{theirs} | {every['seconds'] * 1e3:.3f} | {kept['seconds'] * 1e3:.3f} "
                f"| {kept['seconds'] / every['seconds']:.2f} "
                f"| {petsc_ms} | {to_petsc} "
                f"| {'yes' if row['same_bits'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = solver_arguments(__doc__.splitlines()[0], repeats=9, out=str(HERE / "results" / "solve_setup.json"))
    return solver_main(__file__, parser.parse_args(argv), worker, table, "solve set-up", "CG")


if __name__ == "__main__":
    sys.exit(main())
