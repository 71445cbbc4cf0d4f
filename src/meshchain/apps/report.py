"""The profitability report: ``python -m meshchain report`` (the OP2 paper's Tables 2 and 5).

For a built-in workload (:mod:`meshchain.apps`: ``synthetic``, ``airfoil``) the report
starts one ``mpiexec`` job per rank count and per-rank size. Each job, for each loop count:

1. checks that the chain gives the same answer loop by loop and communication-avoiding
   (a fresh runtime for each, a few time steps, the workload's checksum);
2. runs warm-up steps each way (compilation and first inspection, then executions the
   model learns from) and calibrates the model on the job's communicator
   (:func:`meshchain.model.calibrate`: ``L``, ``B``, ``c``, ``φ`` measured, ``g_l`` and
   the overheads from the warm-up executions);
3. times ``iters`` steps each way, interleaved, ``repeats`` rounds; the time is the
   chain's own (``ChainStats.time_total``) per execution, slowest rank, and each variant
   reports the median of its rounds and their spread
   (:mod:`meshchain.model.timing`): a row whose spread exceeds ``noisy_spread`` is
   measured again, up to ``max_attempts`` times, and is marked noisy (``*`` after the
   gain) if it stays so;
4. predicts both variants for the chain as it ran (its :class:`ChainProfile`, per rank;
   the slowest rank counts) from the calibration of step 2 alone: the model's "gain" is
   fitted on other executions (the warm-up) than the timed ones it is compared with.

The table has the paper's model components (summed over ranks, per chain execution):
bytes ``Σ d·p·m^1`` vs ``p·m^r``, ``ΣS^c`` of each variant, ``ΣS^1`` vs ``ΣS^h``; the
comm reduction and comp increase of Table 5; the predicted gain by the paper's
equations alone and with the fitted overheads; and the measured gain.

Examples
--------
>>> from meshchain.apps.report import format_table
>>> row = dict(workload="synthetic", ranks=2, per_rank=1000, loops=8, per_loop_bytes=6720, ca_bytes=2720,
...            per_loop_core=38688, per_loop_iterations=40688, ca_core=32113, ca_iterations=41512,
...            comm_reduction=59.5, comp_increase=2.0, paper_gain=3.1, predicted_gain=21.0,
...            predicted_per_loop=1.0e-3, predicted_ca=0.79e-3, per_loop=1.004e-3, ca=0.792e-3,
...            measured_gain=21.1, equal=True, per_loop_spread=0.02, ca_spread=0.15, noisy=True)
>>> print(format_table([row]).splitlines()[2])  # doctest: +NORMALIZE_WHITESPACE
synthetic  2  1000  8  6720  2720  38688  32113  40688  41512  59.5  2.0  +3.1  +21.0  1.000  0.790  1.004  0.792  15.0  +21.1*  yes
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..model.timing import MAX_ATTEMPTS, NOISY_SPREAD, measure_interleaved

__all__ = ["main", "run_report", "format_table", "worker", "predicted", "WORKLOADS", "NETWORKS"]

WORKLOADS = ("synthetic", "vertex", "airfoil", "mgcfd")
WARM_UP = 5  # warm-up steps each way before the calibration (the model's executions)
#: How the ranks of a job talk: shared memory (MPICH's default on one host) or MPICH's TCP
#: network module over loopback (latency like an Ethernet cluster's).
NETWORKS = {"shm": {}, "tcp": {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}}

_COLUMNS = [
    ("workload", "workload", "{}"), ("ranks", "ranks", "{}"), ("per_rank", "size/rank", "{}"), ("loops", "loops", "{}"),
    ("per_loop_bytes", "Σdpm¹ B", "{}"), ("ca_bytes", "pmʳ B", "{}"), ("per_loop_core", "ΣS^c", "{}"),
    ("ca_core", "ΣS^c CA", "{}"), ("per_loop_iterations", "ΣS¹", "{}"), ("ca_iterations", "ΣS^h", "{}"),
    ("comm_reduction", "comm red %", "{:.1f}"), ("comp_increase", "comp inc %", "{:.1f}"),
    ("paper_gain", "eq. gain %", "{:+.1f}"), ("predicted_gain", "model gain %", "{:+.1f}"),
    ("predicted_per_loop", "model loop ms", "ms"), ("predicted_ca", "model CA ms", "ms"),
    ("per_loop", "loop ms", "ms"), ("ca", "CA ms", "ms"), ("spread", "spread %", "spread"),
    ("measured_gain", "gain %", "gain"), ("equal", "equal", "yesno"),
]


def format_table(rows) -> str:
    """The rows as an aligned text table (a header, a rule, one line per row)."""
    header = [title for _, title, _ in _COLUMNS]
    lines = [[_cell(row, key, fmt) for key, _, fmt in _COLUMNS] for row in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.rjust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def _cell(row: dict, key: str, fmt: str) -> str:
    if fmt == "spread":  # the larger relative spread of the two timings
        return f"{100 * max(row.get('per_loop_spread', 0.0), row.get('ca_spread', 0.0)):.1f}"
    value = row[key]
    if fmt == "gain":  # a noisy row is marked, not shown as a fact
        return f"{value:+.1f}" + ("*" if row.get("noisy") else "")
    if fmt == "ms":
        return f"{value * 1e3:.3f}"
    if fmt == "yesno":
        return "yes" if value else "NO"
    return fmt.format(value)


# --- the parent: one mpiexec job per rank count and size -----------------------------------------


def mpiexec() -> str:
    """The ``mpiexec`` next to this Python (the ``mpich`` wheel's), else the one on PATH."""
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def run_report(workload: str, *, ranks, per_rank, loops, iters: int = 10, repeats: int = 5, check_steps: int = 3,
               network: str = "shm", noisy_spread: float = NOISY_SPREAD, max_attempts: int = MAX_ATTEMPTS,
               progress=None, timeout: float = 3600) -> list[dict]:
    """Run the report's jobs and return its rows (see the module docstring).

    ``network`` is a key of :data:`NETWORKS`. ``progress(done, total, label)`` is called
    after every loop count of every job.
    """
    _check_options(workload, ranks, per_rank, loops, iters, repeats)
    if network not in NETWORKS:
        from ..core.errors import ConfigurationError

        raise ConfigurationError(f"unknown network {network!r}: choose one of {', '.join(NETWORKS)}")
    jobs = [(n, size) for n in ranks for size in per_rank]
    total, done, rows = len(jobs) * len(loops), 0, []
    for n, size in jobs:
        command = [mpiexec(), "-n", str(n), sys.executable, "-m", "meshchain", "report-worker", workload,
                   "--per-rank", str(size), "--iters", str(iters), "--repeats", str(repeats),
                   "--check-steps", str(check_steps), "--noisy-spread", str(noisy_spread),
                   "--max-attempts", str(max_attempts), "--loops", *map(str, loops)]
        env = dict(os.environ, MESHCHAIN_THREADS=os.environ.get("MESHCHAIN_THREADS", "1"), MESHCHAIN_NETWORK=network,
                   **NETWORKS[network])
        for message in _stream(command, env, timeout):
            if "row" in message:
                rows.append(message["row"])
                done += 1
                if progress is not None:
                    progress(done, total, f"{n} ranks, {size}/rank, {message['row']['loops']} loops")
    return rows


def _stream(command, env, timeout: float):
    """The JSON lines the job prints, as they come; a failed job raises with its output."""
    from ..core.errors import MeshchainError

    import tempfile

    began = time.monotonic()
    # stderr goes to a file: a pipe nobody reads while stdout streams could fill and stall the job
    with tempfile.TemporaryFile(mode="w+") as log, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log,
                                                                     text=True, env=env) as job:
        for line in job.stdout:
            if line.startswith("{"):
                yield json.loads(line)
            if time.monotonic() - began > timeout:
                job.kill()
                raise MeshchainError(f"report job {' '.join(command)} ran past {timeout:.0f} s and was stopped")
        job.wait()
        log.seek(0)
        errors = log.read()
        if job.returncode != 0:
            raise MeshchainError(f"report job failed (exit {job.returncode}): {' '.join(command)}\n{errors[-4000:]}")


