"""The model on several ranks: predictions recorded per chain, timed executions observed,
and ``ca="auto"``'s decision.

Every chain execution on several ranks records its :class:`~meshchain.model.ChainProfile`
in ``mc.stats()`` and, unless something was compiled during it, is kept as an
:class:`~meshchain.model.overheads.Observation` (to fit the runtime's overheads). Once a
calibration is known (``mc.model.calibrate()`` now, or saved by an earlier run on this
host with as many ranks) the predicted time of both variants is recorded too.

``ca="auto"`` needs ``g_l`` for every loop and the overheads: until it has them it runs
the chain once each way to time it (the decision says so). Then it agrees on the
slowest rank's predictions (one small ``Allreduce``), chooses, and remembers the choice
for the chain and the state it starts from, so later executions cost nothing extra.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager

import numpy as np

from ..model.calibrate import load_calibration, loop_costs, measure_chain_machine
from ..model.overheads import Observation, fit_overheads
from ..model.policy import choose_ca, measuring

__all__ = ["current_calibration", "record_prediction", "decide", "observe", "fitted_machine"]


def current_calibration(runtime, *, measure: bool = False):
    """The runtime's calibration: the one set by ``mc.model.calibrate()``, else the saved one
    for this host and rank count; with ``measure`` (collective) the network is measured
    now if neither exists."""
    if runtime.calibration is None and not runtime.calibration_looked_up:
        runtime.calibration = load_calibration()
        runtime.calibration_looked_up = True
    if runtime.calibration is None and measure:
        runtime.calibration = measure_chain_machine(runtime)
    return runtime.calibration


def costs(runtime, calibration) -> dict:
    """``g_l`` by loop name: measured in this run where a loop ran, else calibrated."""
    return {**calibration.loop_costs, **loop_costs(runtime.recorder)}


def fitted_machine(runtime, calibration, g: dict, *, fresh: bool = False):
    """The calibrated machine with the overheads fitted from this run's observations (when
    it has enough of both kinds), else the calibration's own (None if it has none).

    The fit is redone when 16 executions were observed since the last one, or ``fresh``."""
    observations = runtime.observations
    if observations.missing():
        return calibration.machine if calibration.overheads else None
    cached = runtime.fitted_machine
    if cached is not None and not fresh and cached[0] is calibration and observations.added - cached[1] < 16:
        return cached[2]
    machine = dataclasses.replace(calibration.machine, round_overhead=0.0, loop_overhead=0.0)
    o_r, o_l = fit_overheads(observations.residuals(g, machine))
    machine = dataclasses.replace(machine, round_overhead=o_r, loop_overhead=o_l)
    runtime.fitted_machine = (calibration, observations.added, machine)
    return machine


@contextmanager
def observe(runtime, profile, ca: bool, records):
    """Time the execution in the ``with`` block and keep it as an observation, unless a loop
    was compiled meanwhile."""
    compiled = sum(r.compilations for r in records)
    began = time.perf_counter()
    yield
    seconds = time.perf_counter() - began
    if sum(r.compilations for r in records) == compiled:
        runtime.observations.add(Observation(ca, seconds, profile))


def record_prediction(runtime, chain, profile) -> None:
    """Add this execution's model terms and predicted times on this rank to ``chain``."""
    chain.profile = profile
    calibration = current_calibration(runtime)
    if calibration is None or not profile.ca:
        return
    g = costs(runtime, calibration)
    machine = fitted_machine(runtime, calibration, g)
    if machine is None or profile.missing(g):
        return
    key = (id(profile), machine)
    predicted = runtime.predictions.get(key)
    if predicted is None or predicted[0] is not profile:
        if len(runtime.predictions) >= 1024:
            runtime.predictions.clear()
        predicted = runtime.predictions[key] = (profile, profile.per_loop_time(g, machine),
                                                profile.ca_time(g, machine), calibration.describe(machine))
    chain.predicted_executions += 1
    chain.predicted_per_loop += predicted[1]
    chain.predicted_ca += predicted[2]
    chain.model = predicted[3]


def decide(runtime, profile, signature):
    """``ca="auto"`` for a chain with ``profile`` (collective; the same answer on every rank)."""
    objects = signature.by_key()
    key = (signature.loops, tuple(sorted((k, o._valid_depth) for k, o in objects.items() if not o.is_global)))
    decision = runtime.ca_decisions.get(key)
    if decision is not None:
        return decision
    calibration = current_calibration(runtime, measure=True)
    g = costs(runtime, calibration)
    missing = profile.missing(g)
    machine = fitted_machine(runtime, calibration, g, fresh=True)
    unobserved = runtime.observations.missing() if machine is None else []
    predicted = np.array([0.0, 0.0, float(bool(missing)), float(False in unobserved),
                          float(True in unobserved)])
    if not missing and machine is not None:
        predicted[:2] = profile.per_loop_time(g, machine), profile.ca_time(g, machine)
    from mpi4py import MPI

    runtime.comm.Allreduce(MPI.IN_PLACE, predicted, op=MPI.MAX)
    if predicted[2:].any():
        return measuring(missing, run_ca=bool(not predicted[2] and not predicted[3] and predicted[4]))
    decision = choose_ca(per_loop_time=float(predicted[0]), ca_time=float(predicted[1]),
                         basis=calibration.describe(machine))
    runtime.ca_decisions[key] = decision
    return decision
