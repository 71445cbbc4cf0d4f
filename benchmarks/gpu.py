"""Airfoil on the GPU: time per iteration, and the bandwidth ``update`` and ``res_calc`` reach
against the device-to-device copy bandwidth measured in the same run.

Bandwidth counts the bytes a loop must move at least (as OP2 reports it): every dat
the loop touches, once, read and/or written, plus the maps it reads:

* ``update`` (direct, cells): qold read, q written, res read and written, adt read
  -> ``(4 + 4 + 8 + 1) * 8`` bytes per cell;
* ``res_calc`` (indirect, edges): x read (nodes), q and adt read, res read and written
  (cells), two int32 map columns per edge for ``pedge`` and ``pecell``.

Targets (issue 7): ``update`` >= 50 % and ``res_calc`` >= 25 % of the copy bandwidth.

Usage::

    python benchmarks/gpu.py                          # cupy, 2.16M-cell mesh, 50 iterations
    python benchmarks/gpu.py --size 60 90 --iters 3 --backend cuda-emulation   # smoke test, no GPU

Writes ``benchmarks/results/gpu.json``; prints a Markdown table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def copy_bandwidth(nbytes: int, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), CuPy events."""
    import cupy

    source = cupy.ones(nbytes // 8, dtype=cupy.float64)
    target = cupy.empty_like(source)
    target[...] = source
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        target[...] = source
    end.record()
    end.synchronize()
    seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3 / repeats
    return 2 * source.nbytes / seconds


def loop_bytes(problem) -> dict:
    """Compulsory bytes per call of ``update`` and ``res_calc``."""
    ncell, nnode, nedge = problem.cells.size, problem.nodes.size, problem.edges.size
    return {
        "update": (4 + 4 + 8 + 1) * 8 * ncell,
        "res_calc": nnode * 2 * 8 + ncell * (4 + 1 + 8) * 8 + nedge * 4 * 4,
    }


def measure(size, iters: int, backend: str, increments: str) -> dict:
    import meshchain as mc
    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    mc.configure(backend=backend, gpu_increments=increments)
    problem = airfoil.declare(naca0012(*size))
    airfoil.iterate(problem)  # compiles, uploads
    mc.stats(reset=True)
    began = time.perf_counter()
    for _ in range(iters):
        rms = airfoil.iterate(problem)
    elapsed = time.perf_counter() - began
    loops = mc.stats().loops
    moved = loop_bytes(problem)
    row = {"increments": increments, "ms_per_iteration": elapsed / iters * 1e3, "rms": rms,
           "cells": problem.cells.size, "edges": problem.edges.size}
    for name in ("update", "res_calc"):
        per_call = loops[name].time_compute / loops[name].calls
        row[f"{name}_ms"] = per_call * 1e3
        row[f"{name}_GBs"] = moved[name] / per_call / 1e9
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, default=(1200, 1800), help="NACA0012 mesh (default 2.16M cells)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--backend", default="cupy", choices=("cupy", "cuda-emulation"))
    parser.add_argument("--out", default=str(HERE / "results" / "gpu.json"))
    args = parser.parse_args(argv)
    import meshchain as mc

    try:
        mc.configure(backend=args.backend)
    except mc.BackendUnavailableError as exc:
        print(f"benchmarks/gpu.py needs a GPU: {exc}", file=sys.stderr)
        return 2
    copy = copy_bandwidth(1 << 30) if args.backend == "cupy" else float("nan")
    rows = [measure(tuple(args.size), args.iters, args.backend, inc) for inc in ("atomic", "colour")]
    for row in rows:
        row["update_of_copy"] = row["update_GBs"] * 1e9 / copy
        row["res_calc_of_copy"] = row["res_calc_GBs"] * 1e9 / copy
    result = {"command": " ".join(["python", "benchmarks/gpu.py", *(argv or sys.argv[1:])]),
              "host": platform.node(), "copy_GBs": copy / 1e9, "rows": rows}
    if args.backend == "cupy":
        import cupy

        result["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"device-to-device copy: {copy / 1e9:.0f} GB/s")
    print("| increments | ms/iteration | update GB/s (% of copy) | res_calc GB/s (% of copy) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['increments']} | {row['ms_per_iteration']:.3f} | {row['update_GBs']:.0f} "
              f"({row['update_of_copy']:.0%}) | {row['res_calc_GBs']:.0f} ({row['res_calc_of_copy']:.0%}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
