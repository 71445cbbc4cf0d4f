"""Sparse tiling: tiled vs untiled chains on meshes far larger than the caches.

One process, the numba backend. Two chains:

* ``synthetic``: the MG-CFD chain of the OP2 CA paper (``nchains`` x (update, edge_flux),
  all over the edges, after ``advance`` on the nodes) on ``structured_tris(n, n)``;
* ``airfoil``: OP2 Airfoil's stage chain (adt_calc, res_calc, bres_calc, update) on the
  generated NACA0012 mesh; one step is save_soln and two stages.

For every tile size the untiled and the tiled chain run interleaved, round by round; each
keeps its fastest round. Reported: time per step, speed-up ``T_untiled / T_tiled``, the
inspector's time for the chain (first execution; later ones reuse the plan), tiles and
colours, and the chain executions after which tiling has paid for its inspection
(``t_inspect / (T_untiled - T_tiled)`` per execution; "never" when tiling is slower).

The tile size ``2**30`` makes a single tile: the chain fused into one compiled call that
runs each loop over its whole set in order, without the block colouring untiled loops use
for threads. It separates that effect from the cache reuse that real tiles add.

Usage::

    python benchmarks/tiling.py                     # writes results/tiling.json
    python benchmarks/tiling.py --problems synthetic --tile-sizes 1024 4096 --iters 5 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHOLE = 1 << 30  # a tile size this large makes one tile: the fused chain, untiled order, no colouring
sys.path.insert(0, str(HERE.parent / "examples"))


def synthetic_problem(size: int, nchains: int):
    import synthetic_chain as sc

    from meshchain.meshes import structured_tris

    problem = sc.declare(structured_tris(size, size))
    info = {"mesh": f"structured_tris({size}, {size})", "edges": problem.edges.size, "nodes": problem.nodes.size,
            "loops": 2 * nchains, "chain": "synthetic"}

    def step(tile_size):
        sc.run(problem, nchains, 1, tile_size=tile_size)

    return info, step


def airfoil_problem(size: tuple[int, int]):
    import airfoil

    from meshchain.meshes import naca0012

    problem = airfoil.declare(naca0012(*size))
    info = {"mesh": f"naca0012{size}", "edges": problem.edges.size, "cells": problem.cells.size, "loops": 4,
            "chain": "stage"}

    def step(tile_size):
        airfoil.iterate(problem, ca=True, tile_size=tile_size)

    return info, step


def measure(info, step, tile_sizes, iters: int, repeats: int) -> list[dict]:
    import meshchain as mc

    def timed(tile_size):
        mc.stats(reset=True)
        start = time.perf_counter()
        for _ in range(iters):
            step(tile_size)
        mc.flush()
        return (time.perf_counter() - start) / iters

    step(None)  # compile the untiled loops
    rows = []
    for tile_size in tile_sizes:
        mc.stats(reset=True)
        mc.get_runtime().tile_plans.clear()  # inspect again (another thread count may have cached the plan)
        step(tile_size)  # compile the tiled chain and inspect it
        mc.flush()
        chain = mc.stats().chains[info["chain"]]
        inspect_s, tiles, colours = chain.time_tile_inspect, chain.tiles, chain.tile_colours
        best = {}
        for _ in range(repeats):
            for variant in (None, tile_size):
                elapsed = timed(variant)
                best[variant] = min(best.get(variant, elapsed), elapsed)
        untiled, tiled = best[None], best[tile_size]
        per_execution_saving = (untiled - tiled) / (2 if info["chain"] == "stage" else 1)
        rows.append({**info, "tile_size": tile_size, "tiles": tiles, "colours": colours,
                     "ms_untiled": untiled * 1e3, "ms_tiled": tiled * 1e3, "speedup": untiled / tiled,
                     "inspect_s": inspect_s,
                     "break_even_executions": inspect_s / per_execution_saving if per_execution_saving > 0 else None})
        print(table(rows[-1:]).split("\n", 2)[-1], flush=True)
    return rows


def table(rows) -> str:
    lines = ["| chain | mesh | loops | threads | tile size | tiles | colours | untiled ms/step | tiled ms/step | "
             "speed-up | inspection s | break-even executions |", "|---" * 12 + "|"]
    for r in rows:
        even = "never" if r["break_even_executions"] is None else f"{r['break_even_executions']:.0f}"
        size = "whole set" if r["tiles"] == 1 and r["tile_size"] >= WHOLE else r["tile_size"]
        lines.append(f"| {r['chain']} | {r['mesh']} | {r['loops']} | {r['threads']} | {size} | {r['tiles']} | {r['colours']} | "
                     f"{r['ms_untiled']:.2f} | {r['ms_tiled']:.2f} | **{r['speedup']:.3f}** | {r['inspect_s']:.3f} | "
                     f"{even} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", choices=("synthetic", "airfoil"), default=["synthetic", "airfoil"])
    parser.add_argument("--size", type=int, default=577, help="synthetic mesh: structured_tris(N, N) (~3 N^2 edges)")
    parser.add_argument("--nchains", type=int, nargs="+", default=[2, 4], help="synthetic: loops = 2 x nchains")
    parser.add_argument("--airfoil-size", type=int, nargs=2, default=(400, 600), metavar=("I", "J"))
    parser.add_argument("--tile-sizes", type=int, nargs="+", default=[1024, 4096, 16384, 65536, WHOLE],
                        help=f"seed iterations per tile ({WHOLE}: one tile, the whole set)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iters", type=int, default=5, help="steps per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the fastest counts")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "tiling.json")
    args = parser.parse_args(argv)

    import meshchain as mc

    rows = []
    for name in args.problems:
        problems = ([synthetic_problem(args.size, n) for n in args.nchains] if name == "synthetic"
                    else [airfoil_problem(tuple(args.airfoil_size))])
        for info, step in problems:
            for threads in args.threads:
                mc.configure(threads=threads)
                rows += measure({**info, "threads": threads}, step, args.tile_sizes, args.iters, args.repeats)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
