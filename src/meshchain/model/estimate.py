"""A chain's model terms on this rank, read off its schedules (nothing is run for them).

:func:`chain_profile` turns the loop-by-loop schedule of a chain (Alg. 1, one segment per
loop) and its communication-avoiding schedule (Alg. 2, one grouped exchange per segment),
both built from the same state by :mod:`meshchain.inspector.schedule`, into a
:class:`~meshchain.model.profile.ChainProfile`: ``S^c``, ``S^1`` / ``S^h``, ``d_l``, ``p``,
``m^1`` / ``m^r`` and the messages and bytes each way would send.

Examples
--------
>>> from meshchain.inspector.schedule import ExchangeSpec, Schedule, Segment
>>> sent = ExchangeSpec(((0, 0, 1),), False, ((1, 80), (2, 40)))
>>> per_loop = Schedule("per-loop", (Segment((0,), (1,), (120,), (sent,), (90,), (), (), (), ()),))
>>> profile = chain_profile(("flux",), per_loop, None)
>>> lp = profile.per_loop[0]
>>> lp.core, lp.iterations, lp.dats, lp.neighbours, lp.max_message, lp.messages, lp.bytes
(90, 120, 1, 2, 80, 2, 120)
"""

from __future__ import annotations

from .profile import ChainProfile, LoopProfile, SegmentProfile

__all__ = ["chain_profile"]


def chain_profile(names, per_loop, ca) -> ChainProfile:
    """Both executions of the chain whose loops are called ``names``; ``ca`` may be None."""
    return ChainProfile(tuple(_loop(names, segment) for segment in per_loop.segments),
                        () if ca is None else tuple(_segment(names, segment) for segment in ca.segments))


def _loop(names, segment) -> LoopProfile:
    sizes = [size for exchange in segment.exchanges for size in exchange.sizes]
    return LoopProfile(names[segment.loops[0]], core=segment.cores[0], iterations=segment.iterations[0],
                       dats=sum(len(exchange.items) for exchange in segment.exchanges),
                       neighbours=len({neighbour for neighbour, _ in sizes}),
                       max_message=max((nbytes for _, nbytes in sizes), default=0), messages=len(sizes),
                       bytes=sum(nbytes for _, nbytes in sizes))


def _segment(names, segment) -> SegmentProfile:
    sizes = [size for exchange in segment.exchanges for size in exchange.sizes]
    return SegmentProfile(tuple(names[p] for p in segment.loops), core=tuple(segment.cores),
                          iterations=tuple(segment.iterations), neighbours=len(sizes),
                          max_message=max((nbytes for _, nbytes in sizes), default=0), messages=len(sizes),
                          bytes=sum(nbytes for _, nbytes in sizes))