def _check_options(workload, ranks, per_rank, loops, iters, repeats) -> None:
    from ..core.errors import ConfigurationError

    if workload not in WORKLOADS:
        raise ConfigurationError(f"unknown workload {workload!r}: choose one of {', '.join(WORKLOADS)}")
    if not ranks or min(ranks) < 2:
        raise ConfigurationError(f"report: rank counts must be >= 2 (one process has nothing to communicate), "
                                 f"got {list(ranks)}")
    if not per_rank or min(per_rank) < 1 or not loops or min(loops) < 1 or iters < 1 or repeats < 1:
        raise ConfigurationError("report: --per-rank, --loops, --iters and --repeats must be positive")


class ProgressBar:
    """A one-line progress bar on ``stream`` (stderr)."""

    def __init__(self, stream=sys.stderr, width: int = 30):
        self.stream, self.width, self.began = stream, width, time.monotonic()

    def __call__(self, done: int, total: int, label: str) -> None:
        filled = round(self.width * done / total)
        elapsed = time.monotonic() - self.began
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {label:<40} "
                          f"{elapsed:6.1f} s")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()


# --- the worker: runs under mpiexec ---------------------------------------------------------------


def worker(workload: str, *, per_rank: int, loops, iters: int, repeats: int, check_steps: int,
           noisy_spread: float = NOISY_SPREAD, max_attempts: int = MAX_ATTEMPTS) -> None:
    """One job of the report: every loop count, printed as JSON lines by rank 0."""
    app = importlib.import_module(f"meshchain.apps.{workload}")
    for count in loops:
        row = _measure(app, workload, per_rank, count, iters, repeats, check_steps, noisy_spread, max_attempts)
        if row is not None:
            print(json.dumps({"row": row}), flush=True)


