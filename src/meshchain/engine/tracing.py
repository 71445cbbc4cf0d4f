"""The trace and its forcing: recording loops, chain blocks, captured steps, running what is pending.

:class:`Tracing` is the part of a session that decides *when* loops run (the session's
:mod:`.pipeline` decides *how*). ``par_loop`` records a loop in the trace (:mod:`.trace`),
inside the chain block or captured step that is open, or as a chain named in the chain
configuration; forcing an object runs the pending loops it depends on; a unit that fails
discards the loops that depend on it and leaves the others pending.

Examples
--------
>>> import meshchain as mc
>>> tracing = mc.get_runtime().tracing
>>> cells = mc.Set(2, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> mc.par_loop(mc.Kernel.from_source("def one(a):\\n    a[0] = 1.0\\n"), cells, q(mc.WRITE))
>>> len(tracing.trace), q.data_ro[:, 0].tolist(), len(tracing.trace)
(1, [1.0, 1.0], 0)
"""

from __future__ import annotations

import sys

from ..core.errors import CaptureError
from ..ir.mixed import expanded, has_mixed
from ..types import Arg
from ..types.mat import MatArg
from .capture import Recording
from .chains import ChainMatcher, ChainRun, load_chain_config, refuse_nesting
from .trace import Trace, dependents

__all__ = ["Tracing"]

_LOOKED_AT = 16  # pending loops Tracing.in_use looks through at most


