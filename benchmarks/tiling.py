"""Sparse tiling: tiled vs untiled chains on meshes sized from the machine's last-level cache.

One process, the numba backend. Two chains:

* ``synthetic``: the MG-CFD chain of the OP2 CA paper (``nchains`` x (update, edge_flux),
  all over the edges, after ``advance`` on the nodes) on ``structured_tris(n, n)``;
* ``airfoil``: OP2 Airfoil's stage chain (adt_calc, res_calc, bres_calc, update) on the
  generated NACA0012 mesh ``naca0012(I, J)``, ``J = 1.5 I``; one step is save_soln and two
  stages.

Mesh size. Tiling can only save where the data does not fit in the cache, so the meshes
are sized at run time from the last-level cache (LLC) of the machine the script runs on
(read from ``/sys/devices/system/cpu/cpu0/cache``, else ``sysconf``/``getconf``; override
with ``--llc-bytes``): each problem's working set, the bytes of all the dats and maps its
chain touches, is made at least ``--cache-factor`` (default 4) times the LLC. The bytes per
element are measured on a small instance of the problem, the mesh is scaled from them and
the real instance is checked (and grown if it falls short). ``--size`` and
``--airfoil-size`` fix a mesh instead; a warning says when it is below the target.
Memory: the synthetic chain's inspection needs about 11 x its working set at its peak
(11.3 GiB for the 1 GiB meshes of a 260 MiB cache).

Timing. Every chain first runs untiled and tiled on a tiny mesh, so that compiling kernels,
fused chains and the inspector is not timed. For every tile size the untiled and the tiled
chain run interleaved, round by round (the order alternates between rounds). Each
variant's time is the median of its rounds; the spread of a variant is the
interquartile range of its rounds over their median (:mod:`meshchain.model.timing`), and a
row is marked noisy when either spread exceeds 10 %. Reported: time per step, speed-up
``T_untiled / T_tiled`` (of the medians), the inspector's time for the chain (first
execution; later ones reuse the plan), tiles and colours, and the chain executions after
which tiling has paid for its inspection (``t_inspect / (T_untiled - T_tiled)`` per
execution; "never" when tiling is slower).

The tile size ``2**30`` makes a single tile: the chain fused into one compiled call that
runs each loop over its whole set in order, without the block colouring untiled loops use
for threads. It separates that effect from the cache reuse that real tiles add.

Usage::

    python benchmarks/tiling.py                     # writes results/tiling.json
    python benchmarks/tiling.py --threads 1 --tile-sizes 16384 65536 --nchains 4
    python benchmarks/tiling.py --problems synthetic --size 300 --tile-sizes 1024 --iters 2 --repeats 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WHOLE = 1 << 30  # a tile size this large makes one tile: the fused chain, untiled order, no colouring
NOISY = 0.10  # a row is noisy when a variant's rounds spread more than this (meshchain.model.timing.NOISY_SPREAD)
MIB = 1 << 20
MARGIN = 1.01  # meshes are sized for 1 % more than the target, so boundary effects rarely need a second try
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
sys.path.insert(0, str(HERE.parent / "examples"))


# -- the last-level cache ------------------------------------------------------------------

def parse_cache_size(text: str) -> int:
    """Bytes in a cache size as the kernel writes it.

    Parameters
    ----------
    text : str
        ``"266240K"``, ``"32M"``, ``"1G"`` or a plain number of bytes.

    Returns
    -------
    int
        The size in bytes.

    Raises
    ------
    ValueError
        ``text`` is not a size.

    Examples
    --------
    >>> parse_cache_size("266240K") == 260 * 2**20
    True
    >>> parse_cache_size("32M"), parse_cache_size("512")
    (33554432, 512)
    """
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"not a cache size: {text!r} (expected e.g. '266240K', '32M' or bytes)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]
    return int(match.group(1)) * scale


def _llc_from_sysfs(cache_dir: Path) -> int | None:
    """The size of the highest-level data or unified cache listed under ``cache_dir``
    (``index*/level``, ``type``, ``size``), or None when there is none."""
    best = None
    for index in sorted(cache_dir.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size > 0 and (best is None or level > best[0]):
            best = (level, size)
    return None if best is None else best[1]


def _llc_from_sysconf() -> int | None:
    """The largest level-4/3/2 cache size that ``os.sysconf`` or ``getconf`` report, or None."""
    for level in (4, 3, 2):
        name = f"LEVEL{level}_CACHE_SIZE"
        try:
            size = os.sysconf(f"SC_{name}")
        except (ValueError, OSError):
            size = None
        if not size:
            try:
                out = subprocess.run(["getconf", name], capture_output=True, text=True, timeout=5, check=False)
                size = int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None
            except (OSError, subprocess.SubprocessError):
                size = None
        if size and size > 0:
            return int(size)
    return None


def last_level_cache(*, cache_dir: Path = CACHE_DIR) -> tuple[int, str]:
    """The size of this machine's last-level cache, read at run time.

    Linux lists cpu0's caches under ``cache_dir``; the highest ``level`` of type Data or
    Unified is the last level. Elsewhere, ``os.sysconf("SC_LEVEL3_CACHE_SIZE")`` (and levels
    4 and 2) or the ``getconf`` command answer.

    Parameters
    ----------
    cache_dir : Path, keyword-only
        Where the kernel lists the caches (for tests).

    Returns
    -------
    (int, str)
        The size in bytes and where it was read.

    Raises
    ------
    RuntimeError
        Nothing reports a cache size; the message says to pass ``--llc-bytes``.
    """
    size = _llc_from_sysfs(cache_dir)
    if size is not None:
        return size, str(cache_dir)
    size = _llc_from_sysconf()
    if size is not None:
        return size, "sysconf/getconf"
    raise RuntimeError(f"cannot find the last-level cache size (nothing under {cache_dir}, and neither "
                       "sysconf nor getconf reports LEVEL3_CACHE_SIZE); pass it with --llc-bytes, "
                       "e.g. --llc-bytes 33554432 for 32 MiB")


# -- working sets and mesh sizes -----------------------------------------------------------

def working_set_bytes(problem) -> int:
    """Bytes of all the dats, maps and globals of a declared problem (a dataclass such as
    ``SyntheticChain`` or ``Airfoil``): what its chain reads and writes.

    Each object is counted once; the values are read where they are stored (this forces
    pending loops).

    Parameters
    ----------
    problem : dataclass instance
        Its fields are the problem's sets, maps, dats and globals.

    Returns
    -------
    int
        The sum of the arrays' ``nbytes``.
    """
    import meshchain as mc

    seen, total = set(), 0
    for field in dataclasses.fields(problem):
        obj = getattr(problem, field.name)
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, mc.Dat):
            total += obj.data_ro.nbytes
        elif isinstance(obj, mc.Map):
            total += np.asarray(obj.values).nbytes
        elif isinstance(obj, mc.Global):
            total += obj.value.nbytes
    return total


def sized_problem(declare, *, target: int, probe: int, max_tries: int = 4):
    """Declare a problem whose working set is at least ``target`` bytes.

    ``declare(scale)`` builds a problem whose working set grows as ``scale**2`` (a mesh of
    ``scale`` x ``c scale`` elements). The bytes per ``scale**2`` are measured on
    ``declare(probe)``; the scale that reaches ``target`` is declared, checked, and grown in
    proportion while it falls short.

    Parameters
    ----------
    declare : callable
        ``scale -> problem``.
    target : int, keyword-only
        Working-set bytes to reach.
    probe : int, keyword-only
        Scale of the small instance that measures bytes per element.
    max_tries : int, keyword-only
        Real instances to declare before giving up.

    Returns
    -------
    (int, problem, int)
        The scale, the problem and its working set in bytes.

    Raises
    ------
    RuntimeError
        ``max_tries`` instances all fell short of ``target``.
    """
    per_scale2 = working_set_bytes(declare(probe)) / probe**2
    scale = max(probe, math.ceil(math.sqrt(MARGIN * target / per_scale2)))
    for _ in range(max_tries):
        problem = declare(scale)
        size = working_set_bytes(problem)
        if size >= target:
            return scale, problem, size
        del problem
        tried, scale = scale, max(scale + 1, math.ceil(scale * math.sqrt(MARGIN * target / size)))
    raise RuntimeError(f"no mesh reached a working set of {target / MIB:.0f} MiB in {max_tries} tries "
                       f"(last: scale {tried}, {size / MIB:.0f} MiB)")


def _airfoil_shape(i: int) -> tuple[int, int]:
    """``(I, J)`` of ``naca0012`` with ``J = 1.5 I`` as in OP2's 400 x 600 mesh."""
    return i, (3 * i + 1) // 2


