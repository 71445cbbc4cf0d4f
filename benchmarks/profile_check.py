"""Does the profiler tell the truth? Airfoil on 2 ranks, communication-avoiding (issue 34).

Three figures, each against a measurement the profiler does not make:

``coverage``
    The per-loop times of the trace (``meshchain.core.profiling.loop_seconds``: every plan
    run shared out to its loops) summed, over the iteration time measured around the
    profiled iterations with ``time.perf_counter`` (slowest rank). What is missing is the
    Python between plan runs (recording loops, the trace, reading ``rms``).
``overhead``
    The iteration time profiled over the same unprofiled (interleaved rounds).
``update GB/s``
    ``mc.stats(summary=True)``'s achieved bandwidth of ``update`` (its bytes from the access
    descriptors over its compute time) against the same bytes over the time of ``update``
    measured independently: ``perf_counter`` around ``par_loop(update)`` + ``flush()``
    run on its own (the loop's whole cost on a rank), and a bare Numba function doing
    ``update``'s arithmetic on arrays of the rank's size (the floor). The summary is taken
    from a run loop by loop (``update`` is a plan of its own) and from the CA run (where
    ``update`` shares fused phases with the chain's other loops and gets its time by iterations).

Usage::

    python benchmarks/profile_check.py                      # 2 ranks, shm and tcp; naca0012(240, 360)
    python benchmarks/profile_check.py --network shm --size 120 180 --iters 20
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
TCP = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}


def bare_update_seconds(cells: int, repeats: int) -> float:
    """Seconds per call of a bare Numba ``update`` over ``cells`` cells (median)."""
    import numba
    import numpy as np

    @numba.njit(cache=False)
    def update(qold, q, res, adt, rms):
        total = 0.0
        for i in range(qold.shape[0]):
            adti = 1.0 / adt[i, 0]
            for n in range(4):
                delta = adti * res[i, n]
                q[i, n] = qold[i, n] - delta
                res[i, n] = 0.0
                total += delta * delta
        rms[0] += total

    qold, q, res = (np.random.default_rng(k).random((cells, 4)) for k in range(3))
    adt, rms = np.ones((cells, 1)) + 1.0, np.zeros(1)
    update(qold, q, res, adt, rms)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        update(qold, q, res, adt, rms)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def worker(size, iters: int, rounds: int) -> dict | None:
    import numpy as np

    import meshchain as mc
    from meshchain.apps import airfoil
    from meshchain.core.profiling import loop_seconds
    from meshchain.meshes import naca0012

    session = mc.get_runtime()
    comm = session.comm
    problem = airfoil.declare(naca0012(*size))
    airfoil.run(problem, 3, out=None, ca=True)
    airfoil.run(problem, 3, out=None)

    def slowest(seconds: float) -> float:
        return comm.allreduce(seconds, op=__import__("mpi4py").MPI.MAX) if comm is not None else seconds

    def iterations(profiled: bool):
        comm is not None and comm.Barrier()
        if profiled:
            with mc.profile() as profile:
                start = time.perf_counter()
                for _ in range(iters):
                    airfoil.iterate(problem, ca=True)
                mc.flush()
                seconds = time.perf_counter() - start
            return slowest(seconds) / iters, profile
        start = time.perf_counter()
        for _ in range(iters):
            airfoil.iterate(problem, ca=True)
        mc.flush()
        return slowest(time.perf_counter() - start) / iters, None

    plain, profiled, coverage = [], [], []
    for _ in range(rounds):  # interleaved
        plain.append(iterations(False)[0])
        seconds, profile = iterations(True)
        profiled.append(seconds)
        traced = sum(loop_seconds(profile.events).values()) / iters  # this rank's plan runs
        coverage.append(slowest(traced) / seconds)

    mc.stats(reset=True)
    for _ in range(iters):
        airfoil.iterate(problem, ca=True)
    ca_summary = mc.stats(summary=True)
    mc.stats(reset=True)
    for _ in range(iters):
        airfoil.iterate(problem, ca=None)
    loop_summary = mc.stats(summary=True)

    a = problem
    alone = []
    for _ in range(rounds):
        comm is not None and comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            mc.par_loop(airfoil.update, a.cells, a.p_qold(mc.READ), a.p_q(mc.WRITE), a.p_res(mc.RW),
                        a.p_adt(mc.READ), a.rms(mc.INC))
            mc.flush()
        alone.append(slowest(time.perf_counter() - start) / iters)
    owned = a.p_q.data_ro.shape[0]
    bare = slowest(bare_update_seconds(owned, 10 * iters))
    update_bytes = loop_summary.loops["update"].bytes_moved / loop_summary.loops["update"].calls  # all ranks, per call
    if session.rank != 0:
        return None
    median = float(np.median(plain)), float(np.median(profiled)), float(np.median(coverage))
    return {"ranks": session.size, "cells": a.cells.size, "iters": iters, "rounds": rounds,
            "iteration_ms": median[0] * 1e3, "iteration_profiled_ms": median[1] * 1e3,
            "overhead": median[1] / median[0], "coverage": median[2],
            "update_bytes_per_call": update_bytes,
            "update_gbs_summary_loop_by_loop": loop_summary.loops["update"].gbytes_per_second,
            "update_gbs_summary_ca": ca_summary.loops["update"].gbytes_per_second,
            "update_gbs_alone": update_bytes / float(np.median(alone)) / 1e9,
            "update_gbs_bare_numba": update_bytes / bare / 1e9,
            "copy_gbs": loop_summary.copy_bandwidth / 1e9, "copy_source": loop_summary.copy_source}


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=("shm", "tcp", "both"), default="both")
    parser.add_argument("--size", type=int, nargs=2, default=(240, 360))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--json", default=str(HERE / "results" / "profile_check.json"))
    args = parser.parse_args()
    if args.worker:
        result = worker(args.size, args.iters, args.rounds)
        if result is not None:
            print(json.dumps(result))
        return
    rows = []
    for network in (("shm", "tcp") if args.network == "both" else (args.network,)):
        env = dict(os.environ, **(TCP if network == "tcp" else {}))
        env.pop("MESHCHAIN_MPI_CHILD", None)
        command = [mpiexec(), "-n", str(args.ranks), sys.executable, __file__, "--worker", "--size", *map(str, args.size),
                   "--iters", str(args.iters), "--rounds", str(args.rounds)]
        out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=1800)
        rows.append({"network": network, **json.loads(out.stdout.strip().splitlines()[-1])})
    print("| network | cells | iteration ms | profiled ms | overhead | trace / measured | update GB/s: summary "
          "(loop by loop) | summary (CA) | alone (perf_counter) | bare Numba | copy GB/s |")
    print("|---" * 11 + "|")
    for r in rows:
        print(f"| {r['network']} | {r['cells']} | {r['iteration_ms']:.3f} | {r['iteration_profiled_ms']:.3f} | "
              f"{r['overhead']:.3f} | {100 * r['coverage']:.1f} % | {r['update_gbs_summary_loop_by_loop']:.2f} | "
              f"{r['update_gbs_summary_ca']:.2f} | {r['update_gbs_alone']:.2f} | {r['update_gbs_bare_numba']:.2f} | "
              f"{r['copy_gbs']:.2f} |")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "command": sys.argv}, indent=2))


if __name__ == "__main__":
    main()
