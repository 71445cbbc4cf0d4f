"""``mc.stats(summary=True)``: where the time went, in the manner of PETSc's ``-log_view``.

Per loop and per chain: the time (over ranks: the slowest and the fastest, and the
slowest as a percentage of the total time), calls, messages and bytes sent (summed over
ranks), and per loop the bytes its iterations must move from its access descriptors
(:mod:`meshchain.engine.traffic`, OP2's measure) with the achieved bandwidth: those bytes
over the loop's compute time (all ranks' bytes over the slowest rank's time), beside the
copy bandwidth of the machine: what one rank copies while every rank copies at once
(``mc.model.calibrate()`` measures it, else it is measured when the summary is made),
times the ranks (``% copy`` is of that).

A loop's time is its compute time plus the time it waited for its own halo exchanges
(when it ran on its own, or in a chain run loop by loop). A chain run
communication-avoiding computes its loops in phases of several loops each (one compiled
call): a phase's time is shared out to its loops by iterations, and the chain's waiting
is the chain's (its row), not a loop's.

Examples
--------
>>> from meshchain.core.stats import LoopStats, Stats
>>> update = LoopStats("update", calls=10, iterations=1000, time_compute=0.002, bytes_moved=8_000_000)
>>> summary = Summary.of([Stats({"update": update})], seconds=[0.004], copy_bandwidth=(8e9, "measured now"))
>>> row = summary.loops["update"]
>>> row.gbytes_per_second, round(row.percent)
(4.0, 50)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Summary", "LoopRow", "ChainRow"]


@dataclass
class LoopRow:
    """One loop over all ranks: ``time_max``/``time_min`` seconds (compute plus its own waits),
    ``compute_max`` the slowest rank's compute seconds, the rest summed over ranks."""

    name: str
    calls: int = 0
    iterations: int = 0
    time_max: float = 0.0
    time_min: float = 0.0
    compute_max: float = 0.0
    wait_max: float = 0.0
    messages: int = 0
    bytes_sent: int = 0
    bytes_moved: int = 0
    percent: float = 0.0

    @property
    def gbytes_per_second(self) -> float:
        """Achieved bandwidth: bytes moved (all ranks) over the slowest rank's compute time, GB/s."""
        return self.bytes_moved / self.compute_max / 1e9 if self.compute_max > 0 else float("nan")


@dataclass
class ChainRow:
    """One chain over all ranks: ``time_max``/``time_min`` wall-clock seconds of its runs."""

    name: str
    runs: int = 0
    loops: int = 0
    mode: str = ""
    time_max: float = 0.0
    time_min: float = 0.0
    wait_max: float = 0.0
    messages: int = 0
    bytes_sent: int = 0
    percent: float = 0.0


