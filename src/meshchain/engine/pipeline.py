"""Running units: plans as values, looked up by unit and state, built on first use.

:meth:`Pipeline.execute` runs one unit (a single loop, or the loops of one chain). The
first execution of a unit in a given state (the valid halo depth of each of its dats;
the configuration and the mesh layout are part of it too: their changes empty the
plan cache) chooses a strategy (:mod:`.strategies`), builds the schedule (the
inspectors), assembles the executable plan (:mod:`.assemble`) and caches it. Later
executions in the same state look the plan up and run it (:mod:`.plans`): a dict
look-up, a check that the kernels' globals did not change, and the run.

On several ranks, the collective part of building a plan (building deeper halos,
agreeing on ``ca="auto"``) aborts the job if it fails on some ranks only; the rest
(compiling) is agreed on when the plan is assembled, so every rank raises the same error.

Examples
--------
>>> import meshchain as mc
>>> session = mc.reset_runtime()  # a session of its own: no plans of other examples
>>> cells = mc.Set(4, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> bump = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
>>> for _ in range(3):
...     mc.par_loop(bump, cells, q(mc.RW))
...     mc.flush()
>>> plans = mc.get_runtime().pipeline.plans
>>> [(plan.account.runs, plan.steps[0].core.names) for plan in plans.values()]
[(3, ['bump'])]
"""

from __future__ import annotations

import time

from ..comm.agree import abort_all
from ..core import profiling
from ..core.errors import InternalError, MeshchainError, MeshchainWarning
from ..inspector.schedule import MoreLayers
from ..model.estimate import chain_profile
from .accounting import diagnose
from .assemble import assemble
from .strategies import schedule_for
from .tiling import Tiling, refuse_tiling
from .units import Unit, unit_key

__all__ = ["Pipeline"]

_clock = time.perf_counter


class Pipeline:
    """The session's plans and how to run a unit (see the module docstring)."""

    def __init__(self, session):
        self.session = session
        caches = session.caches
        self.units = caches.cache("units", limit=2048, counts_hits=True,
                                  on_drop=lambda _: self._chain_units.clear())
        # a chain's loops found again as the same checked loops (:mod:`.loops` hands out the loop
        # made last time for the same arguments): its unit without working out the unit's key
        self._chain_units = caches.cache("chain units by their loops", limit=1024)
        self.plans = caches.cache("plans", limit=1024, events=("configure", "partition", "repartition"),
                                  on_drop=self._dropped, counts_hits=True)
        self.schedules = caches.cache("schedules", limit=2048, events=("configure", "partition", "repartition"),
                                      counts_hits=True)
        self.sequence = 0

    def execute(self, run, loops) -> Unit:
        """Run ``loops``, recorded in chain ``run`` (None: one loop on its own); returns their unit."""
        units = self.units
        if run is not None:
            same = (run.options, *map(id, loops))
            unit = self._chain_units.get(same)
            if unit is not None and unit.loops == tuple(loops):  # the unit holds its loops: their ids are theirs
                units.hits += 1
                self.run_unit(unit)
                return unit
        options = None if run is None else run.options
        key = unit_key(loops, options)
        unit = units.get(key)
        if unit is None:
            unit = units[key] = Unit(loops, options, self.session.store)
        else:
            units.hits += 1
            unit.bind(loops)
        if run is not None:
            self._chain_units[same] = unit
        self.run_unit(unit)
        return unit

    def run_unit(self, unit, *, replayed: bool = False):
        """Run ``unit`` bound to its latest loops' objects (a captured step replays this way:
        ``replayed``, then on several ranks as the plan's compiled replay where it can,
        :meth:`~meshchain.engine.plans.Plan.run_compiled`). Returns the next replay's quick way where
        there is one: the compiled replay's :meth:`~meshchain.engine.replay.CompiledReplay.again`
        when the run was one, on one process the plan's :meth:`~meshchain.engine.plans.Plan.again`;
        else None."""
        session = self.session
        distributed = session.distributed
        if not distributed:  # the common case first: its plan, bound to these records (or rebound), current
            plan = self.plans.get((unit, None, None))
            if (plan is not None and not (plan.kernels and not plan.current())
                    and (plan.binding.records is unit.records or plan.binding.rebind(plan, unit.records))):
                self.plans.hits += 1
                plan.run()
                return plan.again(self, unit) if replayed else None
        options = unit.options
        state = unit.state() if distributed else None
        mode = learner = None
        if distributed and options is not None and options.ca == "auto":
            mode, learner = self._auto(unit)
        plans = self.plans
        plan_key = (unit, state, mode)
        plan = plans.get(plan_key)
        first = plan is None or bool(plan.kernels and not plan.current())
        if not first and plan.binding.records != unit.records and not self._rebound(plan, unit):
            first = True  # a part of the plan cannot take other objects (see .rebind): built for these
        if first:
            if plan is not None:  # stale (a kernel's module globals changed), or bound to other objects: dropped
                plans.pop(plan_key)  # like an evicted plan (closed, its statistics kept), then built again (a miss)
            plan = self._build(unit, plan_key, mode)
        else:
            plans.hits += 1
        if distributed and options is not None:
            self.sequence += 1
            account = plan.account
            account.sequence = self.sequence  # which of a chain's plans ran last ("mode")
            if replayed and options.ca != "auto" and not first and plan.run_compiled():
                # not observed: the model's driver overheads are those of runs step by step. A ca="auto"
                # step never runs compiled: its learner times every run, and its decision is collective
                return plan.compiled.again(self, unit, state)
            began = _clock()
            plan.run()
            seconds = _clock() - began
            if not first:  # a plan's first run (JIT dispatch, lazy set-up) is never timed
                chain = account.chain
                session.model.observe(chain.mode == "ca", seconds, chain.profile, learner)
            return
        plan.run()

    def profile(self, unit):
        """The model terms of ``unit`` in its current state on this rank (both ways)."""
        per_loop = self._schedule(unit, "per-loop")
        ca = self._schedule(unit, "ca") if unit.options is None or unit.options.ca is not False else None
        return chain_profile(unit.names, per_loop, ca)

    # --- building ---------------------------------------------------------------------------------

    def _rebound(self, plan, unit) -> bool:
        """Bind ``plan`` to ``unit``'s objects of this execution (see :mod:`.rebind`); False: it
        is to be built again. On several ranks every rank can rebind it or none can (agreed
        when it was built): a rank that could not alone aborts the job rather than build alone."""
        binding = plan.binding
        if binding.rebind(plan, unit.records):
            return True
        if self.session.distributed and binding.supported:
            collectively(self.session, f"binding the plan of {_what(unit)} to new objects", lambda: _refuse_unlike(unit))
        return False

    def _auto(self, unit):
        """``(mode, learner)`` of this ``ca="auto"`` execution (see :meth:`~meshchain.engine.auto.ModelState.auto`)."""
        use_ca, learner = self.session.model.auto(unit, self.profile(unit))
        return "ca" if use_ca else "per-loop", learner

    def _strategy(self, unit, mode) -> str:
        session = self.session
        if not session.distributed:
            return "serial"
        if mode is not None:
            return mode
        options = unit.options
        if options is None or options.ca is False:
            return "per-loop"
        return "ca"

    def _schedule(self, unit, strategy: str):
        """``unit``'s schedule under ``strategy`` (cached by unit and state). A chain that needs
        deeper halo layers first gets them here, in a stage of their own before it is scheduled
        again: building layers empties the plan and schedule caches, and nothing of this build
        is in them yet."""
        key = (unit, unit.state() if self.session.distributed else None, strategy)
        schedule = self.schedules.get(key)
        if schedule is not None:
            self.schedules.hits += 1
            return schedule
        session = self.session
        while True:
            schedule = collectively(session, f"planning {_what(unit)}", lambda: schedule_for(session, unit, strategy))
            if not isinstance(schedule, MoreLayers):
                break
            collectively(session, f"building {schedule.depth} halo layers for {_what(unit)}",
                         lambda: _build_layers(session, schedule.depth))
        self.schedules[key] = schedule
        return schedule

    def _build(self, unit, key, mode):
        profiler = profiling.active
        began = _clock() if profiler is not None else 0.0
        plan = self._built(unit, key, mode)
        if profiler is not None:
            profiler.span(profiling.label(f"build {_what(unit).replace(chr(39), '')}", "build", loops=list(unit.names)),
                          began, _clock())
        return plan

    def _built(self, unit, key, mode):
        session = self.session
        strategy = self._strategy(unit, mode)
        schedule = self._schedule(unit, strategy)
        if strategy == "ca":
            _diagnose_split(session, unit, schedule)
        profile = self.profile(unit) if unit.options is not None and session.distributed else None
        tiling = self._tiling(unit, strategy)
        plan = assemble(session, unit, schedule, profile=profile, tiling=tiling)
        session.recorder.attach(plan.account)
        if unit.options is not None and session.distributed:
            session.model.watch(plan.account)
        self.plans[key] = plan
        return plan

    def _tiling(self, unit, strategy: str):
        options = unit.options
        if options is None or options.tile_size is None:
            return None
        tiling = Tiling(options.tile_size, options.name)
        if strategy == "per-loop":
            refuse_tiling(self.session, tiling, "it runs loop by loop (ca=False or the model chose so), an exchange "
                                                "between every two loops, so tiles cannot span loops; it runs untiled")
            return None
        return tiling

    def _dropped(self, plan) -> None:
        self.session.model.predict((plan.account,))
        self.session.recorder.detach(plan.account)
        plan.close()


