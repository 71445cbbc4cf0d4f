"""The profiler: a timeline of what the session runs, as a Chrome trace-event file.

``with mc.profile("trace.json"):`` (or ``MESHCHAIN_PROFILE=trace.json``, or
``mc.configure(profile=...)`` for the whole run) records every plan run of a loop or
chain, its phases, its halo exchanges (posting and waiting, with bytes and neighbours),
its reductions over ranks, plan builds, compilations and captured replays, and writes
them in the trace-event format that Perfetto (https://ui.perfetto.dev) and
``chrome://tracing`` read: one process track per rank, one thread track per thread.

What is recorded (``cat`` of each event):

``unit``
    One run of a plan: ``loop update`` or ``chain rk`` (wall clock of the whole run).
``phase``
    A computing phase of a run: ``core`` (the iterations that need no received halo,
    run while the exchanges are in flight), ``boundary`` (the owned iterations that need
    them), ``halo`` (a phase with iterations on the exec halo: the redundant work of a
    communication-avoiding chain, or of a loop that increments through maps) and ``tail``
    (owned iterations run after the next exchange is posted); ``compute`` in a step that
    exchanges nothing. ``args`` give per loop the
    iterations (``owned`` and ``redundant``). A phase of several loops is one compiled
    call; its time is one event.
``exchange``
    ``post`` (pack and start) and ``wait`` (complete and unpack) of halo exchanges, with
    ``bytes`` sent, ``messages`` and ``neighbours``.
``reduction``
    ``reduce`` (settling earlier reductions, starting this step's over ranks) and
    ``reduction wait`` (a Global read waiting for its reduction over ranks).
``agree``
    The ranks agreeing on failures after a run.
``build``, ``compile``, ``replay``
    A plan built (its schedule, inspectors, compilation), a kernel compiled or loaded
    from the cache, a captured step replayed.

Recording costs a clock read and a list append per event (hot paths test
:data:`active`, one module attribute, when nothing is recorded). Timestamps are
microseconds from the start of the profile, which all ranks take together (a barrier).

Examples
--------
>>> from meshchain.core.profiling import Profiler, label
>>> profiler = Profiler(None)
>>> profiler.span(label("core", "phase", loops={"update": 4}), profiler.origin, profiler.origin + 1e-3)
>>> [(e["name"], e["ph"], e["dur"]) for e in profiler.trace_events() if e["ph"] == "X"]
[('core', 'X', 1000.0)]
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from pathlib import Path
from typing import NamedTuple

from .errors import ConfigurationError, OutputError

__all__ = ["Profiler", "Label", "label", "active", "start", "stop", "record", "validate_trace", "loop_seconds"]

_clock = time.perf_counter

#: The profiler recording now, or None. Hot paths read this one name.
active: "Profiler | None" = None


class Label(NamedTuple):
    """What an event is: its ``name``, category ``cat`` and ``args`` (made once, reused)."""

    name: str
    cat: str
    args: dict


def label(name: str, cat: str, **args) -> Label:
    """A :class:`Label` (``args`` as keywords).

    >>> label("post", "exchange", bytes=64).args
    {'bytes': 64}
    """
    return Label(name, cat, args)


class Profiler:
    """Events recorded on this rank, and how to write them (see the module docstring).

    ``path``: where :meth:`write` puts the trace (None: kept in memory only); ``comm``: the
    session's communicator on several ranks (rank 0 writes every rank's events unless the
    path contains ``{rank}``).
    """

    def __init__(self, path, *, comm=None):
        self.path = None if path is None else Path(path)
        self.comm = comm if comm is not None and comm.size > 1 else None
        self.rank = 0 if self.comm is None else self.comm.rank
        self.events: list = []  # (Label, start, end, thread ident)
        if self.comm is not None:
            self.comm.Barrier()  # every rank's clock starts here: ranks line up in the trace
        self.origin = _clock()
        self.wall_origin = time.time()
        self.closed_at = None

    def span(self, what: Label, start: float, end: float) -> None:
        """Record ``what`` from ``start`` to ``end`` (``time.perf_counter()`` seconds)."""
        self.events.append((what, start, end, threading.get_ident()))

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = _clock()

    # --- writing ------------------------------------------------------------------------------------

    def trace_events(self) -> list:
        """This rank's events in the trace-event format (dicts), with the track names."""
        origin, pid = self.origin, self.rank
        threads = {}
        for _, _, _, ident in self.events:
            threads.setdefault(ident, len(threads))
        main = threading.main_thread().ident
        out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}},
               {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
        for ident, tid in threads.items():
            name = "main" if ident == main else f"thread {tid}"
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        for what, start, end, ident in self.events:
            event = {"name": what.name, "cat": what.cat, "ph": "X", "ts": round((start - origin) * 1e6, 3),
                     "dur": round(max(end - start, 0.0) * 1e6, 3), "pid": pid, "tid": threads[ident]}
            if what.args:
                event["args"] = what.args
            out.append(event)
        return out

    def write(self) -> Path | None:
        """Write the trace (collective on several ranks); returns the path written on this rank
        (None: nothing written here)."""
        self.close()
        events = self.trace_events()
        path = self.path
        if path is None:
            return None
        per_rank = "{rank}" in str(path)
        if self.comm is not None and not per_rank:
            gathered = self.comm.gather(events, root=0)
            if self.rank != 0:
                return None
            events = [e for rank_events in gathered for e in rank_events]
        if per_rank:
            path = Path(str(path).replace("{rank}", str(self.rank)))
        document = {"traceEvents": events, "displayTimeUnit": "ms",
                    "otherData": {"producer": "meshchain", "ranks": 1 if self.comm is None else self.comm.size,
                                  "seconds": (self.closed_at or _clock()) - self.origin,
                                  "started": self.wall_origin}}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(document))
        except OSError as exc:
            raise OutputError(f"cannot write the profile to {path}: {exc}") from exc
        return path


