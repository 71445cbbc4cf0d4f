"""Pictures of a profile: the timeline of a trace, and each loop's achieved bandwidth.

:func:`timeline` draws what ``mc.profile()`` recorded (:mod:`meshchain.core.profiling`):
one lane per rank (and thread), each plan run of a loop or chain an outlined box, and
inside it its phases, halo exchanges and reductions as coloured bars, one colour per
kind. :func:`bandwidth` draws the bandwidth column of ``mc.stats(summary=True)``
(:mod:`meshchain.core.summary`) beside the machine's copy bandwidth.

Both need matplotlib (``pip install matplotlib``), imported when they are called; both
draw into ``ax`` (default: a new figure) and return the Axes.

Examples
--------
>>> import matplotlib
>>> matplotlib.use("Agg")
>>> import matplotlib.pyplot as plt
>>> import meshchain as mc
>>> from meshchain import plot
>>> cells = mc.Set(1000, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> bump = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
>>> mc.par_loop(bump, cells, q(mc.RW))
>>> with mc.profile() as profile:
...     for _ in range(3):
...         mc.par_loop(bump, cells, q(mc.RW))
>>> ax = plot.timeline(profile)
>>> [label.get_text() for label in ax.get_yticklabels()], ax.get_xlabel()
(['rank 0'], 'time (ms)')
>>> ax = plot.bandwidth(mc.stats(summary=True))
>>> plt.close("all")
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .core.errors import ConfigurationError
from .core.profiling import validate_trace

__all__ = ["timeline", "bandwidth", "KINDS", "CATEGORIES", "kind_of", "trace_events"]

#: The event categories the profiler writes, all drawn by default.
CATEGORIES = ("unit", "phase", "exchange", "reduction", "agree", "build", "compile", "replay")

#: The kinds of bars, in the legend's order: kind -> (colour, legend text).
KINDS = {
    "core": ("#2ca02c", "core (overlaps the exchanges)"),
    "boundary": ("#98df8a", "boundary"),
    "halo": ("#d62728", "halo (redundant CA work)"),
    "tail": ("#bcbd22", "tail"),
    "compute": ("#1f77b4", "compute"),
    "post": ("#ff7f0e", "post (pack, send)"),
    "wait": ("#9467bd", "wait (receive, unpack)"),
    "reduction": ("#17becf", "reduction"),
    "agree": ("#7f7f7f", "agree on failures"),
    "build/compile": ("#8c564b", "build, compile"),
    "replay": ("#f7b6d2", "replay (captured step)"),
}

_PHASES = ("core", "boundary", "halo", "tail", "compute")
_LANE = 0.8  # height of a lane's outermost bar (lanes are 1 apart)
_NESTED = 0.8  # each level of nesting is this much lower


def _pyplot():
    """matplotlib.pyplot, or a ConfigurationError saying how to install it."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigurationError(f"meshchain.plot draws with matplotlib, which is not installed here ({exc}); "
                                 f"install it: pip install matplotlib") from exc
    return plt


def _axes(ax, size):
    if ax is not None:
        return ax
    return _pyplot().subplots(figsize=size, layout="constrained")[1]


# --- the timeline ----------------------------------------------------------------------------------


def trace_events(trace) -> list:
    """The events of ``trace``: a trace file's path, a parsed trace (a dict with
    ``traceEvents``), a list of events, or what ``mc.profile()`` yields (its ``events``).
    Raises :class:`~meshchain.core.errors.ConfigurationError` on anything else, or on
    events that are not a trace meshchain writes.

    >>> trace_events({"traceEvents": [{"name": "a", "ph": "X", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]})
    [{'name': 'a', 'ph': 'X', 'ts': 0, 'dur': 1, 'pid': 0, 'tid': 0}]
    """
    document = trace
    if hasattr(trace, "events") and not isinstance(trace, dict):
        document = list(trace.events)
    elif isinstance(trace, (str, os.PathLike)):
        path = Path(trace)
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"there is no trace file {path} (mc.profile(path) or MESHCHAIN_PROFILE=path "
                                     f"writes one)") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigurationError(f"cannot read the trace {path} as trace-event JSON: {exc}") from exc
    if isinstance(document, (list, tuple)):  # the JSON array format, or events
        document = {"traceEvents": list(document)}
    if not isinstance(document, dict):
        raise ConfigurationError(f"a trace is a trace file's path, a parsed trace (a dict with traceEvents), a list "
                                 f"of events or what mc.profile() yields, not {type(trace).__name__}")
    problems = validate_trace(document)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigurationError(f"not a meshchain trace: {'; '.join(problems[:3])}{more}")
    return document["traceEvents"]


