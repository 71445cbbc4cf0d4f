"""The communication layer: halo transports on Airfoil, sparse exchanges, repartitioning.

Every figure is a ratio within one run: the variants of a table are timed round by round,
interleaved (:func:`meshchain.model.timing.measure_interleaved`), each one the **median**
of ``--repeats`` rounds with its spread (interquartile range / median); a set of
variants whose spread exceeds 10 % is measured again (up to ``--attempts`` times) and a
variant still above 10 % is marked ``*`` (noisy). Every sample is the slowest rank's
time. Every timed region comes after a warm-up: kernels compiled (or loaded from
``--cache-dir``), plans, colourings and halo exchanges built; a sample during which an
exchange plan was built or a kernel compiled is counted in the JSON (``plan_builds``,
``compilations``: 0 expected). One ``mpiexec`` job per network, rank count and part, 1
Numba thread per rank; ``--network tcp`` sends MPI messages through MPICH's TCP module
over loopback (``MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp``), like an
Ethernet cluster; ``shm`` through shared memory. More ranks than cores oversubscribe the
machine: such rows say "(over)".

``transports``: Airfoil's halo exchanges
    OP2's Airfoil (``meshchain.apps.airfoil``; ``setup(per_rank=...)``, or
    ``naca0012(I, J)`` with ``--airfoil-size I J``, partitioned with ``"rib"``). For each
    halo transport (``mc.configure(transport=...)``: ``p2p``, ``persistent``,
    ``neighbour``, ``rma``; those this MPI offers) and each mode (``loop``: loop by loop,
    ``iterate(problem, ca=None)``; ``ca``: each stage one communication-avoiding chain,
    ``ca=True``), the time per iteration (``--iters`` iterations per sample, after 2
    untimed ones since ``configure`` drops the plans), as a ratio to ``p2p``. Then the
    *exchanges alone*: the halo exchanges one steady-state iteration runs (captured from
    the plans: which exchanges, how often; each with its dats, neighbours and rows), run
    standalone in the same order, ``begin()`` then ``end()``, built with each transport
    (µs per iteration's exchanges, ``--exchange-reps`` iterations' worth per sample), and
    their **floor**: bare mpi4py ``Irecv``/``Isend``/``Waitall`` of preallocated numpy
    buffers of the same byte counts with the same neighbours (no packing, no unpacking).
    "messages" and "kB" are what one rank sends per iteration (mean over ranks).

``sparse``: many small messages (IPComMan's case)
    Each rank sends N items (``--items``) of S bytes (``--item-bytes``) to neighbours
    drawn at random (seeded) from a fixed symmetric neighbourhood (all other ranks up to
    5 ranks, else rank +-1, +-2). One sample is ``max(1, --items-per-sample // N)``
    rounds; time per round. Variants: **packed**, ``SparseExchange`` with its default
    64 KiB buffer limit; **per item**, ``SparseExchange(buffer_limit=32 + S rounded up to
    8 + 8)``, so that every MPI message carries exactly one item (header and length
    included), for N up to ``--per-item-max`` (10^4 by default: at 10^5 one round takes
    several seconds per termination, tens on 4 ranks over TCP); each with termination
    ``nbx``, ``allreduce`` and ``neighbourhood``; and **bare per item**: plain mpi4py,
    the counts per destination exchanged first by one ``Alltoall``, then one ``Irecv``
    per incoming item into a preallocated array and one ``Isend`` per item, one
    ``Waitall``. Ratios: other terminations to ``nbx`` (same packing), per item to
    packed (``nbx``), bare per item to packed ``nbx``; "messages": MPI messages one rank
    sends per round (mean over ranks). Every variant's delivery is checked in its
    warm-up round (the number of items received and the sum of their bytes).

``repartition``: moving the mesh
    Airfoil as above. ``mc.repartition(method)`` for ``block``, ``kway`` (when pymetis is
    installed) and ``rib`` (the nodes' coordinates), in that cycle, so every call moves
    the mesh from the previous method's partition (one untimed cycle first); then one
    iteration (its extra time over a steady one is the rebuild: plans, colourings,
    halos), one more untimed and ``--iters`` timed (loop by loop, ``persistent``). Ratio:
    repartition time / steady iteration time on the new partition (the median
    repartition and the median iteration of ``--repeats`` cycles; not re-measured,
    since every call changes the partition). The sparse-exchange totals of the call
    (``meshchain.comm.sparse.TOTALS`` after ``reset_totals()``, summed over ranks):
    rounds (per rank), messages, MB.

``sums``: short sums over ranks
    Sums of 1, 2, 4, 16, 37 and 64 float64 values (37: an s-step CG block's reduction at
    s = 4): a bare mpi4py ``Allreduce`` (the floor) against
    :func:`meshchain.comm.pairwise.pairwise_sum` (recursive doubling, what the s-step
    methods reduce with), interleaved, ``--sum-reps`` sums per sample; and whether every
    rank got the same bits, and ``MPI_Allreduce``'s. From compiled code, as the Krylov
    iterations sum (``--sum-reps`` sums in one compiled loop, where compiled code can call
    MPI): ``MPI_Allreduce`` by address (the floor there) against
    :func:`meshchain.comm.by_address.sum_all`, which sums by ``MPI_Sendrecv`` rounds where
    ``MPI_Allreduce`` would take two.

``cold``: a halo exchange after a sweep (issue 36's model)
    Ranks in pairs (``r`` and ``r ^ 1``; even rank counts) exchange 171 rows of two float64
    (the synthetic chain's 2736-byte message at 40 000 edges per rank) with persistent
    requests, packed and unpacked by :mod:`meshchain.comm.packing`; between posting and
    waiting each rank sweeps a working set of 0.25 to 16 MiB (half of it the dat the rows
    are unpacked into), or nothing: the floor, an exchange with its data and MPI's state
    warm; then it spins without touching memory until the partner has surely sent. The
    sizes take turns, round by round. ``MPI_Waitall`` and the unpacking timed apart: the
    median of a round's ``--exchange-reps`` exchanges (slowest rank), median of
    ``--repeats`` rounds. What a loop that sweeps more than the caches hold between two
    exchanges adds to each exchange's round.

Output: JSON (``--out``, default ``benchmarks/results/comm.json``) with the machine (CPU
model, cores, MPICH version, Python, numba, mpi4py) and every measurement; Markdown
tables on stdout (progress on stderr).

Usage::

    .venv/bin/python benchmarks/comm.py --quick --ranks 2          # ~10 s per job
    .venv/bin/python benchmarks/comm.py --airfoil-size 400 600     # the real one: ranks 2 3 4,
                                                                   # shm and tcp, 720000 cells
    .venv/bin/python benchmarks/comm.py                            # Airfoil at 20000 cells per rank
    .venv/bin/python benchmarks/comm.py --parts sparse --network shm --ranks 2 4 --per-item-max 100000
    .venv/bin/python benchmarks/comm.py --parts sums --ranks 2 3 4                 # short sums, ~1 min
    .venv/bin/python benchmarks/comm.py --parts cold --ranks 2 4                   # exchanges after sweeps
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TCP = {"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
PARTS = ("transports", "sparse", "repartition", "sums", "cold")
SUM_COUNTS = (1, 2, 4, 16, 37, 64)
"""Float64 values per sum of the ``sums`` part (37: an s-step CG block's reduction at s = 4)."""
COLD_MEGABYTES = (0.25, 1, 2, 4, 8, 16)
"""Working sets swept between two exchanges in the ``cold`` part (the L2 cache here: 2 MiB a core)."""
COLD_ROWS = 171
"""Rows of two float64 values each rank sends and unpacks per exchange in the ``cold`` part: the
2736-byte message of the synthetic chain at 40 000 edges per rank (``benchmarks/model.py``)."""
TERMINATIONS = ("nbx", "allreduce", "neighbourhood")
METHODS = ("block", "kway", "rib")
MODES = {"loop": None, "ca": True}
FULL = dict(per_rank=20000, iters=10, repeats=5, attempts=3, exchange_reps=100, sum_reps=2000,
            items=[1000, 10000, 100000],
            item_bytes=[8, 64, 256], items_per_sample=10000,
            per_item_max=10000)
QUICK = dict(per_rank=2000, iters=2, repeats=3, attempts=1, exchange_reps=10, sum_reps=200, items=[1000], item_bytes=[8, 256],
             items_per_sample=2000, per_item_max=10000)


def mpiexec() -> str:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


# --- helpers used by the workers ---------------------------------------------------------------


def slowest(comm, seconds: float) -> float:
    """The largest of the ranks' ``seconds`` (``comm`` None: one process)."""
    from mpi4py import MPI

    return seconds if comm is None else comm.allreduce(seconds, op=MPI.MAX)


def interleaved(comm, variants: dict, repeats: int) -> tuple[dict, dict]:
    """``(last results, seconds per round)`` of ``variants`` (name -> call) run in turns,
    ``repeats + 1`` rounds, each call timed on the slowest rank (all ranks start together);
    the first round (compiling, set-up) is not counted. Taking turns makes a shared VM's drift
    in speed touch every variant alike."""
    times, found = {name: [] for name in variants}, {}
    for repeat in range(repeats + 1):
        for name, call in variants.items():
            if comm is not None:
                comm.Barrier()
            began = time.perf_counter()
            found[name] = call()
            if repeat:
                times[name].append(slowest(comm, time.perf_counter() - began))
    return found, times


def timed(comm, action, reps: int) -> float:
    """Seconds per call of ``action`` over ``reps`` calls, slowest rank (all ranks start together)."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(reps):
        action()
    return slowest(comm, (time.perf_counter() - start) / reps)


def timing_dict(timing) -> dict:
    return {"median": timing.median, "spread": timing.spread, "noisy": timing.noisy, "attempts": timing.attempts,
            "samples": list(timing.samples)}


def airfoil_problem(config):
    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    if config["airfoil_size"]:
        return airfoil.declare(naca0012(*config["airfoil_size"]))
    return airfoil.setup(per_rank=config["per_rank"], loops=4)


def compilations() -> int:
    import meshchain as mc

    return sum(s.compilations for s in mc.stats().loops.values())


class ExchangeRecorder:
    """Wraps the backend's ``halo_exchange`` (this process only): records every exchange a
    plan builds (communicator, items, tag) and counts its forward runs while ``counting``."""

    def __init__(self, backend):
        self.original = backend.halo_exchange
        self.created: list = []
        backend.halo_exchange = self.make

    def make(self, comm, items, *, tag, transport="persistent"):
        exchange = self.original(comm, items, tag=tag, transport=transport)
        entry = {"comm": comm, "items": list(items), "tag": tag, "exchange": exchange, "runs": 0}
        self.created.append(entry)
        begin = exchange.begin

        def counted():
            entry["runs"] += 1
            begin()

        exchange.begin = counted
        return exchange


# --- part 1: transports on Airfoil ---------------------------------------------------------------


def transports_worker(config: dict) -> dict:
    import numpy as np
    from mpi4py import MPI

    import meshchain as mc
    from meshchain.apps import airfoil
    from meshchain.comm.packing import WORD
    from meshchain.comm.transports import TRANSPORTS, available_transports, intracomm
    from meshchain.model.timing import measure_interleaved

    problem = airfoil_problem(config)
    session = mc.get_runtime()
    comm = intracomm(session.comm)
    recorder = ExchangeRecorder(session.backend)
    offered = [t for t in available_transports(comm) if t in session.backend.transports]
    iters, repeats, attempts = config["iters"], config["repeats"], config["attempts"]

    for mode in MODES.values():  # compile (or load from the cache); the CA chains deepen the halos here
        for _ in range(2):
            airfoil.iterate(problem, ca=mode)

    # which exchanges one steady-state iteration runs, per mode (plans dropped by configure first)
    captured = {}
    for name, mode in MODES.items():
        mc.configure(transport="persistent")
        mc.configure(transport="p2p")  # a changed configuration drops every plan
        recorder.created.clear()
        for _ in range(2):
            airfoil.iterate(problem, ca=mode)
        for entry in recorder.created:
            entry["runs"] = 0
        airfoil.iterate(problem, ca=mode)
        sequence = [(e, e["runs"]) for e in recorder.created if e["runs"]]
        agreed = comm.bcast([runs for _, runs in sequence])
        if agreed != [runs for _, runs in sequence]:
            raise RuntimeError(f"ranks ran different halo exchanges in one iteration ({name}): {agreed} here "
                               f"{[runs for _, runs in sequence]}")
        captured[name] = sequence
    chain = mc.stats().chains.get(airfoil.CHAIN)
    chain_info = {"mode": chain.mode, "depth": chain.depth, "segments_per_execution":
                  chain.segments / max(chain.executions, 1)} if chain is not None else {}

    # --- whole iterations, per transport and mode --------------------------------------------------
    def iteration_take(transport, mode):
        def take():
            mc.configure(transport=transport)
            for _ in range(2):
                airfoil.iterate(problem, ca=mode)
            before, compiled = len(recorder.created), compilations()
            seconds = timed(comm, lambda: airfoil.iterate(problem, ca=mode), iters)
            checks["plan_builds"] += len(recorder.created) - before
            checks["compilations"] += compilations() - compiled
            return seconds
        return take

    checks = {"plan_builds": 0, "compilations": 0}
    takes = {(t, name): iteration_take(t, mode) for t in offered for name, mode in MODES.items()}
    iteration = measure_interleaved(takes, repeats=repeats, max_attempts=attempts)

    # --- the same exchanges alone, per transport, and the bare floor -------------------------------
    standalone, rows = {}, []
    for name, sequence in captured.items():
        built = {t: [(recorder.original(e["comm"], e["items"], tag=e["tag"], transport=t), runs)
                     for e, runs in sequence] for t in offered}
        floor_plan = []
        for entry, runs in sequence:
            exchange = entry["exchange"]
            sends = [(n, np.ones((end - begin) * WORD.itemsize, np.uint8)) for n, begin, end in exchange.send.ranges]
            receives = [(n, np.empty((end - begin) * WORD.itemsize, np.uint8))
                        for n, begin, end in exchange.receive.ranges]
            floor_plan.append((sends, receives, runs))

        def run_built(items):
            def one():
                for exchange, runs in items:
                    for _ in range(runs):
                        exchange.begin()
                        exchange.end()
            return one

        def bare():
            for sends, receives, runs in floor_plan:
                for _ in range(runs):
                    requests = [comm.Irecv(buffer, source=n, tag=99) for n, buffer in receives]
                    requests += [comm.Isend(buffer, dest=n, tag=99) for n, buffer in sends]
                    MPI.Request.Waitall(requests)

        actions = {t: run_built(items) for t, items in built.items()}
        actions["bare"] = bare
        for action in actions.values():  # warm up: windows and graph communicators are made at the first run
            for _ in range(3):
                action()
        reps = config["exchange_reps"]
        standalone[name] = measure_interleaved({k: (lambda a=a: timed(comm, a, reps)) for k, a in actions.items()},
                                               repeats=repeats, max_attempts=attempts)
        for items in built.values():
            for exchange, _ in items:
                exchange.close()
        per_rank = {"exchanges": sum(runs for _, runs in sequence),
                    "messages": sum(runs * e["exchange"].messages for e, runs in sequence),
                    "bytes": sum(runs * e["exchange"].bytes_sent for e, runs in sequence)}
        means = {k: comm.allreduce(v) / comm.size for k, v in per_rank.items()}
        for t in (*TRANSPORTS, "bare"):
            if t != "bare" and t not in offered:
                rows.append({"mode": name, "transport": t, "available": False})
                continue
            row = {"mode": name, "transport": t, "available": True,
                   "exchange": timing_dict(standalone[name][t]), **{f"{k}_per_iter": v for k, v in means.items()}}
            if t != "bare":
                row["iteration"] = timing_dict(iteration[(t, name)])
            rows.append(row)
    return {"rows": rows, "checks": checks, "chain": chain_info, "cells": problem.cells.size,
            "transports_offered": offered}


# --- part 2: sparse exchanges --------------------------------------------------------------------


def neighbourhood(rank: int, size: int) -> list:
    if size <= 5:
        return [r for r in range(size) if r != rank]
    return sorted({(rank + d) % size for d in (-2, -1, 1, 2)})


def sparse_worker(config: dict) -> dict:
    import numpy as np
    from mpi4py import MPI

    from meshchain.comm.sparse import HEADER_BYTES, SparseExchange
    from meshchain.model.timing import measure_interleaved

    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.rank, comm.size
    neighbours = neighbourhood(rank, size)
    rows = []
    for n_items in config["items"]:
        for nbytes in config["item_bytes"]:
            rng = np.random.default_rng(1000 * rank + 7)
            destinations = rng.choice(neighbours, size=n_items)
            payload = rng.integers(0, 256, size=(n_items, nbytes), dtype=np.uint8)
            items, targets = list(payload), destinations.tolist()
            counts = np.bincount(destinations, minlength=size).astype(np.int64)
            incoming = np.empty(size, dtype=np.int64)
            comm.Alltoall(counts, incoming)
            expected = int(incoming.sum())
            sums = np.array([int(payload[destinations == d].sum()) for d in range(size)], dtype=np.int64)
            received_sums = np.empty(size, dtype=np.int64)
            comm.Alltoall(sums, received_sums)
            checksum = int(received_sums.sum())
            inbox = np.empty((expected, nbytes), dtype=np.uint8)
            slots = list(inbox)
            sources = [s for s in range(size) for _ in range(int(incoming[s]))]
            one_item = HEADER_BYTES + -(-nbytes // 8) * 8 + 8
            stats, delivered = {}, {}

            def sparse(termination, limit, key):
                def one():
                    options = {} if limit is None else {"buffer_limit": limit}
                    exchange = SparseExchange(comm, termination=termination, neighbours=neighbours, **options)
                    for dest, item in zip(targets, items):
                        exchange.post(dest, item)
                    delivered[key] = exchange.finish()
                    stats[key] = (exchange.stats["messages_sent"], exchange.stats["bytes_sent"])
                return one

            def bare():
                counted = np.empty(size, dtype=np.int64)
                comm.Alltoall(counts, counted)
                requests = [comm.Irecv(slot, source=source, tag=5) for slot, source in zip(slots, sources)]
                requests += [comm.Isend(item, dest=dest, tag=5) for dest, item in zip(targets, items)]
                MPI.Request.Waitall(requests)
                delivered[("bare", "counts")] = [(None, slot) for slot in slots]
                stats[("bare", "counts")] = (n_items, n_items * nbytes)

            actions = {}
            packings = [("packed", None)] + ([("per-item", one_item)] if n_items <= config["per_item_max"] else [])
            for packing, limit in packings:
                for termination in TERMINATIONS:
                    actions[(packing, termination)] = sparse(termination, limit, (packing, termination))
            actions[("bare", "counts")] = bare
            for key, action in actions.items():  # warm up, and check the delivery (count and byte sum)
                inbox[:] = 0
                action()
                got = delivered.pop(key)
                total = sum(int(item.sum()) for _, item in got)
                if (len(got), total) != (expected, checksum):
                    raise RuntimeError(f"{key}: rank {rank} received {len(got)} items summing to {total}, expected "
                                       f"{expected} summing to {checksum}")
            reps = max(1, config["items_per_sample"] // n_items)
            timings = measure_interleaved({k: (lambda a=a: timed(comm, a, reps)) for k, a in actions.items()},
                                          repeats=config["repeats"], max_attempts=config["attempts"])
            for key, timing in timings.items():
                messages, sent = (comm.allreduce(v) / size for v in stats[key])
                rows.append({"items": n_items, "item_bytes": nbytes, "packing": key[0], "termination": key[1],
                             "rounds_per_sample": reps, "round": timing_dict(timing),
                             "messages_per_rank": messages, "bytes_per_rank": sent})
    comm.Free()
    return {"rows": rows, "neighbours": len(neighbourhood(0, size))}


# --- part 3: repartitioning ----------------------------------------------------------------------


def repartition_worker(config: dict) -> dict:
    from mpi4py import MPI

    import meshchain as mc
    from meshchain.apps import airfoil
    from meshchain.comm import sparse
    from meshchain.comm.transports import intracomm
    from meshchain.model.timing import median_record

    problem = airfoil_problem(config)
    session = mc.get_runtime()
    comm = intracomm(session.comm)
    mc.configure(transport="persistent")
    recorder = ExchangeRecorder(session.backend)
    has_metis = importlib.util.find_spec("pymetis") is not None
    methods = [m for m in METHODS if m != "kway" or comm.allreduce(has_metis, op=MPI.LAND)]
    iters = config["iters"]

    def step():
        airfoil.iterate(problem, ca=None)

    def move(method):
        mc.repartition(method, coords=problem.p_x if method == "rib" else None)

    for _ in range(2):
        step()
    for method in methods:  # warm up: whatever the repartitioning compiles or builds the first time
        move(method)
        for _ in range(2):
            step()
    records = {m: [] for m in methods}
    checks = {"plan_builds": 0, "compilations": 0}
    for _ in range(config["repeats"]):
        for method in methods:
            sparse.reset_totals()
            moving = timed(comm, lambda: move(method), 1)
            totals = dict(sparse.TOTALS)
            first = timed(comm, step, 1)
            step()
            before, compiled = len(recorder.created), compilations()
            steady = timed(comm, step, iters)
            checks["plan_builds"] += len(recorder.created) - before
            checks["compilations"] += compilations() - compiled
            records[method].append({
                "repartition": moving, "first_iteration": first, "iteration": steady,
                "rebuild": first - steady, "ratio": moving / steady,
                "sparse_rounds": comm.allreduce(totals.get("rounds", 0), op=MPI.MAX),
                "messages": comm.allreduce(totals.get("messages_sent", 0)),
                "bytes": comm.allreduce(totals.get("bytes_sent", 0))})
    rows = []
    for method in methods:
        record = median_record(records[method], key="repartition")
        iteration = median_record(records[method], key="iteration")
        rows.append(dict(record, method=method, iteration=iteration["iteration"],
                         iteration_spread=iteration["spread"], iteration_noisy=iteration["noisy"],
                         ratio=record["repartition"] / iteration["iteration"], all_rounds=records[method]))
    return {"rows": rows, "checks": checks, "cells": problem.cells.size, "methods": methods}


def sums_worker(config: dict) -> dict:
    """Short sums over ranks: ``MPI_Allreduce`` (the floor: a bare mpi4py call) against
    :func:`meshchain.comm.pairwise.pairwise_sum`, interleaved; and whether every rank got
    the same bits (and, on two ranks, ``MPI_Allreduce``'s)."""
    import numpy as np
    from mpi4py import MPI

    from meshchain.comm.pairwise import pairwise_sum

    comm = MPI.COMM_WORLD
    reps = config["sum_reps"]
    rows = []
    for count in SUM_COUNTS:
        start = np.random.default_rng(comm.rank).uniform(-1.0, 1.0, count)
        work = start.copy()

        def by_mpi():
            comm.Allreduce(start, work, op=MPI.SUM)

        def by_pairs():
            np.copyto(work, start)
            pairwise_sum(comm, work)

        variants = {"MPI_Allreduce": by_mpi, "pairwise": by_pairs}
        compiled = _compiled_sums(comm, start, work)
        for action in variants.values():
            timed(comm, action, 50)
        for action in compiled.values():
            action(50)
        times = {name: [] for name in (*variants, *compiled)}
        for _ in range(config["repeats"]):
            for name, action in variants.items():
                times[name].append(timed(comm, action, reps))
            for name, action in compiled.items():
                times[name].append(timed(comm, lambda: action(reps), 1) / reps)
        reference = np.empty(count)
        comm.Allreduce(start, reference, op=MPI.SUM)
        mine = pairwise_sum(comm, start.copy())
        same = all(np.array_equal(mine, other) for other in comm.allgather(mine))
        rows.append({"count": count, "same_on_every_rank": bool(comm.allreduce(same, op=MPI.LAND)),
                     "equal_to_mpi": bool(comm.allreduce(np.array_equal(mine, reference), op=MPI.LAND)),
                     **{name: sorted(values)[len(values) // 2] for name, values in times.items()}})
    return {"rows": rows}


def _compiled_sums(comm, start, work) -> dict:
    """``{name: run(k)}``: ``k`` sums of ``start`` into ``work`` in one compiled loop, by
    ``MPI_Allreduce`` (``handles`` without the rank and size) and by
    :func:`meshchain.comm.by_address.sum_all` as the Krylov iterations call it; ``{}`` where
    compiled code cannot call MPI."""
    import numba

    from meshchain.comm.by_address import sum_all
    from meshchain.comm.compiled import addresses, handles

    functions = addresses()
    if functions is None:
        return {}

    @numba.njit
    def loop(k, values, out, chosen):
        error = 0
        for _ in range(k):
            error |= sum_all(functions, values, out, chosen)
        return error

    full = handles(comm)
    return {name: (lambda k, chosen=chosen: loop(k, start, work, chosen))
            for name, chosen in (("compiled MPI_Allreduce", full[:3].copy()), ("compiled sum_all", full))}


def cold_worker(config: dict) -> dict:
    """A halo exchange after a sweep: each rank sends :data:`COLD_ROWS` rows to its partner
    (rank ``r ^ 1``) with persistent requests, packed and unpacked by
    :mod:`meshchain.comm.packing` as the compiled plans do, and between two exchanges sweeps a
    working set of each size of :data:`COLD_MEGABYTES` (half of it the dat the rows are
    unpacked into), or nothing (the warm floor), then spins (no memory traffic) for 30 µs and
    half the slowest rank's sweep, so that the partner's message was sent before the
    wait: what is timed is the exchange's own completion, not one rank waiting for the other.
    Times: ``MPI_Waitall`` and the unpacking, per exchange: the median exchange of a round
    (the slowest rank's), median of the rounds; the sweep alone for reference."""
    import numba
    import numpy as np
    from mpi4py import MPI

    from meshchain.comm.packing import pack, unpack

    comm = MPI.COMM_WORLD
    if comm.size % 2:  # every rank alike: none waits for a partner that is not there
        raise RuntimeError("the cold part pairs ranks 0-1, 2-3, ...: run it on an even number of ranks")

    @numba.njit(cache=True)
    def sweep(dat, a):
        for i in range(dat.shape[0]):
            dat[i, 0] += 0.5 * a[2 * i]
            dat[i, 1] -= 0.5 * a[2 * i + 1]

    rng = np.random.default_rng(comm.rank)
    reps = config["exchange_reps"]
    cases = [_cold_case(comm, rng, megabytes) for megabytes in (None, *COLD_MEGABYTES)]
    for round_ in range(config["repeats"] + 1):  # the sizes take turns; the first round compiles and warms up
        for case in cases:
            times = np.zeros((reps, 3))
            comm.Barrier()
            for k in range(reps):
                pack(case["send"], case["views"], case["table"])
                MPI.Prequest.Startall(case["requests"])
                t0 = time.perf_counter()
                if case["megabytes"] is not None:
                    sweep(*case["views"], case["a"])
                swept = time.perf_counter()
                while time.perf_counter() < swept + case["slack"]:  # the partner's sweep done: no wait for it
                    pass
                t1 = time.perf_counter()
                MPI.Request.Waitall(case["requests"])
                t2 = time.perf_counter()
                unpack(case["receive"], case["views"], case["table"])
                times[k] = t2 - t1, time.perf_counter() - t2, swept - t0
            medians = np.median(times, axis=0)  # an exchange the machine interrupted does not count
            comm.Allreduce(MPI.IN_PLACE, medians, op=MPI.MAX)
            case["slack"] = 30e-6 + 0.5 * medians[2]
            if round_:
                for name, seconds in zip(("wait", "unpack", "sweep"), medians):
                    case["samples"].setdefault(name, []).append(float(seconds))
    rows = []
    for case in cases:
        for request in case["requests"]:
            request.Free()
        rows.append({"megabytes": case["megabytes"],
                     **{name: sorted(v)[len(v) // 2] for name, v in case["samples"].items()}})
    return {"rows": rows}


def _cold_case(comm, rng, megabytes) -> dict:
    """The arrays, rows and persistent requests of one working set of the ``cold`` part."""
    import numpy as np

    n = max(int((megabytes or COLD_MEGABYTES[0]) * 2**20) // 32, 4 * COLD_ROWS)
    table = np.zeros((COLD_ROWS, 3), dtype=np.int64)
    table[:, 1] = np.sort(rng.choice(n, COLD_ROWS, replace=False))
    table[:, 2] = 2 * np.arange(COLD_ROWS)
    send, receive = np.empty(2 * COLD_ROWS), np.empty(2 * COLD_ROWS)
    requests = [comm.Recv_init(receive, comm.rank ^ 1, 41), comm.Send_init(send, comm.rank ^ 1, 41)]
    return {"megabytes": megabytes, "views": (rng.uniform(-1.0, 1.0, (n, 2)),), "a": rng.uniform(-1.0, 1.0, 2 * n),
            "table": table, "send": send, "receive": receive, "requests": requests, "slack": 1e-3, "samples": {}}


WORKERS = {"transports": transports_worker, "sparse": sparse_worker, "repartition": repartition_worker,
           "sums": sums_worker, "cold": cold_worker}


# --- the driver ----------------------------------------------------------------------------------


def launch(script: str, worker: list, ranks: int, network: str, env: dict, config: dict, timeout: float,
           label: str) -> dict:
    """Run ``script --worker ... --config`` under ``mpiexec -n ranks`` (over TCP for ``network``
    "tcp") and return the JSON rank 0 printed last; a failed job shows its output and raises."""
    env = dict(env, **TCP) if network == "tcp" else env
    command = [mpiexec(), "-n", str(ranks), sys.executable, script, "--worker", *worker, "--config", json.dumps(config)]
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        raise RuntimeError(f"{label} on {ranks} ranks ({network}) failed with exit code {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def serve(worker, config: dict) -> int:
    """The worker side of :func:`launch`: run ``worker(config)``, rank 0 prints its JSON."""
    result = worker(config)
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps(result), flush=True)
    return 0


def run_job(part: str, network: str, ranks: int, config: dict, cache_dir: str, timeout: float) -> dict:
    # a cache directory of its own: compiled loops are reused from run to run, and no saved
    # calibration of another program picks a transport or turns the model on
    env = dict(os.environ, MESHCHAIN_THREADS="1", MESHCHAIN_CACHE_DIR=cache_dir, NUMBA_NUM_THREADS="1")
    return launch(__file__, [part], ranks, network, env, config, timeout, part)


def solver_arguments(description: str, *, repeats: int, out: str) -> argparse.ArgumentParser:
    """The options of a solver benchmark run by :func:`sweep_solves` (its worker's too)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--per-rank", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--rtol", type=float, default=1e-8)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--out", default=out)
    return parser


def sweep_solves(script: str, args, label: str, **config) -> tuple[list, dict]:
    """One :func:`launch` of ``script``'s ``worker`` per network in ``args.network``, rank count
    in ``args.ranks`` (1 rank once, as network "-": one process sends nothing) and size in
    ``args.per_rank``, each with ``per_rank``, ``rtol``, ``repeats`` and ``config``, in the
    user's environment and a compile cache of its own; the results (each with its
    ``network``) and :func:`machine`, both written to ``args.out``."""
    results = []
    with tempfile.TemporaryDirectory(prefix="solves-") as folder:
        env = user_environment(MESHCHAIN_CACHE_DIR=f"{folder}/meshchain")
        for network in args.network:
            for ranks in args.ranks:
                if ranks == 1 and network == "tcp":
                    continue
                for per_rank in args.per_rank:
                    job = dict(config, per_rank=per_rank, rtol=args.rtol, repeats=args.repeats)
                    found = launch(script, ["worker"], ranks, network, env, job, args.timeout,
                                   f"{label} ({per_rank} per rank)")
                    results.append(dict(found, network=network if ranks > 1 else "-"))
    about = machine()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": about, "results": results}, indent=1))
    return results, about


def solve_row(comm, variants: dict, repeats: int, same: tuple, **row) -> dict:
    """``row`` with each of ``variants``' whole solves timed in :func:`interleaved` rounds (the
    first compiles and sets up): its median ``seconds`` and ``iterations`` (a variant returns
    them, or ``(iterations, history)``), and ``same_bits``: whether the two variants named in
    ``same`` returned the same."""
    found, times = interleaved(comm, variants, repeats)
    row["same_bits"] = found[same[0]] == found[same[1]]
    for name in variants:
        iterations = found[name] if isinstance(found[name], int) else found[name][0]
        row[name] = {"seconds": statistics.median(times[name]), "iterations": iterations}
    return row


def cube_for(per_rank: int, ranks: int) -> int:
    """Hexahedra per side so that the cube has about ``per_rank * ranks`` nodes."""
    return max(2, round((per_rank * ranks) ** (1 / 3)) - 1)


def poisson_problem(per_rank: int) -> tuple:
    """``(comm, ranks, problem)``: :mod:`meshchain.apps.poisson` on ``structured_tets`` with about
    ``per_rank`` unknowns per rank (``comm`` None on one process)."""
    import meshchain as mc
    from meshchain.apps import poisson
    from meshchain.meshes import structured_tets

    comm = mc.get_runtime().comm
    ranks = 1 if comm is None else comm.size
    n = cube_for(per_rank, ranks)
    return comm, ranks, poisson.declare(structured_tets(n, n, n))


# meshchain's nonsymmetric methods -> (PETSc KSP type, options), and its preconditioners -> PETSc PC types
NONSYMMETRIC_KSP = {"gmres": ("gmres", {"ksp_gmres_cgs_refinement_type": "refine_ifneeded"}),
                    "pipegmres": ("pgmres", {}), "bicgstab": ("bcgs", {}),
                    "pipebicgstab": ("pipebcgs", {"ksp_pc_side": "right"})}
PETSC_PC = {"jacobi": "jacobi", "bjacobi-ilu": "bjacobi"}


def petsc_nonsymmetric(method: str, pc: str) -> tuple:
    """``(KSP type, PC type, options)``: PETSc's counterpart of ``mc.solve(method=method, pc=pc)``."""
    ksp_type, options = NONSYMMETRIC_KSP[method]
    return ksp_type, PETSC_PC[pc], options


def petsc_ksp(problem, ksp_type: str, options: dict, *, rtol: float, maxiter=None, pc: str = "jacobi"):
    """``(ksp, A, b)``: PETSc's KSP of ``ksp_type`` with ``options`` on the problem's matrix."""
    from petsc4py import PETSc

    A = problem.A.to_petsc()
    b = problem.A.petsc_vec(problem.b)
    opts = PETSc.Options()
    for key, value in dict(options, options_suppress_deprecated_warnings=None).items():
        opts[key] = value
    ksp = PETSc.KSP().create(comm=A.getComm())
    ksp.setOperators(A)
    ksp.setType(ksp_type)
    ksp.getPC().setType(pc)
    ksp.setTolerances(rtol=rtol, atol=0.0, max_it=maxiter or 100000)
    ksp.setFromOptions()
    for key in (*options, "options_suppress_deprecated_warnings"):
        opts.delValue(key)
    return ksp, A, b


def petsc_solver(problem, ksp_type: str, pc: str, rtol: float, options: dict | None = None):
    """A whole solve of :func:`petsc_ksp`'s KSP from ``x = 0``, set up now: ``solve()`` returns
    its iterations."""
    ksp, _, b = petsc_ksp(problem, ksp_type, options or {}, rtol=rtol, pc=pc)
    x = b.duplicate()
    x.set(0.0)
    ksp.solve(b, x)  # sets up

    def solve() -> int:
        x.set(0.0)
        ksp.solve(b, x)
        return ksp.getIterationNumber()

    return solve


def solver_main(script: str, args, worker, table, label: str, what: str, **config) -> int:
    """A solver benchmark's ``main`` once its options are parsed (:func:`solver_arguments`): under
    ``mpiexec`` the worker's side, else :func:`sweep_solves` and its table (``what``: the solves)."""
    if args.worker:
        return serve(worker, json.loads(args.config))
    began = time.perf_counter()
    results, about = sweep_solves(script, args, label, **config)
    print(f"{about['cpu']}; no thread variables set; {what}, rtol {args.rtol}, whole solves, median of "
          f"{args.repeats} interleaved rounds, slowest rank; whole run {time.perf_counter() - began:.0f} s.\n")
    print(table(results))
    return 0


#: Thread variables a user does not set: benchmarks run without them unless a labelled row asks.
THREAD_VARIABLES = ("MESHCHAIN_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def write_run(out: str, info: dict, config: dict, seconds: float, results: list, **extra) -> Path:
    """A benchmark run's JSON at ``out`` (its folder made): the machine, the configuration, the
    command line, the run's seconds, the results and ``extra``; returns the path."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": info, "config": config, "argv": sys.argv[1:], "seconds": seconds,
                                "results": results, **extra}, indent=1))
    return path


def user_environment(**extra) -> dict:
    """The calling environment without :data:`THREAD_VARIABLES` (whatever the shell set), plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}, **extra}


def machine() -> dict:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import mpi4py

    mpi4py.rc.initialize = mpi4py.rc.finalize = False  # the version is known before MPI_Init
    from mpi4py import MPI

    try:
        import numba
        numba_version = numba.__version__
    except ImportError:
        numba_version = ""
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(),
            "mpi": " ".join(MPI.Get_library_version().split("\n")[0].split()), "mpi4py": mpi4py.__version__,
            "python": platform.python_version(), "numba": numba_version, "platform": platform.platform()}


def _ms(timing: dict, scale: float = 1e3, digits: int = 3) -> str:
    return f"{timing['median'] * scale:.{digits}f}{'*' if timing['noisy'] else ''}"


def _spread(timing: dict) -> str:
    return f"{timing['spread'] * 100:.1f}{'*' if timing['noisy'] else ''}"


def _ratio(a: dict, b: dict) -> str:
    return f"{a['median'] / b['median']:.3f}{'*' if a['noisy'] or b['noisy'] else ''}"


def _ranks(entry: dict) -> str:
    return f"{entry['ranks']}{' (over)' if entry['ranks'] > entry['cores'] else ''}"


def transports_table(results: list) -> str:
    head = ("| network | ranks | cells | mode | transport | ms/iter | spread % | vs p2p | exchanges µs/iter "
            "| spread % | vs p2p | vs floor | exchanges/iter | messages/iter | kB/iter |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for entry in results:
        for mode in MODES:
            rows = {r["transport"]: r for r in entry["rows"] if r["mode"] == mode}
            p2p, floor = rows.get("p2p"), rows["bare"]
            for name, r in rows.items():
                label = "bare Isend/Irecv (floor)" if name == "bare" else name
                lead = f"| {entry['network']} | {_ranks(entry)} | {entry['cells']} | {mode} | {label} |"
                if not r["available"]:
                    lines.append(lead + " n/a |" + " |" * 9)
                    continue
                it = r.get("iteration")
                iteration = (f" {_ms(it)} | {_spread(it)} | {_ratio(it, p2p['iteration']) if p2p else ''} |"
                             if it else " | | |")
                ex = r["exchange"]
                lines.append(lead + iteration + f" {_ms(ex, 1e6, 1)} | {_spread(ex)} | "
                             f"{_ratio(ex, p2p['exchange']) if p2p else ''} | {_ratio(ex, floor['exchange'])} | "
                             f"{r['exchanges_per_iter']:.1f} | {r['messages_per_iter']:.1f} | "
                             f"{r['bytes_per_iter'] / 1e3:.1f} |")
    return "\n".join(lines)


def sparse_table(results: list) -> str:
    head = ("| network | ranks | N items | S bytes | packed nbx ms | allreduce ÷ nbx | neighbourhood ÷ nbx | "
            "per-item nbx ms | allreduce ÷ nbx | neighbourhood ÷ nbx | per-item ÷ packed | bare per-item ms | "
            "bare ÷ packed | messages packed | messages per-item |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for entry in results:
        cases = {}
        for r in entry["rows"]:
            cases.setdefault((r["items"], r["item_bytes"]), {})[(r["packing"], r["termination"])] = r
        for (n_items, nbytes), c in cases.items():
            packed, item, bare = c[("packed", "nbx")], c.get(("per-item", "nbx")), c[("bare", "counts")]
            if item is None:
                per_item = "— | — | — | — | "
                count = "—"
            else:
                per_item = (f"{_ms(item['round'])} | {_ratio(c[('per-item', 'allreduce')]['round'], item['round'])} | "
                            f"{_ratio(c[('per-item', 'neighbourhood')]['round'], item['round'])} | "
                            f"{_ratio(item['round'], packed['round'])} | ")
                count = f"{item['messages_per_rank']:.0f}"
            lines.append(
                f"| {entry['network']} | {_ranks(entry)} | {n_items} | {nbytes} | {_ms(packed['round'])} | "
                f"{_ratio(c[('packed', 'allreduce')]['round'], packed['round'])} | "
                f"{_ratio(c[('packed', 'neighbourhood')]['round'], packed['round'])} | {per_item}"
                f"{_ms(bare['round'])} | {_ratio(bare['round'], packed['round'])} | "
                f"{packed['messages_per_rank']:.1f} | {count} |")
    return "\n".join(lines)


def sums_table(results: list) -> str:
    head = ("| network | ranks | values | MPI_Allreduce µs | pairwise µs | pairwise ÷ MPI | "
            "compiled MPI_Allreduce µs | compiled sum_all µs | sum_all ÷ MPI | same bits on every rank | bits of MPI |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for entry in results:
        for r in entry["rows"]:
            floor, ours = r.get("compiled MPI_Allreduce"), r.get("compiled sum_all")
            compiled = (f"{floor * 1e6:.1f} | {ours * 1e6:.1f} | {ours / floor:.2f}" if floor and ours else "- | - | -")
            lines.append(f"| {entry['network']} | {_ranks(entry)} | {r['count']} | {r['MPI_Allreduce'] * 1e6:.1f} | "
                         f"{r['pairwise'] * 1e6:.1f} | {r['pairwise'] / r['MPI_Allreduce']:.2f} | {compiled} | "
                         f"{'yes' if r['same_on_every_rank'] else 'no'} | {'yes' if r['equal_to_mpi'] else 'no'} |")
    return "\n".join(lines)


def cold_table(results: list) -> str:
    head = ("| network | ranks | swept between exchanges | MPI_Waitall µs | unpack µs | wait + unpack µs | "
            "× no sweep | the sweep µs |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for entry in results:
        floor = entry["rows"][0]["wait"] + entry["rows"][0]["unpack"]
        for r in entry["rows"]:
            both = r["wait"] + r["unpack"]
            swept = "nothing" if r["megabytes"] is None else f"{r['megabytes']:g} MiB"
            lines.append(f"| {entry['network']} | {_ranks(entry)} | {swept} | {r['wait'] * 1e6:.2f} | "
                         f"{r['unpack'] * 1e6:.2f} | {both * 1e6:.2f} | {both / floor:.2f} | {r['sweep'] * 1e6:.0f} |")
    return "\n".join(lines)


def repartition_table(results: list) -> str:
    head = ("| network | ranks | cells | method | repartition ms | spread % | iteration ms | spread % | "
            "repartition ÷ iteration | rebuild ms (1st iteration − steady) | sparse rounds | messages | MB moved |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for entry in results:
        for r in entry["rows"]:
            star = "*" if r["noisy"] else ""
            istar = "*" if r["iteration_noisy"] else ""
            lines.append(f"| {entry['network']} | {_ranks(entry)} | {entry['cells']} | {r['method']} | "
                         f"{r['repartition'] * 1e3:.1f}{star} | {r['spread'] * 100:.1f}{star} | "
                         f"{r['iteration'] * 1e3:.2f}{istar} | {r['iteration_spread'] * 100:.1f}{istar} | "
                         f"{r['ratio']:.1f}{'*' if star or istar else ''} | {r['rebuild'] * 1e3:.1f} | "
                         f"{r['sparse_rounds']} | {r['messages']} | {r['bytes'] / 1e6:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run (seconds per job): smaller defaults")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--network", nargs="+", choices=("shm", "tcp"), default=["shm", "tcp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("--per-rank", type=int, help="Airfoil cells per rank (default 20000; quick 2000)")
    parser.add_argument("--airfoil-size", nargs=2, type=int, metavar=("I", "J"),
                        help="a fixed naca0012(I, J) mesh instead (400 600: OP2's 720000 cells)")
    parser.add_argument("--iters", type=int, help="Airfoil iterations per sample (default 10; quick 2)")
    parser.add_argument("--exchange-reps", type=int, help="iterations' worth of exchanges per sample (100; quick 10)")
    parser.add_argument("--sum-reps", type=int, help="sums: sums per sample (2000; quick 200)")
    parser.add_argument("--items", nargs="+", type=int, help="sparse: items per rank (1000 10000 100000)")
    parser.add_argument("--item-bytes", nargs="+", type=int, help="sparse: bytes per item (8 64 256)")
    parser.add_argument("--items-per-sample", type=int,
                        help="sparse: a sample is max(1, this // N) rounds (10000; quick 2000)")
    parser.add_argument("--per-item-max", type=int,
                        help="sparse: run the per-item SparseExchange variants only up to this N (10000)")
    parser.add_argument("--repeats", type=int, help="interleaved rounds; the median counts (5; quick 3)")
    parser.add_argument("--attempts", type=int, help="measurements of a noisy set of variants (3; quick 1)")
    parser.add_argument("--out", default=str(HERE / "results" / "comm.json"))
    parser.add_argument("--cache-dir", default=str(HERE / "build" / "comm-cache"),
                        help="meshchain's cache directory for the workers (compiled loops are reused)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per mpiexec job")
    parser.add_argument("--worker", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve(WORKERS[args.worker], json.loads(args.config))

    defaults = QUICK if args.quick else FULL
    config = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in defaults.items()}
    config["airfoil_size"] = args.airfoil_size
    info = machine()
    results = {part: [] for part in args.parts}
    began = time.perf_counter()
    for network in args.network:
        for ranks in args.ranks:
            for part in args.parts:
                start = time.perf_counter()
                print(f"[comm] {part}: {ranks} ranks, {network} ...", end="", file=sys.stderr, flush=True)
                result = run_job(part, network, ranks, config, args.cache_dir, args.timeout)
                seconds = time.perf_counter() - start
                print(f" {seconds:.1f} s", file=sys.stderr, flush=True)
                results[part].append(dict(result, network=network, ranks=ranks, cores=info["cores"],
                                          seconds=seconds))
    total = time.perf_counter() - began
    cells = f"naca0012({args.airfoil_size[0]}, {args.airfoil_size[1]})" if args.airfoil_size else \
        f"setup(per_rank={config['per_rank']})"
    print(f"{info['cpu']}, {info['cores']} cores; {info['mpi']}; mpi4py {info['mpi4py']}, Python {info['python']}, "
          f"numba {info['numba']}. Median of {config['repeats']} interleaved rounds (slowest rank), "
          f"'*': spread > 10 % after up to {config['attempts']} attempts; whole run {total:.0f} s.")
    if "transports" in results:
        print(f"\nAirfoil's halo exchanges ({cells}, {config['iters']} iterations per sample, "
              f"{config['exchange_reps']} iterations' exchanges per sample):\n")
        print(transports_table(results["transports"]))
        for e in results["transports"]:
            chain = e["chain"]
            if chain:
                print(f"\n{e['network']}, {e['ranks']} ranks: the CA stage chain ran as {chain['mode']!r}, halo depth "
                      f"{chain['depth']}, {chain['segments_per_execution']:.0f} segment(s) per execution.", end="")
        print()
    if "sparse" in results:
        print("\nSparse exchange, N items of S bytes per rank to random neighbours (time per round; per item: "
              "SparseExchange with buffer_limit = one item; bare: Alltoall of counts + Isend/Irecv per item):\n")
        print(sparse_table(results["sparse"]))
    if "repartition" in results:
        print(f"\nRepartitioning Airfoil ({cells}), each method from the previous one's partition:\n")
        print(repartition_table(results["repartition"]))
    if "sums" in results:
        print("\nShort sums over ranks (float64, µs per sum, median of the rounds, slowest rank): MPI_Allreduce "
              "against meshchain.comm.pairwise.pairwise_sum (recursive doubling), from Python; from compiled code "
              "(one loop of sums), MPI_Allreduce by address against meshchain.comm.by_address.sum_all:\n")
        print(sums_table(results["sums"]))
    if "cold" in results:
        print(f"\nA halo exchange after a sweep ({COLD_ROWS} rows of 2 float64 to the partner rank, persistent "
              f"requests, meshchain's pack and unpack; µs per exchange, {config['exchange_reps']} per round):\n")
        print(cold_table(results["cold"]))
    checks = [(part, e["network"], e["ranks"], e["checks"]) for part in ("transports", "repartition")
              for e in results.get(part, []) if any(e["checks"].values())]
    if checks:
        print(f"\nwarning: plans built or kernels compiled inside timed regions: {checks}")
    path = write_run(args.out, info, config, total, results)
    print(f"\nwrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
