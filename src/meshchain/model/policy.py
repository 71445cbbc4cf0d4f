"""The decision ``ca="auto"`` takes for one chain: from the calibrated model first, then
re-checked by measuring both variants.

The chain runs communication-avoiding when equation (3) predicts it faster than
equation (2). The inputs (the chain's :class:`~meshchain.model.profile.ChainProfile`
on each rank, the loop costs ``g_l`` and the :class:`~meshchain.model.Machine`) differ
from rank to rank, so the runtime first agrees on the slowest rank's predictions (ranks
that chose differently would wait for messages that never come); this module only
turns agreed numbers into a decision and its explanation.

Once decided, the runtime keeps learning (:class:`~meshchain.engine.auto.Learner`): now
and then it runs a few executions the other way, agrees on the slowest rank's median
time of each variant, and :func:`recheck` switches when the other variant was measured
faster by more than :data:`SWITCH_MARGIN` percent; otherwise the decision is confirmed.
The explanation says when and why.

Examples
--------
>>> from meshchain.model.policy import choose_ca, recheck
>>> decision = choose_ca(per_loop_time=2.0e-3, ca_time=1.5e-3, basis="L = 5.00 µs")
>>> decision.use_ca, decision.gain
(True, 25.0)
>>> print(decision.why)
ca: predicted 1.500 ms per execution against 2.000 ms loop by loop, gain +25.0 % (L = 5.00 µs)
>>> measured = recheck(decision, basis=decision.why, use_ca=True, at=20, per_loop_time=1.2e-3,
...                    ca_time=1.6e-3, per_loop_runs=3, ca_runs=8)
>>> measured.use_ca
False
>>> print(measured.why)  # doctest: +NORMALIZE_WHITESPACE
per-loop: switched at execution 20: measured 1.600 ms per execution communication-avoiding
against 1.200 ms loop by loop (median of 8 and 3 runs, slowest rank); the model had predicted
communication-avoiding (1.500 ms against 2.000 ms loop by loop)
"""

from __future__ import annotations

from typing import NamedTuple

from .equations import gain_percent

__all__ = ["Decision", "choose_ca", "measuring", "recheck", "probing", "SWITCH_MARGIN"]

SWITCH_MARGIN = 5.0  # percent the other variant must be measured faster by for a switch


class Decision(NamedTuple):
    """``use_ca`` and why; the seconds per execution of each variant, predicted (NaN while
    the loop costs are still being measured) or, after a :func:`recheck`, measured; and the
    gain of CA over loop by loop in percent."""

    use_ca: bool
    per_loop_time: float
    ca_time: float
    gain: float
    why: str


def choose_ca(*, per_loop_time: float, ca_time: float, basis: str) -> Decision:
    """Communication-avoiding when it is predicted faster (``basis``: the machine constants
    used, for the explanation)."""
    gain = gain_percent(per_loop_time, ca_time)
    use_ca = ca_time < per_loop_time
    head = "ca" if use_ca else "per-loop"
    why = (f"{head}: predicted {ca_time * 1e3:.3f} ms per execution against {per_loop_time * 1e3:.3f} ms loop by "
           f"loop, gain {gain:+.1f} % ({basis})")
    return Decision(use_ca, per_loop_time, ca_time, gain, why)


def measuring(missing, *, run_ca: bool) -> Decision:
    """The decision while the model lacks numbers: the loop costs ``g_l`` of ``missing``
    loops (run loop by loop to time them), or the runtime's overheads, which need one timed
    execution each way (``run_ca``: the CA one is still missing)."""
    nan = float("nan")
    if missing:
        why = (f"per-loop: measuring first (no cost per iteration yet for {', '.join(missing)}); the model "
               f"decides once every loop and both ways of running have been timed")
    else:
        way = "communication-avoiding" if run_ca else "loop by loop"
        why = (f"{'ca' if run_ca else 'per-loop'}: measuring first (the runtime's overheads need three timed "
               f"executions each way; this one runs {way}); the model decides from then on")
    return Decision(run_ca and not missing, nan, nan, nan, why)


def _way(use_ca: bool) -> str:
    return "communication-avoiding" if use_ca else "loop by loop"


