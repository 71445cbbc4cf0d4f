"""What a user waits for before the first step: compiling the loops, against the steady step.

Each round starts a new process per source tree with an empty cache directory (what a user's
first run, or a fresh test session, pays), declares OP2's Airfoil on ``naca0012(--mesh)``,
and times the first stage (the loops compiled and saved to the cache) and then the steady
stage (median of ``--steps`` stages): its four loops one by one, or with ``--chain`` as one
loop chain (``ca=False``: one phase that calls the four loops, compiled too), or with
``--tile-size N`` as one sparse-tiled chain. With ``--app mgcfd`` it declares MG-CFD on
``channel_bump(--mesh)`` (default ``16, levels=3``) with two synthetic loops and times the
first multigrid cycle and then the steady one, or with ``--captured`` the cycle captured
(``mc.capture``: its 120 loops one compiled replay). With ``--app poisson`` it assembles the P1
Poisson problem on ``structured_tets(--mesh)`` (default ``12, 12, 12``) and times the first
``mc.solve`` (``--method``, Jacobi, rtol 1e-8: its compiled iterations loaded or compiled; the
right-hand side's pending loop runs in it) and then the steady one. The trees take turns within every round, so that a
shared VM's drift touches them alike; the table gives medians over ``--rounds`` rounds and
each tree's ratio to the first one. The user's environment: no thread variables set, unless
``--threads N`` sets ``MESHCHAIN_THREADS`` (what ``make demo`` does with 1; the table says so).
``--ranks N`` runs each process as ``mpiexec -n N`` ranks sharing the cache directory (times:
the slowest rank's); ``--warm`` fills the cache directory with an untimed run first, so the
timed first stage loads its loops from the disk cache (a user's second run).

Usage::

    .venv/bin/python benchmarks/first_run.py                          # this tree
    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/first_run.py --src /tmp/old/src src   # before, after
    .venv/bin/python benchmarks/first_run.py --src /tmp/old/src src --chain
    .venv/bin/python benchmarks/first_run.py --src /tmp/old/src src --app mgcfd --captured
    .venv/bin/python benchmarks/first_run.py --src /tmp/old/src src --ranks 2 --warm
    .venv/bin/python benchmarks/first_run.py --app poisson --method cg --ranks 2 --warm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

DECLARE = {
    "airfoil": ("from meshchain.apps import airfoil\n"
                "from meshchain.meshes import naca0012\n"
                "a = airfoil.declare(naca0012({mesh}))\n"
                "def stage():\n"
                "    airfoil.stage(a, **{how})\n"),
    "mgcfd": ("from meshchain.apps import mgcfd\n"
              "from meshchain.meshes import channel_bump\n"
              "p = mgcfd.declare(channel_bump({mesh}), synthetic_loops=2)\n"
              "mgcfd.initialise(p)\n"
              "def stage():\n"
              "    mgcfd.run(p, 1, captured={captured})\n"),
    "poisson": ("from meshchain.apps import poisson\n"
                "from meshchain.meshes import structured_tets\n"
                "p = poisson.declare(structured_tets({mesh}))\n"
                "def stage():\n"
                "    poisson.solve(p, method={method!r}, rtol=1e-8)\n"),
}
"""Per application: declare the problem, and ``stage()``, the step timed."""

WORKER = """
import json, statistics, sys, time
import meshchain as mc
mc.reset_runtime(cache_dir={cache_dir!r})
comm = mc.get_runtime().comm


def slowest(seconds):
    from mpi4py import MPI

    return seconds if comm is None else comm.allreduce(seconds, op=MPI.MAX)


{declare}
if comm is not None:
    comm.Barrier()
began = time.perf_counter()
stage()
mc.flush()
first = slowest(time.perf_counter() - began)
steady = []
for _ in range({steps}):
    began = time.perf_counter()
    stage()
    mc.flush()
    steady.append(slowest(time.perf_counter() - began))
compiled = list(getattr(mc.stats(), "compiled", ()))  # (none before the counters: older trees compared)
if comm is None or comm.rank == 0:
    print(json.dumps({{"first": first, "steady": statistics.median(steady), "compiled": compiled}}))
