"""Airfoil on GPUs under MPI: what crosses between device and host per iteration, loop by
loop (one exchange per dat, Alg. 1) against communication-avoiding chains (one grouped
exchange per chain segment, Alg. 2).

For each variant it counts, per iteration and on the busiest rank: halo exchanges, MPI
messages, staged copies device -> host and host -> device (``gpu_halos="staged"``; each
exchange packs all its rows on the device and crosses once each way) and the bytes they
move; on a GPU also the time per iteration (slowest rank) and the ratio of the two
variants. The counts do not depend on the device, so the host emulation gives them
too; its times mean nothing and are not reported.

Usage::

    python benchmarks/gpu_halos.py                                   # cupy, 2 ranks, 540000 cells
    python benchmarks/gpu_halos.py --backend cuda-emulation --size 20 30 --iters 4   # no GPU

Writes ``benchmarks/results/gpu_halos.json``; prints a Markdown table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = (("per loop", None), ("CA chain", True))


def mpiexec() -> str:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def run_variant(args, ca) -> dict:
    command = [mpiexec(), "-n", str(args.ranks), sys.executable, __file__, "--worker", "--backend", args.backend,
               "--size", *map(str, args.size), "--iters", str(args.iters), "--ca", str(ca)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, MESHCHAIN_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


class Counter:
    """Counts the device's staged copies (and their bytes) by wrapping its methods."""

    def __init__(self, device):
        self.copies = {"out": 0, "in": 0}
        self.bytes = {"out": 0, "in": 0}
        for way, name in (("out", "copy_out"), ("in", "copy_in")):
            setattr(device, name, self._counted(way, getattr(device, name)))

    def _counted(self, way, method):
        def counted(*args):
            self.copies[way] += 1
            self.bytes[way] += args[-2].nbytes  # the source
            return method(*args)
        return counted


def worker(args) -> None:
    sys.path.insert(0, str(HERE.parent / "examples"))
    import airfoil

    import meshchain as mc
    from meshchain.meshes import naca0012

    ca = None if args.ca == "None" else True
    mc.reset_runtime(backend=args.backend, gpu_halos="staged")
    comm = mc.get_runtime().comm
    problem = airfoil.declare(naca0012(*args.size))
    airfoil.run(problem, 2, out=None, ca=ca)  # compile, upload, build halos
    counter = Counter(mc.get_runtime().backend.device)
    mc.stats(reset=True)
    comm.Barrier()
    start = time.perf_counter()
    airfoil.run(problem, args.iters, out=None, report_every=args.iters, ca=ca)
    mc.stats()  # waits for the GPU
    elapsed = time.perf_counter() - start
    stats = mc.stats()
    exchanges = sum(s.exchanges for s in stats.loops.values()) + sum(c.exchanges for c in stats.chains.values())
    messages = sum(s.messages for s in stats.loops.values()) + sum(c.messages for c in stats.chains.values())
    mine = [exchanges, messages, counter.copies["out"], counter.copies["in"], counter.bytes["out"],
            counter.bytes["in"]]
    busiest = comm.allreduce(mine, op=_elementwise_max())
    seconds = comm.allreduce(elapsed, op=_max())
    if comm.rank == 0:
        names = ("exchanges", "messages", "copies_out", "copies_in", "bytes_out", "bytes_in")
        row = {name: value / args.iters for name, value in zip(names, busiest)}
        row["ms_per_iteration"] = seconds / args.iters * 1e3
        row["cells"] = problem.cells.size
        print(json.dumps(row))


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _elementwise_max():
    from mpi4py import MPI

    return MPI.Op.Create(lambda a, b, _: [max(x, y) for x, y in zip(a, b)], commute=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, default=(600, 900), help="NACA0012 mesh (default 540000 cells)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="cupy", choices=("cupy", "cuda-emulation"))
    parser.add_argument("--out", default=str(HERE / "results" / "gpu_halos.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ca", default="None", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    try:
        rows = [dict(run_variant(args, ca), variant=name) for name, ca in VARIANTS]
    except subprocess.CalledProcessError as exc:
        print(f"benchmarks/gpu_halos.py: a run failed:\n{exc.stderr[-3000:]}", file=sys.stderr)
        return 2
    timed = args.backend == "cupy"
    result = {"command": " ".join(["python", "benchmarks/gpu_halos.py", *(argv or sys.argv[1:])]),
              "backend": args.backend, "ranks": args.ranks, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"Airfoil, {rows[0]['cells']} cells, {args.ranks} ranks, {args.backend}; per iteration, busiest rank:")
    print("| variant | exchanges | MPI messages | copies D->H | copies H->D | KiB D->H | KiB H->D |"
          + (" ms/iteration |" if timed else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if timed else ""))
    for row in rows:
        print(f"| {row['variant']} | {row['exchanges']:g} | {row['messages']:g} | {row['copies_out']:g} | "
              f"{row['copies_in']:g} | {row['bytes_out'] / 1024:.1f} | {row['bytes_in'] / 1024:.1f} |"
              + (f" {row['ms_per_iteration']:.3f} |" if timed else ""))
    if timed:
        print(f"CA chain / per loop time: {rows[1]['ms_per_iteration'] / rows[0]['ms_per_iteration']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
