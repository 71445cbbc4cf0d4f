"""Robust timings for everything that feeds a decision or a table.

One disturbed timing (another process, a page fault storm, a late neighbour) must not
be taken as the truth. A :class:`Timing` is the median of repeated samples with their
relative spread, the interquartile range over the median; a timing whose spread exceeds
a threshold is re-measured (fresh samples), up to a limit of attempts, and the quietest
attempt is kept. If even that one is above the threshold the timing is marked
``noisy``: tables and plots show it as such instead of as a fact.

:func:`measure_interleaved` times several variants round by round (one sample of each
per round), so a slow spell of the machine hits all of them alike; a variant's noise
re-measures all of them. Warm-up (JIT compilation, first-execution inspection) is the
caller's job and happens before: nothing here times a first call.

Examples
--------
>>> from meshchain.model.timing import Timing, spread_of, measure_interleaved
>>> round(spread_of([1.0, 1.0, 1.0, 1.1, 3.0]), 3)   # one outlier hardly moves it
0.1
>>> samples = iter([1.0, 2.0, 1.0, 9.0, 1.0, 2.0,      # attempt 1: 'ca' is disturbed
...                 1.0, 2.0, 1.01, 2.0, 1.0, 2.02])   # attempt 2: both quiet
>>> timings = measure_interleaved({"loop": lambda: next(samples), "ca": lambda: next(samples)},
...                               repeats=3, threshold=0.1, max_attempts=3)
>>> timings["ca"].median, timings["ca"].attempts, timings["ca"].noisy
(2.0, 2, False)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigurationError

__all__ = ["Timing", "spread_of", "summarise", "median_record", "measure_interleaved", "NOISY_SPREAD",
           "MAX_ATTEMPTS"]

NOISY_SPREAD = 0.10  # relative interquartile range above which a timing is noisy
MAX_ATTEMPTS = 3  # measurements of a noisy timing before it is reported as noisy


@dataclass(frozen=True)
class Timing:
    """A repeated measurement: ``median`` seconds, relative ``spread`` (interquartile range
    over the median), the kept ``samples``, how many ``attempts`` it took, and whether it is
    still ``noisy`` after them."""

    median: float
    spread: float
    samples: tuple
    attempts: int = 1
    noisy: bool = False

    def as_dict(self) -> dict:
        return {"median": self.median, "spread": self.spread, "samples": list(self.samples),
                "attempts": self.attempts, "noisy": self.noisy}


def spread_of(samples) -> float:
    """The relative spread of ``samples``: ``(q75 - q25) / median`` (0 for one sample;
    infinite when the median is not positive)."""
    values = np.asarray(samples, dtype=float)
    if values.size < 2:
        return 0.0
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return float((q75 - q25) / median) if median > 0 else float("inf")


def summarise(samples, *, threshold: float = NOISY_SPREAD, attempts: int = 1) -> Timing:
    """A :class:`Timing` of ``samples`` (noisy when the spread exceeds ``threshold``)."""
    spread = spread_of(samples)
    return Timing(float(np.median(samples)), spread, tuple(float(s) for s in samples), attempts, spread > threshold)


def median_record(records: list, *, key: str = "time_per_iter", threshold: float = NOISY_SPREAD) -> dict:
    """Of ``records`` (dicts, one per timed round), the one whose ``key`` is the median round's
    (the lower one of an even count), with ``key`` set to the median and ``spread``,
    ``noisy`` and ``rounds`` (every round's ``key``) added: for benchmarks whose rounds carry
    more than a time (per-kernel times, message counts).

    >>> median_record([{"time_per_iter": 3.0, "n": 1}, {"time_per_iter": 1.0, "n": 2},
    ...                {"time_per_iter": 2.0, "n": 3}])["n"]
    3
    """
    times = [r[key] for r in records]
    timing = summarise(times, threshold=threshold)
    middle = sorted(records, key=lambda r: r[key])[(len(records) - 1) // 2]
    return dict(middle, **{key: timing.median}, spread=timing.spread, noisy=timing.noisy, rounds=times)


def measure_interleaved(takes: dict, *, repeats: int = 5, threshold: float = NOISY_SPREAD,
                        max_attempts: int = MAX_ATTEMPTS) -> dict:
    """Time every variant of ``takes`` (name -> callable returning one sample in seconds)
    ``repeats`` rounds, interleaved; re-measure all of them while any is noisy, up to
    ``max_attempts`` attempts; return name -> :class:`Timing` of the quietest attempt.

    Under MPI the callables must return a value agreed over the ranks (the slowest rank's,
    say), so that every rank re-measures the same number of times.
    """
    if repeats < 1 or max_attempts < 1 or not threshold > 0:
        raise ConfigurationError(f"timing: repeats and max_attempts must be >= 1 and threshold > 0, got "
                                 f"repeats={repeats}, max_attempts={max_attempts}, threshold={threshold}")
    best = None
    for attempt in range(1, max_attempts + 1):
        samples = {name: [] for name in takes}
        for _ in range(repeats):
            for name, take in takes.items():
                samples[name].append(float(take()))
        timings = {name: summarise(s, threshold=threshold, attempts=attempt) for name, s in samples.items()}
        worst = max(t.spread for t in timings.values())
        if best is None or worst < best[0]:
            best = (worst, timings)
        if not any(t.noisy for t in timings.values()):
            break
    return {name: Timing(t.median, t.spread, t.samples, attempt, t.noisy) for name, t in best[1].items()}
