"""Extruded loops (issue 38): meshchain's loops over prisms extruded from a triangle mesh, against
the same loops on a plain set with the maps written out, and a hand-written Numba double loop over
columns and layers that finds each layer's nodes by index arithmetic from its column's bottom row,
read once per column (the floor, written as a Numba user writes it).

Three loops over the prisms (``n x n`` squares split into triangles, ``--layers`` per column):

* ``direct``: ``b = 2 a + b`` on two cell dats;
* ``indirect read``: each prism's mean of a node dat at its 6 vertices (a whole-map READ);
* ``indirect inc``: each prism adds its value to its 6 vertices (a whole-map INC: meshchain
  colours it; the hand-written loop runs it serially, as a user without colouring must).

Per loop and variant: milliseconds per loop (median of ``--rounds`` interleaved rounds, each
``--repeats`` loops then one ``mc.flush``, as a user's time loop runs them) and the ratio to the
hand-written loop. Each configuration runs in its own worker process: the user's environment
(default threads; the hand-written direct and read loops use ``prange`` over columns) and a
labelled row with one thread (``MESHCHAIN_THREADS=1 NUMBA_NUM_THREADS=1``).

``--ranks 2`` adds rows on 2 ranks (``mpiexec``, one thread each, ``--network shm`` and/or
``tcp``; ``--ranks-n`` squares across, default 125: 2 million prisms): the mesh partitioned by
``"block"`` (contiguous columns), each time the slowest rank's;
meshchain's loops exchange the halo each time (the increment's and the read's nodes), the
hand-written loops run each rank's block of columns with no message at all (a floor).

Usage::

    .venv/bin/python benchmarks/extruded.py                    # n = 250, 64 layers: 8 M prisms
    .venv/bin/python benchmarks/extruded.py --n 60 --layers 32
    .venv/bin/python benchmarks/extruded.py --ranks 2 --network shm tcp   # and rows on 2 ranks

Writes ``benchmarks/results/extruded.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
from mpi4py import MPI

import meshchain as mc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comm import TCP, mpiexec, user_environment  # noqa: E402

@mc.kernel
def axpy(x, y):
    y[0] = 2.0 * x[0] + y[0]


@mc.kernel
def mean6(m, z):
    m[0] = (z[0, 0] + z[1, 0] + z[2, 0] + z[3, 0] + z[4, 0] + z[5, 0]) * (1.0 / 6.0)


@mc.kernel
def spread6(v, t):
    t[0, 0] += v[0]
    t[1, 0] += v[0]
    t[2, 0] += v[0]
    t[3, 0] += v[0]
    t[4, 0] += v[0]
    t[5, 0] += v[0]


LOOPS = ("direct", "indirect read", "indirect inc")
VARIANTS = ("meshchain extruded", "meshchain flat maps", "hand-written Numba")
CONFIGURATIONS = {"default threads": {}, "1 thread (MESHCHAIN_THREADS=1 NUMBA_NUM_THREADS=1)":
                  {"MESHCHAIN_THREADS": "1", "NUMBA_NUM_THREADS": "1"}}


def prism_mesh(n: int, layers: int):
    """``(triangles, number of vertices, bottom rows of the prism -> vertex-level map)``."""
    from meshchain.meshes import structured_tris

    base = structured_tris(n, n)
    tri = base.cells.astype(np.int64)
    bottom = np.concatenate([tri * (layers + 1), tri * (layers + 1) + 1], axis=1)
    return tri, base.nnode, bottom


def meshchain_loops(n: int, layers: int, *, extruded: bool, comm=None):
    """The three loops as closures recording one loop each, on a new runtime (partitioned in
    blocks of columns on several ranks)."""
    mc.reset_runtime(comm=comm)
    tri, nv, bottom = prism_mesh(n, layers)
    if extruded:
        cells = mc.ExtrudedSet(mc.Set(len(tri), "triangles"), layers, "prisms")
        nodes = mc.ExtrudedSet(mc.Set(nv, "vertices"), layers + 1, "nodes")
        c2n = mc.Map(cells, nodes, 6, bottom, "c2n", offset=[1] * 6)
    else:
        cells, nodes = mc.Set(len(tri) * layers, "prisms"), mc.Set(nv * (layers + 1), "nodes")
        every_layer = (bottom[:, None, :] + np.arange(layers)[None, :, None]).reshape(-1, 6)
        c2n = mc.Map(cells, nodes, 6, every_layer, "c2n")
    rng = np.random.default_rng(0)
    a = mc.Dat(cells, 1, rng.random(cells.size), "a")
    b = mc.Dat(cells, 1, rng.random(cells.size), "b")
    z = mc.Dat(nodes, 1, rng.random(nodes.size), "z")
    acc = mc.Dat(nodes, 1, None, "acc")
    mc.partition("block", seed_set=cells)
    return {
        "direct": lambda: mc.par_loop(axpy, cells, a(mc.READ), b(mc.RW)),
        "indirect read": lambda: mc.par_loop(mean6, cells, b(mc.WRITE), z(mc.READ, c2n)),
        "indirect inc": lambda: mc.par_loop(spread6, cells, a(mc.READ), acc(mc.INC, c2n)),
    }, mc.flush


@numba.njit(parallel=True, nogil=True)
def hand_direct(a, b, layers):
    for c in numba.prange(len(a) // layers):
        for l in range(layers):
            e = c * layers + l
            b[e] = 2.0 * a[e] + b[e]


@numba.njit(parallel=True, nogil=True)
def hand_read(bottom, z, b, layers):
    for c in numba.prange(bottom.shape[0]):
        n0, n1, n2, n3, n4, n5 = bottom[c, 0], bottom[c, 1], bottom[c, 2], bottom[c, 3], bottom[c, 4], bottom[c, 5]
        for l in range(layers):
            b[c * layers + l] = (z[n0 + l] + z[n1 + l] + z[n2 + l] + z[n3 + l] + z[n4 + l] + z[n5 + l]) * (1.0 / 6.0)


@numba.njit(nogil=True)
def hand_inc(bottom, a, acc, layers):
    for c in range(bottom.shape[0]):
        n0, n1, n2, n3, n4, n5 = bottom[c, 0], bottom[c, 1], bottom[c, 2], bottom[c, 3], bottom[c, 4], bottom[c, 5]
        for l in range(layers):
            v = a[c * layers + l]
            acc[n0 + l] += v
            acc[n1 + l] += v
            acc[n2 + l] += v
            acc[n3 + l] += v
            acc[n4 + l] += v
            acc[n5 + l] += v


def hand_loops(n: int, layers: int, comm=None):
    """The hand-written loops; on several ranks over this rank's block of columns."""
    tri, nv, bottom = prism_mesh(n, layers)
    if comm is not None:
        edges = np.linspace(0, len(tri), comm.size + 1).astype(np.int64)
        tri, bottom = tri[edges[comm.rank]:edges[comm.rank + 1]], bottom[edges[comm.rank]:edges[comm.rank + 1]]
    rng = np.random.default_rng(0)
    a, b = rng.random(len(tri) * layers), rng.random(len(tri) * layers)
    z, acc = rng.random(nv * (layers + 1)), np.zeros(nv * (layers + 1))

    return {"direct": lambda: hand_direct(a, b, layers), "indirect read": lambda: hand_read(bottom, z, b, layers),
            "indirect inc": lambda: hand_inc(bottom, a, acc, layers)}, lambda: None