def _head(use_ca: bool) -> str:
    return "ca" if use_ca else "per-loop"


def recheck(model: Decision, *, basis: str, use_ca: bool, at: int, per_loop_time: float, ca_time: float,
            per_loop_runs: int, ca_runs: int, margin: float = SWITCH_MARGIN) -> Decision:
    """Check the current choice ``use_ca`` against measured times (agreed over ranks).

    Parameters
    ----------
    model : Decision
        What the model predicted (quoted when the measurement overrules it).
    basis : str
        What the current choice rests on (the model's explanation, or that of the latest
        switch); a confirmation is added to it.
    use_ca : bool
        The current choice.
    at : int
        The execution at which the check happens (counted from the model's decision).
    per_loop_time, ca_time : float
        Median seconds per execution of each variant (the slowest rank's).
    per_loop_runs, ca_runs : int
        The timed executions each median is of (the fewest of any rank; 0: none).
    margin : float
        Percent by which the other variant must be faster for a switch.

    Returns
    -------
    Decision
        The choice from now on, with the measured times, the measured gain of CA over loop
        by loop, and why: switched, confirmed, or (a variant was not timed on some rank)
        not checked.

    Examples
    --------
    >>> from meshchain.model.policy import choose_ca, recheck
    >>> model = choose_ca(per_loop_time=2.0e-3, ca_time=1.5e-3, basis="L = 5.00 µs")
    >>> kept = recheck(model, basis=model.why, use_ca=True, at=20, per_loop_time=1.55e-3,
    ...                ca_time=1.6e-3, per_loop_runs=3, ca_runs=8)   # 3 % faster: within the margin
    >>> kept.use_ca, round(kept.gain, 1)
    (True, -3.2)
    >>> print(kept.why)  # doctest: +NORMALIZE_WHITESPACE
    ca: predicted 1.500 ms per execution against 2.000 ms loop by loop, gain +25.0 % (L = 5.00 µs);
    confirmed by measurement at execution 20: measured 1.600 ms per execution communication-avoiding
    against 1.550 ms loop by loop (median of 8 and 3 runs, slowest rank), loop by loop not faster by
    more than 5 %
    """
    gain = gain_percent(per_loop_time, ca_time)
    if not per_loop_runs or not ca_runs:
        missing = _way(not ca_runs)
        why = f"{basis}; not checked at execution {at}: {missing} was not timed on some rank"
        return Decision(use_ca, per_loop_time, ca_time, gain, why)
    current, other = (ca_time, per_loop_time) if use_ca else (per_loop_time, ca_time)
    measured = (f"measured {ca_time * 1e3:.3f} ms per execution communication-avoiding against "
                f"{per_loop_time * 1e3:.3f} ms loop by loop (median of {ca_runs} and {per_loop_runs} runs, "
                f"slowest rank)")
    if gain_percent(current, other) > margin:
        why = (f"{_head(not use_ca)}: switched at execution {at}: {measured}; the model had predicted "
               f"{_way(model.use_ca)} ({model.ca_time * 1e3:.3f} ms against {model.per_loop_time * 1e3:.3f} ms "
               f"loop by loop)")
        return Decision(not use_ca, per_loop_time, ca_time, gain, why)
    why = (f"{basis}; confirmed by measurement at execution {at}: {measured}, {_way(not use_ca)} not faster "
           f"by more than {margin:g} %")
    return Decision(use_ca, per_loop_time, ca_time, gain, why)


def probing(basis: str, *, use_ca: bool, at: int, executions: int) -> str:
    """The explanation while executions ``at`` .. ``at + executions - 1`` run the other way
    than the choice ``use_ca`` (resting on ``basis``) to time it.

    Examples
    --------
    >>> from meshchain.model.policy import probing
    >>> probing("ca: predicted ...", use_ca=True, at=17, executions=3)
    'ca: predicted ...; probing loop by loop at executions 17-19 to check the choice by measurement'
    """
    return (f"{basis}; probing {_way(not use_ca)} at executions {at}-{at + executions - 1} to check the choice "
            f"by measurement")