def start(path, *, comm=None) -> Profiler:
    """Make a :class:`Profiler` the :data:`active` one (collective on several ranks)."""
    global active
    if active is not None:
        raise ConfigurationError(f"a profile is already being recorded (to {active.path or 'memory'}); profiles do "
                                 f"not nest: end that one first (mc.configure(profile=None) ends a session-wide one)")
    active = Profiler(path, comm=comm)
    return active


def stop(profiler: Profiler) -> None:
    """Stop recording into ``profiler`` (it stays readable and writable)."""
    global active
    profiler.close()
    if active is profiler:
        active = None


def record(what: Label, start_time: float) -> None:
    """Record ``what`` from ``start_time`` to now in the active profiler (if any)."""
    profiler = active
    if profiler is not None:
        profiler.span(what, start_time, _clock())


def loop_seconds(events) -> dict:
    """Seconds per loop of the plan runs in ``events`` (trace events, any ranks), summed over
    ranks: each phase's time shared out to its loops by iterations, and the rest of each run
    (exchanges, reductions, agreeing) to its loops in proportion to their phase time (evenly
    when it computed nothing); plus the waits for a loop's reductions over ranks outside its
    runs (reading a global: ``reduction wait`` events naming the loop). Their sum is the
    time of the runs and of those waits.

    >>> from meshchain.core.profiling import loop_seconds
    >>> events = [{"name": "loop a", "cat": "unit", "ph": "X", "ts": 0, "dur": 10, "pid": 0, "tid": 0,
    ...            "args": {"loops": ["a"]}},
    ...           {"name": "a: core", "cat": "phase", "ph": "X", "ts": 1, "dur": 8, "pid": 0, "tid": 0,
    ...            "args": {"loops": {"a": {"owned": 4, "redundant": 0}}}}]
    >>> {name: round(seconds * 1e6, 6) for name, seconds in loop_seconds(events).items()}   # microseconds
    {'a': 10.0}
    """
    totals: dict = {}
    runs = [e for e in events if e.get("ph") == "X" and e.get("cat") == "unit"]
    phases: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "phase":
            phases.setdefault((e["pid"], e["tid"]), []).append(e)
    for track in phases.values():
        track.sort(key=lambda e: e["ts"])
    spans: dict = {}
    for run in runs:
        spans.setdefault((run["pid"], run["tid"]), []).append((run["ts"], run["ts"] + run["dur"]))
    for track in spans.values():
        track.sort()
    for wait in events:
        loops = wait.get("args", {}).get("loops") if wait.get("cat") == "reduction" and wait.get("ph") == "X" else None
        if loops and wait["name"].endswith("reduction wait") and not _inside(wait, spans):
            for name in loops:
                totals[name] = totals.get(name, 0.0) + wait["dur"] * 1e-6 / len(loops)
    for run in runs:
        start, end = run["ts"], run["ts"] + run["dur"]
        inside = [p for p in phases.get((run["pid"], run["tid"]), ()) if start <= p["ts"] and p["ts"] + p["dur"] <= end]
        shares = dict.fromkeys(run.get("args", {}).get("loops", ()), 0.0)
        for phase in inside:
            counts = {name: c["owned"] + c["redundant"] for name, c in phase["args"]["loops"].items()}
            whole = sum(counts.values()) or 1
            for name, count in counts.items():
                shares[name] = shares.get(name, 0.0) + phase["dur"] * count / whole
        computed = sum(shares.values())
        rest = run["dur"] - computed
        for name, share in shares.items():
            part = share / computed if computed > 0 else 1 / len(shares)
            totals[name] = totals.get(name, 0.0) + (share + rest * part) * 1e-6
    return totals


