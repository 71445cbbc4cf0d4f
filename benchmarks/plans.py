"""Speed as users write code: a new Global or Dat per step, against objects reused.

OP2's C applications pass reductions and scalars through stack variables (``op_arg_gbl``),
and PyOP2/Firedrake users create temporaries per step; meshchain keeps plans by structure
and binds a new object declared alike to the plan already built (``engine/rebind.py``).
Per job (``mpiexec -n R``, ``--network shm|tcp``, the user's environment: no thread
variables set):

* **steps**: two loops per step on ``structured_quads(n, n)`` (about ``--nodes`` nodes):
  ``gather`` (cells, reads ``x`` through the cell-to-node map, writes a cell dat) and
  ``total`` (cells, sums that dat into a global), the dat and the global reused (the floor
  of this table), a new Global per step, a new Dat per step, both, a new Dat given the
  whole array of its values on every rank (``new Dat of values``); time per step (median
  of ``--rounds`` rounds of ``--steps`` steps, the variants taking turns in each round;
  slowest rank), its ratio to the reused one, the plans built per step
  (``mc.stats().caches["plans"]``) and the Python bytecode instructions one step executes
  (rank 0; the Python work, whatever the machine's speed); and the step with a new Dat and
  Global made inside it, captured with ``mc.capture`` and replayed (the sum read after each
  step);
* **cg**: a matrix-free CG written with par_loops the way OP2's C apps write it (P1
  stiffness plus a small mass term on ``structured_tris(n, n)``, at least ``--cells``
  cells, element matrices in a cell dat; every reduction and every scalar a new Global),
  against the same code with its globals made once (hoisted), the same code as three
  captured steps (new Globals made inside them; the scalars the Python computes between
  them passed in one Global each), and the whole iteration as one captured step whose
  kernels compute the scalars from the globals reduced earlier in the step (on several
  ranks it replays compiled, reductions included); time per iteration;
* **arithmetic**: PyOP2-style dat arithmetic as users write it on the same mesh's nodes,
  ``x *= a`` (``a`` 0.5 and 2.0 in turn), ``x.axpy(0.5, y)`` and ``x.inner(y)`` (its value
  read), each forced before the next, against NumPy on the rank's owned rows (the floor;
  ``np.einsum`` for the inner product, so no BLAS threads);
* **memory** (1 rank): the growth of the peak RSS over ``--memory-steps`` steps that each
  create a temporary Dat and Global.

Usage::

    .venv/bin/python benchmarks/plans.py                 # shm and tcp, 1 and 2 ranks
    .venv/bin/python benchmarks/plans.py --quick         # seconds

Writes ``benchmarks/results/plans.json`` and prints the tables for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import launch, machine, serve, user_environment, write_run  # noqa: E402

VARIANTS = ("reused", "new Global", "new Dat", "new Dat and Global", "new Dat of values", "new Dat and Global, captured")
FULL = dict(nodes=20000, steps=500, rounds=9, cells=40000, cg_iterations=60, memory_steps=100000)
QUICK = dict(nodes=2000, steps=20, rounds=2, cells=2000, cg_iterations=10, memory_steps=200)

GATHER = "def gather(x, c):\n    c[0] = 0.25 * (x[0, 0] + x[1, 0] + x[2, 0] + x[3, 0])\n"
TOTAL = "def total(c, s):\n    s[0] += c[0]\n"


# --- the worker ----------------------------------------------------------------------------------


def slowest_median(comm, rounds: list) -> float:
    return max(comm.allgather(statistics.median(rounds)))


def bytecodes(run) -> int:
    """The Python bytecode instructions ``run()`` executes on this rank (``sys.settrace`` with
    opcode events): the Python work of a step, free of the machine's speed, which moves by
    up to 2x within minutes on the shared VMs these tables come from. It counts the
    benchmark's own step function too (the same few lines for every variant)."""
    executed = [0]

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            executed[0] += 1
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return executed[0]


