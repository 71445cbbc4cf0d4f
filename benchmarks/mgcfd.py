"""MG-CFD: meshchain's port against OP2's own MG-CFD on the same generated mesh, in one run.

The mesh is :func:`meshchain.meshes.channel_bump` (``--n``: hexahedra across; ``--levels``),
written once as MG-CFD input. Every round times, in turn, each variant's multigrid cycles on
it (``--cycles``, after ``--warmup`` cycles that are not counted; OP2 has no warm-up to
skip, so its whole ``Max total runtime`` over ``--cycles`` cycles counts):

* OP2's MG-CFD (``feature/icpp2023-commavoid``: one synthetic chain per Runge-Kutta stage,
  as meshchain runs it with ``synthetic_loops=2``), built from source beside the project (see
  ``benchmarks/README.md``; ``--op2-bin`` names the folder with ``mgcfd_seq``,
  ``mgcfd_openmp`` and ``mgcfd_mpi``; nothing of it is in the repository): sequential; OpenMP
  with 2 threads; MPI with 2 and 4 ranks (OpenMPI's ``mpirun``, PT-Scotch);
* meshchain: 1 rank with the threads a user gets (all cores), 1 rank with 1 thread (a
  labelled row: ``MESHCHAIN_THREADS=1``), 2 and 4 ranks (``mpiexec``; one thread per rank);
  each also with the cycle captured once (``mc.capture``, :func:`meshchain.apps.mgcfd.captured_cycle`)
  and replayed (rows marked ``captured``; their warm-up is at least
  ``meshchain.engine.replay.COMPILE_AFTER + 4`` cycles, so that the timed cycles replay as in
  a long run: on several ranks as compiled calls); and on 2 ranks captured but every replay
  run step by step in Python (the row ``replayed in Python``: what compiling the replays
  gains, in the same run). The rank rows partition with ``rib`` (the default of
  :func:`meshchain.apps.mgcfd.declare`); rows marked ``kway`` partition the graph, as OP2's MPI
  runs here do (PT-Scotch's k-way), and are compared with OP2 on as many ranks too.

The table gives the median milliseconds per cycle over ``--rounds`` rounds and each
meshchain row's ratio to OP2 on as many cores (sequential for one core, OpenMP for two
threads, MPI for as many ranks): the issue's target is at most 1.0. With 2 cores, 4 ranks
oversubscribe.

``--big N`` instead declares a mesh of ``N`` hexahedra across on ``--ranks`` ranks (4 by
default), partitioned with ``rib`` and ``kway``, and reports the set-up time (generation,
writing, reading in rank blocks, partitioning, the first cycle) and each rank's peak memory.

Usage::

    .venv/bin/python benchmarks/mgcfd.py --op2-bin ../op2build/MG-CFD-app-OP2/bin --n 32
    .venv/bin/python benchmarks/mgcfd.py --big 60 --ranks 4          # 1.0 million nodes

``--figure MODEL.json PNG`` draws the OP2 CA paper's Fig. 10 from a ``benchmarks/model.py
--workload mgcfd`` run: the synthetic chain's measured gain inside MG-CFD against its loop
count, per network, rank count and size, beside the model's held-out prediction.

Writes ``benchmarks/results/mgcfd.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import machine, mpiexec, user_environment  # noqa: E402

OP2_VARIANTS = {"OP2 seq": ("mgcfd_seq", 1, {}), "OP2 OpenMP 2 threads": ("mgcfd_openmp", 1, {"OMP_NUM_THREADS": "2"}),
                "OP2 MPI 2 ranks": ("mgcfd_mpi", 2, {}), "OP2 MPI 4 ranks": ("mgcfd_mpi", 4, {})}
_PLAIN = {"meshchain, default threads": (1, {}), "meshchain, 1 thread (MESHCHAIN_THREADS=1)":
          (1, {"MESHCHAIN_THREADS": "1"}), "meshchain 2 ranks": (2, {}), "meshchain 4 ranks": (4, {})}
_KWAY = {"meshchain 2 ranks, kway": (2, False), "meshchain 4 ranks, kway": (4, False),
         "meshchain 2 ranks, kway, captured": (2, True)}
MESHCHAIN_VARIANTS = {**{name: (ranks, extra, False, "rib") for name, (ranks, extra) in _PLAIN.items()},
                      **{f"{name}, captured": (ranks, extra, True, "rib") for name, (ranks, extra) in _PLAIN.items()},
                      "meshchain 2 ranks, captured, replayed in Python": (2, {}, "python", "rib"),
                      **{name: (ranks, {}, captured, "kway") for name, (ranks, captured) in _KWAY.items()}}
"""name -> (ranks, extra environment, whether each cycle replays a step captured with
``mc.capture``: ``mgcfd.run(..., captured=True)``; ``"python"``: and on several ranks every
replay runs step by step in Python, never compiled; how the mesh is partitioned: ``"rib"``,
the default of :func:`meshchain.apps.mgcfd.declare`, or ``"kway"``, a graph partition as OP2's
MPI runs here make with PT-Scotch)."""
CORES = {"OP2 seq": 1, "OP2 OpenMP 2 threads": 2, "OP2 MPI 2 ranks": 2, "OP2 MPI 4 ranks": 4,
         **{name: ranks for name, (ranks, *_) in MESHCHAIN_VARIANTS.items()}}
_OP2_ALIKE = {"meshchain, default threads": "OP2 OpenMP 2 threads", "meshchain, 1 thread (MESHCHAIN_THREADS=1)": "OP2 seq",
              "meshchain 2 ranks": "OP2 MPI 2 ranks", "meshchain 4 ranks": "OP2 MPI 4 ranks"}
SAME_CORES = {**_OP2_ALIKE, **{f"{name}, captured": op2 for name, op2 in _OP2_ALIKE.items()},
              **{name: f"OP2 MPI {ranks} ranks" for name, (ranks, _) in _KWAY.items()}}


def op2_seconds(binary: Path, ranks: int, extra: dict, folder: Path, cycles: int, timeout: float = 120) -> float:
    """Seconds per cycle of one OP2 MG-CFD run (its own ``Max total runtime``); NaN for an MPI
    run that did not finish in ``timeout`` seconds or crashed (OpenMPI's oversubscribed runs hang
    or die in its shared-memory transport now and then here; the table counts them). A
    sequential or OpenMP run that fails raises."""
    command = [str(binary), "-i", "input.dat", "-g", str(cycles)]
    if ranks > 1:
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), *command, "-m", "ptscotch"]
    try:
        out = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=user_environment(**extra),
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return float("nan")
    found = re.search(r"Max total runtime = ([0-9.eE+-]+)", out.stdout)
    if out.returncode and ranks > 1:
        print(f"{' '.join(command)} failed ({out.returncode}); counted as a failed run", file=sys.stderr)
        return float("nan")
    if out.returncode or found is None:
        raise RuntimeError(f"{' '.join(command)} failed ({out.returncode}): {out.stdout[-2000:]}{out.stderr[-2000:]}")
    return float(found.group(1)) / cycles


def meshchain_seconds(ranks: int, extra: dict, folder: Path, cycles: int, warmup: int, cache: str, *,
                      captured: bool, method: str = "rib") -> dict:
    """Seconds per cycle of meshchain's MG-CFD (a worker job; slowest rank), its threads."""
    config = json.dumps({"input": str(folder / "input.dat"), "cycles": cycles, "warmup": warmup, "captured": captured,
                         "method": method})
    command = [sys.executable, __file__, "--worker", config]
    if ranks > 1:
        command = [mpiexec(), "-n", str(ranks), *command]
    env = user_environment(MESHCHAIN_CACHE_DIR=cache, **extra)
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"meshchain on {ranks} ranks failed: {out.stdout[-2000:]}{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker(config: dict) -> dict:
    import meshchain as mc
    from meshchain.apps import mgcfd

    from meshchain.engine import replay

    problem = mgcfd.declare(config["input"], synthetic_loops=2, method=config["method"])
    warmup = config["warmup"]
    if config["captured"] == "python":
        replay.COMPILE_AFTER = 10**9
    elif config["captured"]:  # the timed cycles replay as in a long run: on several ranks compiled (the first
        warmup = max(warmup, replay.COMPILE_AFTER + 4)  # cycles capture and meet new halo states; measured: the
        # 35th cycle compiles, or loads from the disk cache, when COMPILE_AFTER is 32)

    def run(cycles):  # captured: the warm-up captures, the timed cycles replay
        mgcfd.run(problem, cycles, captured=bool(config["captured"]))

    run(warmup)
    comm = mc.get_runtime().comm
    if comm is not None:
        comm.Barrier()
    began = time.perf_counter()
    run(config["cycles"])
    seconds = (time.perf_counter() - began) / config["cycles"]
    if comm is not None:
        from mpi4py import MPI

        seconds = comm.allreduce(seconds, op=MPI.MAX)
    threads = mc.get_runtime().backend.threads_in_use()
    return {"seconds": seconds, "threads": threads}


