"""Per-loop statistics, returned by ``mc.stats()``.

Examples
--------
>>> from meshchain.core.stats import LoopStats
>>> LoopStats("update").calls
0
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["LoopStats", "ChainStats", "Stats", "StatsRecorder", "Imbalance", "imbalance_of", "hidden_fraction",
           "gain_percent", "comm_reduction_percent",
           "comp_increase_percent", "add_by_layer"]


@dataclass
class LoopStats:
    """Counters of one named loop (summed over its calls)."""

    name: str
    calls: int = 0
    iterations: int = 0
    core_iterations: int = 0
    halo_iterations: int = 0
    halo_iterations_by_layer: list = field(default_factory=list)
    arithmetic_iterations: int = 0  # of a grid loop, those that found their points by index arithmetic
    bytes_moved: int = 0  # what its iterations must move to and from memory, from its access descriptors
    exchanges: int = 0
    neighbours: int = 0
    messages: int = 0
    bytes_sent: int = 0
    time_compute: float = 0.0
    time_plan: float = 0.0
    time_compile: float = 0.0
    time_wait: float = 0.0
    time_flight: float = 0.0
    time_hidden: float = 0.0
    compilations: int = 0
    cache_hits: int = 0
    colours: int = 0
    ca_iterations: int = 0  # of ``iterations``, those run in communication-avoiding segments
    ca_time_compute: float = 0.0  # of ``time_compute``, that of those iterations

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "hidden": self.hidden}

    @property
    def hidden(self) -> float:
        """The fraction of its messages' flight time the rank spent computing (NaN: none sent)."""
        return hidden_fraction(self.time_flight, self.time_hidden)


