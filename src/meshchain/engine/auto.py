"""The model in the engine: ``ca="auto"``'s decision, predictions in ``mc.stats()``, and the
timed executions the runtime's overheads are fitted from.

Every chain execution on several ranks is kept as an
:class:`~meshchain.model.overheads.Observation` (to fit the runtime's overheads ``o_r`` and
``o_l``). Once a calibration is known (``mc.model.calibrate()`` now, or saved by an
earlier run under the same :class:`~meshchain.model.keys.CalibrationKey`: host, rank count,
network, transport, progress mode and threads) the runs of communication-avoiding chain
plans from then on are predicted both ways, from the calibration alone: its constants,
loop costs and overheads were fitted on executions *before* the runs they predict, never
on the runs the prediction is compared with (``mc.stats()`` says so). The model's work is
done when statistics are read (or ``ca="auto"`` decides), never on a chain's execution path.

``ca="auto"`` needs ``g_l`` for every loop and the overheads: until it has them it runs
the chain each way to time it (the decision says so). Then it agrees on the slowest
rank's predictions (one small ``Allreduce``), chooses, and remembers the choice for the
chain, so later executions cost one look-up.

Then it keeps learning from the executions' own timings (a :class:`Learner` per chain,
not per state: which way an execution ran sets the halo state the next one starts from,
so each state would only ever see one variant; executions are counted from the model's
decision). After :data:`FIRST_CHECK` executions the next :data:`PROBES` run the other way
(one more when that variant has not run yet: a plan's first run is never timed, so its
JIT dispatch and set-up never count); at the execution after them the ranks agree
(one ``Allreduce``) on the slowest rank's median of each variant's latest timings, and
:func:`~meshchain.model.policy.recheck` switches when the other variant was measured faster
by more than :data:`~meshchain.model.policy.SWITCH_MARGIN` percent. A switch checks again
after :data:`FIRST_CHECK` executions; a confirmation doubles the interval (up to
:data:`LONGEST_INTERVAL`), so a stable decision soon costs a few probes per thousand
executions. The schedule depends only on execution counts, the same on every rank, so
every rank probes, checks and switches at the same execution.

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
import socket
from collections import deque

import numpy as np

from ..comm.progress import async_progress_enabled
from ..comm.world import network_label
from ..model.calibrate import calibration_path, load_calibration, loop_costs, measure, overlap_of
from ..model.keys import CalibrationKey
from ..model.overheads import Observation, Observations, fit_overheads
from ..model.policy import SWITCH_MARGIN, choose_ca, measuring, probing, recheck
from .accounting import decided

__all__ = ["ModelState", "Learner", "FIRST_CHECK", "LONGEST_INTERVAL", "PROBES", "KEEP"]

REFIT_EVERY = 16  # observations between two fits of the overheads
FIRST_CHECK = 16  # executions of a decided chain before its first check (and after a switch)
LONGEST_INTERVAL = 1024  # the longest interval between two checks (doubled after each confirmation)
PROBES = 3  # timed executions of the other variant before a check
KEEP = 8  # latest timings kept of each variant


class ModelState:
    """The session's model: calibration, observations, decisions (see the module docstring)."""

    def __init__(self, session):
        self.session = session
        self.calibration = None  # meshchain.model.Calibration, set by calibrate() or loaded
        self.looked_up = None  # the key the calibration was looked up (or measured) for
        self.observations = Observations()
        self._fitted = None  # (calibration, observations seen, g, Machine with fitted overheads)
        self.decisions = session.caches.cache("ca decisions", limit=1024,
                                              events=("configure", "partition", "repartition"))

    # --- calibration ------------------------------------------------------------------------------

    def key(self) -> CalibrationKey:
        """The session's :class:`~meshchain.model.keys.CalibrationKey` now (no MPI call)."""
        session = self.session
        transport, progress = session.communication.planned() if session.distributed else ("-", "-")
        return CalibrationKey(socket.gethostname(), session.size, network_label(), transport, progress,
                              session.backend.threads_in_use())

    def current_calibration(self, *, measure_now: bool = False):
        """The calibration set by ``mc.model.calibrate()``, else the saved one for the session's
        key (looked up again when the key changed: another transport, progress mode or
        thread count); with ``measure_now`` (collective) the network is measured now if
        neither exists."""
        key = self.key()
        if self.looked_up != key:
            self.calibration = load_calibration(key, cache_dir=self.session.config.cache_dir)
            self.looked_up = key
            if self.calibration is not None:
                self._calibrated()
        if self.calibration is None and measure_now:
            self.calibrate(save=True, repeats=30, sizes=None)
        return self.calibration

    def calibrate(self, *, save: bool, repeats: int, sizes, apply: bool = False):
        """Measure the machine on the session's communicator (collective) and use the result;
        ``apply``: also switch to the fastest transport and progress mode (:meth:`apply`)."""
        session = self.session
        comm = session.comm
        if comm is None:
            from mpi4py import MPI

            comm = MPI.COMM_SELF
        key = self.key()
        previous = load_calibration(key, cache_dir=session.config.cache_dir)
        path = calibration_path(session.config.cache_dir, key) if save else None
        options = {} if sizes is None else {"sizes": sizes}
        calibration = measure(comm, costs=loop_costs(session.recorder), observations=self.observations,
                              previous=previous, path=path, key=key, repeats=repeats,
                              ca_costs=loop_costs(session.recorder, ca=True), **options)
        self._use(calibration)
        return self.apply(calibration) if apply else calibration

    def apply(self, calibration):
        """Switch the session to ``calibration``'s fastest transport and progress mode (those
        its backend can use; collective through ``mc.configure``) and use the calibration as
        it holds afterwards: ``applied`` says what changed; where something did, ``φ`` is the
        new progress mode's and the overheads (fitted under the old settings) are dropped."""
        session = self.session
        if not session.distributed:
            return self._use(dataclasses.replace(calibration, applied={"nothing": "one process sends no messages"}))
        if not calibration.transport:
            return self._use(dataclasses.replace(calibration, applied={"nothing": "no transport was measured"}))
        before = session.communication.planned()
        usable_progress = (calibration.progress in session.backend.progress_modes
                           and (calibration.progress != "thread" or async_progress_enabled()))
        wanted = (calibration.transport if calibration.transport in session.backend.transports else before[0],
                  calibration.progress if usable_progress else before[1])
        session.reconfigure(transport=wanted[0], progress=wanted[1])
        applied = {name: (old, new) for name, old, new in zip(("transport", "progress"), before, wanted)}
        changed = wanted != before
        machine = calibration.machine
        if changed:
            machine = dataclasses.replace(machine, overlap=overlap_of(wanted[1], calibration.overlaps),
                                          round_overhead=0.0, loop_overhead=0.0)
        return self._use(dataclasses.replace(calibration, machine=machine, applied=applied,
                                             overheads=calibration.overheads and not changed,
                                             session_transport=wanted[0], session_progress=wanted[1]))

    def _use(self, calibration):
        self.calibration = calibration
        self.looked_up = calibration.key
        self._calibrated()
        return calibration

    def fitted(self, calibration, *, fresh: bool = False):
        """``(g, ca_g, machine)``: loop costs loop by loop and communication-avoiding (measured in
        this run where a loop ran, else calibrated) and the calibrated machine with the
        overheads fitted from this run's observations (when it has enough of both kinds), else
        the calibration's own (machine None when it has none). Refitted every
        :data:`REFIT_EVERY` observations, or when ``fresh``."""
        observations = self.observations
        cached = self._fitted
        if (cached is not None and not fresh and cached[0] is calibration
                and observations.added - cached[1] < REFIT_EVERY):
            return cached[2:]
        recorder = self.session.recorder
        g = {**calibration.costs(ca=False), **loop_costs(recorder)}
        ca_g = {**calibration.costs(ca=True), **loop_costs(recorder, ca=True)}
        if observations.missing():
            machine = calibration.machine if calibration.overheads else None
        else:
            machine = dataclasses.replace(calibration.machine, round_overhead=0.0, loop_overhead=0.0)
            o_r, o_l = fit_overheads(observations.residuals(g, machine, ca_g))
            machine = dataclasses.replace(machine, round_overhead=o_r, loop_overhead=o_l)
        self._fitted = (calibration, observations.added, g, ca_g, machine)
        return g, ca_g, machine

    # --- per execution ----------------------------------------------------------------------------

    def observe(self, ca: bool, seconds: float, profile, learner=None) -> None:
        """Keep a timed execution of a chain on several ranks (never a plan's first run: the
        caller leaves those out); ``learner``: the :class:`Learner` of a ``ca="auto"`` chain,
        which gets the timing too."""
        self.observations.add(Observation(ca, seconds, profile))
        if learner is not None:
            learner.record(ca, seconds)

    def watch(self, account) -> None:
        """Predict the runs of a new chain plan from now on when a calibration is known (its
        predictions are worked out when statistics are read: :meth:`predict`)."""
        if account.chain is not None and account.chain.profile is not None and account.chain.profile.ca:
            account.predicted_from = 0 if self.current_calibration() is not None else None

    def predict(self, accounts) -> None:
        """Set each account's predicted seconds per run, both ways, on this rank, from the
        calibration alone (its loop costs and fitted overheads come from executions before
        the runs it predicts; nothing where it lacks numbers)."""
        calibration = self.calibration
        if calibration is None or not calibration.overheads:
            return
        g, ca_g = calibration.costs(ca=False), calibration.costs(ca=True)
        basis = f"{calibration.describe()}; fitted on executions before the ones predicted"
        for account in accounts:
            if account.predicted_from is None:
                continue
            profile = account.chain.profile
            account.prediction = None
            if not profile.missing(g):
                account.prediction = (profile.per_loop_time(g, calibration.machine),
                                      profile.ca_time(ca_g, calibration.machine), basis)

    def _calibrated(self) -> None:
        """A calibration became known: the runs of live chain plans are predicted from now on."""
        for account in self.session.recorder.accounts:
            if account.predicted_from is None and account.chain is not None and account.chain.profile is not None \
                    and account.chain.profile.ca:
                account.predicted_from = account.runs

    # --- ca="auto" --------------------------------------------------------------------------------

    def use_ca(self, unit, profile) -> bool:
        """``ca="auto"`` for this execution of ``unit`` (collective; the same on every rank)."""
        return self.auto(unit, profile)[0]

    def auto(self, unit, profile):
        """``(use_ca, learner)`` for this execution of ``unit`` under ``ca="auto"``: the choice
        for the chain (the model's, from ``profile`` in the state of the execution that
        decided, until measurements overrule it), or a probe of the other variant; checks
        it first when a check is due (collective; the same on every rank). ``learner`` (None
        while the model is measuring) is to be given the execution's timing (:meth:`observe`)."""
        key = unit
        learner = self.decisions.get(key)
        recorder = self.session.recorder
        if learner is None:
            decision = self._decide(profile)
            if decision.gain != decision.gain:  # NaN: still measuring; decide again next time
                decided(recorder, unit.chain, decision.why)
                return decision.use_ca, None
            learner = self.decisions[key] = Learner(decision)
        use_ca = learner.next(self._agree)
        decided(recorder, unit.chain, learner.why)
        return use_ca, learner

    def _agree(self, values):
        """``values`` maximised over the ranks (collective)."""
        from mpi4py import MPI

        self.session.comm.Allreduce(MPI.IN_PLACE, values, op=MPI.MAX)
        return values

    def _decide(self, profile):
        calibration = self.current_calibration(measure_now=True)
        g, ca_g, machine = self.fitted(calibration, fresh=True)
        missing = profile.missing(g)
        unobserved = self.observations.missing() if machine is None else []
        predicted = np.array([0.0, 0.0, float(bool(missing)), float(False in unobserved),
                              float(True in unobserved)])
        if not missing and machine is not None:
            predicted[:2] = profile.per_loop_time(g, machine), profile.ca_time(ca_g, machine)
        from mpi4py import MPI

        self.session.comm.Allreduce(MPI.IN_PLACE, predicted, op=MPI.MAX)
        if predicted[2:].any():
            return measuring(missing, run_ca=bool(not predicted[2] and not predicted[3] and predicted[4]))
        return choose_ca(per_loop_time=float(predicted[0]), ca_time=float(predicted[1]),
                         basis=calibration.describe(machine))


