"""Loop chains on several ranks: communication-avoiding vs per-loop, for two chain patterns.

Variants (``--variants``):

* ``synthetic``: the MG-CFD synthetic chain (OP2 CA paper §4.1.1): ``advance`` on the
  nodes, then ``nchains`` x (update, edge_flux), every loop over the edges;
* ``vertex``: the vertex-centred finite-volume pattern (:mod:`meshchain.apps.vertex`):
  ``nchains`` x (flux on the edges incremented into the nodes, relax: a direct update
  of the nodes). Communication-avoiding, the node updates run redundantly on the halo
  and the whole chain is ONE segment with one grouped message per neighbour, ``nchains``
  layers deep.

For each network, rank count and per-rank mesh size one ``mpiexec`` job declares the mesh
once and, for every nchains, times ``iters`` executions run loop by loop (``ca=False``)
and as one communication-avoiding chain (``ca=True``), interleaved round by round, after
warm-up executions (compilation and first inspection are never timed). Each variant
reports the median of its rounds (slowest rank) and the spread; a noisy row is measured
again (up to 3 times) and marked ``*``. The job calibrates the model on its communicator
after the warm-up executions, before the timed rounds, and predicts both variants from
that calibration (fitted on other executions than the timed ones). Reported per execution: times, the measured and
predicted gain ``1 - T_ca / T_per_loop``, messages and segments, halo depth, and the
paper's Table 2 components summed over ranks: bytes ``Σ d·p·m¹`` (per-loop) vs ``p·mʳ``
(CA), iterations ``ΣS¹`` (per-loop) vs ``ΣS^h`` (CA). The floor: a bare ``Startall`` /
``Waitall`` exchange with each neighbour, timed in the same job. One Numba thread per
rank; on a 2-core machine 4 ranks oversubscribe the cores.

Usage::

    python benchmarks/synthetic_chain.py                       # writes results/synthetic_chain.json
    python benchmarks/synthetic_chain.py --variants vertex --ranks 2 --edges 2500 --nchains 1 8 --network tcp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def mpiexec() -> str:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def grid_for(edges_per_rank: int, ranks: int) -> int:
    """structured_tris(n, n) has about 3 n^2 interior edges."""
    return max(4, round(math.sqrt(edges_per_rank * ranks / 3)))


def run_job(variant: str, ranks: int, n: int, nchains, iters: int, repeats: int, network: str) -> list[dict]:
    from meshchain.apps.report import NETWORKS

    command = [mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", variant, str(n), str(iters),
               str(repeats), *map(str, nchains)]
    env = dict(os.environ, MESHCHAIN_THREADS="1", **NETWORKS[network])
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=3600)
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    return [dict(row, network=network, variant=variant) for row in rows]


def worker(variant: str, n: int, iters: int, repeats: int, nchains_list) -> None:
    import importlib

    from mpi4py import MPI

    import meshchain as mc
    from meshchain.apps.report import predicted
    from meshchain.meshes import structured_tris
    from meshchain.model.timing import measure_interleaved

    app = importlib.import_module(f"meshchain.apps.{variant}")
    comm = mc.get_runtime().comm or MPI.COMM_SELF
    problem = app.declare(structured_tris(n, n), method="kway")
    results = []
    for nchains in nchains_list:
        # compile, build the halo layers, warm the caches, then executions the model is fitted on
        # (calibrated here, before and apart from the timed rounds it predicts)
        for ca in (False, True) * 4:
            app.run(problem, nchains, 2, ca=ca)
        calibration = mc.model.calibrate(repeats=20, save=False)
        last = {}

        def take(ca, nchains=nchains):
            mc.stats(reset=True)
            comm.Barrier()
            start = time.perf_counter()
            app.run(problem, nchains, iters, ca=ca)
            mc.flush()
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / iters
            last[ca] = mc.stats(all_ranks=True).chains[app.CHAIN]
            return elapsed

        timings = measure_interleaved({ca: (lambda ca=ca: take(ca)) for ca in (False, True)}, repeats=repeats)
        model = predicted(mc, comm, app.CHAIN, calibration)
        per_loop, ca_stats = last[False], last[True]
        t_loop, t_ca = timings[False], timings[True]
        edges = comm.allreduce(problem.edges.n_owned)
        results.append({
            "ranks": comm.size, "edges": edges, "edges_per_rank": edges / comm.size, "nchains": nchains,
            "loops": ca_stats.loops // ca_stats.executions, "iters": iters,
            "ms_per_step_per_loop": t_loop.median * 1e3, "ms_per_step_ca": t_ca.median * 1e3,
            "spread": max(t_loop.spread, t_ca.spread), "noisy": t_loop.noisy or t_ca.noisy,
            "gain_percent": (1 - t_ca.median / t_loop.median) * 100, "predicted_gain": model["predicted_gain"],
            "segments_per_step": ca_stats.segments / ca_stats.executions, "depth": ca_stats.depth,
            "messages_per_step_per_loop": per_loop.messages / iters, "messages_per_step_ca": ca_stats.messages / iters,
            "bytes_per_loop": per_loop.bytes_sent / iters, "bytes_ca": ca_stats.bytes_sent / iters,
            "iterations_per_loop": per_loop.per_loop_iterations / iters, "iterations_ca": ca_stats.iterations / iters,
            "neighbours_max": ca_stats.neighbours, "floor_exchange_ms": _bare_exchange(comm) * 1e3,
        })
    if comm.rank == 0:
        print(json.dumps(results))


def _bare_exchange(comm, *, repeats: int = 200) -> float:
    """The floor: seconds for a bare persistent exchange of 8 bytes with the ring neighbours
    (median, slowest rank)."""
    import numpy as np
    from mpi4py import MPI

    peers = sorted({(comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size} - {comm.rank})
    out = [np.ones(1) for _ in peers]
    back = [np.empty(1) for _ in peers]
    requests = [comm.Send_init(o, dest=p, tag=5) for o, p in zip(out, peers)]
    requests += [comm.Recv_init(b, source=p, tag=5) for b, p in zip(back, peers)]
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        MPI.Prequest.Startall(requests)
        MPI.Request.Waitall(requests)
        samples.append(time.perf_counter() - start)
    for request in requests:
        request.Free()
    return comm.allreduce(float(np.median(samples)), op=MPI.MAX)


def table(rows) -> str:
    head = ("| variant | network | ranks | edges/rank | loops | per-loop ms | CA ms | spread % | gain % | model gain % | "
            "segments | depth | msgs/exec (all ranks) loop→CA | bytes Σd·p·m¹ → p·mʳ | ΣS¹ → ΣS^h | bare exchange ms |")
    lines = [head, "|---" * 16 + "|"]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['network']} | {r['ranks']} | {r['edges_per_rank']:.0f} | {r['loops']} | "
            f"{r['ms_per_step_per_loop']:.3f} | {r['ms_per_step_ca']:.3f} | {100 * r['spread']:.1f} | "
            f"{r['gain_percent']:+.1f}{'*' if r['noisy'] else ''} | {r['predicted_gain']:+.1f} | "
            f"{r['segments_per_step']:.0f} | {r['depth']} | {r['messages_per_step_per_loop']:.0f} → "
            f"{r['messages_per_step_ca']:.0f} | {r['bytes_per_loop']:.0f} → {r['bytes_ca']:.0f} | "
            f"{r['iterations_per_loop']:.0f} → {r['iterations_ca']:.0f} | {r['floor_exchange_ms']:.4f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        variant = sys.argv[2]
        n, iters, repeats, *nchains = map(int, sys.argv[3:])
        worker(variant, n, iters, repeats, nchains)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=("synthetic", "vertex"), default=["synthetic", "vertex"])
    parser.add_argument("--networks", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--edges", type=int, nargs="+", default=[2500, 10000, 40000], help="edges per rank")
    parser.add_argument("--nchains", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--iters", type=int, default=10, help="chain executions per round")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; the median counts")
    parser.add_argument("--output", type=Path, default=HERE / "results" / "synthetic_chain.json")
    args = parser.parse_args(argv)
    rows = []
    for variant in args.variants:
        for network in args.networks:
            for ranks in args.ranks:
                for edges in args.edges:
                    rows += run_job(variant, ranks, grid_for(edges, ranks), args.nchains, args.iters, args.repeats,
                                    network)
                    print(table(rows[-len(args.nchains):]).split("\n", 2)[-1], flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