def _measure(app, workload, per_rank, loops, iters, repeats, check_steps, noisy_spread, max_attempts) -> dict | None:
    import meshchain as mc

    equal = _same_answer(app, per_rank, loops, check_steps)
    mc.reset_runtime()
    problem = app.setup(per_rank=per_rank, loops=loops)
    comm = mc.get_runtime().comm
    # compile, build the halo layers, warm the caches, then at least three timed executions each way
    # (a plan's first run is never timed, and the loop-by-loop plan is rebuilt once CA has deepened
    # the halo): the model is fitted on these, before and apart from the timed rounds it predicts
    for ca in (False, True) * WARM_UP:
        app.step(problem, ca=ca)
    calibration = mc.model.calibrate(repeats=20)
    timings = measure_interleaved({ca: (lambda ca=ca: _time_chain(mc, app, problem, ca, iters, comm))
                                   for ca in (False, True)},
                                  repeats=repeats, threshold=noisy_spread, max_attempts=max_attempts)
    row = predicted(mc, comm, app.CHAIN, calibration)
    profiles = comm.gather(mc.stats().chains[app.CHAIN].profile.as_dict(), root=0)
    if comm.rank != 0:
        return None
    loop, ca = timings[False], timings[True]
    return {"workload": workload, "ranks": comm.size, "per_rank": per_rank, "loops": app.loops_in_chain(loops),
            **row, "per_loop": loop.median, "ca": ca.median,
            "measured_gain": mc.model.gain_percent(loop.median, ca.median), "equal": equal,
            "per_loop_spread": loop.spread, "ca_spread": ca.spread, "attempts": loop.attempts,
            "noisy": loop.noisy or ca.noisy, "per_loop_samples": list(loop.samples), "ca_samples": list(ca.samples),
            "network": os.environ.get("MESHCHAIN_NETWORK", "shm"), "profiles": profiles,
            "calibration": calibration.as_dict()}


def _same_answer(app, per_rank, loops, steps) -> bool:
    """The workload's checksum after ``steps`` steps, loop by loop and CA, from fresh runtimes."""
    import meshchain as mc

    sums = []
    for ca in (False, True):
        mc.reset_runtime()
        problem = app.setup(per_rank=per_rank, loops=loops)
        for _ in range(steps):
            app.step(problem, ca=ca)
        sums.append(app.checksum(problem))
    return sums[0] == sums[1] or (sums[0] is not None and abs(sums[0] - sums[1]) <= 1e-12 * abs(sums[0]))


