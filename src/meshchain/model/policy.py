"""The decision ``ca="auto"`` takes for one chain.

The decision must be the same on every rank (ranks that disagree would wait for
messages that never come), so it is taken from quantities every rank agrees on: the
number of exchange rounds each variant needs, which follow from the loops and the
valid depths alone.

Placeholder rule until the calibrated model lands: run communication-avoiding when
that needs fewer exchange rounds than running the loops one by one.

Examples
--------
>>> from meshchain.model.policy import ChainEstimate, choose_ca
>>> choose_ca(ChainEstimate(per_loop_exchanges=6, ca_exchanges=1, segments=1, depth=2))
(True, 'ca: 1 exchange round(s) instead of 6 (placeholder rule: fewer rounds wins)')
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ChainEstimate", "choose_ca"]


class ChainEstimate(NamedTuple):
    """What a chain costs each way, as far as every rank agrees.

    ``per_loop_exchanges``: exchanges (dat, layers) loop-by-loop execution posts;
    ``ca_exchanges``: segments that exchange anything when communication-avoiding;
    ``segments``: segments of the CA plan; ``depth``: its halo depth ``r``.
    """

    per_loop_exchanges: int
    ca_exchanges: int
    segments: int
    depth: int


def choose_ca(estimate: ChainEstimate) -> tuple[bool, str]:
    """``(use_ca, explanation)`` for ``ca="auto"``."""
    rounds = f"{estimate.ca_exchanges} exchange round(s) instead of {estimate.per_loop_exchanges}"
    if estimate.ca_exchanges < estimate.per_loop_exchanges:
        return True, f"ca: {rounds} (placeholder rule: fewer rounds wins)"
    return False, f"per-loop: CA would need {rounds} (placeholder rule: fewer rounds wins)"
