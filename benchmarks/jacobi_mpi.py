"""Five-point Jacobi on several ranks: communication-avoiding sweeps (PA1) against one
exchange per sweep, the CA-stencil paper's study (``parsec-ca-stencil.txt``, Figs. 8-9).

Each job runs under ``mpiexec`` on a ``px x py`` block decomposition with ``--per-rank``
points per rank and axis, scaled by the paper's ``ratio`` knob (``r^2`` of the points computed,
the same number of messages; here the grid itself is scaled, so messages shrink by ``r`` too).
In one job, from the same start: ``base`` (``ca=False``: a ghost exchange before every sweep),
``CA s`` (chains of ``s`` sweeps: one exchange of ``s``-deep ghosts, corners included, then
redundant updates on the shrinking ghost region) for ``s`` in ``--steps``, ``base`` and the
first ``CA s`` again with boundary tasks (``boundary="tasks"``: the ghost-dependent points in
groups that start as their neighbours' messages arrive), and the floors: a
direct Numba loop on the rank's block (compute only) and a bare mpi4py exchange of one ghost
line per face neighbour (communication only). Per variant: milliseconds per sweep (slowest
rank, median of ``--repeats``), the speed-up over ``base``, and the checksum (every variant
must agree with ``base``). Roofline inputs per job: the STREAM triad bandwidth of one rank and
meshchain's calibrated ping-pong latency and bandwidth. One Numba thread per rank.

Usage::

    .venv/bin/python benchmarks/jacobi_mpi.py                       # 2 and 4 ranks, shm and tcp
    .venv/bin/python benchmarks/jacobi_mpi.py --ranks 2 --network tcp --per-rank 64 --ratios 1 0.4

With 2 cores, 4 ranks oversubscribe: the table says so. Writes
``benchmarks/results/jacobi_mpi.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import launch, machine, serve, slowest  # noqa: E402

STAR = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)]
WEIGHTS = (0.6, 0.1, 0.1, 0.1, 0.1)


# --- the worker ----------------------------------------------------------------------------------


def _kernel(mc):
    terms = " + ".join(f"{w!r} * s[{k}, 0]" for k, w in enumerate(WEIGHTS))
    return mc.Kernel.from_source(f"def jacobi(s, out):\n    out[0] = {terms}\n")


def _timed(comm, action, repeats: int, sweeps: int) -> float:
    action()  # compile and plan
    rounds = []
    for _ in range(repeats):
        comm.Barrier()
        began = time.perf_counter()
        action()
        rounds.append(slowest(comm, time.perf_counter() - began) / sweeps)
    return statistics.median(rounds)


def meshchain_variants(comm, config) -> dict:
    import meshchain as mc

    mc.reset_runtime(comm=comm)
    n = max(4, round(config["per_rank"] * config["ratio"]))
    from meshchain.partition.grids import choose_blocks

    blocks = choose_blocks((n * 64, n * 64), comm.size)
    shape = (n * blocks[0], n * blocks[1])
    g = mc.Grid(shape, "g")
    inner = g.interior(1)
    a, b = mc.Dat(g, 1, None, "a"), mc.Dat(g, 1, None, "b")
    total = mc.Global(1, 0.0, "total")
    star, kernel = mc.Stencil(STAR, "star"), _kernel(mc)
    mc.partition("block", blocks=blocks)
    owned = mc.get_runtime().layout_of(g)
    start = np.random.default_rng(0).random(g.size)[owned.global_ids[: owned.n_owned]]
    sweeps = config["sweeps"]

    @mc.kernel
    def add(x, t):
        t[0] += x[0]

    def sweep_chain(name, steps, ca):
        def run():
            pair = (a, b)
            for first in range(0, sweeps, steps):
                with mc.loop_chain(f"{name} from {'ab'[first % 2]}", ca=ca):
                    for k in range(first, first + steps):
                        src, dst = pair[k % 2], pair[1 - k % 2]
                        mc.par_loop(kernel, inner, src(mc.READ, star), dst(mc.WRITE))
            mc.flush()
        return run

    results = {"shape": list(shape), "blocks": list(blocks), "n": n}
    for label, steps, ca, boundary in variant_list(config["steps"]):
        mc.configure(boundary=boundary)
        a.data[:, 0] = start
        b.data[:, 0] = start
        run = sweep_chain(label, steps, ca)
        seconds = _timed(comm, run, config["repeats"], sweeps)
        a.data[:, 0] = start
        b.data[:, 0] = start
        run()
        total.value = 0.0
        mc.par_loop(add, g, a(mc.READ), total(mc.INC))
        chain = mc.stats().chains.get(f"{label} from a")
        results[label] = {"ms_per_sweep": 1e3 * seconds, "checksum": float(total.value[0]),
                          "messages_per_sweep": chain.messages / max(chain.executions, 1) / steps if chain else 0.0,
                          "depth": chain.depth if chain else 0}
    return results


def variant_list(steps) -> list:
    """``(label, sweeps per chain, ca, boundary)``: base, CA for every ``steps``, and base and
    the first CA in boundary tasks."""
    bulk = [("base", 1, False)] + [(f"CA s={s}", s, True) for s in steps]
    tasks = [(f"{label}, tasks", s, ca) for label, s, ca in bulk[:2]]
    return [v + ("bulk",) for v in bulk] + [v + ("tasks",) for v in tasks]


def floors(comm, config, n: int, blocks) -> dict:
    """A direct Numba sweep on the rank's block, and a bare exchange of one ghost line per face."""
    import numba
    from mpi4py import MPI

    @numba.njit(cache=False)
    def sweep(u, v):
        for i in range(1, u.shape[0] - 1):
            for j in range(1, u.shape[1] - 1):
                v[i, j] = (0.6 * u[i, j] + 0.1 * u[i - 1, j] + 0.1 * u[i + 1, j] + 0.1 * u[i, j - 1]
                           + 0.1 * u[i, j + 1])

    u, v = np.random.default_rng(1).random((n + 2, n + 2)), np.zeros((n + 2, n + 2))
    sweeps = config["sweeps"]

    def compute():
        for _ in range(sweeps // 2):
            sweep(u, v)
            sweep(v, u)

    px, py = blocks
    i, j = divmod(comm.rank, py)
    faces = [(i + di) * py + (j + dj) for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1))
             if 0 <= i + di < px and 0 <= j + dj < py]
    outgoing = [np.ones(n) for _ in faces]
    incoming = [np.empty(n) for _ in faces]

    def exchange():
        for _ in range(sweeps):
            requests = [comm.Irecv(buf, source=r, tag=7) for buf, r in zip(incoming, faces)]
            requests += [comm.Isend(buf, dest=r, tag=7) for buf, r in zip(outgoing, faces)]
            MPI.Request.Waitall(requests)

    return {"direct Numba loop (compute only)": 1e3 * _timed(comm, compute, config["repeats"], sweeps),
            "bare mpi4py ghost exchange (communication only)": 1e3 * _timed(comm, exchange, config["repeats"], sweeps)}