def big_worker(config: dict) -> dict:
    """Set-up of a large mesh read in rank blocks, per partitioner: seconds and peak memory."""
    import resource

    import meshchain as mc
    from meshchain.apps import mgcfd

    out = {}
    for method in ("rib", "kway"):
        mc.reset_runtime()
        comm = mc.get_runtime().comm
        began = time.perf_counter()
        problem = mgcfd.declare(config["input"], synthetic_loops=0, method=method)
        declared = time.perf_counter() - began
        mgcfd.run(problem, 1)
        first = time.perf_counter() - began - declared
        began = time.perf_counter()
        mgcfd.run(problem, config["cycles"])
        per_cycle = (time.perf_counter() - began) / config["cycles"]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        peaks = comm.allgather(peak) if comm is not None else [peak]
        out[method] = {"declare_and_partition_s": declared, "first_cycle_s": first, "cycle_s": per_cycle,
                       "peak_mib_per_rank": peaks, "nodes": [lv.nodes.size for lv in problem.levels]}
    return out


def table(result: dict) -> str:
    rows = ["| variant | cores | ms per cycle | spread % | OP2 on as many cores, ms | ratio |", "|---|---|---|---|---|---|"]
    times = result["times"]
    for name, found in times.items():
        samples = [t for t in found if t == t] or [float("nan")]
        failed = len(found) - len([t for t in found if t == t])
        median = statistics.median(samples)
        spread = 100 * (max(samples) - min(samples)) / median
        reference = SAME_CORES.get(name)
        kept = [t for t in times.get(reference, []) if t == t]
        ref = statistics.median(kept) if kept else None
        cores = result["threads"] if name.startswith("meshchain, default threads") else CORES[name]
        over = " (oversubscribed)" if cores > result["machine"]["cores"] else ""
        name = name + (f" ({failed} of {len(found)} runs hung or crashed)" if failed else "")
        rows.append(f"| {name} | {cores}{over} | {median * 1e3:.2f} | {spread:.1f} | "
                    f"{'' if ref is None else f'{ref * 1e3:.2f} ({reference})'} | "
                    f"{'' if ref is None else f'{median / ref:.2f}x'} |")
    return "\n".join(rows)


