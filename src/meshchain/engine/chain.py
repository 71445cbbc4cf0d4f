"""A loop chain on several ranks: communication-avoiding (Alg. 2), loop by loop, or as
``ca="auto"`` decides; statistics in the paper's terms and diagnostics when a chain
has to be split.
"""

from __future__ import annotations

import warnings

from ..core.errors import MeshchainWarning
from ..model.profile import ChainProfile
from .tiled import refuse_tiling
from .auto import decide, observe, record_prediction
from .estimate import ca_profile, per_loop_profile
from .execute import chain_plan, run_chain_segments, run_loop
from ..partition.distribute import MAX_DEPTH

__all__ = ["run_chain"]


def run_chain(runtime, options, loops, records, chain, tiling=None) -> None:
    """Run ``loops`` as the chain ``options`` describes; ``chain`` is its :class:`ChainStats`;
    ``tiling`` (a :class:`meshchain.engine.tiled.Tiling` or None) tiles every CA phase."""
    limit = min(options.max_halo or MAX_DEPTH, MAX_DEPTH)
    use_ca = options.ca
    plan = signature = None
    if use_ca is not False:
        plan, signature = chain_plan(runtime, loops, limit)
    profile = _profile(runtime, loops, plan, signature)
    _add_per_loop(chain, profile)
    record_prediction(runtime, chain, profile)
    if use_ca == "auto":
        decision = decide(runtime, profile, signature)
        use_ca, chain.decision = decision.use_ca, decision.why
    with observe(runtime, profile, bool(use_ca), records):
        _run(runtime, options, loops, records, chain, tiling, plan, signature, profile, use_ca)


def _run(runtime, options, loops, records, chain, tiling, plan, signature, profile, use_ca) -> None:
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
    _add_measured_per_loop(chain, records, before, profile)


def _profile(runtime, loops, plan, signature) -> ChainProfile:
    """The chain's :class:`ChainProfile` from the current state (cached: it depends only on
    the loops, their dats' valid depths and the halo layers built)."""
    valid = tuple(d._valid_depth for loop in loops for d in loop.data if not d.is_global)
    key = (tuple(id(loop) for loop in loops), valid, runtime.depth, id(plan))
    cached = runtime.chain_profiles.get(key)
    if cached is not None and cached[1] is plan and all(a is b for a, b in zip(cached[0], loops)):
        return cached[2]
    profile = ChainProfile(per_loop_profile(runtime, loops), ca_profile(plan, signature, loops) if plan else ())
    if len(runtime.chain_profiles) >= 1024:
        runtime.chain_profiles.clear()
    runtime.chain_profiles[key] = (tuple(loops), plan, profile)
    return profile


def _add_per_loop(chain, profile) -> None:
    totals = profile.totals()
    chain.per_loop_exchanges += sum(lp.dats for lp in profile.per_loop)
    chain.per_loop_messages += totals["per_loop_messages"]
    chain.per_loop_bytes += totals["per_loop_bytes"]
    chain.per_loop_max_message = max([chain.per_loop_max_message, *(lp.max_message for lp in profile.per_loop)])
    chain.per_loop_core_iterations += totals["per_loop_core"]
    chain.per_loop_iterations += totals["per_loop_iterations"]


def _exchange_counts(records) -> dict:
    return {id(r): (r.exchanges, r.messages, r.bytes_sent, r.time_wait) for r in records}


def _add_measured_per_loop(chain, records, before: dict, profile) -> None:
    """Per-loop mode: the chain's measured exchanges are those its loops made."""
    unique = {id(r): r for r in records}
    for key, record in unique.items():
        exchanges, messages, sent, wait = before[key]
        chain.exchanges += record.exchanges - exchanges
        chain.messages += record.messages - messages
        chain.bytes_sent += record.bytes_sent - sent
        chain.time_wait += record.time_wait - wait
    chain.max_message = max([chain.max_message, *(lp.max_message for lp in profile.per_loop)])
    chain.segments += len(records)
    chain.core_iterations += sum(lp.core for lp in profile.per_loop)
    chain.iterations += sum(lp.iterations for lp in profile.per_loop)
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