def kind_of(event: dict) -> str | None:
    """The kind of bar ``event`` is drawn as: ``"run"`` (a plan run, outlined), a key of
    :data:`KINDS`, or None (not a meshchain event: not drawn).

    >>> kind_of({"name": "stage: halo", "cat": "phase", "args": {"phase": "halo"}})
    'halo'
    >>> kind_of({"name": "stage: wait", "cat": "exchange"}), kind_of({"name": "compile update", "cat": "compile"})
    ('wait', 'build/compile')
    """
    cat, name = event.get("cat"), event.get("name", "")
    if cat == "unit":
        return "run"
    if cat == "phase":
        phase = (event.get("args") or {}).get("phase") or name.rpartition(": ")[2]
        return "boundary" if phase in ("tasks", "boundary tasks") else phase if phase in _PHASES else "compute"
    if cat == "exchange":
        return "wait" if name.endswith("wait") else "post"
    if cat in ("reduction", "agree", "replay"):
        return cat
    if cat in ("build", "compile"):
        return "build/compile"
    return None


def timeline(trace, *, ax=None, start=None, end=None, categories=CATEGORIES):
    """Draw a profile's timeline: one lane per rank (and thread), time in milliseconds.

    Each plan run of a loop or chain is an outlined box; its phases (core, boundary, halo:
    the redundant work of a communication-avoiding chain, tail, compute), its halo
    exchanges (post, wait), its reductions and the ranks' agreement, plan builds,
    compilations and captured replays are bars coloured by kind (:data:`KINDS`), an event
    inside another drawn lower over it. Times are those of the trace (milliseconds from
    the start of the profile, all ranks together).

    Parameters
    ----------
    trace : str, Path, dict, list or Profile
        A trace file (``mc.profile(path)``, ``MESHCHAIN_PROFILE``), a parsed one, its
        events, or what ``with mc.profile() as p`` yields.
    ax : matplotlib Axes, optional
        Where to draw; default: a new figure.
    start, end : float, optional
        The time window in milliseconds: only events overlapping it are drawn.
    categories : str or iterable of str
        The event categories drawn (default: all of :data:`CATEGORIES`).

    Returns
    -------
    matplotlib.axes.Axes
        With one rectangle (``ax.patches``) per event drawn.

    Raises
    ------
    ConfigurationError
        A trace that is not one, no events, an unknown category, an empty window, or no
        matplotlib.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> from meshchain.plot import timeline
    >>> events = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
    ...           {"name": "loop update", "cat": "unit", "ph": "X", "ts": 0, "dur": 900, "pid": 0, "tid": 0},
    ...           {"name": "update: post", "cat": "exchange", "ph": "X", "ts": 0, "dur": 100, "pid": 0, "tid": 0},
    ...           {"name": "update: core", "cat": "phase", "ph": "X", "ts": 100, "dur": 500, "pid": 0, "tid": 0},
    ...           {"name": "update: wait", "cat": "exchange", "ph": "X", "ts": 600, "dur": 300, "pid": 0, "tid": 0}]
    >>> ax = timeline(events, end=0.5)          # the first half millisecond: the wait is left out
    >>> len(ax.patches), [float(x) for x in ax.get_xlim()]
    (3, [0.0, 0.5])
    >>> plt.close(ax.figure)
    """
    wanted = {categories} if isinstance(categories, str) else set(categories)
    unknown = sorted(wanted - set(CATEGORIES))
    if unknown:
        raise ConfigurationError(f"unknown event categories {unknown}: the profiler records {list(CATEGORIES)}")
    if start is not None and end is not None and not start < end:
        raise ConfigurationError(f"the time window is empty: start {start} ms is not before end {end} ms")
    events = trace_events(trace)
    complete = [e for e in events if e["ph"] == "X" and e.get("cat") in CATEGORIES]
    if not complete:
        raise ConfigurationError("the trace has no events to draw: nothing ran inside the profile")
    lanes = _lanes(events, complete)
    drawn = [(e, depth) for e, depth in _nesting(complete) if e.get("cat") in wanted and _overlaps(e, start, end)]
    axes = _axes(ax, (12, 1.2 + 0.6 * len(lanes)))
    _draw_bars(axes, drawn, lanes)
    _label_lanes(axes, lanes)
    first = min(e["ts"] for e in complete) / 1e3
    last = max(e["ts"] + e["dur"] for e in complete) / 1e3
    axes.set_xlim(first if start is None else start, last if end is None else end)
    axes.set_xlabel("time (ms)")
    return axes