@dataclass
class Summary:
    """What ``mc.stats(summary=True)`` returns; ``str()`` gives the table.

    Attributes
    ----------
    loops, chains : dict
        :class:`LoopRow` by loop name, :class:`ChainRow` by chain name.
    ranks : int
    seconds : float
        The total time: since the statistics began (or were reset), the slowest rank.
    copy_bandwidth : float
        Bytes per second of a large copy (read plus write) by one rank while every rank copies.
    copy_source : str
        Where that figure comes from.
    """

    loops: dict = field(default_factory=dict)
    chains: dict = field(default_factory=dict)
    ranks: int = 1
    seconds: float = 0.0
    copy_bandwidth: float = 0.0
    copy_source: str = ""

    @classmethod
    def of(cls, per_rank, *, seconds, copy_bandwidth: tuple) -> "Summary":
        """The summary of ``per_rank`` :class:`~meshchain.core.stats.Stats` snapshots (one per
        rank), ``seconds`` each rank's total time, ``copy_bandwidth`` ``(bytes/s, source)``."""
        total = max(seconds) if len(seconds) else 0.0
        loops = {name: _loop_row(name, [s.loops.get(name) for s in per_rank], total)
                 for name in dict.fromkeys(n for s in per_rank for n in s.loops)}
        chains = {name: _chain_row(name, [s.chains.get(name) for s in per_rank], total)
                  for name in dict.fromkeys(n for s in per_rank for n in s.chains)}
        return cls(loops, chains, len(per_rank), total, *copy_bandwidth)

    def as_dict(self) -> dict:
        return {"ranks": self.ranks, "seconds": self.seconds, "copy_bandwidth": self.copy_bandwidth,
                "copy_source": self.copy_source,
                "loops": {k: {**vars(v), "gbytes_per_second": v.gbytes_per_second} for k, v in self.loops.items()},
                "chains": {k: dict(vars(v)) for k, v in self.chains.items()}}

    @property
    def copy_all_ranks(self) -> float:
        """Bytes per second all ranks copy together (:attr:`copy_bandwidth` times the ranks)."""
        return self.copy_bandwidth * self.ranks

    def __str__(self) -> str:
        copy = self.copy_all_ranks / 1e9
        rows = [f"meshchain summary: {self.ranks} rank(s), {self.seconds:.4f} s (slowest rank); copy bandwidth "
                f"{copy:.2f} GB/s ({self.copy_bandwidth / 1e9:.2f} per rank, all copying; {self.copy_source})", "",
                f"{'loop':<20}{'calls':>7}{'max s':>10}{'min s':>10}{'%':>6}{'wait s':>9}{'msgs':>8}{'MB sent':>9}"
                f"{'MB moved':>10}{'GB/s':>8}{'% copy':>8}"]
        for r in sorted(self.loops.values(), key=lambda r: -r.time_max):
            rate = r.gbytes_per_second
            rows.append(f"{r.name:<20}{r.calls:>7}{r.time_max:>10.4f}{r.time_min:>10.4f}{r.percent:>6.1f}"
                        f"{r.wait_max:>9.4f}{r.messages:>8}{r.bytes_sent / 1e6:>9.3f}{r.bytes_moved / 1e6:>10.1f}"
                        f"{rate:>8.2f}{100 * rate / copy if copy > 0 else float('nan'):>8.0f}")
        if self.chains:
            rows += ["", f"{'chain':<20}{'runs':>7}{'max s':>10}{'min s':>10}{'%':>6}{'wait s':>9}{'msgs':>8}"
                         f"{'MB sent':>9}{'loops':>10}{'mode':>10}"]
            rows += [f"{c.name:<20}{c.runs:>7}{c.time_max:>10.4f}{c.time_min:>10.4f}{c.percent:>6.1f}"
                     f"{c.wait_max:>9.4f}{c.messages:>8}{c.bytes_sent / 1e6:>9.3f}{c.loops:>10}{c.mode:>10}"
                     for c in sorted(self.chains.values(), key=lambda c: -c.time_max)]
        rows += ["", "max/min s: over ranks; %: of the total time; msgs, MB sent: summed over ranks; MB moved: "
                     "from access descriptors (OP2's measure); GB/s: MB moved over the slowest rank's compute time; "
                     "% copy: of the copy bandwidth of all ranks"]
        return "\n".join(rows)


def _loop_row(name: str, records, total: float) -> LoopRow:
    present = [r for r in records if r is not None]
    times = [r.time_compute + r.time_wait if r is not None else 0.0 for r in records]
    row = LoopRow(name, calls=max(r.calls for r in present), iterations=sum(r.iterations for r in present),
                  time_max=max(times), time_min=min(times), compute_max=max(r.time_compute for r in present),
                  wait_max=max(r.time_wait for r in present), messages=sum(r.messages for r in present),
                  bytes_sent=sum(r.bytes_sent for r in present), bytes_moved=sum(r.bytes_moved for r in present))
    row.percent = 100 * row.time_max / total if total > 0 else float("nan")
    return row


def _chain_row(name: str, records, total: float) -> ChainRow:
    present = [r for r in records if r is not None]
    times = [r.time_total if r is not None else 0.0 for r in records]
    row = ChainRow(name, runs=max(r.executions for r in present),
                   loops=max(r.loops // r.executions if r.executions else 0 for r in present),
                   mode=next((r.mode for r in present if r.mode), ""), time_max=max(times), time_min=min(times),
                   wait_max=max(r.time_wait for r in present), messages=sum(r.messages for r in present),
                   bytes_sent=sum(r.bytes_sent for r in present))
    row.percent = 100 * row.time_max / total if total > 0 else float("nan")
    return row