def steps_worker(config: dict) -> dict:
    import meshchain as mc
    from meshchain.meshes import structured_quads

    side = max(2, round(math.sqrt(config["nodes"])) - 1)
    d = structured_quads(side, side).declare()
    x = mc.Dat(d.nodes, 1, np.arange(d.nodes.size, dtype=np.float64), "x")
    kept_c, kept_s = mc.Dat(d.cells, 1, None, "c"), mc.Global(1, 0.0, "s")
    mc.partition("rib", coords=d.coords)
    comm = mc.get_runtime().comm
    gather, total = mc.Kernel.from_source(GATHER), mc.Kernel.from_source(TOTAL)
    ones = np.ones(d.cells.size)

    @mc.capture
    def captured():
        c, s = mc.Dat(d.cells, 1, None, "c"), mc.Global(1, 0.0, "s")
        mc.par_loop(gather, d.cells, x(mc.READ, d.cell2node), c(mc.WRITE))
        mc.par_loop(total, d.cells, c(mc.READ), s(mc.INC))
        return s

    def step(variant: str) -> float:
        if variant.endswith("captured"):
            return float(captured().value[0])
        if variant == "new Dat of values":  # given the whole array on every rank, as a user passes values
            c = mc.Dat(d.cells, 1, ones, "c")
        else:
            c = mc.Dat(d.cells, 1, None, "c") if "Dat" in variant else kept_c
        s = mc.Global(1, 0.0, "s") if "Global" in variant else kept_s
        if s is kept_s:
            s.value = 0.0  # reused: set to zero, as a user does before summing again
        mc.par_loop(gather, d.cells, x(mc.READ, d.cell2node), c(mc.WRITE))
        mc.par_loop(total, d.cells, c(mc.READ), s(mc.INC))
        return float(s.value[0])

    from meshchain.engine import replay

    for variant in VARIANTS:  # compiled, planned once; a captured step replayed until its replays run compiled
        for _ in range(replay.COMPILE_AFTER + 4 if variant.endswith("captured") else 5):
            step(variant)
    # the variants take turns within each round, so that the machine's drift (large on a shared VM) falls on all
    rounds: dict = {variant: [] for variant in VARIANTS}
    built = dict.fromkeys(VARIANTS, 0)
    values = set()
    for _ in range(config["rounds"]):
        for variant in VARIANTS:
            before = mc.stats().caches["plans"].misses
            comm.Barrier()
            began = time.perf_counter()
            for _ in range(config["steps"]):
                value = step(variant)
            rounds[variant].append((time.perf_counter() - began) / config["steps"])
            built[variant] += mc.stats().caches["plans"].misses - before
            values.add(value)
    assert len(values) == 1, values  # the same sum whatever the objects
    steps = config["rounds"] * config["steps"]
    executed = {}
    for variant in VARIANTS:  # a step like the one before (the plans bound to this variant's objects), counted
        step(variant)
        executed[variant] = bytecodes(lambda: step(variant))  # noqa: B023 - called at once
    rows = {variant: {"seconds_per_step": slowest_median(comm, rounds[variant]),
                      "plans_built_per_step": built[variant] / steps,
                      "bytecodes_per_step": executed[variant]} for variant in VARIANTS}
    return {"nodes": d.nodes.size, "cells": d.cells.size, "rows": rows}


SPMV = ("def spmv(k, p, y):\n"
        "    for i in range(3):\n"
        "        for j in range(3):\n"
        "            y[i, 0] += k[3 * i + j] * p[j, 0]\n")
DOT = "def dot(a, b, s):\n    s[0] += a[0] * b[0]\n"
ZERO = "def zero(y):\n    y[0] = 0.0\n"
AXPY2 = ("def axpy2(alpha, p, ap, x, r):\n"
         "    x[0] += alpha[0] * p[0]\n"
         "    r[0] -= alpha[0] * ap[0]\n")