def _time_chain(mc, app, problem, ca, iters, comm) -> float:
    """Seconds per chain execution over ``iters`` steps (the slowest rank's)."""
    from mpi4py import MPI

    chain = mc.stats().chains[app.CHAIN]
    before = (chain.time_total, chain.executions)
    comm.Barrier()
    for _ in range(iters):
        app.step(problem, ca=ca)
    mc.flush()
    chain = mc.stats().chains[app.CHAIN]
    seconds = (chain.time_total - before[0]) / max(chain.executions - before[1], 1)
    return comm.allreduce(seconds, op=MPI.MAX)


def predicted(mc, comm, name: str, calibration) -> dict:
    """Both variants predicted for the chain's latest profile (the slowest rank's) from
    ``calibration`` alone (its loop costs and overheads, fitted before the timed runs), and
    the model components summed over ranks."""
    import dataclasses

    import numpy as np
    from mpi4py import MPI

    profile = mc.stats().chains[name].profile
    g, ca_g = calibration.costs(ca=False), calibration.costs(ca=True)
    machine = calibration.machine
    paper = dataclasses.replace(machine, round_overhead=0.0, loop_overhead=0.0)
    times = np.array([profile.per_loop_time(g, machine), profile.ca_time(ca_g, machine),
                      profile.per_loop_time(g, paper), profile.ca_time(ca_g, paper)])
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    totals = profile.totals()
    keys = sorted(totals)
    summed = np.array([totals[k] for k in keys], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, summed, op=MPI.SUM)
    totals = dict(zip(keys, (int(v) for v in summed)))
    return {**totals, "comm_reduction": mc.model.comm_reduction_percent(totals["per_loop_bytes"], totals["ca_bytes"]),
            "comp_increase": mc.model.comp_increase_percent(totals["per_loop_iterations"], totals["ca_iterations"]),
            "predicted_per_loop": float(times[0]), "predicted_ca": float(times[1]),
            "predicted_gain": mc.model.gain_percent(times[0], times[1]),
            "paper_gain": mc.model.gain_percent(times[2], times[3])}


# --- command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m meshchain report",
                                description="Chain profitability: the OP2 CA paper's model against measurement, at "
                                            "several rank counts (Tables 2 and 5).")
    p.add_argument("workload", choices=WORKLOADS, help="built-in chain (meshchain.apps)")
    p.add_argument("--ranks", type=int, nargs="+", default=[2], help="rank counts (default 2)")
    p.add_argument("--per-rank", type=int, nargs="+", default=[2500],
                   help="iterations of the main set each rank owns (default 2500)")
    p.add_argument("--loops", type=int, nargs="+", default=[2, 8, 32], help="loops in the chain (default 2 8 32)")
    p.add_argument("--iters", type=int, default=10, help="chain executions per timed round (default 10)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds per variant; the median counts (default 5)")
    p.add_argument("--network", choices=tuple(NETWORKS), default="shm",
                   help="shm: shared memory; tcp: MPICH's TCP module over loopback (default shm)")
    p.add_argument("--noisy-spread", type=float, default=NOISY_SPREAD,
                   help=f"relative spread above which a row is measured again (default {NOISY_SPREAD})")
    p.add_argument("--max-attempts", type=int, default=MAX_ATTEMPTS,
                   help=f"measurements of a noisy row before it is marked noisy (default {MAX_ATTEMPTS})")
    p.add_argument("--check-steps", type=int, default=3, help="steps of the CA vs loop-by-loop check (default 3)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    rows = run_report(args.workload, ranks=args.ranks, per_rank=args.per_rank, loops=args.loops, iters=args.iters,
                      repeats=args.repeats, check_steps=args.check_steps, network=args.network,
                      noisy_spread=args.noisy_spread, max_attempts=args.max_attempts,
                      progress=None if args.no_progress else ProgressBar())
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0 if all(row["equal"] for row in rows) else 1


