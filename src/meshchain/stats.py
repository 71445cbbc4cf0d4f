"""Per-loop statistics, returned by ``mc.stats()``.

Examples
--------
>>> from meshchain.stats import LoopStats
>>> LoopStats("update").calls
0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["LoopStats", "Stats", "StatsRecorder"]


@dataclass
class LoopStats:
    """Counters of one named loop (summed over its calls)."""

    name: str
    calls: int = 0
    iterations: int = 0
    core_iterations: int = 0
    halo_iterations: int = 0
    halo_iterations_by_layer: list = field(default_factory=list)
    exchanges: int = 0
    neighbours: int = 0
    messages: int = 0
    bytes_sent: int = 0
    time_compute: float = 0.0
    time_plan: float = 0.0
    time_compile: float = 0.0
    time_wait: float = 0.0
    compilations: int = 0
    cache_hits: int = 0
    colours: int = 0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Stats:
    """A snapshot of the statistics; ``loops`` maps loop names to :class:`LoopStats`."""

    loops: dict = field(default_factory=dict)
    backend: str = ""

    def as_dict(self) -> dict:
        return {"backend": self.backend, "loops": {k: v.as_dict() for k, v in self.loops.items()}}

    def combined(self, per_rank) -> "Stats":
        """The statistics of all ranks summed (``neighbours`` and ``colours``: the maximum)."""
        loops = {}
        for snapshot in per_rank:
            for name, record in snapshot.loops.items():
                total = loops.setdefault(name, LoopStats(name))
                for f in dataclasses.fields(LoopStats):
                    if f.name == "name":
                        continue
                    value = getattr(record, f.name)
                    setattr(total, f.name, _merge(f.name, getattr(total, f.name), value))
        return Stats(loops, self.backend)

    def __str__(self) -> str:
        header = (f"{'loop':<20}{'calls':>8}{'iterations':>14}{'colours':>8}{'compute s':>12}{'compile s':>11}"
                  f"{'exchanges':>10}{'messages':>9}{'MB sent':>9}{'wait s':>9}")
        rows = [header] + [
            f"{s.name:<20}{s.calls:>8}{s.iterations:>14}{s.colours:>8}{s.time_compute:>12.4f}{s.time_compile:>11.3f}"
            f"{s.exchanges:>10}{s.messages:>9}{s.bytes_sent / 1e6:>9.3f}{s.time_wait:>9.4f}"
            for s in self.loops.values()
        ]
        return "\n".join(rows)


def _merge(name: str, a, b):
    if name in ("neighbours", "colours"):
        return max(a, b)
    if isinstance(a, list):
        return add_by_layer(a, b)
    return a + b


def add_by_layer(a: list, b) -> list:
    """Element-wise sum of two per-layer lists of different lengths."""
    longer, shorter = (list(a), list(b)) if len(a) >= len(b) else (list(b), list(a))
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


class StatsRecorder:
    """Mutable counters owned by the runtime."""

    def __init__(self):
        self.loops: dict[str, LoopStats] = {}

    def loop(self, name: str) -> LoopStats:
        record = self.loops.get(name)
        if record is None:
            record = self.loops[name] = LoopStats(name)
        return record

    def snapshot(self, backend: str) -> Stats:
        return Stats({k: dataclasses.replace(v) for k, v in self.loops.items()}, backend)

    def reset(self) -> None:
        self.loops.clear()