class Learner:
    """``ca="auto"``'s choice for one chain, re-checked from timed executions.

    ``model`` is the model's :class:`~meshchain.model.policy.Decision`, ``use_ca`` the current
    choice and ``why`` its explanation; ``executions`` counts the executions since the model
    decided, ``probes`` those that ran the other way to time it, ``switches`` the executions
    at which the choice changed; ``times`` holds this rank's latest seconds per execution of
    each variant (``False``: loop by loop, ``True``: CA). Every execution asks :meth:`next`
    which way to run, then hands its timing to :meth:`record` (not for a plan's first run).
    Checks are collective through ``agree`` (maximum over ranks, in place); the schedule is
    described in the module docstring.

    Examples
    --------
    >>> from meshchain.model.policy import choose_ca
    >>> learner = Learner(choose_ca(per_loop_time=2e-3, ca_time=1e-3, basis="model"), interval=4)
    >>> ways = []
    >>> for _ in range(12):
    ...     use_ca = learner.next(lambda values: values)   # one rank: nothing to agree with
    ...     ways.append(use_ca)
    ...     learner.record(use_ca, 1e-3 if use_ca else 5e-4)  # loop by loop is measured faster
    >>> "".join("C" if way else "L" for way in ways)   # probes at 5-8, the check at 9 switches
    'CCCCLLLLLLLL'
    >>> learner.switches, learner.probes
    ([9], 4)
    >>> learner.why.split(":")[:2]
    ['per-loop', ' switched at execution 9']
    """

    __slots__ = ("model", "use_ca", "why", "basis", "executions", "interval", "first_interval", "probe_at",
                 "check_at", "probing", "probes", "checks", "switches", "ran", "times", "margin")

    def __init__(self, decision, *, interval: int = FIRST_CHECK, margin: float = SWITCH_MARGIN):
        self.model, self.use_ca, self.why, self.basis = decision, decision.use_ca, decision.why, decision.why
        self.executions = self.probes = self.checks = self.probing = 0
        self.interval = self.first_interval = interval
        self.probe_at, self.check_at = interval + 1, -1
        self.switches: list[int] = []
        self.ran = {False: 0, True: 0}  # executions each way since the model decided
        self.times = {False: deque(maxlen=KEEP), True: deque(maxlen=KEEP)}
        self.margin = margin

    def next(self, agree) -> bool:
        """Whether this execution runs communication-avoiding: the choice, or a probe of the
        other variant; checks the choice first when one is due (collective: ``agree``)."""
        self.executions += 1
        n = self.executions
        if self.probing:
            return self._probe()
        if n == self.check_at:
            self._check(agree)
        elif n == self.probe_at:
            other = not self.use_ca
            self.probing = PROBES + (self.ran[other] == 0)  # a first run is not timed
            self.why = probing(self.basis, use_ca=self.use_ca, at=n, executions=self.probing)
            return self._probe()
        self.ran[self.use_ca] += 1
        return self.use_ca

    def record(self, ca: bool, seconds: float) -> None:
        """This rank's seconds for an execution that ran ``ca``."""
        self.times[ca].append(seconds)

    def _probe(self) -> bool:
        other = not self.use_ca
        self.probing -= 1
        self.probes += 1
        self.ran[other] += 1
        if not self.probing:
            self.check_at = self.executions + 1  # once the last probe's timing is in
        return other

    def _check(self, agree) -> None:
        n, times = self.executions, self.times
        values = agree(np.array([_median(times[False]), _median(times[True]), -len(times[False]),
                                 -len(times[True])], dtype=np.float64))
        decision = recheck(self.model, basis=self.basis, use_ca=self.use_ca, at=n, per_loop_time=float(values[0]),
                           ca_time=float(values[1]), per_loop_runs=int(-values[2]), ca_runs=int(-values[3]),
                           margin=self.margin)
        self.checks += 1
        if decision.use_ca != self.use_ca:
            self.switches.append(n)
            self.use_ca, self.basis, self.interval = decision.use_ca, decision.why, self.first_interval
        elif values[2] and values[3]:  # confirmed (not: a variant untimed on some rank)
            self.interval = min(2 * self.interval, LONGEST_INTERVAL)
        self.why = decision.why
        times[not self.use_ca].clear()  # the next check times the other variant afresh
        self.probe_at = n + self.interval


def _median(values) -> float:
    return float(np.median(values)) if values else 0.0
