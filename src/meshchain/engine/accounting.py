"""Statistics in one place: what a plan adds to ``mc.stats()`` each time it runs.

Execution code counts nothing. When a plan is built, :func:`account_for` reads off its
schedule everything a run adds to the loops' and the chain's records (calls,
iterations per layer, exchanges, messages, bytes, the model's terms); a run only bumps
``runs`` and adds the seconds its phases took. The session's
:class:`~meshchain.core.stats.StatsRecorder` folds live accounts in when statistics are
read, and for good when a plan is dropped, so nothing counted is lost.

Examples
--------
>>> from meshchain.core.stats import StatsRecorder
>>> from meshchain.inspector.schedule import serial_schedule
>>> from meshchain.inspector.chain import LoopSig
>>> schedule = serial_schedule((LoopSig("scale", 0, ()),), sizes={0: 5})
>>> account = account_for(schedule, ("scale",), layouts=None, chain=None)
>>> account.runs += 2
>>> recorder = StatsRecorder()
>>> recorder.attach(account)
>>> record = recorder.snapshot("numba").loops["scale"]
>>> record.calls, record.iterations, record.core_iterations
(2, 10, 10)
"""

from __future__ import annotations

import numpy as np

from ..core.stats import ChainStats, LoopStats, add_by_layer

__all__ = ["PlanAccount", "account_for", "add_planning", "add_compiling", "add_tile_inspection", "diagnose",
           "decided"]


# A plan's deltas are LoopStats and ChainStats records: of a loop's, the counters in
# _LOOP_SUMS are added per run and those in _LOOP_MAXIMA kept at their largest; of a
# chain's, _CHAIN_SUMS are added, _CHAIN_MAXIMA kept largest, and mode, profile and
# tile_size set.
_LOOP_SUMS = ("calls", "iterations", "core_iterations", "halo_iterations", "arithmetic_iterations", "exchanges",
              "messages", "bytes_sent", "bytes_moved")
_LOOP_MAXIMA = ("neighbours", "colours")
_CHAIN_SUMS = ("loops", "segments", "exchanges", "messages", "bytes_sent", "per_loop_exchanges", "per_loop_messages",
               "per_loop_bytes", "core_iterations", "iterations", "per_loop_core_iterations", "per_loop_iterations",
               "tiled_groups")
_CHAIN_MAXIMA = ("depth", "max_message", "per_loop_max_message", "neighbours", "tiles", "tile_colours")