def declare_synthetic(n: int):
    """The synthetic chain's problem on ``structured_tris(n, n)``."""
    import synthetic_chain as sc

    from meshchain.meshes import structured_tris

    return sc.declare(structured_tris(n, n))


def declare_airfoil(shape: tuple[int, int]):
    """Airfoil's problem on ``naca0012(*shape)``."""
    import airfoil

    from meshchain.meshes import naca0012

    return airfoil.declare(naca0012(*shape))


def build(name: str, *, fixed, target: int):
    """Declare problem ``name`` ("synthetic" or "airfoil"): with the mesh size ``fixed``
    (``n`` or ``(I, J)``), or sized so that its working set is at least ``target`` bytes.

    Returns
    -------
    (str, problem, int)
        The mesh's description, the problem and its working set in bytes.
    """
    if name == "synthetic":
        if fixed is not None:
            problem = declare_synthetic(fixed)
            return f"structured_tris({fixed}, {fixed})", problem, working_set_bytes(problem)
        n, problem, size = sized_problem(declare_synthetic, target=target, probe=64)
        return f"structured_tris({n}, {n})", problem, size
    if fixed is not None:
        shape = tuple(fixed)
        problem = declare_airfoil(shape)
        return f"naca0012{shape}", problem, working_set_bytes(problem)
    i, problem, size = sized_problem(lambda i: declare_airfoil(_airfoil_shape(i)), target=target, probe=40)
    return f"naca0012{_airfoil_shape(i)}", problem, size