def compare(args) -> dict:
    from meshchain.meshes import channel_bump

    folder = Path(tempfile.mkdtemp(prefix="mgcfd-bench-"))
    mesh = channel_bump(args.n, levels=args.levels)
    mesh.write(folder, prefix="channel")
    op2 = Path(args.op2_bin).resolve() if args.op2_bin else None
    cache = str(HERE / "build" / "mgcfd-cache")
    times = {name: [] for name in ([*OP2_VARIANTS] if op2 else []) + [*MESHCHAIN_VARIANTS]}
    threads = 1
    for _ in range(args.rounds):
        for name in times:
            if name in OP2_VARIANTS:
                binary, ranks, extra = OP2_VARIANTS[name]
                times[name].append(op2_seconds(op2 / binary, ranks, extra, folder, args.cycles))
            else:
                ranks, extra, captured, method = MESHCHAIN_VARIANTS[name]
                found = meshchain_seconds(ranks, extra, folder, args.cycles, args.warmup, cache, captured=captured,
                                          method=method)
                times[name].append(found["seconds"])
                if not extra and ranks == 1 and not captured:
                    threads = found["threads"]
    nodes = [level.nodes for level in mesh.levels]
    return {"n": args.n, "levels": args.levels, "nodes": nodes, "cycles": args.cycles, "warmup": args.warmup,
            "rounds": args.rounds, "times": times, "threads": threads, "machine": machine()}


