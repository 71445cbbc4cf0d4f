"""The decision ``ca="auto"`` takes for one chain, from the calibrated model.

The chain runs communication-avoiding when equation (3) predicts it faster than
equation (2). The inputs (the chain's :class:`~meshchain.model.profile.ChainProfile`
on each rank, the loop costs ``g_l`` and the :class:`~meshchain.model.Machine`) differ
from rank to rank, so the runtime first agrees on the slowest rank's predictions (ranks
that chose differently would wait for messages that never come); this module only
turns agreed numbers into a decision and its explanation.

Examples
--------
>>> from meshchain.model.policy import choose_ca
>>> decision = choose_ca(per_loop_time=2.0e-3, ca_time=1.5e-3, basis="L = 5.00 µs")
>>> decision.use_ca, decision.gain
(True, 25.0)
>>> print(decision.why)
ca: predicted 1.500 ms per execution against 2.000 ms loop by loop, gain +25.0 % (L = 5.00 µs)
"""

from __future__ import annotations

from typing import NamedTuple

from .equations import gain_percent

__all__ = ["Decision", "choose_ca", "measuring"]


class Decision(NamedTuple):
    """``use_ca`` and why; the predicted seconds per execution of each variant (NaN while the
    loop costs are still being measured) and the predicted gain in percent."""

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