@dataclass
class ChainStats:
    """Counters of one named chain, in the terms of the OP2 paper (§3.2, Table 2).

    The communication-avoiding side is measured; the ``per_loop_*`` side is what the same
    loops would have exchanged and computed one by one (Alg. 1) from the same state,
    worked out from the halo lists without running it.

    Attributes
    ----------
    executions, loops, segments : int
        Times the chain ran, loops run in it, segments (one grouped exchange each; a chain
        is split where a dependence needs an exchange in between, see ``diagnostics``).
    mode : str
        How it last ran: ``"ca"``, ``"per-loop"`` or ``"serial"`` (one process).
    depth : int
        ``r``: the deepest halo layer the chain ran or needed.
    exchanges, messages, bytes_sent, max_message : int
        Grouped exchanges, messages sent, bytes sent (``p·m^r`` summed), largest message to
        one neighbour (``m^r``).
    per_loop_exchanges, per_loop_messages, per_loop_bytes, per_loop_max_message : int
        The same for per-loop execution (``Σ d·p·m^1``; meshchain sends one message per dat
        per neighbour, where OP2 sends two).
    neighbours : int
        ``p``.
    core_iterations, iterations : int
        ``ΣS^c`` and ``ΣS^h`` (owned plus exec halo to each loop's depth) of the CA run.
    per_loop_core_iterations, per_loop_iterations : int
        ``ΣS^c`` and ``ΣS^1`` of per-loop execution.
    time_core, time_halo, time_wait : float
        Seconds in phase 1 (cores, exchange in flight), phase 2 (the rest) and waiting.
    time_flight, time_hidden : float
        Seconds the chain's grouped messages were in flight (posting to completion) and how
        many of them the rank computed; :attr:`hidden` is their ratio.
    tile_size, tiles, tile_colours : int
        Sparse tiling: seed iterations per tile, most tiles and colours of one tiled group.
    tiled_groups, tile_inspections : int
        Tiled groups run (a phase is one group unless a global reduction splits it) and
        inspections made (the rest came from the cache).
    time_tile_inspect : float
        Seconds in the tiling inspector.
    diagnostics : list of str
        Why a chain ran split, not communication-avoiding, or untiled (also given as warnings).
    decision : str
        For ``ca="auto"``: what was chosen and why, with the predicted times.
    time_total : float
        Seconds the chain's executions took (wall clock; over ranks: the slowest).
    predicted_executions : int
        Executions for which the model predicted both variants (a calibration was known).
    predicted_per_loop, predicted_ca : float
        Their predicted seconds, equations (2) and (3), summed (over ranks: the slowest).
    model : str
        The calibration used for the predictions.
    profile : meshchain.model.ChainProfile or None
        The model terms of the latest execution on this rank (over ranks: rank 0's).
    """

    name: str
    executions: int = 0
    loops: int = 0
    segments: int = 0
    mode: str = ""
    depth: int = 0
    exchanges: int = 0
    messages: int = 0
    bytes_sent: int = 0
    max_message: int = 0
    per_loop_exchanges: int = 0
    per_loop_messages: int = 0
    per_loop_bytes: int = 0
    per_loop_max_message: int = 0
    neighbours: int = 0
    core_iterations: int = 0
    iterations: int = 0
    per_loop_core_iterations: int = 0
    per_loop_iterations: int = 0
    time_core: float = 0.0
    time_halo: float = 0.0
    time_wait: float = 0.0
    time_flight: float = 0.0
    time_hidden: float = 0.0
    tile_size: int = 0
    tiles: int = 0
    tile_colours: int = 0
    tiled_groups: int = 0
    tile_inspections: int = 0
    time_tile_inspect: float = 0.0
    diagnostics: list = field(default_factory=list)
    decision: str = ""
    time_total: float = 0.0
    predicted_executions: int = 0
    predicted_per_loop: float = 0.0
    predicted_ca: float = 0.0
    model: str = ""
    profile: object = None

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "predicted_gain": self.predicted_gain,
                "comm_reduction": self.comm_reduction, "comp_increase": self.comp_increase, "hidden": self.hidden}

    @property
    def hidden(self) -> float:
        """The fraction of its messages' flight time the rank spent computing (NaN: none sent)."""
        return hidden_fraction(self.time_flight, self.time_hidden)

    @property
    def predicted_gain(self) -> float:
        """The model's gain of CA over per-loop in percent (NaN without predictions)."""
        return gain_percent(self.predicted_per_loop, self.predicted_ca) if self.predicted_executions else float("nan")

    @property
    def comm_reduction(self) -> float:
        """Table 5's "Comm Reduc.%", ``100 (1 - p·m^r / Σ d·p·m^1)``, of the latest execution's
        :attr:`profile` (NaN without one)."""
        totals = self._totals()
        return comm_reduction_percent(totals["per_loop_bytes"], totals["ca_bytes"]) if totals else float("nan")

    @property
    def comp_increase(self) -> float:
        """Table 5's "Comp Inc.%", ``100 (1 - ΣS^1 / ΣS^h)``, of the latest :attr:`profile`."""
        totals = self._totals()
        return comp_increase_percent(totals["per_loop_iterations"], totals["ca_iterations"]) if totals else float("nan")

    def _totals(self) -> dict | None:
        return self.profile.totals() if self.profile is not None and self.profile.ca else None

    def diagnose(self, message: str) -> bool:
        """Record ``message``; True if it is new for this chain."""
        if message in self.diagnostics:
            return False
        self.diagnostics.append(message)
        return True