"""


def measure(src: str, declare: str, steps: int, threads: int | None, *, ranks: int = 1, warm: bool = False) -> dict:
    """One process (``ranks`` > 1: one ``mpiexec`` job) on tree ``src`` with a new cache
    directory (``warm``: filled by an untimed run first); its JSON."""
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    if threads is not None:
        env["MESHCHAIN_THREADS"] = str(threads)
    launcher = [] if ranks == 1 else [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks)]
    with tempfile.TemporaryDirectory(prefix="first-run-") as cache_dir:
        for timed in (False, True)[not warm:]:
            source = WORKER.format(declare=declare, steps=steps if timed else 1, cache_dir=cache_dir)
            done = subprocess.run([*launcher, sys.executable, "-c", source], env=env, capture_output=True, text=True,
                                  timeout=900, cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL)
            if done.returncode:
                raise SystemExit(f"the worker on {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", nargs="+", default=[str(HERE.parent / "src")], help="source trees to compare")
    parser.add_argument("--app", choices=sorted(DECLARE), default="airfoil")
    parser.add_argument("--mesh", help="naca0012's arguments (default 100, 150: 45 000 cells), with --app mgcfd "
                        "channel_bump's (default 16, levels=3), with --app poisson structured_tets' (12, 12, 12)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, help="set MESHCHAIN_THREADS (default: the environment as it is)")
    parser.add_argument("--chain", action="store_true", help="run the stage as one loop chain (ca=False)")
    parser.add_argument("--tile-size", type=int, help="run the stage as one sparse-tiled chain of these tiles")
    parser.add_argument("--captured", action="store_true", help="--app mgcfd: replay the cycle captured")
    parser.add_argument("--method", help="--app poisson: the Krylov method (default cg)")
    parser.add_argument("--ranks", type=int, default=1, help="MPI ranks sharing the cache directory")
    parser.add_argument("--warm", action="store_true", help="time the first stage with the loops on disk already")
    parser.add_argument("--json", default=str(HERE / "results" / "first_run.json"))
    args = parser.parse_args(argv)
    if args.app != "mgcfd" and args.captured or args.app != "airfoil" and (args.chain or args.tile_size):
        parser.error("--captured is for --app mgcfd; --chain and --tile-size for --app airfoil")
    if args.method is not None and args.app != "poisson":
        parser.error("--method is for --app poisson")
    args.method = args.method or "cg"
    mesh = args.mesh or {"airfoil": "100, 150", "mgcfd": "16, levels=3", "poisson": "12, 12, 12"}[args.app]
    how = {} if not (args.chain or args.tile_size) else {"ca": False, "tile_size": args.tile_size}
    declare = DECLARE[args.app].format(mesh=mesh, how=how, captured=args.captured, method=args.method)
    runs = {src: [] for src in args.src}
    for _ in range(args.rounds):
        for src in args.src:
            runs[src].append(measure(src, declare, args.steps, args.threads, ranks=args.ranks, warm=args.warm))
    rows = []
    for src, found in runs.items():
        rows.append({"src": src, "first_s": statistics.median(r["first"] for r in found),
                     "steady_ms": statistics.median(r["steady"] for r in found) * 1e3,
                     "first_each": [round(r["first"], 3) for r in found], "compiled": found[-1]["compiled"]})
    base = rows[0]
    threads = "the environment's" if args.threads is None else f"MESHCHAIN_THREADS={args.threads}"
    if args.app == "mgcfd":
        title = f"MG-CFD on channel_bump({mesh}), 2 synthetic loops, {'captured' if args.captured else 'loop by loop'}"
    elif args.app == "poisson":
        title = f"Poisson on structured_tets({mesh}), mc.solve(method={args.method!r}, pc='jacobi')"
    else:
        title = f"Airfoil on naca0012({mesh}), {'loop by loop' if not how else f'one chain, tile_size={args.tile_size}'}"
    print(f"{title}, threads: {threads}, {args.ranks} rank(s), {'warm' if args.warm else 'empty'} cache")
    step = {"mgcfd": "cycle", "poisson": "solve"}.get(args.app, "stage")
    print(f"| source | first {step} s (each round) | ratio | steady {step} ms | ratio | compiled (stats) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['src']} | {row['first_s']:.2f} ({', '.join(map(str, row['first_each']))}) | "
              f"{row['first_s'] / base['first_s']:.2f} | {row['steady_ms']:.3f} | "
              f"{row['steady_ms'] / base['steady_ms']:.2f} | {row['compiled']} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"app": args.app, "mesh": mesh, "method": args.method,
                                           "threads": args.threads, "how": how,
                                           "captured": args.captured, "ranks": args.ranks, "warm": args.warm,
                                           "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
