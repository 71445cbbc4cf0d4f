"""The model's view of a chain on this rank: what each way of running it would exchange and
compute, worked out from the halo lists and the chain plans without running anything.

:func:`chain_profile` returns a :class:`~meshchain.model.profile.ChainProfile` for the
loops as they stand now (the valid depths of their dats): loop by loop, each loop
exchanges the dats it reads deeper than they are valid, one message per dat per
neighbour (Alg. 1); communication-avoiding, each segment of the chain plan exchanges
one grouped message per neighbour (Alg. 2, equation 4).
"""

from __future__ import annotations

import numpy as np

from ..inspector.chain import validity_after
from ..model.profile import ChainProfile, LoopProfile, SegmentProfile
from ..comm.p2p import _layers
from .execute import _core, chain_plan

__all__ = ["chain_profile", "per_loop_profile", "ca_profile", "per_loop_rounds"]


def chain_profile(runtime, loops, plan, signature) -> ChainProfile:
    """Both executions of ``loops`` from the current state; ``plan`` and ``signature`` are the
    chain's CA plan (:func:`meshchain.engine.execute.chain_plan`)."""
    return ChainProfile(per_loop_profile(runtime, loops), ca_profile(plan, signature, loops))


def per_loop_profile(runtime, loops) -> tuple:
    """One :class:`LoopProfile` per loop run by Alg. 1, in order."""
    valid = {id(d): d._valid_depth for loop in loops for d in loop.data if not d.is_global}
    profiles = []
    for loop in loops:
        plan, signature = chain_plan(runtime, [loop], limit=max(runtime.depth, 1))
        segment = plan.segments[0]
        objects = signature.by_key()
        stale = [(objects[key], valid[id(objects[key])], need) for key, need in segment.required
                 if valid[id(objects[key])] < need]
        layout = loop.iterset._layout
        profiles.append(_loop_profile(loop.name, stale, _core(layout, segment.thresholds[0]),
                                      layout.exec_end(segment.depths[0])))
        for dat, _, need in stale:
            valid[id(dat)] = need
        local = {key: valid[id(obj)] for key, obj in objects.items() if not obj.is_global}
        local = validity_after(signature.loops[0], segment.depths[0], local, layout.covered)
        for key, depth in local.items():
            valid[id(objects[key])] = depth
    return tuple(profiles)


def per_loop_rounds(profiles) -> int:
    """Exchange rounds loop-by-loop execution needs (loops that exchange anything)."""
    return sum(1 for p in profiles if p.dats)


def _loop_profile(name, stale, core: int, iterations: int) -> LoopProfile:
    per_neighbour: dict[int, int] = {}
    messages = largest = 0
    for dat, lo, hi in stale:
        for neighbour, nbytes in _message_sizes([(dat, lo, hi)]).items():
            per_neighbour[neighbour] = per_neighbour.get(neighbour, 0) + nbytes
            messages += 1
            largest = max(largest, nbytes)
    return LoopProfile(name, core=core, iterations=iterations, dats=len(stale), neighbours=len(per_neighbour),
                       max_message=largest, messages=messages, bytes=sum(per_neighbour.values()))


def ca_profile(plan, signature, loops) -> tuple:
    """One :class:`SegmentProfile` per segment of ``plan`` (each with one grouped exchange)."""
    objects = signature.by_key()
    valid = {key: obj._valid_depth for key, obj in objects.items() if not obj.is_global}
    covered = {key: s._layout.covered for key, s in signature.set_objects().items()}
    profiles = []
    for segment in plan.segments:
        stale = [(key, depth) for key, depth in segment.required if valid[key] < depth]
        sizes = _message_sizes([(objects[key], valid[key], depth) for key, depth in stale])
        chosen = loops[segment.start : segment.end]
        layouts = [loop.iterset._layout for loop in chosen]
        profiles.append(SegmentProfile(
            tuple(loop.name for loop in chosen),
            core=tuple(_core(layout, t) for layout, t in zip(layouts, segment.thresholds)),
            iterations=tuple(layout.exec_end(d) for layout, d in zip(layouts, segment.depths)),
            neighbours=len(sizes), max_message=max(sizes.values(), default=0), messages=len(sizes),
            bytes=sum(sizes.values())))
        valid.update(stale)
        for loop_sig, depth in zip(signature.loops[segment.start : segment.end], segment.depths):
            valid = validity_after(loop_sig, depth, valid, covered[loop_sig.iterset])
    return tuple(profiles)


def _message_sizes(items) -> dict:
    """Bytes sent to each neighbour (those with a non-empty message) to bring each
    ``(dat, lo, hi)`` from valid depth ``lo`` to ``hi``, all in one message."""
    sizes: dict[int, int] = {}
    for dat, lo, hi in items:
        layout = dat.dataset._layout
        row = int(np.prod(dat._host.shape[1:], dtype=np.int64)) * dat._host.dtype.itemsize
        for neighbour in layout.neighbours:
            rows = _layers(layout.exports.get(neighbour), lo, hi).size
            if rows:
                sizes[neighbour] = sizes.get(neighbour, 0) + rows * row
    return sizes

