"""A plan run as profiler events: the run, its phases, exchanges and reductions.

:class:`~meshchain.engine.plans.Plan` measures the instants of every step anyway (its
statistics need them); while a profile is recorded (:mod:`meshchain.core.profiling`) it
hands them here. The labels of a plan's events (names, loops, iterations, bytes,
neighbours) are made at its first profiled run and kept on the plan and its steps, so a
profiled run adds a list append per event.

Events are named by the loop (a lone loop, or a chain run loop by loop) or the chain they
belong to: ``update: core``, ``rk: post``, ``rk: wait``; their ``args`` say the rest.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.core import profiling
>>> session = mc.reset_runtime()
>>> cells = mc.Set(4, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> bump = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
>>> with mc.profile() as profile:
...     mc.par_loop(bump, cells, q(mc.RW))
>>> sorted({(e["name"], e["cat"]) for e in profile.events if e["ph"] == "X" and e["cat"] != "compile"})
[('build loop bump', 'build'), ('bump: core', 'phase'), ('loop bump', 'unit')]
"""

from __future__ import annotations

from threading import get_ident

from ..core.profiling import label

__all__ = ["trace_run", "trace_step", "trace_simple"]

# the instants trace_step receives, in order
_S0, _S1, _T0, _T1, _T2, _T3, _T4, _T5, _S6 = range(9)


def trace_run(profiler, plan, began: float, ended: float, agreed: float) -> None:
    """Record ``plan``'s run from ``began`` to ``ended`` and its agreement on failures until ``agreed``."""
    labels = plan.labels
    if labels is None:
        labels = plan.labels = _run_labels(plan)
    profiler.span(labels[0], began, ended)
    if agreed - ended > 0 and plan.comm is not None:
        profiler.span(labels[1], ended, agreed)


def trace_simple(profiler, plan, began: float, ended: float) -> None:
    """Record the run of a plan of one call on one process (its call and the run: one span each)."""
    labels = plan.labels
    if labels is None:
        labels = plan.labels = _run_labels(plan)
    events, ident = profiler.events, get_ident()
    if len(labels) > 2:
        events.append((labels[2], began, ended, ident))
    events.append((labels[0], began, ended, ident))


def _run_labels(plan) -> tuple:
    kind = "chain" if plan.chain else "loop"
    loops = list(plan.account.loops)
    labels = (label(f"{kind} {plan.name}", "unit", loops=loops), label(f"{plan.name}: agree", "agree", loops=loops))
    step = plan.steps[0] if len(plan.steps) == 1 else None
    if step is not None and step.core is not None:  # a plan of one call: its phase's label too
        step.labels = step.labels or _step_labels(plan, step)
        labels += (step.labels.get("core"),) if "core" in step.labels else ()
    return labels


def trace_step(profiler, plan, step, times) -> None:
    """Record the events of ``step`` of ``plan`` from its instants ``times`` (see :mod:`.plans`)."""
    labels = step.labels
    if labels is None:
        labels = step.labels = _step_labels(plan, step)
    span = profiler.span
    if times[_S1] - times[_S0] > 0 and step.settle:
        span(labels["settle"], times[_S0], times[_S1])
    if step.exchanges and not step.posted:
        span(labels["post"], times[_S1], times[_T0])
    if "core" in labels and step.core is not None:
        span(labels["core"], times[_T0], times[_T1])
    if step.exchanges:
        span(labels["wait"], times[_T1], times[_T2])
    if step.tasks is not None:
        span(labels["tasks"], times[_T1], times[_T3])
    elif "rest" in labels and step.rest is not None:
        span(labels["rest"], times[_T2], times[_T3])
    if step.eager:
        span(labels["eager"], times[_T3], times[_T4])
        if "tail" in labels and step.tail is not None:
            span(labels["tail"], times[_T4], times[_T5])
    if step.reductions:
        span(labels["reduce"], times[_T5], times[_S6])


def _step_labels(plan, step) -> dict:
    detail = step.detail
    owner = step.waits if step.waits is not None else plan.name  # loop by loop: the loop; else the chain
    labels = {}
    for phase in ("core", "rest", "tail"):
        runs = detail.get(phase)
        if not runs:
            continue
        redundant = sum(r for _, _, r in runs)
        name = phase if phase != "rest" else "halo" if redundant else "boundary" if step.exchanges else "compute"
        loops = {}
        for loop, iterations, extra in runs:
            counts = loops.setdefault(loop, {"owned": 0, "redundant": 0})
            counts["owned"] += iterations - extra
            counts["redundant"] += extra
        labels[phase] = label(f"{_owner(runs, owner)}: {name}", "phase", loops=loops, phase=name)
    if step.tasks is not None and detail.get("rest"):
        labels["tasks"] = label(f"{_owner(detail['rest'], owner)}: boundary tasks", "phase",
                                loops=labels["rest"].args["loops"], phase="tasks")
    for key, exchanges in (("post", step.exchanges), ("wait", step.exchanges), ("eager", step.eager)):
        if exchanges:
            name = "post" if key in ("post", "eager") else "wait"
            labels[key] = label(f"{owner}: {name}", "exchange", **_exchange_args(exchanges))
    labels["settle"] = label(f"{owner}: settle reductions", "reduction", globals=len(step.settle))
    labels["reduce"] = label(f"{owner}: reduce", "reduction", reductions=len(step.reductions))
    return labels


def _owner(runs, owner: str) -> str:
    """The event's name prefix: the one loop a phase runs, else ``owner`` (the chain)."""
    names = {loop for loop, _, _ in runs}
    return next(iter(names)) if len(names) == 1 else owner


def _exchange_args(exchanges) -> dict:
    neighbours = sorted({int(n) for x in exchanges for n, begin, end in _ranges(x) if end > begin})
    return {"bytes": int(sum(x.bytes_sent for x in exchanges)), "messages": int(sum(x.messages for x in exchanges)),
            "neighbours": neighbours, "exchanges": len(exchanges)}


def _ranges(exchange):
    send = getattr(exchange, "send", None)
    return getattr(send, "ranges", ()) if send is not None else ()
