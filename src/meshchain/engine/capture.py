"""Captured steps: a step's loops recorded once, then replayed as a whole.

``step = mc.capture(fn)`` records what ``fn(*args)`` does the first time it is called
with these arguments: its parallel loops become one chain (with the options given to
``capture``), executed at once. Every later call with the same arguments replays that
chain: ``fn`` does not run again, no loop is recorded or looked up, and the plan runs
as it was built (on one process the whole step is one compiled call; on several ranks
Python runs only at the plan's exchanges and reductions, which overlap the computation
as they do uncaptured, until the step has been replayed
:data:`~meshchain.engine.replay.COMPILE_AFTER` times: then the plan, exchanges included,
is one compiled call too where it can be, :mod:`.replay`). ``step(...)`` returns what ``fn`` returned when it was captured:
the same objects, holding the new values.

What a replay repeats, and what it checks:

* **Arguments.** Dats, globals and other objects are compared by identity, numbers and
  strings by value, NumPy arrays by content. Other arguments than last time capture the
  step again (the last 8 captures of a step are kept).
* **Objects made inside the step** (a new ``mc.Global`` per reduction, a temporary
  ``mc.Dat``) are made once, at capture; each replay starts them from the values they
  were made with, so an ``INC`` reduction into a new Global sums from its initial value
  every time (a temporary first written whole, directly, by a loop over its own set
  needs no restoring and gets none).
* **Structure.** ``mc.configure``, ``mc.partition``, ``mc.repartition`` (anything that
  empties the plan caches) and a new session make the next call capture again; a kernel
  whose module globals changed is compiled again, as uncaptured. A stale step is never
  replayed.
* **Python between loops is not repeated, so it is refused**: reading or setting a value
  (``dat.data``, ``glob.value``), ``mc.flush()``, a ``loop_chain`` block or a matrix
  assembly inside the step raise :class:`~meshchain.core.errors.CaptureError` (compute
  such values in a kernel, or outside the step). The Python control flow on reduction
  results (a convergence test) belongs outside: read ``glob.value`` after ``step()``.

Loops pending when a step is called run first, in order. A step that raises while it is
captured records nothing: its loops are discarded and the next call captures again.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes = mc.Set(4, "nodes")
>>> u = mc.Dat(nodes, 1, np.arange(4.0), "u")
>>> @mc.kernel
... def scale(a):
...     a[0] *= 2.0
>>> @mc.kernel
... def accumulate(a, s):
...     s[0] += a[0]
>>> @mc.capture
... def step(field):
...     mc.par_loop(scale, nodes, field(mc.RW))
...     norm = mc.Global(1, 0.0, "norm")           # made once; each replay starts it at 0
...     mc.par_loop(accumulate, nodes, field(mc.READ), norm(mc.INC))
...     return norm
>>> [float(step(u).value[0]) for _ in range(3)]
[12.0, 24.0, 48.0]
>>> step.captures, step.replays
(1, 2)
"""

from __future__ import annotations

import numpy as np

from ..core import profiling
from ..core.access import Access
from ..core.errors import CaptureError
from ..core.storage import GlobalStorage
from ..comm.agree import values_if_different
from ..types._checks import check_count

__all__ = ["CapturedStep", "Recording"]

_KEPT = 8  # captures kept per step (one per distinct arguments)
_SCALARS = (int, float, bool, complex, str, bytes, type(None))


class Recording:
    """What the session notes while a step is captured: the objects declared inside it."""

    __slots__ = ("name", "made")

    def __init__(self, name: str):
        self.name, self.made = name, []

    def refuse(self, what: str):
        """Raise the error for ``what`` done inside the step."""
        raise CaptureError(f"captured step {self.name!r}: {what} inside a captured step cannot be replayed (a "
                           f"replay runs the step's loops only, not its Python); compute it in a kernel, or do it "
                           f"before or after calling the step.")