def roofline(comm) -> dict:
    """STREAM triad of one rank (all ranks at once) and meshchain's calibrated network."""
    from meshchain.model.calibrate import calibrate

    size = 20_000_000
    x, y, z = np.ones(size), np.ones(size), np.empty(size)
    best = float("inf")
    for _ in range(3):
        comm.Barrier()
        began = time.perf_counter()
        np.multiply(y, 3.0, out=z)
        np.add(z, x, out=z)
        best = min(best, time.perf_counter() - began)
    calibration = calibrate(save=False, repeats=20)
    m = calibration.machine
    return {"triad_gb_s_per_rank": 4 * 8 * size / best / 1e9, "latency_us": m.latency * 1e6,
            "bandwidth_gb_s": m.bandwidth / 1e9}


def worker(config: dict) -> dict:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    n = max(4, round(config["per_rank"] * config["ratio"]))
    from meshchain.partition.grids import choose_blocks

    blocks = choose_blocks((n * 64, n * 64), comm.size)
    bare = floors(comm, config, n, blocks)  # before meshchain starts (and with it any progress thread)
    results = meshchain_variants(comm, config)
    results["floors"] = bare
    results["roofline"] = roofline(comm)
    return results


# --- the driver ----------------------------------------------------------------------------------


def rows_of(job: dict, result: dict) -> list[dict]:
    base = result["base"]
    rows = []
    for label, _, _, _ in variant_list(job["steps"]):
        r = result[label]
        rows.append(dict(job, variant=label, ms_per_sweep=r["ms_per_sweep"], speedup=base["ms_per_sweep"] / r["ms_per_sweep"],
                         messages_per_sweep=r["messages_per_sweep"], depth=r["depth"],
                         agrees=abs(r["checksum"] - base["checksum"]) <= 1e-9 * abs(base["checksum"]),
                         shape=result["shape"]))
    for label, ms in result["floors"].items():
        rows.append(dict(job, variant=label, ms_per_sweep=ms, speedup=base["ms_per_sweep"] / ms,
                         messages_per_sweep=float("nan"), depth=0, agrees=True, shape=result["shape"]))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--network", nargs="+", choices=["shm", "tcp"], default=["shm", "tcp"])
    parser.add_argument("--per-rank", nargs="+", type=int, default=[64, 256], help="points per rank and axis")
    parser.add_argument("--ratios", nargs="+", type=float, default=[1.0, 0.4])
    parser.add_argument("--steps", nargs="+", type=int, default=[5, 15, 25, 40])
    parser.add_argument("--sweeps", type=int, default=600, help="a multiple of every --steps (default 600)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=str(HERE / "results" / "jacobi_mpi.json"))
    args = parser.parse_args(argv)
    if args.worker:
        return serve(worker, json.loads(args.config))
    if any(args.sweeps % s for s in args.steps):
        parser.error("--sweeps must be a multiple of every --steps")
    cache = tempfile.mkdtemp(prefix="meshchain-jacobi-mpi-")
    env = dict(os.environ, MESHCHAIN_THREADS="1", NUMBA_NUM_THREADS="1", MESHCHAIN_CACHE_DIR=cache)
    rows = []
    for ranks in args.ranks:
        for network in args.network:
            for per_rank in args.per_rank:
                for ratio in args.ratios:
                    job = dict(ranks=ranks, network=network, per_rank=per_rank, ratio=ratio, steps=args.steps,
                               sweeps=args.sweeps, repeats=args.repeats)
                    result = launch(__file__, [], ranks, network, env, job, args.timeout, "jacobi")
                    rows.extend(rows_of(job, result))
                    print(f"# {ranks} ranks {network} {per_rank}/rank ratio {ratio}: roofline {result['roofline']}",
                          file=sys.stderr, flush=True)
    print_table(rows)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"argv": sys.argv[1:], "machine": machine(), "rows": rows}, indent=1))
    return 0