def worker(config: dict) -> dict:
    """Milliseconds per loop for every variant and loop, rounds interleaved."""
    n, layers, repeats = config["n"], config["layers"], config["repeats"]
    comm = MPI.COMM_WORLD if config.get("ranks") else None
    made = {"meshchain extruded": lambda: meshchain_loops(n, layers, extruded=True, comm=comm),
            "meshchain flat maps": lambda: meshchain_loops(n, layers, extruded=False, comm=comm),
            "hand-written Numba": lambda: hand_loops(n, layers, comm)}
    times = {(v, loop): [] for v in VARIANTS for loop in LOOPS}
    for _ in range(config["rounds"]):
        for variant in VARIANTS:
            loops, flush = made[variant]()
            for loop in LOOPS:
                loops[loop]()
                flush()  # compiled (or loaded from the cache), plans built
                if comm is not None:
                    comm.Barrier()
                began = time.perf_counter()
                for _ in range(repeats):
                    loops[loop]()
                flush()
                took = (time.perf_counter() - began) / repeats * 1e3
                times[variant, loop].append(took if comm is None else comm.allreduce(took, op=MPI.MAX))
    return {f"{v}|{loop}": statistics.median(t) for (v, loop), t in times.items()}


def run_worker(config: dict, env: dict, label: str, ranks: int = 0) -> dict:
    """``config``'s timings from a worker process (under ``mpiexec -n ranks`` when ``ranks``)."""
    command = [sys.executable, __file__, "--worker", json.dumps(dict(config, ranks=ranks))]
    out = subprocess.run([mpiexec(), "-n", str(ranks), *command] if ranks else command, capture_output=True, text=True,
                         env=env, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"the {label} worker failed (exit code {out.returncode}): {out.stdout[-2000:]}{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(result: dict) -> str:
    lines = ["| configuration | loop | " + " | ".join(f"{v}, ms" for v in VARIANTS) + " | extruded / flat | "
             "extruded / hand-written |", "|---" * (4 + len(VARIANTS)) + "|"]
    for name, ms in result["configurations"].items():
        for loop in LOOPS:
            row = [ms[f"{v}|{loop}"] for v in VARIANTS]
            lines.append(f"| {name} | {loop} | " + " | ".join(f"{t:.2f}" for t in row) +
                         f" | {row[0] / row[1]:.2f} | {row[0] / row[2]:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=250, help="squares across the base mesh (2 n^2 triangles; default 250)")
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ranks", type=int, nargs="*", default=[], help="also run on these rank counts (e.g. 2)")
    p.add_argument("--ranks-n", type=int, default=125,
                   help="--n of the rank rows (default 125: 2 million prisms; 8 million, declared whole on every "
                        "rank as this script does, take about 10 GB per rank while mc.partition distributes them)")
    p.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"],
                   help="MPI transport of the rank rows (tcp: MPICH's TCP module over loopback)")
    p.add_argument("--out", default=str(HERE / "results" / "extruded.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        config = json.loads(args.worker)
        timings = worker(config)
        if not config.get("ranks") or MPI.COMM_WORLD.rank == 0:
            print(json.dumps(timings), flush=True)
        return 0
    config = {"n": args.n, "layers": args.layers, "repeats": args.repeats, "rounds": args.rounds}
    result = {"config": config, "configurations": {}}
    for name, extra in CONFIGURATIONS.items():
        result["configurations"][name] = run_worker(config, user_environment(**extra), name)
    for ranks in args.ranks:
        for network in args.network:
            name = f"{ranks} ranks, {network} (1 thread each; n = {args.ranks_n})"
            env = user_environment(MESHCHAIN_THREADS="1", NUMBA_NUM_THREADS="1", **(TCP if network == "tcp" else {}))
            result["configurations"][name] = run_worker(dict(config, n=args.ranks_n), env, name, ranks)
    Path(args.out).parent.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