class PlanAccount:
    """A plan's statistics: static deltas per run, and what its runs measured.

    ``runs`` counts runs; ``compute[i]`` the seconds phase call ``i`` took, shared out to
    loops by ``shares[i]`` (``(loop name, iterations)`` pairs); ``device`` compute seconds a
    backend measured itself; ``wait[name]`` the seconds a loop's own exchanges were waited
    for; ``core``, ``halo`` and ``chain_wait`` a chain's phase 1, phase 2 and waiting time;
    ``total`` the chain's wall-clock time; ``flight[name]`` ``[seconds in flight, seconds
    of them computed]`` of a loop's own exchanges (``name``) or the chain's (None); ``predicted_from`` the run from which the model
    predicts this plan's runs (None: no calibration yet) and ``prediction`` its ``(per-loop
    seconds, CA seconds, basis)`` per run, set when statistics are read.
    """

    __slots__ = ("loops", "chain", "chain_name", "runs", "compute", "shares", "wait", "core", "halo", "chain_wait",
                 "total", "predicted_from", "prediction", "sequence", "device", "flight", "measured")

    def __init__(self, loops: dict, chain: ChainStats | None, chain_name: str | None, shares: list):
        self.loops, self.chain, self.chain_name, self.shares = loops, chain, chain_name, shares
        self.compute = [0.0] * len(shares)
        self.wait: dict[str, float] = {}
        self.flight: dict = {}
        self.device: dict[str, float] = {}  # compute seconds a backend measured itself (GPU events)
        self.runs = 0
        self.core = self.halo = self.chain_wait = self.total = 0.0
        self.predicted_from = None
        self.prediction = None
        self.sequence = 0  # the session's run counter at this plan's latest run ("how it last ran")
        self.measured = None  # (sums, slots, unit): what compiled code adds up (:meth:`measure`), folded in when read

    def measure(self, slots, *, unit: float = 1.0) -> np.ndarray:
        """An array of times that compiled code adds to (a compiled replay,
        :mod:`meshchain.engine.replay`), one per slot: ``("compute", i)``, ``("wait", name)``,
        ``("flight", name)``, ``("hidden", name)``, ``("core",)``, ``("halo",)`` or
        ``("chain_wait",)``, in clock units of ``unit`` seconds (a time-stamp counter's ticks);
        folded into those fields, in seconds, when statistics are read.

        >>> account = PlanAccount({}, None, None, [])
        >>> sums = account.measure([("core",)], unit=0.5)
        >>> sums[0] += 6.0
        >>> account.fold(); account.core
        3.0
        """
        if self.measured is not None:
            self.fold()
        sums = np.zeros(len(slots))
        self.measured = (sums, tuple(slots), unit)
        return sums

    def fold(self) -> None:
        """Move the seconds compiled code added up (:meth:`measure`) into the fields."""
        if self.measured is None:
            return
        sums, slots, unit = self.measured
        for value, slot in zip((sums * unit).tolist(), slots):
            kind = slot[0]
            if kind == "compute":
                self.compute[slot[1]] += value
            elif kind == "wait":
                self.wait[slot[1]] = self.wait.get(slot[1], 0.0) + value
            elif kind in ("flight", "hidden"):
                self.flight.setdefault(slot[1], [0.0, 0.0])[kind == "hidden"] += value
            else:
                setattr(self, kind, getattr(self, kind) + value)
        sums.fill(0.0)

    def add_phase(self, shares) -> int:
        """Register a phase call that runs ``shares``; returns its index into ``compute``."""
        self.shares.append(shares)
        self.compute.append(0.0)
        return len(self.shares) - 1

    def timer(self, name: str):
        """A callable that adds compute seconds measured by a backend to loop ``name``."""
        device = self.device

        def add(seconds: float) -> None:
            device[name] = device.get(name, 0.0) + seconds

        return add

    def reset(self) -> None:
        if self.measured is not None:
            self.measured[0].fill(0.0)
        self.runs = 0
        self.compute = [0.0] * len(self.shares)
        self.wait = {}
        self.flight = {}
        self.device.clear()
        self.core = self.halo = self.chain_wait = self.total = 0.0
        if self.predicted_from is not None:
            self.predicted_from = 0

    def add_to(self, recorder) -> None:
        """Add what the runs so far contributed to ``recorder``'s records."""
        self.fold()
        ca = self.chain is not None and self.chain.mode == "ca"
        for name, seconds in self.device.items():
            recorder.loop(name).time_compute += seconds
            if ca:
                recorder.loop(name).ca_time_compute += seconds
        n = self.runs
        if n == 0:
            return
        for name, delta in self.loops.items():
            record = recorder.loop(name)
            for attribute in _LOOP_SUMS:
                setattr(record, attribute, getattr(record, attribute) + n * getattr(delta, attribute))
            for attribute in _LOOP_MAXIMA:
                setattr(record, attribute, max(getattr(record, attribute), getattr(delta, attribute)))
            if delta.halo_iterations_by_layer:
                record.halo_iterations_by_layer = add_by_layer(record.halo_iterations_by_layer,
                                                               [n * x for x in delta.halo_iterations_by_layer])
        for seconds, shares in zip(self.compute, self.shares):
            total = sum(count for _, count in shares) or 1
            for name, count in shares:
                recorder.loop(name).time_compute += seconds * count / total
                if ca:
                    recorder.loop(name).ca_time_compute += seconds * count / total
        if ca:
            for name, delta in self.loops.items():
                recorder.loop(name).ca_iterations += n * delta.iterations
        for name, seconds in self.wait.items():
            recorder.loop(name).time_wait += seconds
        for name, (flight, hidden) in self.flight.items():
            record = recorder.loop(name) if name is not None else recorder.chain(self.chain_name)
            record.time_flight += flight
            record.time_hidden += hidden
        if self.chain is not None:
            self._add_chain(recorder, n)

    def _add_chain(self, recorder, n: int) -> None:
        record = recorder.chain(self.chain_name)
        delta = self.chain
        record.executions += n
        for attribute in _CHAIN_SUMS:
            setattr(record, attribute, getattr(record, attribute) + n * getattr(delta, attribute))
        for attribute in _CHAIN_MAXIMA:
            setattr(record, attribute, max(getattr(record, attribute), getattr(delta, attribute)))
        if self.sequence >= recorder.sequence.get(self.chain_name, -1):
            record.mode, recorder.sequence[self.chain_name] = delta.mode, self.sequence
            if delta.profile is not None:
                record.profile = delta.profile
        if delta.tile_size:
            record.tile_size = delta.tile_size
        record.time_core += self.core
        record.time_halo += self.halo
        record.time_wait += self.chain_wait
        record.time_total += self.total
        if self.predicted_from is not None and self.prediction is not None and n > self.predicted_from:
            runs = n - self.predicted_from
            per_loop, ca, basis = self.prediction
            record.predicted_executions += runs
            record.predicted_per_loop += runs * per_loop
            record.predicted_ca += runs * ca
            record.model = basis


