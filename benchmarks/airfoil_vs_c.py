"""Airfoil: meshchain's numba backend against the same five loops in plain C (gcc -O3).

One run measures, on the same mesh:

* C on 1 thread (``benchmarks/airfoil.c``, built here with ``gcc -O3``),
* meshchain/numba on 1 thread and on all threads (each in its own process), each loop by
  loop (the default) and with every iteration a captured step (``mc.capture``, replayed:
  ``airfoil.run(captured=True)``),
* the per-``par_loop`` dispatch overhead on a tiny set,

and reports time per iteration, per-kernel times and the ratios numba / C, plus
how many digits of the rms history numba and C share. Results go to JSON.

Usage::

    python benchmarks/airfoil_vs_c.py                       # 720000 cells, 50 iterations
    python benchmarks/airfoil_vs_c.py --size 100 150 --iters 20 --repeats 1
    python benchmarks/airfoil_vs_c.py --size 100 150 --iters 1000 --repeats 3   # 45000 cells (issue 32)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from meshchain.model.timing import median_record

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build"
KERNELS = ("save_soln", "adt_calc", "res_calc", "bres_calc", "update")


def build_c() -> Path:
    """Compile ``airfoil.c`` with ``gcc -O3`` (when the source is newer than the binary)."""
    BUILD.mkdir(exist_ok=True)
    binary, source = BUILD / "airfoil_c", HERE / "airfoil.c"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(["gcc", "-O3", "-o", str(binary), str(source), "-lm"], check=True)
    return binary


def mesh_file(size) -> Path:
    """The generated NACA0012 mesh of ``size`` in OP2's ASCII format (written once)."""
    from meshchain.meshes import naca0012, write_op2_ascii

    path = BUILD / f"naca0012_{size[0]}x{size[1]}.dat"
    if not path.exists():
        BUILD.mkdir(exist_ok=True)
        write_op2_ascii(naca0012(*size), path)
    return path


def run_c(binary: Path, mesh: Path, iters: int, repeats: int) -> dict:
    out = subprocess.run([str(binary), str(mesh), str(iters), str(repeats)], check=True, capture_output=True, text=True)
    result = {"kernels": {}, "rms": []}
    for line in out.stdout.splitlines():
        words = line.split()
        if words[0] == "TIME":
            result["time_per_iter"] = float(words[1])
        elif words[0] == "KERNEL":
            result["kernels"][words[1]] = float(words[2]) / iters
        else:
            result["rms"].append((int(words[0]), float(words[1])))
    return result


def run_numba(mesh: Path, iters: int, repeats: int, threads: int | None, captured: bool = False) -> dict:
    """Run the meshchain Airfoil in a fresh process (so thread settings never leak)."""
    command = [sys.executable, __file__, "--worker", str(mesh), str(iters), str(repeats), str(threads or 0),
               str(int(captured))]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def worker(mesh: str, iters: int, repeats: int, threads: int, captured: bool) -> None:
    """Child process: time the meshchain Airfoil; print one JSON line."""
    sys.path.insert(0, str(HERE.parent / "examples"))
    import airfoil
    import meshchain as mc
    from meshchain.meshes import naca0012, read_op2_ascii

    mc.configure(backend="numba", threads=threads or None)
    # Compile (or load from the cache) on a tiny mesh: same loop signatures, and the big
    # problem is then allocated once, like the C program's.
    airfoil.run(airfoil.declare(naca0012(4, 6)), 1, out=None)
    problem = airfoil.declare(read_op2_ascii(mesh))
    if captured:  # captured (and planned) once, before the timed rounds, as the C program allocates once
        airfoil.run(problem, 2, out=None, captured=True)
        airfoil.reset(problem)
    best, first_history = None, None
    for repeat in range(repeats):
        if repeat:
            airfoil.reset(problem)
        mc.stats(reset=True)
        start = time.perf_counter()
        history = airfoil.run(problem, iters, out=None, report_every=100, captured=captured)
        elapsed = time.perf_counter() - start
        loops = mc.stats().loops
        first_history = history if repeat == 0 else first_history
        if best is None or elapsed / iters < best["time_per_iter"]:
            best = {"time_per_iter": elapsed / iters, "kernels": {k: loops[k].time_compute / iters for k in KERNELS}}
    best["rms"] = first_history
    best["threads"] = mc.get_runtime().config.threads or __import__("numba").get_num_threads()
    best["captured"] = captured
    best["dispatch_us"] = dispatch_overhead_us()
    print(json.dumps(best))


