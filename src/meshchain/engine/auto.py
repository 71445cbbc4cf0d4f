"""The model in the engine: ``ca="auto"``'s decision, predictions in ``mc.stats()``, and the
timed executions the runtime's overheads are fitted from.

Every chain execution on several ranks is kept as an
:class:`~meshchain.model.overheads.Observation` (to fit the runtime's overheads ``o_r`` and
``o_l``). Once a calibration is known (``mc.model.calibrate()`` now, or saved by an
earlier run on this host with as many ranks) the runs of communication-avoiding chain
plans are predicted both ways; the model's work is done when statistics are read (or
``ca="auto"`` decides), never on a chain's execution path.

``ca="auto"`` needs ``g_l`` for every loop and the overheads: until it has them it runs
the chain each way to time it (the decision says so). Then it agrees on the slowest
rank's predictions (one small ``Allreduce``), chooses, and remembers the choice for the
chain and the state it starts from, so later executions cost one look-up.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.model import ChainProfile
>>> model = mc.get_runtime().model
>>> model.observe(True, 1e-4, ChainProfile((), ()))
>>> model.observations.missing()   # loop by loop: none timed yet; CA: one of three
[False, True]
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..model.calibrate import calibration_path, load_calibration, loop_costs, measure
from ..model.overheads import Observation, Observations, fit_overheads
from ..model.policy import choose_ca, measuring

__all__ = ["ModelState"]

REFIT_EVERY = 16  # observations between two fits of the overheads


class ModelState:
    """The session's model: calibration, observations, decisions (see the module docstring)."""

    def __init__(self, session):
        self.session = session
        self.calibration = None  # meshchain.model.Calibration, set by calibrate() or loaded
        self.looked_up = False
        self.observations = Observations()
        self._fitted = None  # (calibration, observations seen, g, Machine with fitted overheads)
        self.decisions = session.caches.cache("ca decisions", limit=1024,
                                              events=("configure", "partition", "repartition"))

    # --- calibration ------------------------------------------------------------------------------

    def current_calibration(self, *, measure_now: bool = False):
        """The calibration set by ``mc.model.calibrate()``, else the saved one for this host and
        rank count; with ``measure_now`` (collective) the network is measured now if neither
        exists."""
        if self.calibration is None and not self.looked_up:
            self.calibration = load_calibration(self.session.size, cache_dir=self.session.config.cache_dir)
            self.looked_up = True
            if self.calibration is not None:
                self._calibrated()
        if self.calibration is None and measure_now:
            self.calibrate(save=True, repeats=30, sizes=None)
        return self.calibration

    def calibrate(self, *, save: bool, repeats: int, sizes):
        """Measure the machine on the session's communicator (collective) and use the result."""
        session = self.session
        comm = session.comm
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_SELF
        previous = load_calibration(comm.size, cache_dir=session.config.cache_dir)
        path = calibration_path(session.config.cache_dir, comm.size) if save else None
        options = {} if sizes is None else {"sizes": sizes}
        self.calibration = measure(comm, costs=loop_costs(session.recorder), observations=self.observations,
                                   previous=previous, path=path, repeats=repeats, **options)
        self.looked_up = True
        self._calibrated()
        return self.calibration

    def fitted(self, calibration, *, fresh: bool = False):
        """``(g, machine)``: loop costs (measured in this run where a loop ran, else calibrated)
        and the calibrated machine with the overheads fitted from this run's observations
        (when it has enough of both kinds), else the calibration's own (machine None when it
        has none). Refitted every :data:`REFIT_EVERY` observations, or when ``fresh``."""
        observations = self.observations
        cached = self._fitted
        if (cached is not None and not fresh and cached[0] is calibration
                and observations.added - cached[1] < REFIT_EVERY):
            return cached[2], cached[3]
        g = {**calibration.loop_costs, **loop_costs(self.session.recorder)}
        if observations.missing():
            machine = calibration.machine if calibration.overheads else None
        else:
            machine = dataclasses.replace(calibration.machine, round_overhead=0.0, loop_overhead=0.0)
            o_r, o_l = fit_overheads(observations.residuals(g, machine))
            machine = dataclasses.replace(machine, round_overhead=o_r, loop_overhead=o_l)
        self._fitted = (calibration, observations.added, g, machine)
        return g, machine

    # --- per execution ----------------------------------------------------------------------------

    def observe(self, ca: bool, seconds: float, profile) -> None:
        """Keep a timed execution of a chain on several ranks."""
        self.observations.add(Observation(ca, seconds, profile))

    def watch(self, account) -> None:
        """Predict the runs of a new chain plan from now on when a calibration is known (its
        predictions are worked out when statistics are read: :meth:`predict`)."""
        if account.chain is not None and account.chain.profile is not None and account.chain.profile.ca:
            account.predicted_from = 0 if self.current_calibration() is not None else None

    def predict(self, accounts) -> None:
        """Set each account's predicted seconds per run, both ways, on this rank, from the
        calibration and the overheads fitted so far (nothing where the model lacks numbers)."""
        calibration = self.calibration
        if calibration is None:
            return
        g, machine = self.fitted(calibration)
        for account in accounts:
            if account.predicted_from is None:
                continue
            profile = account.chain.profile
            account.prediction = None
            if machine is not None and not profile.missing(g):
                account.prediction = (profile.per_loop_time(g, machine), profile.ca_time(g, machine),
                                      calibration.describe(machine))

    def _calibrated(self) -> None:
        """A calibration became known: the runs of live chain plans are predicted from now on."""
        for account in self.session.recorder.accounts:
            if account.predicted_from is None and account.chain is not None and account.chain.profile is not None \
                    and account.chain.profile.ca:
                account.predicted_from = account.runs

    # --- ca="auto" --------------------------------------------------------------------------------

    def use_ca(self, unit, profile) -> bool:
        """``ca="auto"`` for ``unit`` in its current state (collective; the same on every rank)."""
        key = (unit.options, unit.loops, unit.state())
        decision = self.decisions.get(key)
        if decision is None:
            decision = self._decide(profile)
            if decision.gain == decision.gain:  # not NaN: the model decided; keep it
                self.decisions[key] = decision
        self.session.recorder.chain(unit.chain).decision = decision.why
        return decision.use_ca

    def _decide(self, profile):
        calibration = self.current_calibration(measure_now=True)
        g, machine = self.fitted(calibration, fresh=True)
        missing = profile.missing(g)
        unobserved = self.observations.missing() if machine is None else []
        predicted = np.array([0.0, 0.0, float(bool(missing)), float(False in unobserved),
                              float(True in unobserved)])
        if not missing and machine is not None:
            predicted[:2] = profile.per_loop_time(g, machine), profile.ca_time(g, machine)
        from mpi4py import MPI

        self.session.comm.Allreduce(MPI.IN_PLACE, predicted, op=MPI.MAX)
        if predicted[2:].any():
            return measuring(missing, run_ca=bool(not predicted[2] and not predicted[3] and predicted[4]))
        return choose_ca(per_loop_time=float(predicted[0]), ca_time=float(predicted[1]),
                         basis=calibration.describe(machine))