# --- what building plans adds (the only writes to the records outside a plan's account) ---------------

def add_planning(recorder, loop_name: str, seconds: float) -> None:
    """A colouring of loop ``loop_name`` was built in ``seconds``."""
    recorder.loop(loop_name).time_plan += seconds


def add_compiling(recorder, loop_name: str, seconds: float, *, compiled: bool, hits: int) -> None:
    """Loop ``loop_name``'s code was generated, or compiled (``compiled``; ``hits`` of it from the
    disk cache), in ``seconds``."""
    record = recorder.loop(loop_name)
    record.time_compile += seconds
    if compiled:
        record.compilations += 1
        record.cache_hits += hits


def add_tile_inspection(recorder, chain: str, seconds: float) -> None:
    """Chain ``chain``'s sparse tiles were inspected in ``seconds``."""
    record = recorder.chain(chain)
    record.time_tile_inspect += seconds
    record.tile_inspections += 1


def diagnose(recorder, chain: str, message: str, *, tile_size: int | None = None) -> bool:
    """Note ``message`` (why chain ``chain`` runs as it does; ``tile_size``: the tiling it
    asked for); True the first time this message is noted (then it is worth a warning)."""
    record = recorder.chain(chain)
    if tile_size is not None:
        record.tile_size = tile_size
    return record.diagnose(message)


def decided(recorder, chain: str, why: str) -> None:
    """Chain ``chain``'s ``ca="auto"`` choice and its reason."""
    recorder.chain(chain).decision = why