@dataclass(frozen=True)
class Stats:
    """A snapshot of the statistics: ``loops`` maps loop names to :class:`LoopStats`,
    ``chains`` chain names to :class:`ChainStats`; ``transport``, ``progress`` and
    ``interior`` say how halo exchanges ran; ``imbalance`` (``mc.stats(all_ranks=True)``
    only) maps loop names and ``"chain <name>"`` to each rank's compute and waiting
    seconds (:class:`Imbalance`, with max/mean ratios); ``caches`` maps the session's cache
    names to their :class:`~meshchain.core.cache.CacheCounts` (``hits``: found and reused,
    ``None`` where not counted; ``misses``: built), e.g. ``caches["plans"]``: plans built and
    reused. A loop that builds a plan at every call (a new ``mc.Dat`` or ``mc.Global`` per
    step) shows as plan misses growing with the calls; :attr:`compiled` says how many
    kernels were compiled and how many of those came from the disk cache."""

    loops: dict = field(default_factory=dict)
    backend: str = ""
    chains: dict = field(default_factory=dict)
    transport: str = ""
    progress: str = ""
    interior: str = ""
    imbalance: dict = field(default_factory=dict)
    caches: dict = field(default_factory=dict)

    @property
    def compiled(self) -> tuple:
        """``(compilations, of them loaded from the disk cache)``, over every loop."""
        return (sum(s.compilations for s in self.loops.values()), sum(s.cache_hits for s in self.loops.values()))

    def as_dict(self) -> dict:
        return {"backend": self.backend, "transport": self.transport, "progress": self.progress,
                "interior": self.interior, "loops": {k: v.as_dict() for k, v in self.loops.items()},
                "chains": {k: v.as_dict() for k, v in self.chains.items()},
                "imbalance": {k: v._asdict() for k, v in self.imbalance.items()},
                "caches": {k: v._asdict() for k, v in self.caches.items()}}

    def combined(self, per_rank) -> "Stats":
        """The statistics of all ranks summed (``neighbours``, ``colours``, ``depth`` and the
        largest messages: the maximum; diagnostics: every rank's), with :attr:`imbalance`:
        per loop and chain, each rank's compute and waiting seconds (:class:`Imbalance`)."""
        return Stats(_combine(per_rank, "loops", LoopStats), self.backend, _combine(per_rank, "chains", ChainStats),
                     self.transport, self.progress, self.interior, imbalance_of(per_rank), _combine_caches(per_rank))

    def __str__(self) -> str:
        header = (f"{'loop':<20}{'calls':>8}{'iterations':>14}{'colours':>8}{'compute s':>12}{'compile s':>11}"
                  f"{'exchanges':>10}{'messages':>9}{'MB sent':>9}{'wait s':>9}")
        rows = [header] + [
            f"{s.name:<20}{s.calls:>8}{s.iterations:>14}{s.colours:>8}{s.time_compute:>12.4f}{s.time_compile:>11.3f}"
            f"{s.exchanges:>10}{s.messages:>9}{s.bytes_sent / 1e6:>9.3f}{s.time_wait:>9.4f}"
            for s in self.loops.values()
        ]
        if self.chains:
            rows += ["", f"{'chain':<20}{'runs':>6}{'loops':>7}{'mode':>9}{'segments':>9}{'r':>3}{'messages':>9}"
                         f"{'(per-loop)':>11}{'MB sent':>9}{'(per-loop)':>11}{'S^c':>10}{'S^h':>10}{'(S^1)':>10}"]
            rows += [
                f"{c.name:<20}{c.executions:>6}{c.loops:>7}{c.mode:>9}{c.segments:>9}{c.depth:>3}{c.messages:>9}"
                f"{c.per_loop_messages:>11}{c.bytes_sent / 1e6:>9.3f}{c.per_loop_bytes / 1e6:>11.3f}"
                f"{c.core_iterations:>10}{c.iterations:>10}{c.per_loop_iterations:>10}"
                for c in self.chains.values()
            ]
            rows += [f"  {c.name}: tiled, tile_size {c.tile_size}: {c.tiled_groups} tiled groups, up to {c.tiles} tiles "
                     f"in {c.tile_colours} colours; {c.tile_inspections} inspections, {c.time_tile_inspect:.3f} s"
                     for c in self.chains.values() if c.tiled_groups]
            rows += [f"  {c.name}: {d}" for c in self.chains.values() for d in c.diagnostics + [c.decision] if d]
            rows += [_model_row(c) for c in self.chains.values() if c.predicted_executions]
        if self.transport:
            rows.append(f"halo exchanges: transport {self.transport}, progress {self.progress or 'none'}, "
                        f"interior {self.interior or 'static'}")
            rows += [f"  {kind} {s.name}: {100 * s.hidden:.0f} % of {s.time_flight:.4f} s in flight hidden by compute"
                     for kind, records in (("loop", self.loops), ("chain", self.chains))
                     for s in records.values() if s.time_flight > 0]
        rows += _cache_rows(self)
        if self.imbalance:
            rows += ["", f"{'imbalance (max/mean)':<24}{'compute':>9}{'wait':>9}{'compute s per rank':>40}"]
            rows += [f"{name:<24}{x.compute_ratio:>9.2f}{x.wait_ratio:>9.2f}    "
                     f"{' '.join(f'{t:.4f}' for t in x.compute)}" for name, x in self.imbalance.items()]
        return "\n".join(rows)