def print_table(rows) -> None:
    """One line per job: ms per sweep of base, of each CA variant and of the tasks variants
    (speed-up over base), and the floors."""
    jobs = {}
    for r in rows:
        jobs.setdefault((r["ranks"], r["network"], r["per_rank"], r["ratio"]), {})[r["variant"]] = r
    labels = [v for v in dict.fromkeys(r["variant"] for r in rows) if v.startswith("CA s=") or v.endswith("tasks")]
    print("| ranks | network | points per rank | ratio | base ms/sweep | " + " | ".join(labels)
          + " | compute floor | exchange floor |")
    print("|---" * (5 + len(labels)) + "|---|---|")
    for (ranks, network, per_rank, ratio), v in jobs.items():
        n = round(per_rank * ratio)
        cells = " | ".join(f"{v[label]['ms_per_sweep']:.4f} ({v[label]['speedup']:.2f}x)"
                           + ("" if v[label]["agrees"] else " DIFFERENT RESULT") for label in labels)
        crowded = " (oversubscribed)" if ranks > (os.cpu_count() or 1) else ""
        print(f"| {ranks}{crowded} | {network} | {n} x {n} | {ratio} | {v['base']['ms_per_sweep']:.4f} | {cells} | "
              f"{v['direct Numba loop (compute only)']['ms_per_sweep']:.4f} | "
              f"{v['bare mpi4py ghost exchange (communication only)']['ms_per_sweep']:.4f} |")


if __name__ == "__main__":
    sys.exit(main())
