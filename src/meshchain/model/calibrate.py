"""Calibrating the model on this machine: ``L``, ``B`` and ``c`` measured, ``g_l`` from timed runs.

:func:`calibrate` (collective on the current session's communicator; the session runs
:func:`measure` with what it has timed) times ping-pong messages
between pairs of ranks (``0 <-> 1``, ``2 <-> 3``, ...) at several sizes and fits
``t = L + m / B`` to half the round trips; it times packing and unpacking rows of a
dat as a grouped message does (``c`` per byte); and it takes each loop's cost per
iteration ``g_l`` from the loops timed so far (:func:`loop_costs`). Every rank gets the
same numbers: the largest latency and pack cost and the smallest bandwidth measured.

Results are saved as JSON in ``<cache_dir>/model/<host>-<N>ranks.json`` and used by
``ca="auto"`` in later runs with the same host and rank count (:func:`load_calibration`).
On one process the "messages" go to the process itself.

Examples
--------
>>> import meshchain as mc
>>> calibration = mc.model.calibrate(save=False, repeats=3)
>>> m = calibration.machine
>>> m.latency > 0 and m.bandwidth > 0 and m.pack_cost > 0
True
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..comm.exchange import HaloExchange, HaloItem
from ..comm.pingpong import half_round_trip
from ..comm.progress import measure_progress
from ..comm.transports import available_transports
from ..core import context
from ..core.cache import memo
from ..core.errors import ConfigurationError
from .equations import Machine
from .overheads import fit_overheads

__all__ = ["Calibration", "calibrate", "measure", "load_calibration", "loop_costs", "calibration_path",
           "measure_network", "measure_packing", "measure_transports", "measure_overlap",
           "measure_copy_bandwidth"]

SIZES = (8, 1024, 16384, 131072, 1048576)


@dataclass(frozen=True)
class Calibration:
    """A calibrated :class:`Machine` and loop costs ``g_l`` (seconds per iteration, by loop
    name) for ``ranks`` ranks on ``host``; ``overheads``: whether the machine's ``o_r`` and
    ``o_l`` were fitted (from executions of both kinds) or are unknown."""

    machine: Machine
    loop_costs: dict = field(default_factory=dict)
    ranks: int = 1
    host: str = ""
    created: str = ""
    overheads: bool = False
    transport: str = ""
    transport_times: dict = field(default_factory=dict)
    progress: str = ""
    progress_times: dict = field(default_factory=dict)
    overlaps: dict = field(default_factory=dict)
    copy_bandwidth: float = 0.0  # bytes per second of a large contiguous copy (read + write), 0: not measured

    def as_dict(self) -> dict:
        return {"machine": asdict(self.machine), "loop_costs": dict(self.loop_costs), "ranks": self.ranks,
                "host": self.host, "created": self.created, "overheads": self.overheads,
                "transport": self.transport, "transport_times": dict(self.transport_times),
                "progress": self.progress, "progress_times": dict(self.progress_times),
                "overlaps": dict(self.overlaps), "copy_bandwidth": self.copy_bandwidth}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(Machine(**data["machine"]), dict(data.get("loop_costs", {})), int(data["ranks"]),
                   data.get("host", ""), data.get("created", ""), bool(data.get("overheads", False)),
                   str(data.get("transport", "")), dict(data.get("transport_times", {})),
                   str(data.get("progress", "")), dict(data.get("progress_times", {})),
                   dict(data.get("overlaps", {})), float(data.get("copy_bandwidth", 0.0)))

    def describe(self, machine: Machine | None = None) -> str:
        """The constants in words (``machine``: these instead of the calibration's)."""
        m = machine or self.machine
        fastest = f"; fastest transport {self.transport}" if self.transport else ""
        progress = f", progress {self.progress}" if self.progress else ""
        return (f"L = {m.latency * 1e6:.2f} µs, B = {m.bandwidth / 1e9:.2f} GB/s, c = {m.pack_cost * 1e9:.3f} ns/B, "
                f"o_r = {m.round_overhead * 1e6:.1f} µs, o_l = {m.loop_overhead * 1e6:.1f} µs, "
                f"overlap φ = {m.overlap:.2f}; {self.ranks} rank(s) on {self.host or '?'}{fastest}{progress}")


def calibrate(*, save: bool = True, repeats: int = 30, sizes=SIZES) -> Calibration:
    """Measure ``L``, ``B`` and ``c`` on the current session's communicator and take ``g_l``
    from the loops timed so far; use the result for ``ca="auto"`` from now on. Collective.

    Parameters
    ----------
    save : bool, keyword-only
        Write the result to the session's calibration file (rank 0), for later runs.
    repeats : int, keyword-only
        Round trips timed per message size (the median counts).
    sizes : sequence of int, keyword-only
        Message sizes in bytes; at least two different ones.

    Returns
    -------
    Calibration
        Loop costs measured now replace saved ones of the same name; saved ones of loops
        that did not run are kept.
    """
    sizes = sorted({int(s) for s in sizes})
    if len(sizes) < 2 or sizes[0] <= 0 or repeats < 1:
        raise ConfigurationError(f"calibrate: need at least two positive message sizes and repeats >= 1, got "
                                 f"sizes={sizes}, repeats={repeats}")
    return context.current().calibrate(save=save, repeats=repeats, sizes=sizes)


def measure(comm, *, costs: dict, observations, previous, path: Path | None, repeats: int = 30,
            sizes=SIZES) -> Calibration:
    """A new :class:`Calibration` measured on ``comm`` (collective; ``comm`` may be
    ``MPI.COMM_SELF``): ``costs`` are this rank's loop costs ``g_l`` so far, ``observations``
    the timed executions (:class:`~meshchain.model.overheads.Observations`), ``previous`` the
    saved calibration or None; written to ``path`` by rank 0 unless ``path`` is None."""
    latency, bandwidth = measure_network(comm, sizes=sizes, repeats=repeats)
    machine = Machine(latency, bandwidth, measure_packing(comm))
    costs = {**(previous.loop_costs if previous else {}), **_agreed_costs(comm, costs)}
    machine, fitted = _overheads(comm, observations, machine, costs, previous)
    times = measure_transports(comm, repeats=max(5, repeats // 2))
    progress_times, overlaps = measure_overlap(comm, repeats=max(5, repeats // 4))
    progress = min(progress_times, key=progress_times.get) if progress_times else ""
    if progress:
        machine = dataclasses.replace(machine, overlap=overlaps[progress])
    calibration = Calibration(machine, costs, comm.size, socket.gethostname(),
                              datetime.datetime.now().isoformat(timespec="seconds"), fitted,
                              min(times, key=times.get) if times else "", times, progress, progress_times, overlaps,
                              measure_copy_bandwidth(comm))
    if path is not None and comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(calibration.as_dict(), indent=2))
        partial.replace(path)  # atomic: a reader never sees half a file
    return calibration


def _overheads(comm, observations, machine: Machine, costs: dict, previous) -> tuple[Machine, bool]:
    """``machine`` with ``o_r`` and ``o_l`` fitted from this run's timed executions (largest
    over ranks) when they include both kinds, else the previous calibration's."""
    from mpi4py import MPI

    have = np.array([0.0 if observations.missing() else 1.0])
    comm.Allreduce(MPI.IN_PLACE, have, op=MPI.MIN)
    if have[0]:
        fitted = np.array(fit_overheads(observations.residuals(costs, machine)))
        comm.Allreduce(MPI.IN_PLACE, fitted, op=MPI.MAX)
        return dataclasses.replace(machine, round_overhead=float(fitted[0]), loop_overhead=float(fitted[1])), True
    if previous is not None and previous.overheads:
        return dataclasses.replace(machine, round_overhead=previous.machine.round_overhead,
                                   loop_overhead=previous.machine.loop_overhead), True
    return machine, False


def loop_costs(stats=None) -> dict:
    """``g_l``: seconds per iteration of each loop timed so far on this rank (compute time
    over iterations; compilation excluded), from ``stats`` (anything with a ``loops`` table
    of :class:`~meshchain.core.stats.LoopStats`) or the current session's ``mc.stats()``."""
    if stats is None:
        stats = context.current().statistics()
    return {name: s.time_compute / s.iterations for name, s in stats.loops.items()
            if s.iterations and s.time_compute > 0}


def calibration_path(cache_dir, ranks: int) -> Path:
    """Where the calibration for this host and ``ranks`` ranks is kept under ``cache_dir``."""
    return Path(cache_dir) / "model" / f"{socket.gethostname()}-{ranks}ranks.json"


def load_calibration(ranks: int | None = None, *, cache_dir=None) -> Calibration | None:
    """The saved calibration for this host and rank count (default: the current session's
    cache directory and rank count), or None if there is none.

    A file that cannot be read as a calibration is an error (it names the file), not
    silently ignored."""
    if cache_dir is None or ranks is None:
        session = context.current()
        cache_dir = session.config.cache_dir if cache_dir is None else cache_dir
        ranks = session.size if ranks is None else ranks
    path = calibration_path(cache_dir, ranks)
    if not path.exists():
        return None
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"calibration file {path} is not a meshchain calibration ({exc}); delete it or "
                                 f"run mc.model.calibrate() again") from exc


def measure_network(comm, *, sizes=SIZES, repeats: int = 30) -> tuple[float, float]:
    """``(L, B)`` from ping-pong between rank pairs, agreed over ``comm`` (collective)."""
    from mpi4py import MPI

    times = np.array([half_round_trip(comm, n, repeats) for n in sizes])
    latency, bandwidth = _fit(np.array(sizes, dtype=float), times)
    agreed = np.array([latency, -bandwidth])
    comm.Allreduce(MPI.IN_PLACE, agreed, op=MPI.MAX)
    return float(agreed[0]), float(-agreed[1])


def measure_transports(comm, *, rows: int = 2048, width: int = 4, repeats: int = 15) -> dict:
    """Seconds per halo exchange for each transport this MPI offers (collective): every rank
    exchanges ``rows`` rows of ``width`` float64 with its two ring neighbours, ``repeats``
    timed runs after a first one (which builds windows and communicators), the median,
    the largest over ``comm``. Empty on one process (there is nothing to exchange)."""
    from mpi4py import MPI

    if comm.size == 1:
        return {}
    neighbours = sorted({(comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size})
    values = np.zeros((rows * (1 + len(neighbours)), width))
    exports = {n: np.arange(rows, dtype=np.int64) for n in neighbours}
    imports = {n: rows * (1 + k) + np.arange(rows, dtype=np.int64) for k, n in enumerate(neighbours)}
    times = {}
    for name in available_transports(comm):
        exchange = HaloExchange(comm, [HaloItem(values, exports, imports)], tag=0, transport=name)
        samples = []
        try:
            for _ in range(repeats + 1):
                comm.Barrier()
                start = time.perf_counter()
                exchange.begin()
                exchange.end()
                samples.append(time.perf_counter() - start)
        finally:
            exchange.close()
        median = np.array([float(np.median(samples[1:]))])
        comm.Allreduce(MPI.IN_PLACE, median, op=MPI.MAX)
        times[name] = float(median[0])
    return times


def measure_overlap(comm, *, nbytes: int = 65536, repeats: int = 7) -> tuple[dict, dict]:
    """``(seconds, φ)`` per progress mode (collective; empty on one process).

    Every rank swaps ``nbytes`` with its ring neighbours while a compiled loop that
    releases the GIL computes for about twice the exchange's own time ``T_x``: ``seconds``
    is the median time of ``begin; compute; end`` (``T_o``) in each progress mode MPI
    allows here (:func:`meshchain.comm.progress.measure_progress`), and ``φ`` the achieved
    overlap ``(T_x + T_c - T_o) / min(T_x, T_c)`` clipped to ``[0, 1]``, ``T_c`` being the
    computation alone. The machine's ``overlap`` is the fastest mode's ``φ``.
    """
    from mpi4py import MPI

    if comm.size == 1:
        return {}, {}
    alone = measure_progress(comm, lambda: None, nbytes=nbytes, repeats=repeats, modes=("none",))["none"]
    spin = _spinner()
    spin(10)
    began = time.perf_counter()
    spin(1_000_000)
    per_iteration = np.array([(time.perf_counter() - began) / 1_000_000])
    comm.Allreduce(MPI.IN_PLACE, per_iteration, op=MPI.MAX)
    count = max(1000, int(2 * alone / per_iteration[0]))
    compute_alone = np.array([_median_seconds(lambda: spin(count), repeats)])
    comm.Allreduce(MPI.IN_PLACE, compute_alone, op=MPI.MAX)
    times = measure_progress(comm, lambda: spin(count), nbytes=nbytes, repeats=repeats)
    shorter = min(alone, float(compute_alone[0]))
    overlaps = {mode: float(min(1.0, max(0.0, (alone + compute_alone[0] - seconds) / shorter)))
                for mode, seconds in times.items()}
    return times, overlaps


def _spin(count):
    x = 0.0
    for i in range(count):
        x = x * 0.999999 + 1.0
    return x


_COMPILED = memo("calibration functions")


def _spinner():
    """A compiled busy loop that releases the GIL (the calibration's stand-in for a kernel)."""
    spinner = _COMPILED.get("spin")
    if spinner is None:
        import numba

        spinner = _COMPILED["spin"] = numba.njit(nogil=True, cache=True)(_spin)
    return spinner


def _median_seconds(call, repeats: int) -> float:
    samples = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return float(np.median(samples[1:]))


def measure_packing(comm, *, rows: int = 50_000, width: int = 4, repeats: int = 5) -> float:
    """``c``: seconds per byte to gather rows of a dat into a message and scatter them back
    (the median of ``repeats`` timings after a cold one), the largest over ``comm``
    (collective)."""
    from mpi4py import MPI

    rng = np.random.default_rng(comm.rank)
    data = rng.random((rows * 4, width))
    picked = np.sort(rng.choice(rows * 4, size=rows, replace=False))
    samples = []
    for _ in range(repeats + 1):  # the first (cold) trip is not counted
        start = time.perf_counter()
        message = np.ascontiguousarray(data[picked]).view(np.uint8).ravel()
        data[picked] = message.view(data.dtype).reshape(-1, width)
        samples.append(time.perf_counter() - start)
    cost = np.array([float(np.median(samples[1:])) / message.nbytes])
    comm.Allreduce(MPI.IN_PLACE, cost, op=MPI.MAX)
    return float(cost[0])


def measure_copy_bandwidth(comm=None, *, megabytes: int = 64, repeats: int = 5) -> float:
    """Bytes per second of a large contiguous copy, counting what is read and written (STREAM's
    "Copy"): the best of ``repeats`` copies of ``megabytes`` MB, one thread; on several ranks
    every rank copies at once and the smallest is taken (collective).

    >>> measure_copy_bandwidth(megabytes=8, repeats=2) > 1e8
    True
    """
    source = np.ones(megabytes * 2**20 // 8)
    target = np.empty_like(source)
    if comm is not None:
        comm.Barrier()
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    rate = np.array([2 * source.nbytes / best])
    if comm is not None and comm.size > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, rate, op=MPI.MIN)
    return float(rate[0])


def _fit(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """``t = L + m / B`` by least squares, kept positive: ``L`` at least a tenth of the
    smallest message's time, ``B`` at least what the largest message achieved."""
    slope, intercept = np.polyfit(sizes, times, 1)
    latency = max(intercept, times[0] * 0.1, 1e-9)
    bandwidth = sizes[-1] / times[-1]
    if slope > 0:
        bandwidth = max(1.0 / slope, bandwidth)
    return float(latency), float(bandwidth)


def _agreed_costs(comm, costs: dict) -> dict:
    """Every rank's loop costs, the largest per loop (the slowest rank sets the pace)."""
    merged: dict = {}
    for rank_costs in comm.allgather(costs):
        for name, g in rank_costs.items():
            merged[name] = max(merged.get(name, 0.0), g)
    return merged