XPAY = "def xpay(beta, r, p):\n    p[0] = r[0] + beta[0] * p[0]\n"
# the scalars computed in the kernels from the globals reduced earlier in the step (one captured step)
AXPY2_FROM = ("def axpy2_from(rr, pap, p, ap, x, r):\n"
              "    alpha = rr[0] / pap[0]\n"
              "    x[0] += alpha * p[0]\n"
              "    r[0] -= alpha * ap[0]\n")
XPAY_FROM = "def xpay_from(rr_new, rr, r, p):\n    p[0] = r[0] + (rr_new[0] / rr[0]) * p[0]\n"


def element_matrices(coords: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """P1 stiffness plus a lumped mass term (so the operator is SPD without boundary rows)."""
    xy = coords[cells]  # (ncell, 3, 2)
    d = np.stack([xy[:, 1] - xy[:, 2], xy[:, 2] - xy[:, 0], xy[:, 0] - xy[:, 1]], axis=1)  # edge vectors
    area = 0.5 * np.abs(d[:, 0, 0] * d[:, 1, 1] - d[:, 0, 1] * d[:, 1, 0])
    k = np.einsum("eik,ejk->eij", d, d) / (4.0 * area)[:, None, None]
    k += (area / 3.0)[:, None, None] * np.eye(3)[None]
    return k.reshape(len(cells), 9)


def cg_worker(config: dict) -> dict:
    import meshchain as mc
    from meshchain.meshes import structured_tris

    side = max(2, math.ceil(math.sqrt(config["cells"] / 2)))
    mesh = structured_tris(side, side)
    d = mesh.declare()
    k = mc.Dat(d.cells, 9, element_matrices(mesh.coords, mesh.cells), "k")
    vectors = {name: mc.Dat(d.nodes, 1, None, name) for name in ("x", "r", "p", "ap")}
    rhs = mc.Dat(d.nodes, 1, np.random.default_rng(0).uniform(0.5, 1.5, mesh.nnode), "rhs")
    mc.partition("rib", coords=d.coords)
    comm = mc.get_runtime().comm
    kernels = {name: mc.Kernel.from_source(source) for name, source in
               (("spmv", SPMV), ("dot", DOT), ("zero", ZERO), ("axpy2", AXPY2), ("xpay", XPAY),
                ("axpy2_from", AXPY2_FROM), ("xpay_from", XPAY_FROM))}
    x, r, p, ap = (vectors[n] for n in ("x", "r", "p", "ap"))
    hoisted = {name: mc.Global(1, 0.0, name) for name in ("pap", "rr", "alpha", "beta")}

    def scalar(name: str, value: float, fresh: bool):
        if fresh:
            return mc.Global(1, value, name)
        hoisted[name].value = value
        return hoisted[name]

    def reduce(a, c, name: str, fresh: bool) -> float:
        s = mc.Global(1, 0.0, name) if fresh else hoisted[name]
        if not fresh:
            s.value = 0.0
        mc.par_loop(kernels["dot"], d.nodes, a(mc.READ), c(mc.READ), s(mc.INC))
        return float(s.value[0])

    def iterate(rr: float, fresh: bool) -> float:
        mc.par_loop(kernels["zero"], d.nodes, ap(mc.WRITE))
        mc.par_loop(kernels["spmv"], d.cells, k(mc.READ), p(mc.READ, d.cell2node), ap(mc.INC, d.cell2node))
        alpha = rr / reduce(p, ap, "pap", fresh)
        mc.par_loop(kernels["axpy2"], d.nodes, scalar("alpha", alpha, fresh)(mc.READ), p(mc.READ), ap(mc.READ),
                    x(mc.RW), r(mc.RW))
        rr_new = reduce(r, r, "rr", fresh)
        mc.par_loop(kernels["xpay"], d.nodes, scalar("beta", rr_new / rr, fresh)(mc.READ), r(mc.READ), p(mc.RW))
        return rr_new

    @mc.capture
    def apply_and_pap():
        mc.par_loop(kernels["zero"], d.nodes, ap(mc.WRITE))
        mc.par_loop(kernels["spmv"], d.cells, k(mc.READ), p(mc.READ, d.cell2node), ap(mc.INC, d.cell2node))
        pap = mc.Global(1, 0.0, "pap")
        mc.par_loop(kernels["dot"], d.nodes, p(mc.READ), ap(mc.READ), pap(mc.INC))
        return pap

    @mc.capture
    def update_and_rr(alpha):
        mc.par_loop(kernels["axpy2"], d.nodes, alpha(mc.READ), p(mc.READ), ap(mc.READ), x(mc.RW), r(mc.RW))
        rr = mc.Global(1, 0.0, "rr")
        mc.par_loop(kernels["dot"], d.nodes, r(mc.READ), r(mc.READ), rr(mc.INC))
        return rr

    @mc.capture
    def direction(beta):
        mc.par_loop(kernels["xpay"], d.nodes, beta(mc.READ), r(mc.READ), p(mc.RW))

    alpha_in, beta_in = mc.Global(1, 0.0, "alpha"), mc.Global(1, 0.0, "beta")

    def iterate_captured(rr: float) -> float:
        alpha_in.value = rr / float(apply_and_pap().value[0])
        rr_new = float(update_and_rr(alpha_in).value[0])
        beta_in.value = rr_new / rr
        direction(beta_in)
        return rr_new

    @mc.capture
    def iteration(rr):  # the whole iteration: alpha and beta computed in the kernels from the globals
        mc.par_loop(kernels["zero"], d.nodes, ap(mc.WRITE))
        mc.par_loop(kernels["spmv"], d.cells, k(mc.READ), p(mc.READ, d.cell2node), ap(mc.INC, d.cell2node))
        pap = mc.Global(1, 0.0, "pap")
        mc.par_loop(kernels["dot"], d.nodes, p(mc.READ), ap(mc.READ), pap(mc.INC))
        mc.par_loop(kernels["axpy2_from"], d.nodes, rr(mc.READ), pap(mc.READ), p(mc.READ), ap(mc.READ), x(mc.RW),
                    r(mc.RW))
        rr_new = mc.Global(1, 0.0, "rr")
        mc.par_loop(kernels["dot"], d.nodes, r(mc.READ), r(mc.READ), rr_new(mc.INC))
        mc.par_loop(kernels["xpay_from"], d.nodes, rr_new(mc.READ), rr(mc.READ), r(mc.READ), p(mc.RW))
        return rr_new

    rr_in = mc.Global(1, 0.0, "rr")

    def iterate_one_step(rr: float) -> float:
        rr_in.value = rr
        return float(iteration(rr_in).value[0])

    def solve(fresh) -> tuple:
        x.data[:, 0] = 0.0
        r.data[:, 0] = rhs.data_ro[:, 0]
        p.data[:, 0] = rhs.data_ro[:, 0]
        rr = reduce(r, r, "rr", bool(fresh))
        first = rr
        comm.Barrier()
        began = time.perf_counter()
        for _ in range(config["cg_iterations"]):
            if fresh == "one step":
                rr = iterate_one_step(rr)
            else:
                rr = iterate_captured(rr) if fresh == "captured" else iterate(rr, fresh)
        seconds = (time.perf_counter() - began) / config["cg_iterations"]
        return seconds, math.sqrt(rr / first)

    rows = {}
    for fresh, name in ((False, "globals hoisted"), (True, "a new Global per reduction and scalar"),
                        ("captured", "captured steps, new Globals inside"),
                        ("one step", "one captured step, scalars in kernels")):
        solve(fresh)  # compiled, planned
        mc.stats(reset=True)
        timings, reduction = [], None
        for _ in range(config["rounds"]):
            seconds, reduction = solve(fresh)
            timings.append(seconds)
        plans = mc.stats().caches["plans"]
        rows[name] = {"seconds_per_iteration": slowest_median(comm, timings), "residual_reduction": reduction,
                      "plans_built_per_iteration": plans.misses / (config["rounds"] * (config["cg_iterations"] + 1))}
    return {"cells": d.cells.size, "nodes": d.nodes.size, "rows": rows}


def memory_worker(config: dict) -> dict:
    import meshchain as mc
    from meshchain.meshes import structured_quads

    side = max(2, round(math.sqrt(config["nodes"])) - 1)
    d = structured_quads(side, side).declare()
    x = mc.Dat(d.nodes, 1, np.arange(d.nodes.size, dtype=np.float64), "x")
    gather, total = mc.Kernel.from_source(GATHER), mc.Kernel.from_source(TOTAL)
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # noqa: E731 - bytes (Linux: KiB)
    samples = []
    for i in range(config["memory_steps"]):
        c, s = mc.Dat(d.cells, 1, None, "c"), mc.Global(1, 0.0, "s")
        mc.par_loop(gather, d.cells, x(mc.READ, d.cell2node), c(mc.WRITE))
        mc.par_loop(total, d.cells, c(mc.READ), s(mc.INC))
        s.value
        if i in (9, config["memory_steps"] // 2 - 1, config["memory_steps"] - 1):
            samples.append((i + 1, peak()))
    return {"cells": d.cells.size, "bytes_per_dat": d.cells.size * 8, "samples": samples,
            "growth_bytes": samples[-1][1] - samples[0][1], "caches": mc.get_runtime().caches.sizes()}


def arithmetic_worker(config: dict) -> dict:
    """Dat arithmetic as users write it (a scalar per call, an inner product read at once), each
    operation forced before the next (``mc.flush``), against NumPy on the rank's owned rows
    (``np.einsum`` for the inner product: no BLAS threads)."""
    import meshchain as mc
    from meshchain.meshes import structured_quads

    side = max(2, round(math.sqrt(config["nodes"])) - 1)
    d = structured_quads(side, side).declare()
    rng = np.random.default_rng(0)
    x, y = (mc.Dat(d.nodes, 1, rng.uniform(0.5, 1.5, d.nodes.size), name) for name in ("x", "y"))
    mc.partition("rib", coords=d.coords)
    comm = mc.get_runtime().comm
    X, Y = x.data_ro[:, 0].copy(), y.data_ro[:, 0].copy()

    factors = [0.5, 2.0]  # halved and doubled in turn: no value drifts into subnormals

    def scale():
        factors.reverse()
        x.__imul__(factors[0])
        mc.flush()

    def scale_numpy():
        factors.reverse()
        np.multiply(X, factors[0], out=X)

    def axpy():
        x.axpy(0.5, y)
        mc.flush()

    operations = {"x *= a": (scale, scale_numpy),
                  "x.axpy(0.5, y)": (axpy, lambda: np.add(X, 0.5 * Y, out=X)),
                  "x.inner(y)": (lambda: x.inner(y), lambda: np.einsum("i,i", X, Y))}
    for pair in operations.values():
        for operation in pair * 20:
            operation()
    rounds: dict = {(name, kind): [] for name in operations for kind in ("meshchain", "numpy")}
    for _ in range(config["rounds"]):  # the operations and their floors take turns
        for name, pair in operations.items():
            for kind, operation in zip(("meshchain", "numpy"), pair):
                comm.Barrier()
                began = time.perf_counter()
                for _ in range(config["steps"]):
                    operation()
                rounds[(name, kind)].append((time.perf_counter() - began) / config["steps"])
    rows = {name: {kind: slowest_median(comm, rounds[(name, kind)]) for kind in ("meshchain", "numpy")}
            for name in operations}
    return {"nodes": d.nodes.size, "rows": rows}


WORKERS = {"steps": steps_worker, "cg": cg_worker, "arithmetic": arithmetic_worker, "memory": memory_worker}


# --- the driver ----------------------------------------------------------------------------------


def table_steps(results: list) -> str:
    lines = ["| network | ranks | nodes | variant | µs per step | × reused | plans built per step "
             "| bytecodes per step |", "|---|---|---|---|---|---|---|---|"]
    for result in results:
        rows = result["rows"]
        floor = rows["reused"]["seconds_per_step"]
        for variant in VARIANTS:
            row = rows[variant]
            lines.append(f"| {result['network']} | {result['ranks']} | {result['nodes']} | {variant} | "
                         f"{row['seconds_per_step'] * 1e6:.1f} | {row['seconds_per_step'] / floor:.2f} | "
                         f"{row['plans_built_per_step']:.1f} | {row['bytecodes_per_step']} |")
    return "\n".join(lines)


def table_arithmetic(results: list) -> str:
    lines = ["| network | ranks | nodes | operation | meshchain µs | NumPy µs | × NumPy |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        for name, row in result["rows"].items():
            meshchain, numpy = row["meshchain"], row["numpy"]
            lines.append(f"| {result['network']} | {result['ranks']} | {result['nodes']} | `{name}` | "
                         f"{meshchain * 1e6:.1f} | {numpy * 1e6:.1f} | {meshchain / numpy:.1f} |")
    return "\n".join(lines)


def table_cg(results: list) -> str:
    lines = ["| network | ranks | cells | variant | ms per iteration | × hoisted | × 1 rank | plans built per iteration |",
             "|---|---|---|---|---|---|---|---|"]
    one = {name: row["seconds_per_iteration"] for result in results if result["ranks"] == 1
           for name, row in result["rows"].items()}
    for result in results:
        hoisted = result["rows"]["globals hoisted"]["seconds_per_iteration"]
        for name, row in result["rows"].items():
            seconds = row["seconds_per_iteration"]
            lines.append(f"| {result['network']} | {result['ranks']} | {result['cells']} | {name} | {seconds * 1e3:.3f} | "
                         f"{seconds / hoisted:.2f} | {seconds / one[name]:.2f} | "
                         f"{row['plans_built_per_iteration']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run: smaller defaults")
    parser.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    for name, value in FULL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"default {value}")
    parser.add_argument("--out", default=str(HERE / "results" / "plans.json"))
    parser.add_argument("--cache-dir", default=str(HERE / "build" / "plans-cache"))
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve(WORKERS[args.worker], json.loads(args.config))
    defaults = QUICK if args.quick else FULL
    config = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    env = user_environment(MESHCHAIN_CACHE_DIR=args.cache_dir)  # no thread variables, as a user runs it
    info, began = machine(), time.perf_counter()
    results = {"steps": [], "arithmetic": [], "cg": []}
    for network in args.network:
        for ranks in args.ranks:
            if ranks == 1 and network == "tcp":
                continue  # one rank sends nothing
            for part in ("steps", "arithmetic", "cg"):
                print(f"[plans] {part}, {ranks} ranks, {network} ...", file=sys.stderr, flush=True)
                result = launch(__file__, [part], ranks, network, env, config, args.timeout, f"plans {part}")
                results[part].append(dict(result, network=network, ranks=ranks))
    memory = launch(__file__, ["memory"], 1, "shm", env, config, args.timeout, "plans memory")
    total = time.perf_counter() - began
    print(f"{info['cpu']}, {info['cores']} cores; {info['mpi']}; Python {info['python']}, numba {info['numba']}. "
          f"No thread variables set. Median of {config['rounds']} rounds, slowest rank; whole run {total:.0f} s.\n")
    print(table_steps(results["steps"]))
    print("\nDat arithmetic, each operation forced before the next (µs per operation; NumPy on the owned rows):\n")
    print(table_arithmetic(results["arithmetic"]))
    print(f"\nMatrix-free CG ({config['cg_iterations']} iterations per solve):\n")
    print(table_cg(results["cg"]))
    growth = memory["growth_bytes"] / 2**20
    print(f"\nMemory: {config['memory_steps']} steps each creating a Dat of {memory['cells']} cells "
          f"({memory['bytes_per_dat'] / 2**10:.0f} KiB) and a Global: peak RSS grew {growth:.0f} MiB "
          f"({', '.join(f'{n} steps: {b / 2**20:.0f} MiB' for n, b in memory['samples'])}); caches held "
          f"{memory['caches']}")
    write_run(args.out, info, config, total, results, memory=memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