def _lanes(events, complete) -> dict:
    """(pid, tid) -> (row, label), rank 0's main thread first."""
    names = {(e["pid"], e.get("tid", 0), e["name"]): e["args"].get("name") for e in events if e["ph"] == "M"}
    keys = sorted({(e["pid"], e["tid"]) for e in complete})
    threads = {}
    for pid, tid in keys:
        threads[pid] = threads.get(pid, 0) + 1
    lanes = {}
    for row, (pid, tid) in enumerate(keys):
        text = names.get((pid, 0, "process_name")) or f"rank {pid}"
        if threads[pid] > 1:
            text += f" {names.get((pid, tid, 'thread_name')) or f'thread {tid}'}"
        lanes[pid, tid] = (row, text)
    return lanes


def _nesting(complete):
    """Each event with its depth: how many events of its lane enclose it."""
    out = []
    by_lane: dict = {}
    for e in complete:
        by_lane.setdefault((e["pid"], e["tid"]), []).append(e)
    for lane in by_lane.values():
        open_ends: list = []
        for e in sorted(lane, key=lambda e: (e["ts"], -e["dur"], e.get("cat") != "unit")):  # a run encloses
            while open_ends and open_ends[-1] <= e["ts"] + 1e-3:  # ends before this starts (1 ns of rounding)
                open_ends.pop()
            out.append((e, len(open_ends)))
            open_ends.append(e["ts"] + e["dur"])
    return out


def _overlaps(event, start, end) -> bool:
    ts, te = event["ts"] / 1e3, (event["ts"] + event["dur"]) / 1e3
    return (start is None or te >= start) and (end is None or ts <= end)


def _draw_bars(ax, drawn, lanes) -> None:
    groups: dict = {}
    for e, depth in drawn:
        kind = kind_of(e)
        if kind is not None:
            groups.setdefault(kind, []).append((e, depth))
    for kind in ["run", *KINDS]:
        members = groups.get(kind)
        if not members:
            continue
        rows = [lanes[e["pid"], e["tid"]][0] for e, _ in members]
        heights = [_LANE * _NESTED ** depth for _, depth in members]
        widths = [e["dur"] / 1e3 for e, _ in members]
        lefts = [e["ts"] / 1e3 for e, _ in members]
        if kind == "run":
            bars = ax.barh(rows, widths, left=lefts, height=heights, fill=False, edgecolor="black", linewidth=0.6,
                           label="run of a loop or chain")
        else:
            colour, text = KINDS[kind]
            bars = ax.barh(rows, widths, left=lefts, height=heights, color=colour, linewidth=0, label=text)
        for bar, (_, depth) in zip(bars, members):
            bar.set_zorder(2 + depth)


def _label_lanes(ax, lanes) -> None:
    rows = [row for row, _ in lanes.values()]
    ax.set_yticks(rows, [text for _, text in lanes.values()])
    ax.set_ylim(max(rows) + 0.6, min(rows) - 0.6)  # the first lane on top
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)


# --- the bandwidth bars ----------------------------------------------------------------------------


