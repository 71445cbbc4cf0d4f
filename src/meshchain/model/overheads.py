"""The runtime's own costs, ``o_r`` per exchange round and ``o_l`` per loop in a round, fitted
from timed chain executions.

Each execution of a chain on several ranks is an :class:`Observation`: how it ran (loop
by loop: one round per loop; communication-avoiding: one round per segment), the
seconds it took, and its :class:`~meshchain.model.ChainProfile`. What the paper's
equations (with ``g_l``, ``L``, ``B``, ``c``) do not explain is the residual
``rounds · o_r + loops · o_l``; :func:`fit_overheads` solves for both by non-negative
least squares. Telling ``o_r`` from ``o_l`` needs executions of both kinds (loop by loop
every loop that exchanges is a round); three of each are asked for, and the median counts.

Examples
--------
>>> from meshchain.model.overheads import fit_overheads
>>> # (rounds, loops, residual seconds): 8 rounds of 8 loops, then 1 round of 8 loops
>>> o_r, o_l = fit_overheads([(8, 8, 8 * 30e-6 + 8 * 10e-6), (1, 8, 30e-6 + 8 * 10e-6)])
>>> round(o_r * 1e6, 6), round(o_l * 1e6, 6)
(30.0, 10.0)
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from .profile import ChainProfile

__all__ = ["Observation", "Observations", "fit_overheads"]


class Observation(NamedTuple):
    """One timed execution: ``ca`` (how it ran), ``seconds`` and its ``profile``."""

    ca: bool
    seconds: float
    profile: ChainProfile

    def terms(self) -> tuple[int, int]:
        """``(rounds, loops)``: exchange rounds (loops or segments that exchange with a
        neighbour) and loops run."""
        if self.ca:
            return sum(1 for s in self.profile.ca if s.neighbours), sum(len(s.loops) for s in self.profile.ca)
        return sum(1 for lp in self.profile.per_loop if lp.dats and lp.neighbours), len(self.profile.per_loop)


class Observations:
    """The latest timed executions of each kind (at most ``keep`` of each)."""

    def __init__(self, keep: int = 64):
        self.kinds = {False: deque(maxlen=keep), True: deque(maxlen=keep)}
        self.added = 0

    def add(self, observation: Observation) -> None:
        self.kinds[observation.ca].append(observation)
        self.added += 1

    def missing(self, enough: int = 3) -> list[bool]:
        """The kinds with fewer than ``enough`` observations (``False``: loop by loop,
        ``True``: CA)."""
        return [kind for kind, seen in self.kinds.items() if len(seen) < enough]

    def residuals(self, g: dict, machine) -> list[tuple[int, int, float]]:
        """``(rounds, loops, seconds - equations)`` per observation (``machine`` without
        overheads)."""
        rows = []
        for kind, seen in self.kinds.items():
            for obs in seen:
                model = obs.profile.ca_time(g, machine) if kind else obs.profile.per_loop_time(g, machine)
                rows.append((*obs.terms(), obs.seconds - model))
        return rows


def fit_overheads(rows) -> tuple[float, float]:
    """``(o_r, o_l) >= 0`` minimising ``Σ (rounds o_r + loops o_l - residual)^2`` over ``rows``.

    Rows with the same ``(rounds, loops)`` count once, with their median residual: a
    first, cold execution or one slowed by another process then does not skew the fit."""
    from scipy.optimize import nnls

    groups: dict = {}
    for rounds, loops, residual in rows:
        groups.setdefault((rounds, loops), []).append(residual)
    if not groups:
        return 0.0, 0.0
    terms = np.array(list(groups), dtype=float)
    medians = np.array([max(float(np.median(r)), 0.0) for r in groups.values()])
    solution, _ = nnls(terms, medians)
    return float(solution[0]), float(solution[1])
