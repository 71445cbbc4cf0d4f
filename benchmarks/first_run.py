"""What a user waits for before the first step: compiling the loops, against the steady step.

Each round starts a new process per source tree with an empty cache directory (what a user's
first run, or a fresh test session, pays), declares OP2's Airfoil on ``naca0012(--mesh)``,
and times the first stage (the loops compiled and saved to the cache) and then the steady
stage (median of ``--steps`` stages). The trees take turns within every round, so that a
shared VM's drift touches them alike; the table gives medians over ``--rounds`` rounds and
each tree's ratio to the first one. The user's environment: no thread variables set, unless
``--threads N`` sets ``MESHCHAIN_THREADS`` (what ``make demo`` does with 1; the table says so).

Usage::

    .venv/bin/python benchmarks/first_run.py                          # this tree
    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/first_run.py --src /tmp/old/src src   # before, after
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

WORKER = """
import json, statistics, sys, tempfile, time
import meshchain as mc
from meshchain.apps import airfoil
from meshchain.meshes import naca0012
mc.reset_runtime(cache_dir=tempfile.mkdtemp(prefix="first-run-"))
a = airfoil.declare(naca0012({mesh}))
began = time.perf_counter()
airfoil.stage(a)
mc.flush()
first = time.perf_counter() - began
steady = []
for _ in range({steps}):
    began = time.perf_counter()
    airfoil.stage(a)
    mc.flush()
    steady.append(time.perf_counter() - began)
print(json.dumps({{"first": first, "steady": statistics.median(steady), "compiled": list(mc.stats().compiled)}}))
"""


def measure(src: str, mesh: str, steps: int, threads: int | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    if threads is not None:
        env["MESHCHAIN_THREADS"] = str(threads)
    done = subprocess.run([sys.executable, "-c", WORKER.format(mesh=mesh, steps=steps)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(f"the worker on {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", nargs="+", default=[str(HERE.parent / "src")], help="source trees to compare")
    parser.add_argument("--mesh", default="100, 150", help="naca0012's arguments (default 100, 150: 45 000 cells)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, help="set MESHCHAIN_THREADS (default: the environment as it is)")
    parser.add_argument("--json", default=str(HERE / "results" / "first_run.json"))
    args = parser.parse_args(argv)
    runs = {src: [] for src in args.src}
    for _ in range(args.rounds):
        for src in args.src:
            runs[src].append(measure(src, args.mesh, args.steps, args.threads))
    rows = []
    for src, found in runs.items():
        rows.append({"src": src, "first_s": statistics.median(r["first"] for r in found),
                     "steady_ms": statistics.median(r["steady"] for r in found) * 1e3,
                     "first_each": [round(r["first"], 3) for r in found], "compiled": found[-1]["compiled"]})
    base = rows[0]
    threads = "the environment's" if args.threads is None else f"MESHCHAIN_THREADS={args.threads}"
    print(f"Airfoil on naca0012({args.mesh}), threads: {threads}")
    print("| source | first stage s (each round) | ratio | steady stage ms | ratio | compiled (stats) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['src']} | {row['first_s']:.2f} ({', '.join(map(str, row['first_each']))}) | "
              f"{row['first_s'] / base['first_s']:.2f} | {row['steady_ms']:.3f} | "
              f"{row['steady_ms'] / base['steady_ms']:.2f} | {row['compiled']} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"mesh": args.mesh, "threads": args.threads, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
