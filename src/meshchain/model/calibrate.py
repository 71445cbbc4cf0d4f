"""Calibrating the model on this machine: ``L``, ``B``, ``c`` and ``φ`` measured, ``g_l`` and the
overheads from timed runs.

:func:`calibrate` (collective on the current session's communicator; the session runs
:func:`measure` with what it has timed) times ping-pong messages between pairs of ranks
(``0 <-> 1``, ``2 <-> 3``, ...) at several sizes and fits ``t = L + m / B`` to half the
round trips; it times packing and unpacking rows of a dat as a grouped message does
(``c`` per byte); it times a halo exchange with each transport and the overlap ``φ``
achieved in each progress mode; it takes each loop's cost per iteration ``g_l`` from the
loops timed so far (:func:`loop_costs`); and last it fits the runtime's overheads ``o_r``
and ``o_l`` to what the equations, with all of the above (``φ`` of the progress mode the
session uses), leave unexplained in the chain executions timed so far. Every rank gets the
same numbers: the largest latency and pack cost and the smallest bandwidth measured.

**What a calibration holds for.** The overheads and ``φ`` depend on the transport and the
progress mode in use, the network on how the ranks talk, the loop costs on the threads:
a calibration is kept per :class:`~meshchain.model.keys.CalibrationKey` (host, rank count,
network, transport, progress mode, threads) in ``<cache_dir>/model/``, and a later run
uses a saved one only when all of them match (:func:`load_calibration`).

**What it changes.** Nothing, unless asked: ``calibrate(apply=True)`` (or
:func:`apply` with a calibration) switches the session to the transport and progress mode
measured fastest, and the returned calibration says what it applied
(:attr:`Calibration.applied`). The overheads were fitted under the settings before; when
applying changes them, the applied calibration carries no overheads (calibrate again once
chains have run under the new settings).

On one process the "messages" go to the process itself.

Examples
--------
>>> import meshchain as mc
>>> calibration = mc.model.calibrate(save=False, repeats=3)
>>> m = calibration.machine
>>> m.latency > 0 and m.bandwidth > 0 and m.pack_cost > 0
True
>>> calibration.applied    # nothing changed in the session
{}
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
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
from .keys import CalibrationKey
from .overheads import fit_overheads

__all__ = ["Calibration", "calibrate", "apply", "measure", "load_calibration", "loop_costs", "calibration_path",
           "measure_network", "measure_packing", "measure_transports", "measure_overlap",
           "measure_copy_bandwidth"]

SIZES = (8, 1024, 16384, 131072, 1048576)


@dataclass(frozen=True)
class Calibration:
    """A calibrated :class:`Machine` and loop costs ``g_l`` (seconds per iteration, by loop
    name: ``loop_costs`` run loop by loop, ``ca_loop_costs`` in communication-avoiding
    segments; :meth:`costs`) for ``ranks`` ranks on ``host``; ``overheads``: whether the
    machine's ``o_r`` and ``o_l`` were fitted (from executions of both kinds) or are unknown.

    ``transport`` and ``progress`` are the fastest measured (``transport_times``,
    ``progress_times``, and ``overlaps``: ``φ`` per progress mode); ``network``,
    ``threads``, ``session_transport`` and ``session_progress`` what the session ran with
    when it was measured (the machine's ``φ`` and overheads hold for those: :attr:`key`);
    ``applied`` what :func:`apply` changed in the session (setting -> ``(before, after)``),
    or why it changed nothing (``{"nothing": reason}``); empty when not applied."""

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
    network: str = ""
    threads: int = 0
    session_transport: str = ""
    session_progress: str = ""
    applied: dict = field(default_factory=dict)
    ca_loop_costs: dict = field(default_factory=dict)  # g_l in communication-avoiding segments (:func:`loop_costs`)

    @property
    def key(self) -> CalibrationKey:
        """What this calibration holds for."""
        return CalibrationKey(self.host, self.ranks, self.network, self.session_transport, self.session_progress,
                              self.threads)

    def as_dict(self) -> dict:
        return {"machine": asdict(self.machine), "loop_costs": dict(self.loop_costs), "ranks": self.ranks,
                "host": self.host, "created": self.created, "overheads": self.overheads,
                "transport": self.transport, "transport_times": dict(self.transport_times),
                "progress": self.progress, "progress_times": dict(self.progress_times),
                "overlaps": dict(self.overlaps), "copy_bandwidth": self.copy_bandwidth, "network": self.network,
                "threads": self.threads, "session_transport": self.session_transport,
                "session_progress": self.session_progress,
                "applied": {k: list(v) if isinstance(v, tuple) else v for k, v in self.applied.items()},
                "ca_loop_costs": dict(self.ca_loop_costs)}

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        return cls(Machine(**data["machine"]), dict(data.get("loop_costs", {})), int(data["ranks"]),
                   data.get("host", ""), data.get("created", ""), bool(data.get("overheads", False)),
                   str(data.get("transport", "")), dict(data.get("transport_times", {})),
                   str(data.get("progress", "")), dict(data.get("progress_times", {})),
                   dict(data.get("overlaps", {})), float(data.get("copy_bandwidth", 0.0)),
                   str(data.get("network", "")), int(data.get("threads", 0)),
                   str(data.get("session_transport", "")), str(data.get("session_progress", "")),
                   {k: tuple(v) if isinstance(v, list) else v for k, v in data.get("applied", {}).items()},
                   dict(data.get("ca_loop_costs", {})))

    def costs(self, *, ca: bool) -> dict:
        """The loop costs of an execution loop by loop (``ca`` False) or communication-avoiding:
        ``ca_loop_costs`` over ``loop_costs`` (a calibration saved before they were kept apart
        has only the latter)."""
        return {**self.loop_costs, **self.ca_loop_costs} if ca else dict(self.loop_costs)

    def describe(self, machine: Machine | None = None) -> str:
        """The constants in words (``machine``: these instead of the calibration's)."""
        m = machine or self.machine
        fastest = f"; fastest transport {self.transport}" if self.transport else ""
        progress = f", progress {self.progress}" if self.progress else ""
        overheads = (f"o_r = {m.round_overhead * 1e6:.1f} µs, o_l = {m.loop_overhead * 1e6:.1f} µs"
                     if self.overheads or machine is not None else "o_r, o_l not fitted")
        return (f"L = {m.latency * 1e6:.2f} µs, B = {m.bandwidth / 1e9:.2f} GB/s, c = {m.pack_cost * 1e9:.3f} ns/B, "
                f"{overheads}, overlap φ = {m.overlap:.2f}; measured {self.created or 'at an unknown date'} for "
                f"{self.key.describe()}{fastest}{progress}{self._applied_text()}")

    def _applied_text(self) -> str:
        if not self.applied:
            return ""
        if "nothing" in self.applied:
            return f"; applied nothing: {self.applied['nothing']}"
        return "; applied " + ", ".join(f"{name} {after} (was {before})" for name, (before, after) in self.applied.items())


def calibrate(*, save: bool = True, repeats: int = 30, sizes=SIZES, apply: bool = False) -> Calibration:
    """Measure ``L``, ``B``, ``c`` and ``φ`` on the current session's communicator, take ``g_l``
    from the loops timed so far and fit the overheads to the chain executions timed so far;
    the model (``ca="auto"``, the predictions in ``mc.stats()``) uses the result from now on.
    Collective.

    Parameters
    ----------
    save : bool, keyword-only
        Write the result to the session's calibration file (rank 0), for later runs.
    repeats : int, keyword-only
        Round trips timed per message size (the median counts).
    sizes : sequence of int, keyword-only
        Message sizes in bytes; at least two different ones.
    apply : bool, keyword-only
        Also switch the session to the transport and progress mode measured fastest
        (:func:`apply`); by default the calibration changes nothing in the session.

    Returns
    -------
    Calibration
        Loop costs measured now replace saved ones of the same name (from the calibration
        saved for the same :class:`~meshchain.model.keys.CalibrationKey`); saved ones of
        loops that did not run are kept. ``applied`` says what ``apply`` changed.
    """
    sizes = sorted({int(s) for s in sizes})
    if len(sizes) < 2 or sizes[0] <= 0 or repeats < 1:
        raise ConfigurationError(f"calibrate: need at least two positive message sizes and repeats >= 1, got "
                                 f"sizes={sizes}, repeats={repeats}")
    return context.current().calibrate(save=save, repeats=repeats, sizes=sizes, apply=apply)


def apply(calibration: Calibration) -> Calibration:
    """Switch the current session to ``calibration``'s fastest transport and progress mode
    (those the session's backend can use; collective on several ranks); returns the
    calibration as it now holds, with :attr:`Calibration.applied` saying what changed.

    >>> import meshchain as mc
    >>> mc.model.apply(mc.model.calibrate(save=False, repeats=2)).applied
    {'nothing': 'one process sends no messages'}
    """
    return context.current().apply_calibration(calibration)


def measure(comm, *, costs: dict, observations, previous, path: Path | None, key: CalibrationKey,
            repeats: int = 30, sizes=SIZES, ca_costs: dict | None = None) -> Calibration:
    """A new :class:`Calibration` measured on ``comm`` (collective; ``comm`` may be
    ``MPI.COMM_SELF``) for ``key`` (the session's settings: ``φ`` is the overlap of its
    progress mode): ``costs`` are this rank's loop costs ``g_l`` so far loop by loop and
    ``ca_costs`` in communication-avoiding segments (None: ``costs``), ``observations``
    the timed executions (:class:`~meshchain.model.overheads.Observations`), ``previous`` the
    saved calibration for ``key`` or None; written to ``path`` by rank 0 unless ``path`` is
    None.

    The overheads are fitted last, to what the equations leave unexplained with every other
    constant measured, ``φ`` included (fitted as if ``φ = 1`` they would count the message
    time that does not overlap a second time)."""
    latency, bandwidth = measure_network(comm, sizes=sizes, repeats=repeats)
    pack_cost = measure_packing(comm)
    times = measure_transports(comm, repeats=max(5, repeats // 2))
    progress_times, overlaps = measure_overlap(comm, repeats=max(5, repeats // 4))
    machine = Machine(latency, bandwidth, pack_cost, overlap=overlap_of(key.progress, overlaps))
    ca_costs = {**(previous.ca_loop_costs if previous else {}), **_agreed_costs(comm, costs if ca_costs is None
                                                                                   else ca_costs)}
    costs = {**(previous.loop_costs if previous else {}), **_agreed_costs(comm, costs)}
    machine, fitted = _overheads(comm, observations, machine, costs, previous, ca_costs)
    created = comm.bcast(datetime.datetime.now().isoformat(timespec="seconds"), root=0)  # rank 0's, as saved
    calibration = Calibration(machine, costs, comm.size, key.host, created, fitted,
                              min(times, key=times.get) if times else "", times,
                              min(progress_times, key=progress_times.get) if progress_times else "", progress_times,
                              overlaps, measure_copy_bandwidth(comm), key.network, key.threads, key.transport,
                              key.progress, ca_loop_costs=ca_costs)
    if path is not None and comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(calibration.as_dict(), indent=2))
        partial.replace(path)  # atomic: a reader never sees half a file
    return calibration


def overlap_of(progress: str, overlaps: dict) -> float:
    """``φ`` of progress mode ``progress`` among the measured ``overlaps`` (1: none measured,
    one process; a mode not measured counts as the worst one measured).

    >>> overlap_of("none", {"none": 0.1, "poll": 0.8}), overlap_of("thread", {"none": 0.1, "poll": 0.8})
    (0.1, 0.1)
    """
    if not overlaps:
        return 1.0
    return float(overlaps.get(progress, min(overlaps.values())))


def _overheads(comm, observations, machine: Machine, costs: dict, previous, ca_costs: dict) -> tuple[Machine, bool]:
    """``machine`` with ``o_r`` and ``o_l`` fitted from this run's timed executions (largest
    over ranks) when they include both kinds, else the previous calibration's (saved for
    the same key)."""
    from mpi4py import MPI

    have = np.array([0.0 if observations.missing() else 1.0])
    comm.Allreduce(MPI.IN_PLACE, have, op=MPI.MIN)
    if have[0]:
        fitted = np.array(fit_overheads(observations.residuals(costs, machine, {**costs, **ca_costs})))
        comm.Allreduce(MPI.IN_PLACE, fitted, op=MPI.MAX)
        return dataclasses.replace(machine, round_overhead=float(fitted[0]), loop_overhead=float(fitted[1])), True
    if previous is not None and previous.overheads:
        return dataclasses.replace(machine, round_overhead=previous.machine.round_overhead,
                                   loop_overhead=previous.machine.loop_overhead), True
    return machine, False


def loop_costs(stats=None, *, ca: bool = False) -> dict:
    """``g_l``: seconds per iteration of each loop timed so far on this rank (compute time
    over iterations; compilation excluded), from ``stats`` (anything with a ``loops`` table
    of :class:`~meshchain.core.stats.LoopStats`) or the current session's ``mc.stats()``:
    from its runs loop by loop (``ca`` False) or in communication-avoiding segments (``ca``
    True), where it ran that way, else from all its runs.

    A loop runs at another rate in each: in a segment the chain's loops follow one another
    with no exchange in between (the synthetic chain of ``benchmarks/model.py``, 2 ranks:
    3-5 % faster per iteration at 10 000 edges per rank, 25 % at 1000). A segment's time is
    shared among its loops by iterations, so each loop's CA cost is its segment's rate.

    >>> from meshchain.core.stats import LoopStats
    >>> from types import SimpleNamespace
    >>> stats = SimpleNamespace(loops={"a": LoopStats("a", iterations=300, time_compute=5.0, ca_iterations=100,
    ...                                               ca_time_compute=1.0)})
    >>> loop_costs(stats), loop_costs(stats, ca=True)
    ({'a': 0.02}, {'a': 0.01})
    """
    if stats is None:
        stats = context.current().statistics()
    out = {}
    for name, s in stats.loops.items():
        iterations, seconds = (s.ca_iterations, s.ca_time_compute) if ca else \
            (s.iterations - s.ca_iterations, s.time_compute - s.ca_time_compute)
        if not (iterations and seconds > 0):
            iterations, seconds = s.iterations, s.time_compute
        if iterations and seconds > 0:
            out[name] = seconds / iterations
    return out


def calibration_path(cache_dir, key: CalibrationKey) -> Path:
    """Where the calibration for ``key`` is kept under ``cache_dir``."""
    return Path(cache_dir) / "model" / key.filename()


def load_calibration(key: CalibrationKey | None = None, *, cache_dir=None) -> Calibration | None:
    """The saved calibration for ``key`` (default: the current session's host, rank count,
    network, transport, progress mode and threads) under ``cache_dir`` (default: the
    session's), or None if there is none: a calibration taken under other settings is
    never used.

    A file that cannot be read as a calibration is an error (it names the file), not
    silently ignored."""
    if cache_dir is None or key is None:
        session = context.current()
        cache_dir = session.config.cache_dir if cache_dir is None else cache_dir
        key = session.calibration_key() if key is None else key
    path = calibration_path(cache_dir, key)
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
    computation alone. :func:`measure` gives the machine the ``φ`` of the session's own
    mode (:func:`overlap_of`), which need not be the fastest one.
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
