"""Communication that overlaps computation: exchange-then-compute, core, eager sends, progress.

Every figure is a ratio within one ``mpiexec`` job: the variants of a table are timed
round by round, interleaved (:func:`meshchain.model.timing.measure_interleaved`), each
one the **median** of ``--repeats`` rounds with its spread (interquartile range /
median); a set of variants whose spread exceeds 10 % is measured again (up to
``--attempts`` times) and a variant still above 10 % is marked ``*`` (noisy). Every
sample is the slowest rank's time per iteration over ``--iters`` iterations. Every
timed region comes after a warm-up: each variant is configured and run in both modes
before any timing (kernels compiled or loaded from ``--cache-dir``, plans, colourings and
halos built), and each sample runs 2 untimed iterations after its ``mc.configure`` (a
changed configuration drops the plans); a sample during which a kernel was compiled is
counted in the JSON (``compilations``: 0 expected). ``--network tcp`` sends MPI messages
through MPICH's TCP module over loopback (``MPIR_CVAR_NOLOCAL=1
MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp``), like an Ethernet cluster; ``shm`` through
shared memory. Ranks x threads beyond the cores oversubscribe the machine: such rows say
"(over)".

Variants (``mc.configure`` options; every one ``transport="persistent"``):

``exchange-then-compute``
    ``overlap=False, eager=False, progress="none"``: wait for a loop's exchanges before
    any of its computation; the reference of every ratio.
``core``
    ``overlap=True, eager=False, progress="none"``: the core iterations run while the
    exchanges are in flight (meshchain's behaviour before eager sends).
``eager``
    ``eager=True, progress="none"``: boundary first; the step before an exchange computes
    the rows other ranks import, posts the exchange, then computes its interior.
``eager+poll``, ``eager+dynamic``, ``eager+poll+dynamic``
    the same with ``progress="poll"`` (a communication thread tests the requests while
    compiled code runs without the GIL) and/or ``interior="dynamic"`` (interior blocks
    handed out in chunks to ``threads`` threads, the communication-driving thread joining
    when its messages are complete).
``eager+thread``
    ``progress="thread"``: MPICH's asynchronous progress thread. MPICH starts it only when
    MPI initialises with it asked for, so it runs in a job of its own, launched with
    ``MESHCHAIN_PROGRESS=thread``, with ``exchange-then-compute`` again as that job's own
    reference. MPICH's thread polls all the time on a core of its own: it slows
    everything in that job, the reference included; compare within the job only.

Workloads (``--workloads``), each in two modes: ``loop``, the chain run loop by loop
(``ca=False``: each loop's exchanges of their own, so consecutive loops' exchanges can be
posted eagerly) and ``ca``, one communication-avoiding chain (``ca=True``):

``airfoil``
    OP2's Airfoil (``meshchain.apps.airfoil``; ``setup(per_rank=...)`` cells per rank, or
    ``naca0012(I, J)`` with ``--airfoil-size I J``, partitioned with ``"rib"``); one
    iteration is ``save_soln`` and two stages, each stage the chain ``"stage"``.
``synthetic``
    The MG-CFD synthetic chain (``meshchain.apps.synthetic``; ``setup(per_rank=...)``
    edges per rank, ``--loops`` loops, ``kway``); one iteration is ``advance`` and the
    chain.

Per row: ms per iteration (median, spread) and its ratio to exchange-then-compute in the
same job; waiting per iteration: the loops' ``time_wait`` plus the chains' ``time_wait``
(``mc.stats()`` after ``mc.stats(reset=True)`` before each sample), divided by the
iterations, of the **slowest rank** (the mean over ranks is in the JSON), and its
reduction in % against exchange-then-compute; the floor: the loops' compute seconds
per iteration (``time_compute``, mean over ranks), what an iteration would take if no
rank waited and nothing else cost; hidden: ``Σ time_hidden / Σ time_flight``
of the loops and chains (the share of the messages' flight the rank computed), **mean
over ranks**. These figures are the medians over the samples the timing kept. One job
per network, rank count, thread count (``NUMBA_NUM_THREADS`` and ``MESHCHAIN_THREADS``
set to it) and group (the variants above; the progress-thread job). A variant the
library refuses here (``mc.configure`` or its first run raises) is skipped with its error
in a note, as is a job whose Numba cannot run the threads asked for.

Output: JSON (``--out``, default ``benchmarks/results/overlap.json``) with the machine (CPU
model, cores, MPICH version, Python, numba, mpi4py) and every measurement; Markdown
tables on stdout (progress on stderr).

Usage::

    .venv/bin/python benchmarks/overlap.py --quick --network shm --ranks 2 --threads 1   # seconds per job
    .venv/bin/python benchmarks/overlap.py                      # shm and tcp, 2 and 4 ranks, 1 and 2 threads
    .venv/bin/python benchmarks/overlap.py --airfoil-size 400 600 --workloads airfoil --ranks 2
    .venv/bin/python benchmarks/overlap.py --variants exchange-then-compute eager eager+thread --threads 2
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
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import (TCP, _ms, _ratio, _spread, airfoil_problem, compilations, machine, mpiexec,  # noqa: E402
                  slowest, timing_dict, write_run)

REFERENCE = "exchange-then-compute"
_EAGER = dict(overlap=True, eager=True, interior="static")
VARIANTS = {
    REFERENCE: dict(overlap=False, eager=False, progress="none", interior="static"),
    "core": dict(overlap=True, eager=False, progress="none", interior="static"),
    "eager": dict(_EAGER, progress="none"),
    "eager+poll": dict(_EAGER, progress="poll"),
    "eager+dynamic": dict(_EAGER, progress="none", interior="dynamic"),
    "eager+poll+dynamic": dict(_EAGER, progress="poll", interior="dynamic"),
    "eager+thread": dict(_EAGER, progress="thread"),
}
THREAD_JOB = ("eager+thread",)  # variants that need MPICH's progress thread, started with MPI
WORKLOADS = ("airfoil", "synthetic")
MODES = {"loop": False, "ca": True}
FULL = dict(per_rank=20000, loops=8, iters=10, repeats=5, attempts=3)
QUICK = dict(per_rank=2000, loops=4, iters=2, repeats=3, attempts=1)
PROGRESS_ENV = ("MESHCHAIN_PROGRESS", "MPICH_ASYNC_PROGRESS", "MPIR_PARAM_ASYNC_PROGRESS", "MPIR_CVAR_ASYNC_PROGRESS")


# --- the worker ----------------------------------------------------------------------------------


def workload(name: str, config: dict):
    """(problem size, what the size counts, one iteration as ``step(ca)``)."""
    import meshchain as mc

    if name == "airfoil":
        from meshchain.apps import airfoil

        problem = airfoil_problem(config)
        return problem.cells.size, "cells", lambda ca: airfoil.iterate(problem, ca=ca)
    from meshchain.apps import synthetic

    problem = synthetic.setup(per_rank=config["per_rank"], loops=config["loops"])

    def step(ca):
        synthetic.step(problem, ca=ca)
        mc.flush()

    return problem.edges.size, "edges", step


def _sums(stats) -> dict:
    records = [*stats.loops.values(), *stats.chains.values()]
    return {"wait": sum(r.time_wait for r in records), "flight": sum(r.time_flight for r in records),
            "hidden": sum(r.time_hidden for r in records),
            "compute": sum(r.time_compute for r in stats.loops.values())}


def _figures(per_rank: list, iters: int) -> dict:
    """One sample's figures from every rank's sums."""
    import numpy as np

    wait = np.array([r["wait"] for r in per_rank]) / iters
    flight = np.array([r["flight"] for r in per_rank])
    hidden = np.array([r["hidden"] for r in per_rank])
    fractions = [h / f for h, f in zip(hidden, flight) if f > 0]
    return {"wait_max": float(wait.max()), "wait_mean": float(wait.mean()),
            "flight_mean": float(flight.mean() / iters),
            "hidden": float(np.mean(fractions)) if fractions else float("nan"),
            "compute_mean": float(np.mean([r["compute"] for r in per_rank]) / iters)}


def worker(config: dict) -> dict:
    import meshchain as mc

    session = mc.get_runtime()  # meshchain starts MPI: MESHCHAIN_PROGRESS=thread switches MPICH's thread on first
    import numba
    import numpy as np

    from meshchain.comm.transports import intracomm
    from meshchain.model.timing import measure_interleaved

    comm = intracomm(session.comm)
    threads, iters = config["threads"], config["iters"]
    if numba.config.NUMBA_NUM_THREADS < threads:
        return {"skipped": f"Numba offers {numba.config.NUMBA_NUM_THREADS} threads (NUMBA_NUM_THREADS), "
                           f"{threads} asked for"}
    results = []
    for name in config["workloads"]:
        mc.reset_runtime(threads=threads, transport="persistent")  # each workload partitions a mesh of its own
        comm = intracomm(mc.get_runtime().comm)
        size, unit, step = workload(name, config)
        usable, refused = [], {}
        for variant in config["variants"]:  # warm up every variant in both modes; note what the library refuses
            error = None
            try:
                mc.configure(**VARIANTS[variant])
                for ca in (*MODES.values(), *MODES.values()):
                    step(ca)
            except Exception as exc:  # noqa: BLE001 - reported in the table's notes
                error = f"{type(exc).__name__}: {exc}"
            errors = [e for e in comm.allgather(error) if e]
            if errors:
                refused[variant] = errors[0]
            else:
                usable.append(variant)
        rows = []
        for mode, ca in MODES.items():
            records = {v: {} for v in usable}

            def take(variant, ca=ca, records=records):
                mc.configure(**VARIANTS[variant])
                for _ in range(2):
                    step(ca)
                mc.stats(reset=True)
                comm.Barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    step(ca)
                seconds = slowest(comm, time.perf_counter() - start) / iters
                stats = mc.stats()
                sample = _figures(comm.allgather(_sums(stats)), iters)
                sample["compilations"] = comm.allreduce(compilations())
                sample["how"] = {"transport": stats.transport, "progress": stats.progress, "interior": stats.interior}
                records[variant][seconds] = sample
                return seconds

            if not usable:
                continue
            timings = measure_interleaved({v: (lambda v=v: take(v)) for v in usable}, repeats=config["repeats"],
                                          max_attempts=config["attempts"])
            for variant, timing in timings.items():
                kept = [records[variant][s] for s in timing.samples]
                figures = {k: float(np.nanmedian(values)) if not np.isnan(values).all() else float("nan")
                           for k in ("wait_max", "wait_mean", "flight_mean", "hidden", "compute_mean")
                           for values in [np.array([s[k] for s in kept])]}
                rows.append(dict(figures, mode=mode, variant=variant, options=VARIANTS[variant],
                                 iteration=timing_dict(timing), how=kept[-1]["how"],
                                 compilations=sum(s["compilations"] for s in kept)))
        results.append({"workload": name, "size": size, "unit": unit, "rows": rows, "refused": refused})
    return {"workloads": results}


# --- the driver ----------------------------------------------------------------------------------


def jobs(variants: list) -> list:
    """(group, variants) of each job: the progress-thread variants in one of their own, with the reference."""
    main = [v for v in variants if v not in THREAD_JOB]
    thread = [v for v in variants if v in THREAD_JOB]
    groups = [("main", [REFERENCE] + [v for v in main if v != REFERENCE])] if main else []
    return groups + ([("thread", [REFERENCE] + thread)] if thread else [])


def run_job(group: str, network: str, ranks: int, threads: int, config: dict, cache_dir: str,
            timeout: float) -> dict:
    # a cache directory of its own: compiled loops are reused from run to run, and no saved
    # calibration of another program picks a transport or a progress mode
    env = {k: v for k, v in os.environ.items() if k not in PROGRESS_ENV}
    env.update(MESHCHAIN_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads), MESHCHAIN_CACHE_DIR=cache_dir)
    if group == "thread":
        env["MESHCHAIN_PROGRESS"] = "thread"
    if network == "tcp":
        env.update(TCP)
    config = dict(config, threads=threads)
    command = [mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", group, "--config", json.dumps(config)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        raise RuntimeError(f"{group} job on {ranks} ranks x {threads} threads ({network}) failed with exit code "
                           f"{out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pct(value: float, digits: int = 1) -> str:
    return "—" if value != value else f"{value * 100:.{digits}f}"


def table(results: list) -> str:
    head = ("| network | ranks | threads | workload | size | mode | variant | progress | ms/iter | spread % | "
            "÷ exchange-then-compute | floor: compute ms/iter | wait ms/iter (slowest rank) | wait reduction % | "
            "hidden % (mean over ranks) |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for entry in results:
        over = " (over)" if entry["ranks"] * entry["threads"] > entry["cores"] else ""
        for w in entry.get("workloads", []):
            reference = {r["mode"]: r for r in w["rows"] if r["variant"] == REFERENCE}
            for r in w["rows"]:
                ref, it = reference.get(r["mode"]), r["iteration"]
                ratio = _ratio(it, ref["iteration"]) if ref else ""
                reduction = (f"{(1 - r['wait_max'] / ref['wait_max']) * 100:+.1f}"
                             if ref and ref["wait_max"] > 0 and r is not ref else "")
                lines.append(f"| {entry['network']} | {entry['ranks']}{over} | {entry['threads']} | {w['workload']} | "
                             f"{w['size']} {w['unit']} | {r['mode']} | {r['variant']} | {r['how']['progress']} | "
                             f"{_ms(it)} | {_spread(it)} | {ratio} | {r['compute_mean'] * 1e3:.3f} | {r['wait_max'] * 1e3:.3f} | "
                             f"{reduction} | "
                             f"{_pct(r['hidden'])} |")
    return "\n".join(lines)


def notes(results: list) -> list:
    out = []
    for e in results:
        where = f"{e['network']}, {e['ranks']} ranks x {e['threads']} thread(s) ({e['group']} job)"
        if e.get("skipped"):
            out.append(f"- {where}: skipped: {e['skipped']}")
        for w in e.get("workloads", []):
            out += [f"- {where}, {w['workload']}: {v} refused: {error}" for v, error in w["refused"].items()]
            compiled = sum(r["compilations"] for r in w["rows"])
            if compiled:
                out.append(f"- {where}, {w['workload']}: warning: {compiled} kernel compilations inside timed samples")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (seconds per job): smaller defaults")
    parser.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], help="Numba threads per rank")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS),
                        help="exchange-then-compute is always measured, as the reference of each job")
    parser.add_argument("--per-rank", type=int,
                        help="Airfoil cells / synthetic edges per rank (default 20000; quick 2000)")
    parser.add_argument("--airfoil-size", nargs=2, type=int, metavar=("I", "J"),
                        help="a fixed naca0012(I, J) mesh for Airfoil instead (400 600: OP2's 720000 cells)")
    parser.add_argument("--loops", type=int, help="loops in the synthetic chain, even (default 8; quick 4)")
    parser.add_argument("--iters", type=int, help="iterations per sample (default 10; quick 2)")
    parser.add_argument("--repeats", type=int, help="interleaved rounds; the median counts (5; quick 3)")
    parser.add_argument("--attempts", type=int, help="measurements of a noisy set of variants (3; quick 1)")
    parser.add_argument("--out", default=str(HERE / "results" / "overlap.json"))
    parser.add_argument("--cache-dir", default=str(HERE / "build" / "overlap-cache"),
                        help="meshchain's cache directory for the workers (compiled loops are reused)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per mpiexec job")
    parser.add_argument("--worker", choices=("main", "thread"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(json.loads(args.config))
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:
            print(json.dumps(result), flush=True)
        return 0

    defaults = QUICK if args.quick else FULL
    config = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    config.update(airfoil_size=args.airfoil_size, workloads=args.workloads)
    info = machine()
    results = {"main": [], "thread": []}
    began = time.perf_counter()
    for network in args.network:
        for ranks in args.ranks:
            for threads in args.threads:
                for group, variants in jobs(args.variants):
                    start = time.perf_counter()
                    print(f"[overlap] {group}: {ranks} ranks x {threads} threads, {network} ...", end="",
                          file=sys.stderr, flush=True)
                    if ranks < 2:
                        result = {"skipped": "one rank exchanges no halos"}
                    else:
                        result = run_job(group, network, ranks, threads, dict(config, variants=variants),
                                         args.cache_dir, args.timeout)
                    seconds = time.perf_counter() - start
                    print(f" {seconds:.1f} s", file=sys.stderr, flush=True)
                    results[group].append(dict(result, group=group, network=network, ranks=ranks, threads=threads,
                                               cores=info["cores"], seconds=seconds))
    total = time.perf_counter() - began
    airfoil_size = (f"naca0012({args.airfoil_size[0]}, {args.airfoil_size[1]})" if args.airfoil_size else
                    f"setup(per_rank={config['per_rank']})")
    print(f"{info['cpu']}, {info['cores']} cores; {info['mpi']}; mpi4py {info['mpi4py']}, Python {info['python']}, "
          f"numba {info['numba']}. Median of {config['repeats']} interleaved rounds of {config['iters']} iterations "
          f"(slowest rank), '*': spread > 10 % after up to {config['attempts']} attempts; whole run {total:.0f} s. "
          f"Airfoil {airfoil_size}; synthetic chain setup(per_rank={config['per_rank']}, loops={config['loops']}). "
          f"Waiting: loops' + chains' time_wait per iteration, slowest rank; reduction against "
          f"exchange-then-compute; hidden: Σ time_hidden / Σ time_flight, mean over ranks.")
    if results["main"]:
        print("\nHalo exchanges and computation, per variant (one job per network, ranks and threads):\n")
        print(table(results["main"]))
    if results["thread"]:
        print("\nMPICH's asynchronous progress thread (jobs launched with MESHCHAIN_PROGRESS=thread; the thread spins "
              "on a core and slows everything in its job, its own exchange-then-compute reference included: compare "
              "within the job only):\n")
        print(table(results["thread"]))
    remarks = notes(results["main"] + results["thread"])
    if remarks:
        print("\nNotes:\n" + "\n".join(remarks))
    path = write_run(args.out, info, config, total, results, variants=VARIANTS)
    print(f"\nwrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