class Tracing:
    """The trace of pending loops, the chain block or captured step open, and how they run.

    ``loop_of(kernel, iterset, args, name)`` checks a loop (once per structure),
    ``assemble(kernel, iterset, args, name)`` records a matrix assembly, ``execute(run,
    loops)`` runs a unit (the pipeline).
    """

    def __init__(self, config, *, loop_of, assemble, execute):
        self.trace = Trace()
        self.open_run: ChainRun | None = None
        self.capturing: Recording | None = None  # a step being captured (:mod:`.capture`)
        self._loop_of, self._assemble, self._execute = loop_of, assemble, execute
        self.configure(config)

    def configure(self, config) -> None:
        """Take the trace length and the chain configuration of ``config``."""
        chains = getattr(self, "_chains", None)
        self.config, self._trace_length = config, config.trace_length
        if chains is None or config.chains != chains:
            self.matcher = ChainMatcher(load_chain_config(config.chains) if config.chains else ())
        self._chains = config.chains

    # --- recording ----------------------------------------------------------------------------------

    def record(self, kernel, iterset, args, name) -> None:
        """Record ``par_loop(kernel, iterset, *args, name=name)`` (checked once per structure:
        see :mod:`.loops`)."""
        for a in args:
            if type(a) is not Arg:  # matrices, mixed arguments (or not arguments at all: the checks say so)
                if has_mixed(args):
                    kernel, args, name = expanded(kernel, args, name)
                if any(type(a) is MatArg for a in args):
                    if self.capturing is not None:
                        self.capturing.refuse("assembling a matrix")
                    self._assemble(kernel, iterset, args, name)
                    return
                break
        loop = self._loop_of(kernel, iterset, args, name)
        run = self.open_run
        if run is None and self.matcher.specs:
            self._record_matched(loop)
            return
        entries = self.trace.entries  # Trace.append, inline: this runs for every par_loop
        entries.append((loop, run))
        if len(entries) >= self._trace_length:
            self.flush()

    def _record_matched(self, loop) -> None:
        """Record ``loop`` where chains are named in the chain configuration."""
        run, completed = self.matcher.feed(loop.name)
        self.trace.append(loop, run)
        for done in completed:
            self.run_entries(self.trace.take_chain(done))
        if len(self.trace) >= self.config.trace_length:
            self.flush()

    def open_chain(self, options) -> ChainRun:
        """Start recording loops into a chain (``with mc.loop_chain(...)``)."""
        if self.capturing is not None:
            self.capturing.refuse(f"opening loop chain {options.name!r} (pass its options to mc.capture)")
        if self.open_run is not None:
            refuse_nesting(self.open_run, options)
        trace = self.trace
        run = self.open_run = ChainRun(options, (len(trace.entries), trace.removals))
        return run

    def close_chain(self, run: ChainRun, *, force: bool) -> None:
        """End a chain block; run the chain (and what it depends on) unless ``force`` is False
        (the block raised: its loops stay pending, like any recorded loop)."""
        if self.open_run is run:
            self.open_run = None
        if not force:
            return
        trace = self.trace
        loops = trace.take_only(run)
        if loops is not None:  # only its loops were pending
            try:
                self._execute(run, loops)
            except Exception as exc:
                self._after_failure(exc, loops, ())
                raise
            return
        self.run_entries(trace.take_chain(run))

    # --- captured steps (:mod:`.capture`) --------------------------------------------------------------

    def check_step_call(self, options) -> None:
        """Refuse to run (capture or replay) the step of ``options`` while a captured step or a
        loop_chain block is being recorded: its loops would not be part of that recording."""
        if self.open_run is not None:
            what = self.capturing.name if self.capturing is not None else self.open_run.options.name
            raise CaptureError(f"captured step {options.name!r} called while {what!r} is being recorded (a captured "
                               f"step or a loop_chain block); call it outside.")

    def begin_capture(self, options):
        """Record the loops of a step being captured into one chain run: ``(run, recording)``."""
        self.check_step_call(options)
        trace = self.trace
        run = self.open_run = ChainRun(options, (len(trace.entries), trace.removals))
        self.capturing = Recording(options.name)
        self._trace_length = sys.maxsize  # the step's loops are never split by the trace's length
        return run, self.capturing

    def end_capture(self, run, *, keep: bool):
        """Stop recording ``run``: its loops (``keep``), or None with its loops discarded."""
        self.open_run = self.capturing = None
        self._trace_length = self.config.trace_length
        if not keep:
            self.trace.take()
            return None
        return self.trace.take_only(run) or []

    def after_failure(self, exc, loops) -> None:
        """Annotate ``exc``, raised running ``loops``, with what became of the loops pending."""
        self._after_failure(exc, loops, ())

    def in_use(self, obj) -> bool:
        """Whether a pending loop, the chain block open or a step being captured may use ``obj``
        (an object the session keeps for itself is then not changed, :mod:`.arithmetic`). With
        more than :data:`_LOOKED_AT` loops pending the answer is yes without looking (the check
        stays cheaper than making a new object)."""
        entries = self.trace.entries
        if self.capturing is not None or self.open_run is not None or len(entries) > _LOOKED_AT:
            return True
        key = id(obj)
        return any(key in loop.read_ids or key in loop.write_ids for loop, _ in entries)

    # --- forcing ------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Run every pending loop."""
        if self.capturing is not None:
            self.capturing.refuse("running the pending loops (mc.flush, mc.stats, mc.configure, ...)")
        if self.trace:
            self.run_entries(self.trace.take())

    def force_read(self, obj) -> None:
        """Run the pending loops ``obj``'s value depends on."""
        if self.capturing is not None:
            self.capturing.refuse(f"reading the values of {type(obj).__name__} {obj.name!r}")
        if self.trace:
            self.run_entries(self.trace.take_needed(obj, write=False))

    def force_write(self, obj) -> None:
        """Run the pending loops that must see ``obj`` before the user overwrites it."""
        if self.capturing is not None:
            self.capturing.refuse(f"setting the values of {type(obj).__name__} {obj.name!r}")
        if self.trace:
            self.run_entries(self.trace.take_needed(obj, write=True))

    def run_entries(self, entries) -> None:
        """Run trace entries in order: consecutive loops of one chain run as that chain. When
        one unit fails, the loops that depend on it are discarded; the others stay pending."""
        if len(entries) == 1 and entries[0][1] is None:  # one loop on its own
            loop = entries[0][0]
            try:
                self._execute(None, [loop])
            except Exception as exc:
                self._after_failure(exc, [loop], ())
                raise
            return
        units = _units(entries)
        for position, (run, loops) in enumerate(units):
            try:
                self._execute(run, loops)
            except Exception as exc:
                self._after_failure(exc, loops, units[position + 1:])
                raise

    def _after_failure(self, exc, failed, later_units) -> None:
        later = [(loop, run) for run, loops in later_units for loop in loops] + self.trace.take()
        flags = dependents(failed, [entry[0] for entry in later])
        dropped = [entry[0].name for entry, hit in zip(later, flags) if hit]
        kept = [entry for entry, hit in zip(later, flags) if not hit]
        self.trace.extend(kept)
        if dropped:
            exc.add_note(f"meshchain: {len(dropped)} pending loop(s) that depended on the failed one were discarded: "
                         f"{', '.join(dropped)}")
        if kept:
            exc.add_note(f"meshchain: {len(kept)} pending loop(s) that did not depend on it are still pending: "
                         f"{', '.join(entry[0].name for entry in kept)}")



def _units(entries) -> list:
    """Group trace entries into ``(chain or None, [loops])``: consecutive loops of one chain
    form one unit, every other loop its own."""
    units: list = []
    for loop, chain in entries:
        if chain is not None and units and units[-1][0] is chain:
            units[-1][1].append(loop)
        else:
            units.append((chain, [loop]))
    return units
