"""A loop chain on several ranks: communication-avoiding (Alg. 2), loop by loop, or as
``ca="auto"`` decides; statistics in the paper's terms and diagnostics when a chain
has to be split.
"""

from __future__ import annotations

import warnings

from ..errors import MeshchainWarning
from ..model import ChainEstimate, choose_ca
from ..tiled import refuse_tiling
from .execute import chain_plan, per_loop_estimate, run_chain_segments, run_loop
from .partition import MAX_DEPTH

__all__ = ["run_chain"]


def run_chain(runtime, options, loops, records, chain, tiling=None) -> None:
    """Run ``loops`` as the chain ``options`` describes; ``chain`` is its :class:`ChainStats`;
    ``tiling`` (a :class:`meshchain.tiled.Tiling` or None) tiles every CA phase."""
    limit = min(options.max_halo or MAX_DEPTH, MAX_DEPTH)
    use_ca = options.ca
    plan = signature = None
    if use_ca is not False:
        plan, signature = chain_plan(runtime, loops, limit)
    estimate = per_loop_estimate(runtime, loops)
    _add_per_loop(chain, estimate)
    if use_ca == "auto":
        ca_rounds = sum(1 for s in plan.segments if s.required)
        use_ca, why = choose_ca(ChainEstimate(estimate["rounds"], ca_rounds, len(plan.segments), plan.depth))
        chain.decision = why
    if use_ca:
        _diagnose(runtime, chain, options, plan, len(loops))
        chain.mode = "ca"
        run_chain_segments(runtime, loops, plan, signature, records, chain, tiling)
        return
    chain.mode = "per-loop"
    if tiling is not None:
        refuse_tiling(runtime, tiling, "it runs loop by loop (ca=False or the model chose so), an exchange between "
                                       "every two loops, so tiles cannot span loops; it runs untiled")
    before = _exchange_counts(records)
    for loop, record in zip(loops, records):
        run_loop(runtime, loop, record)
    _add_measured_per_loop(chain, records, before, estimate)


def _add_per_loop(chain, estimate: dict) -> None:
    chain.per_loop_exchanges += estimate["exchanges"]
    chain.per_loop_messages += estimate["messages"]
    chain.per_loop_bytes += estimate["bytes"]
    chain.per_loop_max_message = max(chain.per_loop_max_message, estimate["max_message"])
    chain.per_loop_core_iterations += estimate["core_iterations"]
    chain.per_loop_iterations += estimate["iterations"]


def _exchange_counts(records) -> dict:
    return {id(r): (r.exchanges, r.messages, r.bytes_sent, r.time_wait) for r in records}


def _add_measured_per_loop(chain, records, before: dict, estimate: dict) -> None:
    """Per-loop mode: the chain's measured exchanges are those its loops made."""
    unique = {id(r): r for r in records}
    for key, record in unique.items():
        exchanges, messages, sent, wait = before[key]
        chain.exchanges += record.exchanges - exchanges
        chain.messages += record.messages - messages
        chain.bytes_sent += record.bytes_sent - sent
        chain.time_wait += record.time_wait - wait
    chain.max_message = max(chain.max_message, estimate["max_message"])
    chain.segments += len(records)
    chain.core_iterations += estimate["core_iterations"]
    chain.iterations += estimate["iterations"]
    chain.depth = max(chain.depth, 1)


def _diagnose(runtime, chain, options, plan, nloops: int) -> None:
    """Say (once per chain and reason) why a CA chain runs in several segments."""
    reasons = [s.reason for s in plan.segments if s.reason]
    if not reasons:
        return
    if len(plan.segments) == nloops and nloops > 1:
        head = (f"[chain-not-ca] loop chain {options.name!r} cannot run communication-avoiding: every loop needs "
                f"an exchange before it, so it runs loop by loop")
    else:
        head = (f"[chain-split] loop chain {options.name!r} runs as {len(plan.segments)} segments, one exchange "
                f"each")
    message = f"{head}: " + "; ".join(dict.fromkeys(reasons))
    if chain.diagnose(message) and runtime.comm.rank == 0:
        warnings.warn(MeshchainWarning(message), stacklevel=2)
