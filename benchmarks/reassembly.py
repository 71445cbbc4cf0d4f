"""A time loop's solve: the matrix assembled again before every solve, against the same solve
with the matrix unchanged.

A time-dependent or nonlinear solver assembles its matrix again at every step and then solves.
What a Krylov method builds from the matrix's values (the Jacobi scaling, the matrix powers
kernel's halo rows, the Newton shifts of the s-step basis, the costs ``s="auto"`` measures)
is then built again, or refreshed, in the first solve after the assembly. Per job
(``mpiexec -n R``, ``--network shm|tcp``, the user's environment: no thread variables set):
Poisson P1 on ``structured_tets`` (about ``--per-rank`` unknowns per rank, Jacobi, ``--rtol``),
and per method (cg, the floor: only Jacobi's diagonal depends on the values; pipecg;
``sstep-cg`` with ``s = 4`` and ``s = "auto"``), ``--steps`` rounds of: the stiffness matrix
assembled again (``A.zero()``, the assembly loop, the Dirichlet rows; the same values, which
changes nothing in what a solve must redo), one solve timed (*after assembly*), a second solve
timed (*steady*: nothing changed since the first). The methods take turns in each round; the
first round (compiling, halo layers) is not counted. Times are the slowest rank's, medians over
rounds; the assembly is timed apart.

Usage::

    .venv/bin/python benchmarks/reassembly.py                     # shm and tcp, 1 and 2 ranks
    .venv/bin/python benchmarks/reassembly.py --quick             # seconds

Writes ``benchmarks/results/reassembly.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import launch, machine, poisson_problem, serve, slowest, user_environment, write_run  # noqa: E402

METHODS = (("cg", {}), ("pipecg", {}), ("sstep-cg s=4", {"s": 4}), ("sstep-cg s=auto", {"s": "auto"}))
FULL = dict(per_rank=2000, steps=15, rtol=1e-8)
QUICK = dict(per_rank=500, steps=3, rtol=1e-8)


def worker(config: dict) -> dict:
    import meshchain as mc

    comm, _, problem = poisson_problem(config["per_rank"])
    d, x = problem.mesh, problem.u

    def assemble() -> float:
        began = time.perf_counter()
        problem.A.zero()
        mc.par_loop(problem.kernels["stiffness"], d.cells, problem.A(mc.INC, (d.cell2node, d.cell2node)),
                    d.coords(mc.READ, d.cell2node), problem.bc(mc.READ, d.cell2node))
        problem.A.zero_rows(problem.wall, diagonal=1.0)
        mc.api.engine_surface().matrices.settle(problem.A)  # the recorded assembly added now, not in the solve
        return time.perf_counter() - began

    def solve(options: dict) -> tuple[float, object]:
        x.data[...] = 0.0
        if comm is not None:
            comm.Barrier()
        began = time.perf_counter()
        info = mc.solve(problem.A, x, problem.b, method=options.get("method"), pc="jacobi", rtol=config["rtol"],
                        **{k: v for k, v in options.items() if k != "method"})
        return time.perf_counter() - began, info

    times = {name: {"after": [], "steady": []} for name, _ in METHODS}
    assembly, found = [], {}
    for round_ in range(config["steps"] + 1):
        for name, options in METHODS:
            options = dict(options, method=name.split()[0])
            seconds = slowest(comm, assemble())
            after, info = solve(options)
            steady, again = solve(options)
            if round_:  # the first round compiles and builds halo layers: not counted
                assembly.append(seconds)
                times[name]["after"].append(slowest(comm, after))
                times[name]["steady"].append(slowest(comm, steady))
            found[name] = {"iterations": info.iterations, "converged": bool(info.converged and again.converged),
                           "steps": info.steps}
    rows = {name: {**found[name], "after": statistics.median(t["after"]), "steady": statistics.median(t["steady"])}
            for name, t in times.items()}
    return {"unknowns": d.nodes.size, "assembly": statistics.median(assembly), "rows": rows}


def table(results: list) -> str:
    lines = ["| network | ranks | unknowns | assembly ms | method | its | ms after assembly | ms steady "
             "| after / steady |", "|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        for name, row in result["rows"].items():
            label = name if row.get("steps") is None or "auto" not in name else f"{name} ({row['steps']})"
            lines.append(f"| {result['network']} | {result['ranks']} | {result['unknowns']} | "
                         f"{1e3 * result['assembly']:.2f} | {label} | {row['iterations']}"
                         f"{'' if row['converged'] else '*'} | {1e3 * row['after']:.2f} | {1e3 * row['steady']:.2f} | "
                         f"{row['after'] / row['steady']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run: smaller defaults")
    parser.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--per-rank", type=int, help=f"unknowns per rank (default {FULL['per_rank']})")
    parser.add_argument("--steps", type=int, help=f"rounds timed (default {FULL['steps']})")
    parser.add_argument("--rtol", type=float, help=f"relative tolerance (default {FULL['rtol']})")
    parser.add_argument("--out", default=str(HERE / "results" / "reassembly.json"))
    parser.add_argument("--cache-dir", default=str(HERE / "build" / "krylov-cache"))
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve(worker, json.loads(args.config))
    defaults = QUICK if args.quick else FULL
    config = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    env = user_environment(MESHCHAIN_CACHE_DIR=args.cache_dir)  # no thread variables, as a user runs it
    info, began = machine(), time.perf_counter()
    results = []
    for network in args.network:
        for ranks in args.ranks:
            if ranks == 1 and network == "tcp":
                continue  # one rank sends nothing
            print(f"[reassembly] {ranks} ranks, {network} ...", file=sys.stderr, flush=True)
            result = launch(__file__, ["solve"], ranks, network, env, config, args.timeout, "reassembly")
            results.append(dict(result, network=network, ranks=ranks))
    total = time.perf_counter() - began
    print(f"{info['cpu']}, {info['cores']} cores; {info['mpi']}; Python {info['python']}, numba {info['numba']}. "
          f"No thread variables set. Poisson P1, Jacobi, rtol {config['rtol']}; median of {config['steps']} "
          f"rounds, slowest rank; whole run {total:.0f} s.\n")
    print(table(results))
    write_run(args.out, info, config, total, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