#: The caches ``str(mc.stats())`` shows (all are in :attr:`Stats.caches`).
SHOWN_CACHES = ("loop structures", "units", "schedules", "plans")


def _cache_rows(stats: Stats) -> list:
    shown = [stats.caches[name] for name in SHOWN_CACHES if name in stats.caches]
    if not shown:
        return []
    compiled, loaded = stats.compiled
    rows = ["", f"{'cache':<20}{'built':>8}{'reused':>10}{'held':>8}"]
    rows += [f"{c.name:<20}{c.misses:>8}{'-' if c.hits is None else c.hits:>10}{c.entries:>8}" for c in shown]
    rows.append(f"kernels compiled: {compiled} ({loaded} loaded from the disk cache)")
    return rows


def _combine_caches(per_rank) -> dict:
    """Every rank's cache counters summed (entries too: what all ranks hold)."""
    totals = {}
    for snapshot in per_rank:
        for name, c in snapshot.caches.items():
            had = totals.get(name)
            if had is None:
                totals[name] = c
            else:
                hits = None if had.hits is None or c.hits is None else had.hits + c.hits
                totals[name] = had._replace(hits=hits, misses=had.misses + c.misses, entries=had.entries + c.entries)
    return totals


def _model_row(c: ChainStats) -> str:
    n = c.predicted_executions
    return (f"  {c.name}: model: per-loop {c.predicted_per_loop / n * 1e3:.3f} ms, CA {c.predicted_ca / n * 1e3:.3f} ms "
            f"per execution, predicted gain {c.predicted_gain:+.1f} %; comm reduction {c.comm_reduction:.1f} %, "
            f"comp increase {c.comp_increase:.1f} % ({c.model})")


class Imbalance(NamedTuple):
    """Each rank's compute and waiting seconds of one loop or chain (``mc.stats(all_ranks=True)``).

    >>> Imbalance((1.0, 3.0), (0.5, 0.0)).compute_ratio
    1.5
    """

    compute: tuple
    wait: tuple

    @property
    def compute_ratio(self) -> float:
        """max / mean of the ranks' compute seconds (1: balanced; NaN: nothing measured)."""
        return _max_over_mean(self.compute)

    @property
    def wait_ratio(self) -> float:
        return _max_over_mean(self.wait)


def _max_over_mean(values) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else float("nan")


def imbalance_of(per_rank) -> dict:
    """Per loop (by name) and chain (``"chain <name>"``), the :class:`Imbalance` of ``per_rank`` snapshots."""
    found = {}
    for name in dict.fromkeys(n for snapshot in per_rank for n in snapshot.loops):
        records = [snapshot.loops.get(name) for snapshot in per_rank]
        found[name] = Imbalance(tuple(r.time_compute if r else 0.0 for r in records),
                                tuple(r.time_wait if r else 0.0 for r in records))
    for name in dict.fromkeys(n for snapshot in per_rank for n in snapshot.chains):
        records = [snapshot.chains.get(name) for snapshot in per_rank]
        found[f"chain {name}"] = Imbalance(tuple(r.time_core + r.time_halo if r else 0.0 for r in records),
                                           tuple(r.time_wait if r else 0.0 for r in records))
    return found


def hidden_fraction(flight: float, hidden: float) -> float:
    """``hidden / flight`` (NaN when nothing was in flight).

    >>> hidden_fraction(2.0, 1.5)
    0.75
    """
    return hidden / flight if flight > 0 else float("nan")


def _combine(per_rank, attribute: str, kind) -> dict:
    totals = {}
    for snapshot in per_rank:
        for name, record in getattr(snapshot, attribute).items():
            total = totals.setdefault(name, kind(name))
            for f in dataclasses.fields(kind):
                if f.name != "name":
                    setattr(total, f.name, _merge(f.name, getattr(total, f.name), getattr(record, f.name)))
    return totals


_MAXIMA = ("neighbours", "colours", "depth", "max_message", "per_loop_max_message", "tile_size", "tiles",
           "tile_colours", "time_total", "predicted_executions", "predicted_per_loop", "predicted_ca")


def _merge(name: str, a, b):
    if name in _MAXIMA:
        return max(a, b)
    if name == "diagnostics":
        return a + [x for x in b if x not in a]
    if isinstance(a, str) or name == "profile":
        return a or b
    if isinstance(a, list):
        return add_by_layer(a, b)
    return a + b


