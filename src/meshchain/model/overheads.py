"""The runtime's own costs, ``o_r`` per exchange round and ``o_l`` per loop in a round, fitted
from timed chain executions.

Each execution of a chain on several ranks is an :class:`Observation`: how it ran (loop
by loop: one round per loop; communication-avoiding: one round per segment), the
seconds it took, and its :class:`~meshchain.model.ChainProfile`. What the paper's
equations (with ``g_l``, ``L``, ``B``, ``c``) do not explain is the residual
``rounds · o_r + loops · o_l``; :func:`fit_overheads` solves for both by non-negative
least squares. Telling ``o_r`` from ``o_l`` needs executions of both kinds (loop by loop
every loop that exchanges is a round); three of each are asked for, and the median counts.

The least squares are *relative*: what the model predicts is a gain, a ratio of two times,
so each equation is divided by the time it is about, and a long execution (where the
overheads are a small share, and a few per cent of error in ``g_l`` outweighs them) does not
outweigh a short one. Beside the equation of each kind, an execution loop by loop and a
communication-avoiding one of the same loops give the equation of their *difference*
(divided by the loop-by-loop time: the gain's own unit), where the loop costs both pay cancel
and ``o_r`` is what the saved rounds cost. On ``benchmarks/model.py``'s sweeps (60 rows) the
held-out error fell from 8.3-12.7 points (absolute least squares, no difference equations) to
6.5-8.4 on the four runs this fit was chosen on, and from 9.8 and 12.6 to 7.1 and 10.6 on two
runs made afterwards (``benchmarks/README.md``).

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

__all__ = ["Observation", "Observations", "Residual", "fit_overheads"]


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

    def residuals(self, g: dict, machine, ca_g: dict | None = None) -> list[Residual]:
        """A :class:`Residual` per observation (``machine`` without overheads; ``g`` the loop
        costs loop by loop, ``ca_g`` communication-avoiding, None: ``g``)."""
        rows = []
        ca_g = g if ca_g is None else ca_g
        for kind, seen in self.kinds.items():
            for obs in seen:
                model = obs.profile.ca_time(ca_g, machine) if kind else obs.profile.per_loop_time(g, machine)
                rows.append(Residual(*obs.terms(), obs.seconds - model, obs.seconds, kind))
        return rows


class Residual(NamedTuple):
    """What the equations leave unexplained in one timed execution: its ``rounds`` and
    ``loops`` (:meth:`Observation.terms`), the ``residual`` seconds, and, when known, the
    measured ``seconds`` (the fit is then relative to them) and whether it ran ``ca``
    (executions of both kinds with as many loops then also give their difference); and the
    ``execution`` it belongs to (None: repeated executions of the same chains, grouped by their
    counts; else only rows of the same ``execution`` are grouped and paired: one
    configuration's pair of variants)."""

    rounds: int
    loops: int
    residual: float
    seconds: float | None = None
    ca: bool | None = None
    execution: object = None


def fit_overheads(rows) -> tuple[float, float]:
    """``(o_r, o_l) >= 0`` fitting ``rounds o_r + loops o_l = residual`` over ``rows``
    (:class:`Residual`, or ``(rounds, loops, residual)``) by non-negative least squares.

    Rows of the same execution, kind, ``rounds`` and ``loops`` count once, with their median
    residual (and median seconds): a first, cold execution or one slowed by another process
    then does not skew the fit. Where ``seconds`` are known each equation is divided by them,
    and each loop-by-loop group and CA group with as many loops add the equation of their
    difference, divided by the loop-by-loop seconds (see the module docstring).

    >>> o_r, o_l = fit_overheads([Residual(8, 8, 8 * 30e-6 + 8 * 10e-6, 1e-3, False),
    ...                            Residual(1, 8, 30e-6 + 8 * 10e-6, 4e-4, True)])
    >>> round(o_r * 1e6, 6), round(o_l * 1e6, 6)
    (30.0, 10.0)
    """
    from scipy.optimize import nnls

    medians = _medians(rows)
    if not medians:
        return 0.0, 0.0
    equations, targets = _equations(medians)
    solution, _ = nnls(np.array(equations, dtype=float), np.array(targets, dtype=float))
    return float(solution[0]), float(solution[1])


def _medians(rows) -> dict:
    """``(execution, ca, rounds, loops) -> (median residual, 1 / median seconds)`` (None where
    some row has no seconds: that group's equation is not scaled and has no difference)."""
    groups: dict = {}
    for row in rows:
        row = Residual(*row)
        groups.setdefault((row.execution, row.ca, row.rounds, row.loops), []).append(row)
    medians = {}
    for key, found in groups.items():
        seconds = [r.seconds for r in found if r.seconds is not None]
        middle = float(np.median(seconds)) if len(seconds) == len(found) else 0.0
        medians[key] = (float(np.median([r.residual for r in found])), 1.0 / middle if middle > 0 else None)
    return medians


def _equations(medians: dict) -> tuple[list, list]:
    """The scaled equations ``(rounds, loops) · (o_r, o_l) = residual`` of every group, then
    the difference of each loop-by-loop group with seconds and each CA group of the same
    execution with as many loops."""
    scaled = {key: (residual, 1.0 if scale is None else scale) for key, (residual, scale) in medians.items()}
    equations = [(rounds * scale, loops * scale) for (_, _, rounds, loops), (_, scale) in scaled.items()]
    targets = [residual * scale for residual, scale in scaled.values()]
    for (execution, ca, rounds, loops), (residual, scale) in medians.items():
        if ca is not False or scale is None:
            continue
        for (other_execution, other_ca, other_rounds, other_loops), (other, _) in medians.items():
            if other_execution == execution and other_ca is True and other_loops == loops and other_rounds != rounds:
                equations.append(((rounds - other_rounds) * scale, 0.0))
                targets.append((residual - other) * scale)
    return equations, targets
