"""Held-out validation of the model: calibrate on some configurations, predict the others.

A report row (:mod:`meshchain.apps.report`) holds what one configuration (rank count,
network, size per rank, loops) measured: both variants' median times, every rank's
:class:`~meshchain.model.profile.ChainProfile`, and the job's calibration (``L``, ``B``,
``c``, the loop costs ``g_l``). For each row, :func:`held_out` builds the model from
*other* rows only, those of the same workload, rank count and network that differ from it
in every swept dimension (another size per rank *and* another loop count), never from
the row itself:

* ``L``, ``B``, ``c`` and ``φ``: the medians over the calibration rows; each ``g_l``:
  their medians per size interpolated in ``log(size)`` to the row's size per rank
  (:func:`loop_costs_at`: a loop's cost per iteration depends on its size through the
  caches), loop by loop and communication-avoiding apart (where the rows measured both:
  :func:`meshchain.model.calibrate.loop_costs`);
* ``o_r`` and ``o_l``: fitted last (:func:`~meshchain.model.overheads.fit_overheads`) to
  what the equations, with those constants (``φ`` included), leave unexplained in the
  calibration rows' measured times, both variants and their difference, relative to the
  times;

then predicts both variants for the row (the slowest rank's prediction counts) and
compares the predicted gain with the measured one. Rows marked noisy are predicted but
never used to calibrate.

Examples
--------
>>> from meshchain.model.validate import held_out, summary
>>> from meshchain.model.profile import ChainProfile, LoopProfile, SegmentProfile
>>> def row(size, loops, per_loop, ca):
...     lp = tuple(LoopProfile("a", core=size // 2, iterations=size, dats=1, neighbours=1, max_message=80)
...                for _ in range(loops))
...     seg = (SegmentProfile(("a",) * loops, core=(size // 2,) * loops, iterations=(size + 10,) * loops,
...                           neighbours=1, max_message=80 * loops),)
...     calibration = {"machine": {"latency": 1e-5, "bandwidth": 1e9, "pack_cost": 0.0},
...                    "loop_costs": {"a": 1e-8}}
...     return {"workload": "w", "ranks": 2, "network": "shm", "per_rank": size, "loops": loops,
...             "per_loop": per_loop, "ca": ca, "noisy": False, "calibration": calibration,
...             "profiles": [ChainProfile(lp, seg).as_dict()] * 2}
>>> rows = [row(1000, 2, 4.0e-5, 2.5e-5), row(1000, 8, 16.1e-5, 7.5e-5),
...         row(4000, 2, 10.0e-5, 8.4e-5), row(4000, 8, 40.0e-5, 33.9e-5)]
>>> [round(r["predicted_gain"], 1) for r in held_out(rows)]
[37.1, 54.2, 5.6, 9.3]
>>> s = summary(held_out(rows))
>>> s["rows"], s["right_choices"], s["over_predicted"]
(4, 4, 1)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .equations import Machine, gain_percent
from .overheads import Observation, Residual, fit_overheads
from .profile import ChainProfile

__all__ = ["held_out", "calibration_rows", "fit", "loop_costs_at", "predict", "summary"]

_GROUP = ("workload", "ranks", "network")
_SWEPT = ("per_rank", "loops")


def calibration_rows(row: dict, rows) -> list[dict]:
    """The rows the model for ``row`` is built from: same workload, rank count and network,
    another value in every swept dimension that has more than one value, and not noisy."""
    group = [r for r in rows if all(r.get(k) == row.get(k) for k in _GROUP)]
    swept = [k for k in _SWEPT if len({r[k] for r in group}) > 1]
    return [r for r in group if r is not row and not r.get("noisy") and all(r[k] != row[k] for k in swept)]


def fit(rows, *, size=None) -> tuple[dict, dict, Machine]:
    """``(g, ca_g, machine)`` from calibration ``rows``: medians of their measured constants,
    the loop costs loop by loop and communication-avoiding at ``size`` per rank (see
    :func:`loop_costs_at`; None: their medians), and the overheads fitted to what the
    equations leave unexplained in their times (each row with the loop costs at its own size)."""
    machines = [r["calibration"]["machine"] for r in rows]
    base = Machine(latency=float(np.median([m["latency"] for m in machines])),
                   bandwidth=float(np.median([m["bandwidth"] for m in machines])),
                   pack_cost=float(np.median([m.get("pack_cost", 0.0) for m in machines])),
                   overlap=float(np.median([m.get("overlap", 1.0) for m in machines])))
    residuals = []
    for number, r in enumerate(rows):
        at = r.get("per_rank") if size is not None else None
        g_r, ca_g_r = loop_costs_at(rows, at), loop_costs_at(rows, at, ca=True)
        profiles = [ChainProfile.from_dict(p) for p in r["profiles"]]
        for ca, measured in ((False, r["per_loop"]), (True, r["ca"])):
            equations = max(p.ca_time(ca_g_r, base) if ca else p.per_loop_time(g_r, base) for p in profiles)
            terms = Observation(ca, measured, profiles[0]).terms()
            residuals.append(Residual(*terms, measured - equations, measured, ca, number))
    o_r, o_l = fit_overheads(residuals)
    return (loop_costs_at(rows, size), loop_costs_at(rows, size, ca=True),
            dataclasses.replace(base, round_overhead=o_r, loop_overhead=o_l))


def _costs(row: dict, ca: bool) -> dict:
    """A row's calibrated loop costs, loop by loop or communication-avoiding (rows measured
    before the two were kept apart have one set)."""
    calibration = row["calibration"]
    return {**calibration["loop_costs"], **calibration.get("ca_loop_costs", {})} if ca else calibration["loop_costs"]


def loop_costs_at(rows, size=None, *, ca: bool = False) -> dict:
    """Each loop's cost per iteration ``g_l`` at ``size`` per rank, from the calibration
    ``rows`` (``ca``: in communication-avoiding segments): the median per size, interpolated
    linearly in ``log(size)`` (the nearest size's beyond their range), since a loop's cost
    per iteration depends on its size through the caches; ``size`` None: the median over
    all rows.

    >>> rows = [{"per_rank": 1000, "calibration": {"loop_costs": {"a": 1.0}}},
    ...         {"per_rank": 100000, "calibration": {"loop_costs": {"a": 3.0}}}]
    >>> loop_costs_at(rows, 10000), loop_costs_at(rows, 10), loop_costs_at(rows)
    ({'a': 2.0}, {'a': 1.0}, {'a': 2.0})
    """
    costs = [(r.get("per_rank"), _costs(r, ca)) for r in rows]
    names = {name for _, found in costs for name in found}
    out = {}
    for name in names:
        found = [(at, known[name]) for at, known in costs if name in known]
        if size is None or any(at is None for at, _ in found):
            out[name] = float(np.median([cost for _, cost in found]))
            continue
        sizes = sorted({at for at, _ in found})
        medians = [float(np.median([cost for at, cost in found if at == s])) for s in sizes]
        out[name] = float(np.interp(np.log(size), np.log(sizes), medians))
    return out


def predict(row: dict, g: dict, machine: Machine, ca_g: dict | None = None) -> tuple[float, float]:
    """Predicted seconds per execution loop by loop and CA for ``row`` (slowest rank; ``ca_g``:
    the loop costs in communication-avoiding segments, None: ``g``)."""
    profiles = [ChainProfile.from_dict(p) for p in row["profiles"]]
    ca_g = g if ca_g is None else ca_g
    return (max(p.per_loop_time(g, machine) for p in profiles), max(p.ca_time(ca_g, machine) for p in profiles))


def held_out(rows) -> list[dict]:
    """Every row predicted by a model calibrated on other rows (see the module docstring):
    the row with ``predicted_per_loop``, ``predicted_ca``, ``predicted_gain``, ``error``
    (points), ``right_choice``, ``tie`` (the measured gain is within the measured spread,
    so either choice costs less than the noise) and ``calibrated_on`` (how many rows);
    rows with nothing to calibrate on get ``predicted_gain`` None."""
    out = []
    for row in rows:
        basis = calibration_rows(row, rows)
        result = dict(row, calibrated_on=len(basis), predicted_gain=None, error=None, right_choice=None, tie=None)
        if basis:
            g, ca_g, machine = fit(basis, size=row.get("per_rank"))
            per_loop, ca = predict(row, g, machine, ca_g)
            predicted = gain_percent(per_loop, ca)
            measured = gain_percent(row["per_loop"], row["ca"])
            spread = 100 * max(row.get("per_loop_spread", 0.0), row.get("ca_spread", 0.0))
            result.update(predicted_per_loop=per_loop, predicted_ca=ca, predicted_gain=predicted,
                          measured_gain=measured, error=abs(predicted - measured),
                          right_choice=(predicted > 0) == (measured > 0), tie=abs(measured) <= spread,
                          held_out_machine=dataclasses.asdict(machine))
        out.append(result)
    return out


def summary(rows) -> dict:
    """Mean and worst absolute error (points), the rows over-predicted (predicted gain above
    the measured one: a systematic error shows as most rows on one side), right choices
    (strict, and counting ties within the measured spread as right) over the predicted rows
    of :func:`held_out`."""
    done = [r for r in rows if r.get("error") is not None]
    errors = [r["error"] for r in done]
    return {"rows": len(done), "mean_error": float(np.mean(errors)) if errors else float("nan"),
            "worst_error": max(errors, default=float("nan")),
            "over_predicted": sum(r["predicted_gain"] > r["measured_gain"] for r in done),
            "right_choices": sum(bool(r["right_choice"]) for r in done),
            "right_or_tie": sum(bool(r["right_choice"] or r["tie"]) for r in done),
            "noisy": sum(bool(r.get("noisy")) for r in done)}
