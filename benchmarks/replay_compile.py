"""The first compile of a captured step's replay on several ranks: what a user waits for once.

A step captured with ``mc.capture`` and replayed :data:`meshchain.engine.replay.COMPILE_AFTER`
times on several ranks is compiled into a few functions (pieces of
:data:`~meshchain.engine.replay.PIECE` prepared calls, :mod:`meshchain.engine.replay`); the
replay in progress waits for it. Each piece takes its arguments boxed in Numba structures
(:mod:`meshchain.backends.numba_replay`): per call, exchange and reduction a structure of
its own, inside one structure for the piece. This benchmark runs MG-CFD's captured cycle
(:func:`meshchain.apps.mgcfd.captured_cycle`, a generated channel of ``--n`` hexahedra across
and ``--levels`` levels (one per ``--n``), its synthetic chain of 2 loops) on ``--ranks`` ranks:

* **first run**: empty caches (a new ``NUMBA_CACHE_DIR`` and meshchain cache directory), the
  machine's first run. Per rank: the seconds spent making the compiled replay (the backend's
  ``replay``: boxing and compiling), of which boxing the arguments; then, in the same job
  (after the replay was made), each piece's arguments boxed as one flat tuple, the way they
  were boxed before each group got a structure of its own (the same values; this process has
  compiled the rest already, so that figure is, if anything, low);
* **cached run**: the same job again with those caches kept: what every later run pays.

Usage::

    .venv/bin/python benchmarks/replay_compile.py                        # 2 ranks; n = 8 (3 levels), 32 (4)
    .venv/bin/python benchmarks/replay_compile.py --n 8 --levels 3       # about a minute

Writes ``benchmarks/results/replay_compile.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import launch, machine, serve, user_environment  # noqa: E402


def worker(config: dict) -> dict:
    """One job: MG-CFD's captured cycle until its replay is compiled; per rank the seconds
    spent (see the module docstring)."""
    import meshchain as mc
    from meshchain.apps import mgcfd
    from meshchain.backends import numba_backend, numba_replay
    from meshchain.engine import replay
    from meshchain.meshes import channel_bump

    spent = {"replay": 0.0, "boxing": 0.0, "pieces": 0, "calls": 0}
    bound = []  # per piece made, the values its first binding boxed
    make, bind = numba_backend.NumbaBackend.replay, numba_replay.ReplayCall.bind

    def timed_make(self, calls, *args, **options):
        began = time.perf_counter()
        try:
            return make(self, calls, *args, **options)
        finally:
            spent["replay"] += time.perf_counter() - began
            spent["pieces"] += 1
            spent["calls"] += len(calls)

    def timed_bind(self, values):
        if self.entry is None:  # the binding that compiles (later ones rebind)
            bound.append((self.natives, *values))
        began = time.perf_counter()
        try:
            return bind(self, values)
        finally:
            spent["boxing"] += time.perf_counter() - began

    numba_backend.NumbaBackend.replay, numba_replay.ReplayCall.bind = timed_make, timed_bind
    problem = mgcfd.declare(channel_bump(config["n"], levels=config["levels"]), synthetic_loops=2)
    began = time.perf_counter()
    mgcfd.run(problem, replay.COMPILE_AFTER + 6, captured=True)  # the first cycles capture and meet new halo
    total = time.perf_counter() - began  # states: the 35th compiles (measured with COMPILE_AFTER = 32)
    if not bound:
        raise RuntimeError(f"no replay was compiled in {replay.COMPILE_AFTER + 6} cycles")
    flat = 0.0
    for values in bound:  # as before: one flat tuple per piece (compiled now for its own type)
        began = time.perf_counter()
        numba_replay.box(values)
        flat += time.perf_counter() - began
    comm = mc.get_runtime().comm
    found = comm.gather(dict(spent, flat_boxing=flat, cycles_seconds=total), root=0)
    nodes = [level.nodes.size for level in problem.levels]
    return {"ranks": comm.size, "nodes": nodes, "per_rank": found} if comm.rank == 0 else {}


def run(n: int, levels: int, ranks: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="replay-compile-") as folder:
        env = user_environment(NUMBA_CACHE_DIR=f"{folder}/numba", MESHCHAIN_CACHE_DIR=f"{folder}/meshchain")
        config = {"n": n, "levels": levels}
        first = launch(__file__, ["worker"], ranks, "shm", env, config, timeout, "replay compile (first run)")
        cached = launch(__file__, ["worker"], ranks, "shm", env, config, timeout, "replay compile (cached)")
    return {"n": n, "levels": levels, "first": first, "cached": cached}


def table(results: list) -> str:
    lines = ["| mesh | nodes | ranks | pieces (calls) | first run: making the replay, s | of which boxing, s "
             "| boxing as flat tuples, s | cached run: making the replay, s |",
             "|---|---|---|---|---|---|---|---|"]
    for result in results:
        first, cached = result["first"], result["cached"]
        worst = max(first["per_rank"], key=lambda r: r["replay"])
        lines.append(
            f"| channel_bump({result['n']}, levels={result['levels']}) | {sum(first['nodes'])} | {first['ranks']} "
            f"| {worst['pieces']} ({worst['calls']}) | {worst['replay']:.1f} | {worst['boxing']:.1f} "
            f"| {max(r['flat_boxing'] for r in first['per_rank']):.1f} "
            f"| {max(r['replay'] for r in cached['per_rank']):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, nargs="+", default=[8, 32], help="hexahedra across the channel")
    parser.add_argument("--levels", type=int, nargs="+", default=[3, 4], help="multigrid levels, one per --n")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--out", default=str(HERE / "results" / "replay_compile.json"))
    args = parser.parse_args(argv)
    if args.worker:
        return serve(worker, json.loads(args.config))
    began = time.perf_counter()
    if len(args.levels) != len(args.n):
        parser.error(f"--levels needs one value per --n ({len(args.n)}), got {len(args.levels)}")
    results = [run(n, levels, args.ranks, args.timeout) for n, levels in zip(args.n, args.levels)]
    about = machine()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": about, "results": results}, indent=1))
    print(f"{about['cpu']}; whole run {time.perf_counter() - began:.0f} s; slowest rank per column.\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