def account_for(schedule, names, *, layouts, chain: str | None, colours: dict | None = None,
                profile=None, tiling=None, arithmetic: dict | None = None, moved=None) -> PlanAccount:
    """The account of a plan that runs ``schedule`` on the unit whose loops are ``names``.

    ``layouts[p]`` is the :class:`~meshchain.partition.layout.SetLayout` of loop ``p``'s set
    (None on one process); ``chain`` the chain's name (None for a lone loop); ``colours``
    the most colours each loop position ran in; ``profile`` the chain's model terms (its
    per-loop side fills the ``per_loop_*`` fields); ``tiling`` ``(tile_size, groups, most
    tiles, most colours)`` when phases run tiled; ``arithmetic`` per loop name the iterations
    of a run that find their grid points by index arithmetic; ``moved(position, iterations)``
    the bytes that many iterations of loop ``position`` move (:mod:`.traffic`).
    """
    loops = {name: LoopStats(name) for name in names}
    for name, count in (arithmetic or {}).items():
        loops[name].arithmetic_iterations += count
    for segment in schedule.segments:
        for position, depth, iterations, core in zip(segment.loops, segment.depths, segment.iterations,
                                                     _actual_cores(segment)):
            delta = loops[names[position]]
            delta.calls += 1
            delta.iterations += iterations
            if moved is not None:
                delta.bytes_moved += moved(position, iterations)
            delta.core_iterations += core
            if layouts is not None:
                layout = layouts[position]
                delta.halo_iterations += iterations - layout.n_owned
                delta.halo_iterations_by_layer = add_by_layer(delta.halo_iterations_by_layer,
                                                              np.diff(layout.exec_ends[: depth + 1]).tolist())
                delta.neighbours = max(delta.neighbours, len(layout.neighbours))
        if schedule.strategy == "per-loop":
            delta = loops[names[segment.loops[0]]]
            delta.exchanges += len(segment.exchanges)
            delta.messages += sum(x.messages for x in segment.exchanges)
            delta.bytes_sent += sum(x.bytes for x in segment.exchanges)
    for position, count in (colours or {}).items():
        delta = loops[names[position]]
        delta.colours = max(delta.colours, count)
    chain_delta = None if chain is None else _chain_delta(schedule, names, layouts, profile, tiling)
    return PlanAccount(loops, chain_delta, chain, [])


def _actual_cores(segment) -> list:
    """Iterations each loop of the segment runs while its exchanges are in flight."""
    core = {run.loop: run.end for run in segment.core}
    return [core.get(p, 0) if segment.exchanges else (segment.iterations[i] if not segment.rest else 0)
            for i, p in enumerate(segment.loops)]


def _chain_delta(schedule, names, layouts, profile, tiling) -> ChainStats:
    delta = ChainStats("", loops=sum(len(s.loops) for s in schedule.segments), mode=schedule.strategy, profile=profile)
    if tiling is not None:
        delta.tile_size, delta.tiled_groups, delta.tiles, delta.tile_colours = tiling
    if profile is not None:
        totals = profile.totals()
        delta.per_loop_exchanges = sum(lp.dats for lp in profile.per_loop)
        delta.per_loop_messages = totals["per_loop_messages"]
        delta.per_loop_bytes = totals["per_loop_bytes"]
        delta.per_loop_max_message = max((lp.max_message for lp in profile.per_loop), default=0)
        delta.per_loop_core_iterations = totals["per_loop_core"]
        delta.per_loop_iterations = totals["per_loop_iterations"]
    if schedule.strategy == "ca":
        for segment in schedule.segments:
            delta.segments += 1
            delta.depth = max(delta.depth, max(segment.depths, default=0), max((d for _, d in segment.required),
                                                                                 default=0))
            for exchange in segment.exchanges:
                delta.exchanges += 1
                delta.messages += exchange.messages
                delta.bytes_sent += exchange.bytes
                delta.max_message = max(delta.max_message, exchange.largest)
            delta.core_iterations += sum(_actual_cores(segment))
            delta.iterations += sum(segment.iterations)
            delta.neighbours = max([delta.neighbours, *(len(layouts[p].neighbours) for p in segment.loops)])
    elif schedule.strategy == "per-loop":
        delta.segments = len(schedule.segments)
        delta.depth = 1
        for segment in schedule.segments:
            delta.exchanges += len(segment.exchanges)
            delta.messages += sum(x.messages for x in segment.exchanges)
            delta.bytes_sent += sum(x.bytes for x in segment.exchanges)
        if profile is not None:
            delta.max_message = max((lp.max_message for lp in profile.per_loop), default=0)
            delta.core_iterations = sum(lp.core for lp in profile.per_loop)
            delta.iterations = sum(lp.iterations for lp in profile.per_loop)
    return delta
