"""Predicted against measured time per iteration of the Krylov methods (issue 36, item 3).

:func:`run_krylov_report` starts one ``mpiexec`` job per rank count and per-rank size; each
job declares a P1 Poisson problem on a structured tetrahedral mesh, asks the Krylov model
for its predictions (``mc.solve(..., method="sstep-cg", s="auto")``: the costs are measured
on the matrix, :mod:`meshchain.linalg.tune`) and then times ``cg``, ``pipecg``, the block
s-step CG with ``s`` = 2, 4 and the model's choice, and CA-CG with ``s = 4`` (median of ``repeats`` solves, slowest rank, the
first solve not counted). A row per method: its iterations, measured and predicted seconds
per iteration, and whether the model chose it. The profitability notebook plots them.

Examples
--------
``run_krylov_report(ranks=[2], per_rank=[2000], network="tcp")`` starts one job (the
notebook's section runs it); each of its rows names one of these methods:

>>> [name if steps is None else f"{name} s={steps}" for name, steps in METHODS]
['cg', 'pipecg', 'sstep-cg s=2', 'sstep-cg s=4', 'ca-cg s=4']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from .report import NETWORKS, _stream, mpiexec

__all__ = ["run_krylov_report", "worker_main", "METHODS"]

METHODS = (("cg", None), ("pipecg", None), ("sstep-cg", 2), ("sstep-cg", 4), ("ca-cg", 4))
"""The methods each job times (with Jacobi), and the s-step ``s`` the model chose."""


def run_krylov_report(*, ranks, per_rank, network: str = "shm", repeats: int = 3, rtol: float = 1e-8,
                      timeout: float = 1800) -> list[dict]:
    """The rows of every job (see the module docstring); ``network`` a key of
    :data:`meshchain.apps.report.NETWORKS`."""
    if network not in NETWORKS:
        from ..core.errors import ConfigurationError

        raise ConfigurationError(f"unknown network {network!r}: choose one of {', '.join(NETWORKS)}")
    rows = []
    for n in ranks:
        for size in per_rank:
            command = [mpiexec(), "-n", str(n), sys.executable, "-m", "meshchain", "krylov-worker",
                       "--per-rank", str(size), "--repeats", str(repeats), "--rtol", str(rtol)]
            env = dict(os.environ, MESHCHAIN_THREADS=os.environ.get("MESHCHAIN_THREADS", "1"),
                       MESHCHAIN_NETWORK=network, **NETWORKS[network])
            rows += [dict(message["row"], network=network) for message in _stream(command, env, timeout)
                     if "row" in message]
    return rows


def worker_main(argv=None) -> int:
    """``python -m meshchain krylov-worker``: one job's rows as JSON lines (rank 0)."""
    parser = argparse.ArgumentParser(prog="python -m meshchain krylov-worker")
    parser.add_argument("--per-rank", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rtol", type=float, default=1e-8)
    args = parser.parse_args(argv)
    import meshchain as mc
    from meshchain.apps import poisson
    from meshchain.meshes import structured_tets

    comm = mc.get_runtime().comm
    ranks = 1 if comm is None else comm.size
    side = max(2, round((args.per_rank * ranks) ** (1 / 3)) - 1)
    problem = poisson.declare(structured_tets(side, side, side))
    auto = _timed(mc, problem, comm, "sstep-cg", "auto", args)
    chosen = auto["steps"]
    methods = list(METHODS) + ([("sstep-cg", chosen)] if ("sstep-cg", chosen) not in METHODS else [])
    for method, steps in methods:
        found = _timed(mc, problem, comm, method, steps, args)
        name = method if steps is None else f"{method} s={steps}"
        row = {"ranks": ranks, "per_rank": args.per_rank, "unknowns": problem.mesh.nodes.size, "method": name,
               "iterations": found["iterations"], "measured": found["per_iteration"],
               "predicted": auto["predicted"][name], "chosen": method == "sstep-cg" and steps == chosen,
               "converged": found["converged"]}
        if comm is None or comm.rank == 0:
            print(json.dumps({"row": row}), flush=True)
    return 0


def _timed(mc, problem, comm, method: str, steps, args) -> dict:
    """Median seconds per iteration of ``repeats`` solves (slowest rank; the first not counted)."""
    options = {} if steps is None else {"s": steps}
    times, info = [], None
    for repeat in range(args.repeats + 1):
        problem.u.data[...] = 0.0
        if comm is not None:
            comm.Barrier()
        began = time.perf_counter()
        info = mc.solve(problem.A, problem.u, problem.b, method=method, pc="jacobi", rtol=args.rtol, **options)
        elapsed = time.perf_counter() - began
        if comm is not None:
            elapsed = comm.allreduce(elapsed, op=_max())
        if repeat:
            times.append(elapsed / max(info.iterations, 1))
    return {"per_iteration": statistics.median(times), "iterations": info.iterations, "steps": info.steps,
            "predicted": info.predicted, "converged": bool(info.converged)}


def _max():
    from mpi4py import MPI

    return MPI.MAX
