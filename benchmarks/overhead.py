"""meshchain's own cost per loop: the execution core's Python overhead, with its floors.

Four cases on tiny sets (so that only meshchain's own work is timed), 1 Numba thread:

``eager``
    one process: ``par_loop`` of a direct one-argument loop over a 4-element set, then
    ``mc.flush()`` (time per loop);
``chain``
    one process: a 16-loop chain (8 x the synthetic ``update``, ``edge_flux`` pair on a
    3 x 3 triangle mesh, 21 edges) executed again: recording included (time per loop);
``mpi-pair``
    2 ranks: a node loop writing ``pres`` directly and an edge loop reading it through a
    map, so every step exchanges the ``pres`` halo; ``mc.flush()`` after the pair (time per
    loop);
``mpi-chain``
    2 ranks: the 16-loop chain run communication-avoiding, executed again (one grouped
    exchange per execution; time per loop).
``captured``, ``mpi-pair-captured``, ``mpi-chain-captured``
    the chain (one process), the pair (2 ranks, loop by loop: ``ca=False``) and the chain
    (2 ranks, ``ca=True``) as steps captured with ``mc.capture`` and replayed: no recording,
    no look-up, no Python between the loops of a segment (time per loop).
``eager-profiled``, ``chain-profiled``, ``captured-profiled``
    the eager, chain and captured cases while ``mc.profile()`` records; their floor is the
    same case unprofiled (what the profiler adds per loop).

In the same run, the floors: ``numba-loop`` is a bare call of the very compiled function
the eager case runs, with the arguments its plan prepared; ``numba-chain`` the same for
the chain's one fused call (per loop: its compiled work, which a tiny mesh keeps small);
``mpi-exchange`` a bare ``Startall``/``Waitall`` of persistent requests with the neighbours
and sizes of the pair's halo exchange; ``mpi-agree`` a bare one-int ``Allreduce``, what the
agreement on failures after every execution on several ranks costs at least. Each case
reports its ratio to its floor. Every case reports the median
of ``--repeats`` rounds (slowest rank). ``--network tcp`` sends MPI messages through
MPICH's TCP module over loopback (``MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi
FI_PROVIDER=tcp``), like an Ethernet cluster; ``shm`` is shared memory.

Usage::

    python benchmarks/overhead.py                       # writes results/overhead.json
    python benchmarks/overhead.py --network shm --repeats 3 --calls 500
    python benchmarks/overhead.py --before old.json     # a column for an earlier run's figures
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
LIMITS_US = {"eager": 5.0, "chain": 2.0, "mpi-pair": 15.0, "mpi-chain": 5.0,
             # captured steps: the floor plus what issue 32 allows per loop (0.4 µs per loop where the fused
             # call is 0.29: 0.11 µs of overhead; on 2 ranks the exchange floor per loop plus 1 µs)
             "captured": lambda floor: floor + 0.11, "mpi-pair-captured": lambda floor: floor / 2 + 1.0,
             "mpi-chain-captured": lambda floor: floor / 16 + 1.0,
             # the profiler on (issue 34): at most 1 µs per loop over the same case unprofiled
             "eager-profiled": lambda floor: floor + 1.0, "chain-profiled": lambda floor: floor + 1.0,
             "captured-profiled": lambda floor: floor + 1.0}
FLOOR_OF = {"eager": "numba-loop", "chain": "numba-chain", "mpi-pair": "mpi-exchange", "mpi-chain": "mpi-exchange",
            "captured": "numba-chain", "mpi-pair-captured": "mpi-exchange", "mpi-chain-captured": "mpi-exchange",
            "eager-profiled": "eager", "chain-profiled": "chain", "captured-profiled": "captured"}


def mpiexec() -> str:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def warm_up(actions, seconds: float = 1.0, comm=None) -> None:
    """Run ``actions`` for ``seconds`` before anything is timed: on this VM the first second
    of a busy process runs measurably slower (every case, the floors included). On several
    ranks rank 0's clock decides, so that every rank runs as many exchanges."""
    end = time.perf_counter() + seconds
    while True:
        for _ in range(50):
            for action in actions:
                action()
        over = time.perf_counter() > end
        if (comm.bcast(over) if comm is not None else over):
            return