def add_by_layer(a: list, b) -> list:
    """Element-wise sum of two per-layer lists of different lengths."""
    longer, shorter = (list(a), list(b)) if len(a) >= len(b) else (list(b), list(a))
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


class StatsRecorder:
    """The session's statistics: records counted once (compilation, inspection,
    diagnostics) and the accounts of live plans (what each of their runs adds; see
    :mod:`meshchain.engine.accounting`), folded together when they are read.

    :meth:`loop` and :meth:`chain` give the base records (to count into);
    :attr:`loops` and :attr:`chains` the folded view, as of now.
    """

    def __init__(self):
        self._loops: dict[str, LoopStats] = {}
        self._chains: dict[str, ChainStats] = {}
        self._accounts: list = []
        self.sequence: dict[str, int] = {}  # chain name -> run number of the latest folded account
        self.started = time.perf_counter()  # when counting began (the summary's total time)

    def loop(self, name: str) -> LoopStats:
        record = self._loops.get(name)
        if record is None:
            record = self._loops[name] = LoopStats(name)
        return record

    def chain(self, name: str) -> ChainStats:
        record = self._chains.get(name)
        if record is None:
            record = self._chains[name] = ChainStats(name)
        return record

    @property
    def loops(self) -> dict:
        return self._folded().loops

    @property
    def chains(self) -> dict:
        return self._folded().chains

    @property
    def accounts(self) -> tuple:
        """The live accounts."""
        return tuple(self._accounts)

    def attach(self, account) -> None:
        """Count ``account``'s runs from now on (it has ``add_to(recorder)`` and ``reset()``)."""
        self._accounts.append(account)

    def detach(self, account) -> None:
        """Fold ``account`` in for good (its plan is dropped)."""
        if account in self._accounts:
            self._accounts.remove(account)
            account.add_to(self)
            account.reset()

    def snapshot(self, backend: str, transport: str = "", progress: str = "", interior: str = "") -> Stats:
        folded = self._folded()
        return Stats(folded.loops, backend, folded.chains, transport, progress, interior)

    def _folded(self) -> Stats:
        folded = StatsRecorder()
        folded._loops = {k: _copy(v) for k, v in self._loops.items()}
        folded._chains = {k: _copy(v) for k, v in self._chains.items()}
        folded.sequence = dict(self.sequence)
        for account in self._accounts:
            account.add_to(folded)
        return Stats(folded._loops, "", folded._chains)

    def reset(self) -> None:
        self.started = time.perf_counter()
        self._loops.clear()
        self._chains.clear()
        self.sequence.clear()
        for account in self._accounts:
            account.reset()


def _copy(record):
    copied = dataclasses.replace(record)
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, list):
            setattr(copied, f.name, list(value))
    return copied


def gain_percent(per_loop_time: float, ca_time: float) -> float:
    """The gain of CA over per-loop execution, ``100 (T_op2 - T_ca) / T_op2`` (the paper's
    "Gain%": negative when CA is slower, down to -300 % in its Table 5).

    >>> gain_percent(2.0, 1.5)
    25.0
    """
    if per_loop_time <= 0:
        return 0.0
    return 100.0 * (per_loop_time - ca_time) / per_loop_time


def comm_reduction_percent(per_loop_bytes: float, ca_bytes: float) -> float:
    """Table 5 "Comm Reduc.%": ``100 (1 - p·m^r / Σ k·d·p·m^1)``.

    >>> round(comm_reduction_percent(31694400, 21051360), 2)   # Hydra 'weight', 4 nodes
    33.58
    """
    return 100.0 * (1.0 - ca_bytes / per_loop_bytes) if per_loop_bytes else 0.0


def comp_increase_percent(per_loop_iterations: float, ca_iterations: float) -> float:
    """Table 5 "Comp Inc.%": ``100 (1 - ΣS^1 / ΣS^h)``.

    >>> round(comp_increase_percent(37538, 135189), 2)         # Hydra 'weight', 4 nodes
    72.23
    """
    return 100.0 * (1.0 - per_loop_iterations / ca_iterations) if ca_iterations else 0.0