def big(args) -> dict:
    from meshchain.meshes import channel_bump

    folder = Path(tempfile.mkdtemp(prefix="mgcfd-big-"))
    began = time.perf_counter()
    mesh = channel_bump(args.big, levels=args.levels)
    generated = time.perf_counter() - began
    mesh.write(folder, prefix="channel")
    written = time.perf_counter() - began - generated
    nodes = [level.nodes for level in mesh.levels]
    del mesh
    config = json.dumps({"input": str(folder / "input.dat"), "cycles": args.cycles})
    command = [mpiexec(), "-n", str(args.ranks), sys.executable, __file__, "--big-worker", config]
    env = user_environment(MESHCHAIN_CACHE_DIR=str(HERE / "build" / "mgcfd-cache"))
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode:
        raise RuntimeError(f"big run failed: {out.stdout[-2000:]}{out.stderr[-3000:]}")
    return {"n": args.big, "nodes": nodes, "ranks": args.ranks, "generate_s": generated, "write_s": written,
            "runs": json.loads(out.stdout.strip().splitlines()[-1]), "machine": machine()}


def figure(rows: list, path: str) -> None:
    """The CA gain against the chain's loop count (the CA paper's Fig. 10): one panel per
    network and rank count, one colour per size per rank; measured (solid, with the measured
    spread) and the model's held-out prediction (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["network"], r["ranks"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (network, ranks) in zip(axes[0], panels):
        for colour, size in enumerate(sorted({r["per_rank"] for r in rows})):
            mine = sorted((r for r in rows if (r["network"], r["ranks"], r["per_rank"]) == (network, ranks, size)),
                          key=lambda r: r["loops"])
            if not mine:
                continue
            loops = [r["loops"] for r in mine]
            spread = [100 * (r["per_loop_spread"] + r["ca_spread"]) for r in mine]
            ax.errorbar(loops, [r["measured_gain"] for r in mine], yerr=spread, color=f"C{colour}", marker="o",
                        capsize=2, label=f"{size} nodes/rank, measured")
            held = [(r["loops"], r["predicted_gain"]) for r in mine if r.get("predicted_gain") is not None]
            if held:
                ax.plot(*zip(*held), color=f"C{colour}", linestyle="--", marker="x", label="held-out model")
        over = " (oversubscribed)" if ranks > (rows[0].get("cores") or ranks) else ""
        ax.set_title(f"{network}, {ranks} ranks{over}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["loops"] for r in rows}), [str(n) for n in sorted({r["loops"] for r in rows})])
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set_xlabel("loops in the chain")
    axes[0][0].set_ylabel("CA gain, %")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("MG-CFD's synthetic chain, communication-avoiding against loop by loop", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=32, help="hexahedra across the channel (default 32: 105 633 nodes)")
    p.add_argument("--levels", type=int, default=4)
    p.add_argument("--cycles", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="meshchain's cycles before the timed ones (compiling)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--op2-bin", help="the folder with OP2's mgcfd_seq, mgcfd_openmp and mgcfd_mpi")
    p.add_argument("--big", type=int, help="set-up and memory of this mesh size on --ranks ranks instead")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--out", default=str(HERE / "results" / "mgcfd.json"))
    p.add_argument("--figure", nargs=2, metavar=("MODEL_JSON", "PNG"), help="draw Fig. 10 from a model.py run")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--big-worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker or args.big_worker:
        result = (worker if args.worker else big_worker)(json.loads(args.worker or args.big_worker))
        import meshchain as mc

        comm = mc.get_runtime().comm
        if comm is None or comm.rank == 0:
            print(json.dumps(result), flush=True)
        return 0
    if args.figure:
        figure(json.loads(Path(args.figure[0]).read_text()), args.figure[1])
        return 0
    result = big(args) if args.big else compare(args)
    Path(args.out).parent.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["runs"], indent=1) if args.big else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
