"""Airfoil under MPI: time per iteration on 1, 2 and 4 ranks, halo waiting, overlap gain.

For each rank count it runs the meshchain Airfoil twice — with the loops' core
iterations overlapping their halo exchanges (``overlap=True``, the default) and with
exchange-then-compute (``overlap=False``) — and reports time per iteration (slowest
rank), the fraction of rank time spent waiting on halo exchanges, messages and bytes
per iteration, speed-up over 1 rank and the overlap gain, as ratios of one run.
Variants are interleaved round by round; each reports the median of its rounds (its
other figures from the median round) with the spread of the rounds, interquartile range
over the median (:mod:`meshchain.model.timing`); a variant whose spread exceeds 10 % is
marked ``*``. Every rank uses 1 Numba thread. On this 2-core machine 4 ranks
oversubscribe the cores.

Usage::

    python benchmarks/airfoil_mpi.py                      # 180000 cells, 50 iterations
    python benchmarks/airfoil_mpi.py --size 100 150 --iters 20 --repeats 1 --ranks 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from meshchain.model.timing import median_record

HERE = Path(__file__).resolve().parent


def mpiexec() -> str:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def run_variant(size, iters: int, ranks: int, overlap: bool) -> dict:
    command = [mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", str(size[0]), str(size[1]),
               str(iters), "1" if overlap else "0"]
    env = dict(os.environ, MESHCHAIN_THREADS="1")
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker(size, iters: int, overlap: bool) -> None:
    sys.path.insert(0, str(HERE.parent / "examples"))
    import airfoil

    import meshchain as mc
    from meshchain.meshes import naca0012

    airfoil.run(airfoil.declare(naca0012(4, 6)), 1, out=None)  # compile or load from the cache
    mc.reset_runtime(overlap=overlap)
    comm = mc.get_runtime().comm
    problem = airfoil.declare(naca0012(*size))
    airfoil.run(problem, 2, out=None)
    mc.stats(reset=True)
    if comm is not None:
        comm.Barrier()
    start = time.perf_counter()
    history = airfoil.run(problem, iters, out=None, report_every=iters)
    elapsed = time.perf_counter() - start
    stats = mc.stats(all_ranks=True)
    nranks = 1 if comm is None else comm.size
    slowest = elapsed if comm is None else comm.allreduce(elapsed, op=__import__("mpi4py.MPI").MPI.MAX)
    loops = stats.loops.values()
    result = {
        "ranks": nranks,
        "overlap": overlap,
        "time_per_iter": slowest / iters,
        "wait_fraction": sum(s.time_wait for s in loops) / (elapsed * nranks if comm is None else comm.allreduce(elapsed)),
        "messages_per_iter": sum(s.messages for s in loops) / iters,
        "bytes_per_iter": sum(s.bytes_sent for s in loops) / iters,
        "exchanges_per_iter": sum(s.exchanges for s in loops) / iters / nranks,
        "rms": history[-1][1],
    }
    if comm is None or comm.rank == 0:
        print(json.dumps(result))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, default=(200, 300), metavar=("I", "J"))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; the median counts")
    parser.add_argument("--ranks", nargs="+", type=int, default=(1, 2, 4))
    parser.add_argument("--json", default=str(HERE / "results" / "airfoil_mpi.json"))
    args = parser.parse_args(argv)
    variants = [(n, overlap) for n in args.ranks for overlap in ((True,) if n == 1 else (True, False))]
    rounds = {v: [] for v in variants}
    for _ in range(args.repeats):
        for ranks, overlap in variants:
            rounds[(ranks, overlap)].append(run_variant(args.size, args.iters, ranks, overlap))
    best = {v: median_record(rounds[v]) for v in variants}
    base = best[(args.ranks[0], True)]["time_per_iter"]
    cells = 3 * args.size[0] * args.size[1]
    print(f"Airfoil, {cells} cells, {args.iters} iterations, median of {args.repeats} interleaved rounds, 1 thread per rank"
          f" ({os.cpu_count()} cores: more ranks than cores oversubscribe)")
    print("| ranks | overlap | ms/iter | spread % | speed-up vs 1 rank | waiting on halos | messages/iter | kB sent/iter "
          "| overlap gain |")
    print("|---" * 9 + "|")
    for ranks, overlap in variants:
        r = best[(ranks, overlap)]
        gain = ""
        if overlap and (ranks, False) in best:
            gain = f"{best[(ranks, False)]['time_per_iter'] / r['time_per_iter']:.3f}"
        print(f"| {ranks} | {'core during exchange' if overlap else 'exchange, then compute'} | "
              f"{r['time_per_iter'] * 1e3:.2f} | {r['spread'] * 100:.1f}{'*' if r['noisy'] else ''} | "
              f"{base / r['time_per_iter']:.2f} | {r['wait_fraction'] * 100:.1f} % | "
              f"{r['messages_per_iter']:.0f} | {r['bytes_per_iter'] / 1e3:.1f} | {gain} |")
    rms = {f"{k[0]}{'o' if k[1] else 'n'}": v["rms"] for k, v in best.items()}
    print("final rms per variant:", rms)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"args": vars(args), "results": [best[v] for v in variants]}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker((int(sys.argv[2]), int(sys.argv[3])), int(sys.argv[4]), sys.argv[5] == "1")
    else:
        sys.exit(main())