def _inside(event, spans) -> bool:
    """Whether ``event`` lies within one of the runs ``spans`` of its track (counted there)."""
    track = spans.get((event["pid"], event["tid"]))
    if not track:
        return False
    start = event["ts"]
    at = bisect.bisect_right(track, (start, float("inf"))) - 1  # the last run that began by then
    return at >= 0 and start + event["dur"] <= track[at][1]


#: Event phases this library writes, and the keys each needs.
_REQUIRED = {"X": ("name", "ph", "ts", "dur", "pid", "tid"), "M": ("name", "ph", "pid", "args")}


def validate_trace(document) -> list:
    """The problems of ``document`` (a parsed trace-event JSON object) as a Chrome trace
    written by this module: a ``traceEvents`` list of complete (``X``) and metadata (``M``)
    events, numeric non-negative times, integer ``pid``/``tid``, dict ``args``. Empty: valid.

    >>> validate_trace({"traceEvents": [{"name": "a", "ph": "X", "ts": 0, "dur": -1, "pid": 0, "tid": 0}]})
    ['event 0 (a): dur -1 is not a non-negative number']
    """
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return ["the document is not an object with a traceEvents list"]
    problems = []
    for i, event in enumerate(document["traceEvents"]):
        if not isinstance(event, dict):
            problems.append(f"event {i} is not an object")
            continue
        phase = event.get("ph")
        if phase not in _REQUIRED:
            problems.append(f"event {i}: phase {phase!r} is not one of {sorted(_REQUIRED)}")
            continue
        missing = [key for key in _REQUIRED[phase] if key not in event]
        if missing:
            problems.append(f"event {i} ({event.get('name')}): lacks {missing}")
            continue
        if not isinstance(event["name"], str):
            problems.append(f"event {i}: name is not a string")
        for key in ("pid", "tid"):
            if key in event and (isinstance(event[key], bool) or not isinstance(event[key], int)):
                problems.append(f"event {i} ({event['name']}): {key} {event[key]!r} is not an integer")
        for key in ("ts", "dur"):
            value = event.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                problems.append(f"event {i} ({event['name']}): {key} {value!r} is not a non-negative number")
        if "args" in event and not isinstance(event["args"], dict):
            problems.append(f"event {i} ({event['name']}): args is not an object")
    return problems