class CapturedStep:
    """A function whose loops are captured once and replayed (see the module docstring).

    Attributes
    ----------
    fn : callable
    options : ChainOptions
        How the step's chain runs (its name, ``ca``, ``tile_size``, ``max_halo``).
    captures : int
        Times the step was captured (called with new arguments, or after a change of structure).
    replays : int
        Times a capture was replayed.
    """

    __slots__ = ("fn", "options", "captures", "replays", "_session_of", "_kept", "__wrapped__")

    def __init__(self, fn, options, session_of):
        """``session_of()``: the session to run in (the current one, at each call)."""
        self.fn, self.options, self._session_of = fn, options, session_of
        self.captures = self.replays = 0
        self._kept: dict = {}
        self.__wrapped__ = fn  # what inspect.signature and help() show

    def __repr__(self) -> str:
        return f"CapturedStep({self.options.name!r}, captures={self.captures}, replays={self.replays})"

    def __call__(self, *args, **kwargs):
        session = self._session_of()
        tracing = session.tracing
        if tracing.open_run is not None:
            tracing.check_step_call(self.options)
        key = arguments_key(args, kwargs) if args or kwargs else ()
        capture = self._kept.get(key)
        if capture is None or capture.session is not session or capture.generation != session.caches.generation:
            return self._capture(session, key, args, kwargs)
        if tracing.trace.entries:
            session.flush()
        rerun = capture.rerun  # the quick way where nothing is restored first and nothing changed
        try:
            ran = rerun is not None and not capture.restores and rerun()
        except Exception as exc:  # as a replay the slow way reports it
            session.after_failure(exc, capture.loops)
            raise
        if not ran:
            capture.replay()
        self.replays += 1
        return capture.result

    def repeat(self, times: int, /, *args, **kwargs):
        """Call the step ``times`` times with the same arguments, as ``for _ in range(times):
        step(*args, **kwargs)`` does; returns what the calls return.

        On one process, once the step has been replayed, the remaining replays run in one
        compiled call with no Python between them (as Devito runs a time loop inside its
        operator), where the step's plan is one compiled call (the numba backend), nothing is
        restored between replays (no object made inside the step that its loops change without
        first overwriting it whole) and no profiler or hang diagnostics watch. Otherwise, and
        on several ranks (where replays are compiled already, :mod:`.replay`), the replays run
        one after another, as the calls would. ``times`` must be a positive integer, the same
        on every rank (checked on every rank, so that none waits for replays others skip). A
        compiled run of replays cannot be interrupted (Ctrl-C is seen when it returns): repeat
        in blocks where that matters.

        Examples
        --------
        >>> import numpy as np, meshchain as mc
        >>> nodes = mc.Set(3, "nodes")
        >>> u = mc.Dat(nodes, 1, np.ones(3), "u")
        >>> @mc.kernel
        ... def halve(a):
        ...     a[0] *= 0.5
        >>> @mc.capture
        ... def step():
        ...     mc.par_loop(halve, nodes, u(mc.RW))
        >>> step.repeat(10)
        >>> u.data_ro[:, 0].tolist(), step.replays
        ([0.0009765625, 0.0009765625, 0.0009765625], 9)
        """
        session = self._session_of()
        error = None
        try:
            times = check_count(times, f"captured step {self.options.name!r}: repeat's times", minimum=1,
                                error=CaptureError)
        except CaptureError as exc:
            error = exc
        if session.distributed:
            differing = values_if_different(session.comm, None if error is not None else times, error)
            if differing is not None:
                raise CaptureError(f"captured step {self.options.name!r}: repeat's times differ between ranks: "
                                   f"{differing}; every rank must repeat the step as often.")
        elif error is not None:
            raise error
        key = arguments_key(args, kwargs) if args or kwargs else ()
        result, done = self(*args, **kwargs), 1
        while done < times:
            if self._replayed_in_one_call(session, key, times - done):
                break
            result, done = self(*args, **kwargs), done + 1
        return result

    def _replayed_in_one_call(self, session, key, count: int) -> bool:
        """Replay the capture of ``key`` ``count`` times in one compiled call where it can be
        (see :meth:`repeat`); False with nothing run where it cannot."""
        capture = self._kept.get(key)
        if (session.distributed or capture is None or capture.rerun is None or capture.restores
                or capture.session is not session or capture.generation != session.caches.generation):
            return False
        rerun = capture.rerun
        try:
            return rerun(count)
        except Exception as exc:  # as a replay reports it
            session.after_failure(exc, capture.loops)
            raise
        finally:
            self.replays += rerun.done

    def _capture(self, session, key, args, kwargs):
        self._kept.pop(key, None)
        session.tracing.check_step_call(self.options)
        session.flush()  # pending loops run first: the trace then holds the step's loops only
        run, recording = session.begin_capture(self.options)
        try:
            result = self.fn(*args, **kwargs)
        except BaseException:
            session.end_capture(run, keep=False)
            raise
        loops = session.end_capture(run, keep=True)
        if not loops:
            raise CaptureError(f"captured step {self.options.name!r} recorded no parallel loop: there is nothing to "
                               f"replay (call the function itself).")
        capture = _Capture(session, run, loops, recording.made, result, (args, kwargs))
        capture.execute_first()
        capture.generation = session.caches.generation  # after its plans were built (a CA chain may deepen halos)
        if len(self._kept) >= _KEPT:
            self._kept.pop(next(iter(self._kept)))
        self._kept[key] = capture
        self.captures += 1
        return result