def collectively(session, what: str, action):
    """Run ``action()``, a step every rank takes together; if it fails on this rank of several,
    print the error and abort every rank (the others would wait in a collective forever)."""
    if not session.distributed:
        return action()
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - reported, then the job ends
        abort_all(session.comm, what, exc)
        raise  # pragma: no cover - Abort does not return


def _build_layers(session, depth: int) -> None:
    """Build halo layers up to ``depth`` (collective: every rank plans the same chain)."""
    if depth <= session.layout.depth:
        raise InternalError(f"the chain inspector asked for {depth} halo layers, which exist")
    session.deepen(depth)


def _refuse_unlike(unit):
    raise MeshchainError(f"the objects of {_what(unit)} are declared alike those its plan was built for, but their "
                         f"storage differs in shape on this rank (an internal error; please report it)")


def _what(unit) -> str:
    return f"loop {unit.names[0]!r}" if unit.options is None else f"chain {unit.options.name!r}"


def _diagnose_split(session, unit, schedule) -> None:
    """Say (once per chain and reason) why a CA chain runs in several segments."""
    import warnings

    reasons = [s.reason for s in schedule.segments if s.reason]
    if not reasons or unit.options is None:
        return
    name, nloops = unit.options.name, len(unit.loops)
    if len(schedule.segments) == nloops and nloops > 1:
        head = (f"[chain-not-ca] loop chain {name!r} cannot run communication-avoiding: every loop needs "
                f"an exchange before it, so it runs loop by loop")
    else:
        head = f"[chain-split] loop chain {name!r} runs as {len(schedule.segments)} segments, one exchange each"
    message = f"{head}: " + "; ".join(dict.fromkeys(reasons))
    if diagnose(session.recorder, name, message) and session.rank == 0:
        warnings.warn(MeshchainWarning(message), stacklevel=2)