def median_per_call(action, calls: int, repeats: int, comm=None) -> float:
    """Seconds per call of ``action``: the median round of ``repeats`` (slowest rank). (The
    median, as everywhere meshchain's timings feed a table: one disturbed round does not move
    it; written out here so that the script also runs on older code.)"""
    rounds = []
    for _ in range(repeats):
        if comm is not None:
            comm.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            action()
        elapsed = (time.perf_counter() - start) / calls
        if comm is not None:
            from mpi4py import MPI

            elapsed = comm.allreduce(elapsed, op=MPI.MAX)
        rounds.append(elapsed)
    rounds.sort()
    middle = len(rounds) // 2
    return rounds[middle] if len(rounds) % 2 else (rounds[middle - 1] + rounds[middle]) / 2


def tiny_synthetic():
    from meshchain.apps import synthetic
    from meshchain.meshes import structured_tris

    return synthetic.declare(structured_tris(3, 3), method="block")  # 21 edges, 16 nodes, 18 cells


def serial_worker(calls: int, repeats: int) -> dict:
    import numpy as np

    import meshchain as mc
    from meshchain.apps import synthetic

    cells = mc.Set(4, "cells")
    q = mc.Dat(cells, 1, np.arange(4.0), "q")

    @mc.kernel
    def relax(a):
        a[0] = a[0] * 0.5 + 1.0

    def eager():
        mc.par_loop(relax, cells, q(mc.RW))
        mc.flush()

    problem = tiny_synthetic()

    def chain():
        with mc.loop_chain("bench", ca=True):
            synthetic.record(problem, 8)

    captured = _captured(mc, lambda: synthetic.record(problem, 8), "captured", True)
    warm_up((eager, chain) + ((captured,) if captured else ()))  # compiles (or loads) and builds the plans first
    results = {"eager": median_per_call(eager, calls, repeats),
               "chain": median_per_call(chain, calls // 4, repeats) / 16}
    if captured:
        results["captured"] = median_per_call(captured, calls, repeats) / 16
    loop_floor = numba_floor(lambda u: u.loops[0].kernel is relax)
    chain_floor = numba_floor(lambda u: u.chain == "bench")
    if loop_floor is not None:
        results["numba-loop"] = median_per_call(loop_floor, calls, repeats)
        results["numba-chain"] = median_per_call(chain_floor, calls, repeats) / 16
    results.update(_profiled(mc, eager, chain, captured, calls, repeats))
    return results


def _profiled(mc, eager, chain, captured, calls: int, repeats: int) -> dict:
    """The eager, chain and captured cases again while ``mc.profile()`` records (in memory);
    their floors are the same cases unprofiled (nothing on a meshchain without a profiler)."""
    profile = getattr(mc, "profile", None)
    if profile is None:
        return {}
    results = {}
    with profile():
        results["eager-profiled"] = median_per_call(eager, calls, repeats)
        results["chain-profiled"] = median_per_call(chain, calls // 4, repeats) / 16
        if captured:
            results["captured-profiled"] = median_per_call(captured, calls, repeats) / 16
    return results


def _captured(mc, record, name: str, ca):
    """``record`` as a step captured with ``mc.capture`` (None on a meshchain without it)."""
    capture = getattr(mc, "capture", None)
    return None if capture is None else capture(record, name=name, ca=ca)


def numba_floor(wanted):
    """A bare call of the compiled function a unit's plan runs (``wanted(unit)`` picks the
    unit), with the arguments the plan prepared: the plan's own prepared call, without the
    pipeline around it."""
    import meshchain as mc

    pipeline = getattr(mc.get_runtime(), "pipeline", None)
    if pipeline is None:  # a meshchain from before plans (to measure it the same way): no floor
        return None
    plans = pipeline.plans
    for (unit, _, _), plan in zip(plans.keys(), plans.values()):
        if wanted(unit):
            call = plan.steps[0].core
            entry, arguments = call.entry, call.arguments
            return lambda: entry(*arguments)
    raise RuntimeError("the unit's plan was not found")


def mpi_worker(calls: int, repeats: int) -> dict:
    import meshchain as mc
    from meshchain.apps import synthetic

    comm = mc.get_runtime().comm
    problem = tiny_synthetic()
    p = problem

    def pair():
        mc.par_loop(synthetic.advance, p.nodes, p.pres(mc.RW))
        mc.par_loop(synthetic.update, p.edges, p.res(mc.INC, p.e2n[0]), p.res(mc.INC, p.e2n[1]),
                    p.pres(mc.READ, p.e2n[0]), p.pres(mc.READ, p.e2n[1]))
        mc.flush()

    def chain():
        with mc.loop_chain("bench", ca=True):
            synthetic.record(problem, 8)

    def recorded_pair():
        mc.par_loop(synthetic.advance, p.nodes, p.pres(mc.RW))
        mc.par_loop(synthetic.update, p.edges, p.res(mc.INC, p.e2n[0]), p.res(mc.INC, p.e2n[1]),
                    p.pres(mc.READ, p.e2n[0]), p.pres(mc.READ, p.e2n[1]))

    captured_pair = _captured(mc, recorded_pair, "captured pair", False)
    captured_chain = _captured(mc, lambda: synthetic.record(problem, 8), "captured chain", True)
    actions = (pair, chain) + ((captured_pair, captured_chain) if captured_pair else ())
    for action in actions:  # compile (or load from the cache) and build the plans, together
        action()
    warm_up(actions, comm=comm)
    results = {"mpi-pair": median_per_call(pair, calls, repeats, comm) / 2,
               "mpi-chain": median_per_call(chain, calls // 4, repeats, comm) / 16,
               "mpi-exchange": exchange_floor(comm, problem, calls, repeats),
               "mpi-agree": agreement_floor(comm, calls, repeats)}
    if captured_pair:
        results["mpi-pair-captured"] = median_per_call(captured_pair, calls, repeats, comm) / 2
        results["mpi-chain-captured"] = median_per_call(captured_chain, calls // 4, repeats, comm) / 16
    return results if comm.rank == 0 else {}


def exchange_floor(comm, problem, calls: int, repeats: int) -> float:
    """A bare mpi4py ``Startall``/``Waitall`` of persistent requests with the neighbours and
    byte counts of one exchange of the ``pres`` halo (one layer)."""
    import numpy as np
    from mpi4py import MPI

    import meshchain as mc

    sizes = _halo_sizes(problem.pres)
    requests, buffers = [], []
    for neighbour, (out_bytes, in_bytes) in sorted(sizes.items()):
        out, inbound = np.ones(max(out_bytes, 1), np.uint8)[:out_bytes], np.empty(in_bytes, np.uint8)
        buffers += [out, inbound]
        if out_bytes:
            requests.append(comm.Send_init(out, dest=neighbour, tag=99))
        if in_bytes:
            requests.append(comm.Recv_init(inbound, source=neighbour, tag=99))

    def exchange():
        MPI.Prequest.Startall(requests)
        MPI.Request.Waitall(requests)

    exchange()
    return median_per_call(exchange, calls, repeats, comm)


def agreement_floor(comm, calls: int, repeats: int) -> float:
    """A bare ``Allreduce`` of one int: what the agreement on failures after every execution on
    several ranks costs at least."""
    import numpy as np
    from mpi4py import MPI

    flag = np.zeros(1, dtype=np.int32)
    return median_per_call(lambda: comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX), calls, repeats, comm)


def _halo_sizes(dat) -> dict:
    """Bytes sent to and received from each neighbour to bring ``dat``'s first halo layer."""
    import meshchain as mc

    session = mc.get_runtime()
    layout = session.layout_of(dat.dataset) if hasattr(session, "layout_of") else dat.dataset._layout
    row = dat.dtype.itemsize * dat.dim
    return {n: (len(layout.exports.get(n, [[]])[0]) * row, len(layout.imports.get(n, [[]])[0]) * row)
            for n in layout.neighbours}


def run_worker(kind: str, network: str, calls: int, repeats: int, cache_dir: str) -> dict:
    # a cache directory of its own: compiled loops are reused from run to run, and no saved
    # calibration of another program turns the model on
    env = dict(os.environ, MESHCHAIN_THREADS="1", MESHCHAIN_CACHE_DIR=cache_dir)
    if network == "tcp":
        env.update(TCP)
    command = [sys.executable, __file__, "--worker", kind, "--calls", str(calls), "--repeats", str(repeats)]
    if kind == "mpi":
        command = [mpiexec(), "-n", "2", *command]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict], before: dict | None = None) -> str:
    """The results as a Markdown table; ``before``: ``(network, case) -> µs`` of an earlier run."""
    head = "| network | case | µs per loop | limit | floor | floor µs | ratio to floor | Allreduce µs |"
    if before:
        head = "| network | case | before µs | µs per loop | speed-up | limit | floor | floor µs | ratio to floor | " \
               "Allreduce µs |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for row in rows:
        floor = row.get("floor_us")
        ratio = f"{row['us'] / floor:.1f}" if floor else ""
        floor_text = f"{floor:.2f}" if floor else ""
        agree = f"{row['agree_us']:.2f}" if row.get("agree_us") else ""
        earlier = ""
        if before:
            old = before.get((row["network"], row["case"]))
            earlier = f"{old:.2f} | {row['us']:.2f} | {old / row['us']:.1f}× | " if old else f" | {row['us']:.2f} |  | "
        else:
            earlier = f"{row['us']:.2f} | "
        limit = LIMITS_US[row["case"]]
        limit = f"{limit(floor):.2f}" if callable(limit) else f"{limit:.0f}"
        lines.append(f"| {row['network']} | {row['case']} | {earlier}{limit} | "
                     f"{FLOOR_OF[row['case']]} | {floor_text} | {ratio} | {agree} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=("shm", "tcp", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--worker", choices=("serial", "mpi"))
    parser.add_argument("--json", default=str(HERE / "results" / "overhead.json"))
    parser.add_argument("--before", help="JSON of an earlier run (e.g. of an older version) to compare with")
    parser.add_argument("--cache-dir", default=str(HERE / "build" / "overhead-cache"),
                        help="meshchain's cache directory for the workers (compiled loops are reused)")
    args = parser.parse_args()
    if args.worker == "serial":
        print(json.dumps(serial_worker(args.calls, args.repeats)))
        return
    if args.worker == "mpi":
        results = mpi_worker(args.calls, args.repeats)
        if results:  # rank 0
            print(json.dumps(results))
        return
    serial = run_worker("serial", "shm", args.calls, args.repeats, args.cache_dir)
    rows = [{"network": "-", "case": case, "us": serial[case] * 1e6,
             "floor_us": serial.get(FLOOR_OF[case], 0) * 1e6}
            for case in ("eager", "chain", "captured", "eager-profiled", "chain-profiled", "captured-profiled")
            if case in serial]
    networks = ("shm", "tcp") if args.network == "both" else (args.network,)
    for network in networks:
        measured = run_worker("mpi", network, args.calls, args.repeats, args.cache_dir)
        rows += [{"network": network, "case": case, "us": measured[case] * 1e6,
                  "floor_us": measured["mpi-exchange"] * 1e6, "agree_us": measured["mpi-agree"] * 1e6}
                 for case in ("mpi-pair", "mpi-chain", "mpi-pair-captured", "mpi-chain-captured") if case in measured]
    before = None
    if args.before:
        before = {(r["network"], r["case"]): r["us"] for r in json.loads(Path(args.before).read_text())["rows"]}
    print(table(rows, before))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "calls": args.calls, "repeats": args.repeats}, indent=2))


if __name__ == "__main__":
    main()