def dispatch_overhead_us(calls: int = 20000) -> float:
    """Microseconds per ``par_loop`` call of a direct loop over a 4-element set."""
    import numpy as np

    import meshchain as mc

    tiny = mc.Set(4, "tiny")
    counter = mc.Dat(tiny, 1, None, "counter", dtype=np.int64)

    @mc.kernel
    def bump(c):
        c[0] += 1

    for _ in range(10):
        mc.par_loop(bump, tiny, counter(mc.RW))
    start = time.perf_counter()
    for _ in range(calls):
        mc.par_loop(bump, tiny, counter(mc.RW))
    elapsed = time.perf_counter() - start
    assert int(counter.data[0, 0]) == calls + 10
    return elapsed / calls * 1e6


def shared_digits(a: float, b: float) -> float:
    """Significant decimal digits two numbers share (17 when equal)."""
    if a == b:
        return 17.0
    return -math.log10(abs(a - b) / abs(b))


def report(args, c, numba_runs) -> dict:
    rows = [("C gcc -O3, 1 thread", c, None)] + [
        (f"numba, {r['threads']} thread(s){', captured' if r.get('captured') else ''}", r, r) for r in numba_runs]
    print(f"mesh {args.size[0]}x{args.size[1]} ({3 * args.size[0] * args.size[1]} cells), {args.iters} iterations, "
          f"median of {args.repeats} interleaved rounds")
    print("| variant | ms/iter | spread % | ratio to C | " + " | ".join(f"{k} ms" for k in KERNELS) + " |")
    print("|---|---|---|---|" + "---|" * len(KERNELS))
    for label, r, _ in rows:
        kernels = " | ".join(f"{r['kernels'][k] * 1e3:.2f}" for k in KERNELS)
        print(f"| {label} | {r['time_per_iter'] * 1e3:.2f} | {r['spread'] * 100:.1f}{'*' if r['noisy'] else ''} | "
              f"{r['time_per_iter'] / c['time_per_iter']:.3f} | {kernels} |")
    digits = []
    for r in numba_runs:
        digits += [shared_digits(x[1], y[1]) for x, y in zip(r["rms"] or [], c["rms"])]
    summary = {
        "size": args.size, "iters": args.iters, "repeats": args.repeats,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "c": c, "numba": numba_runs,
        "ratio_numba1_over_c": numba_runs[0]["time_per_iter"] / c["time_per_iter"],
        "min_shared_rms_digits": min(digits) if digits else None,
        "dispatch_us": numba_runs[0]["dispatch_us"],
    }
    if digits:
        print(f"rms numba vs C: at least {min(digits):.1f} shared significant digits over {len(digits)} reports")
    print(f"par_loop dispatch overhead (numba, 4-element direct loop): {summary['dispatch_us']:.1f} us")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, default=(400, 600), metavar=("I", "J"))
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=str(HERE / "results" / "airfoil_vs_c.json"))
    args = parser.parse_args(argv)
    binary, mesh = build_c(), mesh_file(args.size)
    # Rounds interleave the variants, so a slow spell of this (virtual) machine hits them alike;
    # each variant reports its median round.
    variants = ((1, False), (None, False), (1, True), (None, True))  # (threads, captured)
    c_rounds, numba_rounds = [], [[] for _ in variants]
    for _ in range(args.repeats):
        c_rounds.append(run_c(binary, mesh, args.iters, 1))
        for slot, (threads, captured) in enumerate(variants):
            numba_rounds[slot].append(run_numba(mesh, args.iters, 1, threads, captured))
    def median_round(rounds):  # the first round's rms history: the only one with it printed
        return dict(median_record(rounds), rms=rounds[0]["rms"])

    summary = report(args, median_round(c_rounds), [median_round(r) for r in numba_rounds])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), bool(int(sys.argv[6])))
    else:
        sys.exit(main())