class _Capture:
    """One capture: its chain's loops and unit, the objects made inside it with their initial
    values, and what the function returned."""

    __slots__ = ("session", "run", "loops", "unit", "globals", "dats", "restores", "result", "arguments", "generation",
                 "label", "rerun")

    def __init__(self, session, run, loops, made, result, arguments):
        self.session, self.run, self.loops, self.result = session, run, tuple(loops), result
        self.arguments = arguments  # kept alive: the key holds their identities
        self.unit, self.generation = None, -1
        self.label = None  # the profiler's label of a replay, made at the first profiled one
        self.rerun = None  # runs the last replay's compiled plan again where nothing changed (CompiledReplay.again)
        self.globals, self.dats = _initial_values(session, self.loops, made)
        self.restores = bool(self.globals or self.dats)

    def execute_first(self) -> None:
        session = self.session
        try:
            self.unit = session.pipeline.execute(self.run, self.loops)
        except Exception as exc:
            session.after_failure(exc, self.loops)
            raise
        self.loops = self.unit.loops

    def replay(self) -> None:
        profiler = profiling.active
        began = profiling._clock() if profiler is not None else 0.0
        if self.restores:
            self._restore()
        unit, session = self.unit, self.session
        if unit.loops is not self.loops:  # the unit ran other objects meanwhile (a step alike)
            unit.bind(self.loops)
        try:
            rerun = self.rerun
            if rerun is None or not rerun():
                self.rerun = session.pipeline.run_unit(unit, replayed=True)
        except Exception as exc:
            session.after_failure(exc, self.loops)
            raise
        finally:
            if profiler is not None:
                if self.label is None:
                    self.label = profiling.label(f"replay {self.run.options.name}", "replay", loops=list(unit.names))
                profiler.span(self.label, began, profiling._clock())

    def _restore(self) -> None:
        """Put the objects made inside the step back to the values they were made with."""
        for storage, initial in self.globals:
            if storage.pending is not None:
                storage.settle()
            np.copyto(storage.value, initial)
        for storage, initial, depth in self.dats:
            np.copyto(storage.host_current(write=True), initial)
            storage.valid_depth = depth


def _initial_values(session, loops, made):
    """``(globals, dats)``: each object made inside the step and changed by its loops, with the
    values (and for a dat the valid halo depth) a replay restores first."""
    first, changed = {}, set()
    for loop in loops:
        for arg in loop.args:
            key = id(arg.data)
            if key not in first:
                first[key] = _overwritten_whole(loop, arg.data)
            if arg.access is not Access.READ:
                changed.add(key)
    globals_, dats = [], []
    for obj in made:
        key = id(obj)
        if key not in changed or first[key]:  # not changed by the step, or first written whole
            continue
        storage = session.storage(obj)
        if isinstance(storage, GlobalStorage):
            storage.settle()
            globals_.append((storage, storage.value.copy()))
        else:
            dats.append((storage, storage.host_current(write=False).copy(), storage.valid_depth))
    return tuple(globals_), tuple(dats)


def _overwritten_whole(loop, obj) -> bool:
    """Whether ``loop``, the first of the step to use ``obj``, writes every row of the dat
    ``obj`` directly and reads none (then nothing of its old values survives)."""
    if obj.is_global or loop.iterset is not obj.dataset:
        return False
    return all(arg.map is None and arg.access is Access.WRITE for arg in loop.args if arg.data is obj)


def arguments_key(args, kwargs) -> tuple:
    """What tells a step's calls apart: objects by identity, scalars by value, arrays by content.

    >>> import numpy as np
    >>> arguments_key((1.5, "a", np.arange(2)), {}) == arguments_key((1.5, "a", np.arange(2)), {})
    True
    >>> thing = object()
    >>> arguments_key((thing,), {}) == arguments_key((object(),), {})
    False
    """
    key = tuple([_key_of(value) for value in args])
    if kwargs:
        key += tuple(sorted((name, _key_of(value)) for name, value in kwargs.items()))
    return key


def _key_of(value):
    kind = type(value)
    if kind in _SCALARS or isinstance(value, np.generic):
        return kind, value
    if kind is tuple or kind is list:
        return kind, tuple([_key_of(item) for item in value])
    if kind is np.ndarray:
        return kind, value.dtype.str, value.shape, value.tobytes()
    return kind, id(value)