# -- the chains ------------------------------------------------------------------------------

def synthetic_step(problem, nchains: int):
    """One step of the synthetic chain of ``2 nchains`` loops: ``step(tile_size)``."""
    import synthetic_chain as sc

    def step(tile_size):
        sc.run(problem, nchains, 1, tile_size=tile_size)

    return step


def airfoil_step(problem):
    """One Airfoil iteration with each stage as a chain: ``step(tile_size)``."""
    import airfoil

    def step(tile_size):
        airfoil.iterate(problem, ca=True, tile_size=tile_size)

    return step


def variants(name: str, problem, nchains) -> list[tuple[dict, object]]:
    """``(info, step)`` for every chain run on ``problem``."""
    if name == "synthetic":
        return [({"edges": problem.edges.size, "nodes": problem.nodes.size, "loops": 2 * n, "chain": "synthetic"},
                 synthetic_step(problem, n)) for n in nchains]
    return [({"edges": problem.edges.size, "cells": problem.cells.size, "loops": 4, "chain": "stage"},
             airfoil_step(problem))]


def warm_up(name: str, nchains, tile_sizes) -> None:
    """Run every chain of ``name`` untiled and tiled on a tiny mesh, so that compiling the
    kernels, the fused chains and the inspector is not timed on the real mesh."""
    import meshchain as mc

    tiny = declare_synthetic(16) if name == "synthetic" else declare_airfoil((8, 12))
    for _, step in variants(name, tiny, nchains):
        for tile_size in (None, *tile_sizes):
            step(tile_size)
    mc.flush()
    mc.get_runtime().tile_plans.clear()


# -- measurement -----------------------------------------------------------------------------

def summarise(rounds: list[float]) -> tuple[float, float]:
    """The median of ``rounds`` and their spread, the interquartile range over the median
    (:mod:`meshchain.model.timing`, as everywhere else in meshchain).

    Examples
    --------
    >>> summarise([1.0, 1.25, 0.75])
    (1.0, 0.25)
    """
    from meshchain.model.timing import summarise as timing

    summary = timing(rounds)
    return summary.median, summary.spread


def measure(info, step, tile_sizes, *, iters: int, repeats: int) -> list[dict]:
    """Time the untiled and the tiled chain, interleaved, for every tile size."""
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
        rounds = {None: [], tile_size: []}
        for r in range(repeats):
            for variant in ((None, tile_size) if r % 2 == 0 else (tile_size, None)):
                rounds[variant].append(timed(variant))
        (untiled, spread_u), (tiled, spread_t) = summarise(rounds[None]), summarise(rounds[tile_size])
        per_execution_saving = (untiled - tiled) / (2 if info["chain"] == "stage" else 1)
        rows.append({**info, "tile_size": tile_size, "tiles": tiles, "colours": colours,
                     "ms_untiled": untiled * 1e3, "ms_tiled": tiled * 1e3, "speedup": untiled / tiled,
                     "spread_untiled": spread_u, "spread_tiled": spread_t,
                     "noisy": max(spread_u, spread_t) > NOISY,
                     "rounds_ms_untiled": [t * 1e3 for t in rounds[None]],
                     "rounds_ms_tiled": [t * 1e3 for t in rounds[tile_size]],
                     "inspect_s": inspect_s, "loadavg_1min": os.getloadavg()[0],
                     "break_even_executions": inspect_s / per_execution_saving if per_execution_saving > 0 else None})
        print(table(rows[-1:]).split("\n", 2)[-1], flush=True)
    return rows