def worker_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m meshchain report-worker")
    p.add_argument("workload", choices=WORKLOADS)
    p.add_argument("--per-rank", type=int, required=True)
    p.add_argument("--loops", type=int, nargs="+", required=True)
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--repeats", type=int, required=True)
    p.add_argument("--check-steps", type=int, required=True)
    p.add_argument("--noisy-spread", type=float, default=NOISY_SPREAD)
    p.add_argument("--max-attempts", type=int, default=MAX_ATTEMPTS)
    args = p.parse_args(argv)
    worker(args.workload, per_rank=args.per_rank, loops=args.loops, iters=args.iters, repeats=args.repeats,
           check_steps=args.check_steps, noisy_spread=args.noisy_spread, max_attempts=args.max_attempts)
    return 0


# --- the demo ------------------------------------------------------------------------------------

_DEMO = (
    ("synthetic", "the OP2 paper's synthetic chain (update, edge_flux repeated), ~2500 edges per rank",
     dict(per_rank=[2500], loops=[2, 8, 32])),
    ("vertex", "a vertex-centred chain (flux on the edges into the nodes, relax on the nodes) repeated, "
               "~2500 edges per rank; CA runs it as one segment",
     dict(per_rank=[2500], loops=[2, 8])),
    ("airfoil", "OP2's Airfoil, one stage (adt_calc, res_calc, bres_calc, update) as a chain, ~20000 cells per rank",
     dict(per_rank=[20000], loops=[4])),
)


def demo_main(argv=None) -> int:
    """What ``make demo`` runs: the three workloads on 2 ranks, loop by loop and CA, checked equal,
    and the profitability table."""
    p = argparse.ArgumentParser(prog="python -m meshchain demo")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (for tests)")
    args = p.parse_args(argv)
    print(f"meshchain demo: loop chains on {args.ranks} MPI ranks (mpiexec from the mpich wheel), each run loop by "
          f"loop and communication-avoiding; results compared, times measured and predicted by the OP2 paper's "
          f"model (equations 1-4) calibrated on this machine.\n", flush=True)
    rows = []
    for workload, what, sizes in _DEMO:
        print(f"{workload}: {what}", flush=True)
        options = dict(sizes, iters=10, repeats=5)
        if args.quick:
            options = dict(per_rank=[max(200, s // 10) for s in sizes["per_rank"]], loops=sizes["loops"][:2],
                           iters=3, repeats=1)
        rows += run_report(workload, ranks=[args.ranks], progress=ProgressBar(), **options)
    print()
    print(format_table(rows))
    print(_DEMO_LEGEND)
    _print_calibration(rows)
    same = all(row["equal"] for row in rows)
    print("results: loop by loop and communication-avoiding agree in every row" if same else
          "results: MISMATCH between loop by loop and communication-avoiding (column 'equal')")
    return 0 if same else 1


_DEMO_LEGEND = """
Columns, per chain execution and summed over ranks: bytes sent loop by loop (Σdpm¹) and as one grouped
message (pmʳ); core iterations overlapping communication (ΣS^c) and all iterations (ΣS¹ loop by loop, ΣS^h
with the redundant halo work of CA); Table 5's comm reduction and comp increase; the gain of CA predicted by
the paper's equations alone ('eq.') and with meshchain's own per-round and per-loop costs fitted ('model';
both from a calibration taken on warm-up executions, before and apart from the timed ones);
then the measured times (medians of repeated rounds), their larger relative spread, and the gain
(1 - T_ca / T_loop; '*': still noisy after re-measuring, not to be read as a fact). CA pays when the messages it saves cost more than the
redundant halo work it adds: with many loops and small partitions; it does not with few loops on large ones.
ca="auto" makes this choice per chain from the calibrated model."""


def _print_calibration(rows) -> None:
    if rows:
        from ..model.calibrate import Calibration

        calibration = Calibration.from_dict(rows[-1]["calibration"])
        print(f"calibration ({calibration.created}): {calibration.describe()}")