def bandwidth(summary, *, ax=None):
    """Draw each loop's achieved bandwidth from ``mc.stats(summary=True)``, slowest loop on top.

    A loop's bandwidth is the bytes its accesses must move (all ranks) over the slowest
    rank's compute time; the dashed line is the machine's copy bandwidth (a large copy,
    read plus write, on one rank while every rank copies), the most a loop bound by memory
    can reach on one rank; on several ranks a dotted line shows it times the number of
    ranks, the bound of the ranks together. Loops without compute time are left out.

    Parameters
    ----------
    summary : Summary or dict
        What ``mc.stats(summary=True)`` returns, or its ``as_dict()`` (read back from JSON).
    ax : matplotlib Axes, optional
        Where to draw; default: a new figure.

    Returns
    -------
    matplotlib.axes.Axes
        One bar (``ax.patches``) per loop, the copy bandwidth a line labelled ``copy ...``
        (and on several ranks one labelled ``<ranks> ranks x copy ...``).

    Raises
    ------
    ConfigurationError
        Not a summary, no loop with a measured bandwidth, or no matplotlib.

    Examples
    --------
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> import matplotlib.pyplot as plt
    >>> from meshchain.plot import bandwidth
    >>> summary = {"ranks": 1, "copy_bandwidth": 10e9, "loops": {
    ...     "update": {"gbytes_per_second": 6.0, "time_max": 0.5, "percent": 40.0},
    ...     "res_calc": {"gbytes_per_second": 3.0, "time_max": 0.7, "percent": 56.0}}}
    >>> ax = bandwidth(summary)
    >>> [label.get_text() for label in ax.get_yticklabels()], [line.get_label() for line in ax.get_lines()]
    (['res_calc', 'update'], ['copy 10.0 GB/s'])
    >>> plt.close(ax.figure)
    """
    rows, copy, ranks = _bandwidth_rows(summary)
    rows.sort(key=lambda r: -r[2])
    axes = _axes(ax, (8, 1.2 + 0.45 * len(rows)))
    positions = range(len(rows))
    bars = axes.barh(positions, [r[1] for r in rows], color="#1f77b4", height=0.6)
    for bar, (_, rate, seconds, percent) in zip(bars, rows):
        share = f", {percent:.0f} % of the time" if math.isfinite(percent) else ""
        axes.annotate(f" {rate:.2f} GB/s{share}", (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                          va="center", fontsize="small")
    if copy > 0:
        each = " per rank" if ranks > 1 else ""
        axes.axvline(copy / 1e9, color="#d62728", linestyle="--", label=f"copy {copy / 1e9:.1f} GB/s{each}")
        if ranks > 1:  # the loops' bandwidth is all ranks' bytes: beside it, all ranks copying at once
            axes.axvline(ranks * copy / 1e9, color="#d62728", linestyle=":",
                             label=f"{ranks} ranks x copy: {ranks * copy / 1e9:.1f} GB/s")
        axes.legend(loc="lower right", fontsize="small")
    axes.set_yticks(list(positions), [r[0] for r in rows])
    axes.set_ylim(len(rows) - 0.5, -0.5)  # the slowest loop on top
    axes.set_xlim(0, 1.45 * max([max(ranks, 1) * copy / 1e9] + [r[1] for r in rows]))
    axes.set_xlabel("achieved GB/s (bytes moved / slowest rank's compute time)")
    axes.set_title(f"loops by time, {ranks} rank{'s' if ranks != 1 else ''}")
    return axes


def _bandwidth_rows(summary):
    """[(name, GB/s, max seconds, percent)] of the loops with a bandwidth, copy bytes/s, ranks."""
    if hasattr(summary, "as_dict") and not isinstance(summary, dict):
        summary = summary.as_dict()
    if not isinstance(summary, dict) or not isinstance(summary.get("loops"), dict):
        raise ConfigurationError(f"bandwidth() draws what mc.stats(summary=True) returns (or its as_dict()), "
                                 f"not {type(summary).__name__}")
    rows = []
    for name, row in summary["loops"].items():
        try:
            rate = float(row["gbytes_per_second"])
            seconds = float(row.get("time_max", 0.0))
            percent = float(row.get("percent", math.nan))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"loop {name!r} of the summary has no bandwidth (gbytes_per_second): "
                                     f"{exc!r}") from None
        if math.isfinite(rate):
            rows.append((str(name), rate, seconds, percent))
    if not rows:
        raise ConfigurationError("the summary has no loop with a measured bandwidth: no loop computed since the "
                                 "statistics began (mc.stats(reset=True) clears them)")
    return rows, float(summary.get("copy_bandwidth") or 0.0), int(summary.get("ranks", 1))