def table(rows) -> str:
    """The rows as a Markdown table."""
    lines = ["| chain | mesh | working set MiB | loops | threads | tile size | tiles | colours | untiled ms/step | "
             "tiled ms/step | speed-up | spread untiled / tiled | noisy | inspection s | break-even executions |",
             "|---" * 15 + "|"]
    for r in rows:
        even = "never" if r["break_even_executions"] is None else f"{r['break_even_executions']:.0f}"
        size = "whole set" if r["tiles"] == 1 and r["tile_size"] >= WHOLE else r["tile_size"]
        lines.append(f"| {r['chain']} | {r['mesh']} | {r['working_set_bytes'] / MIB:.0f} | {r['loops']} | "
                     f"{r['threads']} | {size} | {r['tiles']} | {r['colours']} | {r['ms_untiled']:.2f} | "
                     f"{r['ms_tiled']:.2f} | **{r['speedup']:.3f}** | {100 * r['spread_untiled']:.1f} % / "
                     f"{100 * r['spread_tiled']:.1f} % | {'yes' if r['noisy'] else 'no'} | {r['inspect_s']:.3f} | "
                     f"{even} |")
    return "\n".join(lines)


def cache_line(llc: int, source: str, factor: float) -> str:
    """One line on the cache and the working-set target."""
    return (f"last-level cache: {llc / MIB:.1f} MiB ({source}); working-set target: {factor:g} x LLC = "
            f"{factor * llc / MIB:.0f} MiB")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="+", choices=("synthetic", "airfoil"), default=["synthetic", "airfoil"])
    parser.add_argument("--size", type=int, help="synthetic mesh: structured_tris(N, N) (~3 N^2 edges); "
                                                 "default: sized from the last-level cache")
    parser.add_argument("--nchains", type=int, nargs="+", default=[2, 4], help="synthetic: loops = 2 x nchains")
    parser.add_argument("--airfoil-size", type=int, nargs=2, metavar=("I", "J"),
                        help="airfoil mesh: naca0012(I, J); default: sized from the last-level cache")
    parser.add_argument("--llc-bytes", type=int, help="last-level cache size in bytes (default: read from the machine)")
    parser.add_argument("--cache-factor", type=float, default=4.0,
                        help="working set of each mesh, in multiples of the last-level cache (default 4)")
    parser.add_argument("--tile-sizes", type=int, nargs="+", default=[1024, 4096, 16384, 65536, WHOLE],
                        help=f"seed iterations per tile ({WHOLE}: one tile, the whole set)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iters", type=int, default=5, help="steps per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; the median counts")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "tiling.json")
    args = parser.parse_args(argv)
    if args.llc_bytes is not None and args.llc_bytes <= 0:
        parser.error(f"--llc-bytes must be a positive number of bytes, got {args.llc_bytes}")
    if args.cache_factor <= 0:
        parser.error(f"--cache-factor must be positive, got {args.cache_factor}")
    return args


def run_problem(name: str, args: argparse.Namespace, *, cache: dict) -> list[dict]:
    """Declare problem ``name`` at its size and measure its chains; its data is released on
    return."""
    import meshchain as mc

    llc = cache["llc_bytes"]
    target = math.ceil(args.cache_factor * llc)
    fixed = args.size if name == "synthetic" else args.airfoil_size
    start = time.perf_counter()
    mesh, problem, size = build(name, fixed=fixed, target=target)
    print(f"{name}: {mesh}, working set {size / MIB:.1f} MiB = {size / llc:.2f} x LLC "
          f"(declared in {time.perf_counter() - start:.1f} s)", flush=True)
    if size < target:
        print(f"warning: {mesh} is below the target of {target / MIB:.0f} MiB; part of it may stay in cache",
              flush=True)
    rows = []
    for threads in args.threads:
        mc.configure(threads=threads)
        warm_up(name, args.nchains, args.tile_sizes)
        for info, step in variants(name, problem, args.nchains):
            row = {**info, "mesh": mesh, "working_set_bytes": size, **cache, "threads": threads}
            rows += measure(row, step, args.tile_sizes, iters=args.iters, repeats=args.repeats)
    mc.get_runtime().tile_plans.clear()
    mc.get_runtime().colourings.clear()
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.llc_bytes is not None:
        llc, source = args.llc_bytes, "--llc-bytes"
    else:
        try:
            llc, source = last_level_cache()
        except RuntimeError as error:
            raise SystemExit(f"tiling.py: {error}") from None
    print(cache_line(llc, source, args.cache_factor), flush=True)
    cache = {"llc_bytes": llc, "llc_source": source, "cache_factor": args.cache_factor}
    start = time.perf_counter()
    rows = [row for name in args.problems for row in run_problem(name, args, cache=cache)]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(rows, indent=1))
    print(f"\n{cache_line(llc, source, args.cache_factor)}; measured in {time.perf_counter() - start:.0f} s")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
