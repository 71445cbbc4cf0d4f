"""Short sums over ranks in one message round per doubling (recursive doubling).

A solver's block reduction (an s-step method's Gram matrix: a few dozen float64 values)
is latency-bound. MPICH's ``MPI_Allreduce`` picks reduce-scatter then allgather for any
count of at least the largest power of two of the ranks: two message rounds on two ranks
where one would do. Over MPICH's TCP module on this project's machines a sum of 2 to 64
float64 values on 2 ranks took 19-36 µs that way against 11-20 µs in one ``Sendrecv``
round; over shared memory both take about 3.8 µs (``benchmarks/comm.py --parts sums``
measures it).

:func:`pairwise_sum` sums by recursive doubling: ranks pair up in ``log2 p`` rounds
(``p`` the largest power of two not above the size; the ranks beyond it first add theirs
into a partner and get the total back at the end). Every rank ends with the same bits: a
pair adds the same two numbers (addition is commutative), and later rounds add equal
partial sums. On two ranks these are also the bits of ``MPI_Allreduce`` (one addition per
value); on more ranks the sums are grouped as the rounds pair them, which may differ from
MPI's grouping in the last bit.

Collective over ``comm``: every rank calls it in the same order with as many values. Its
messages carry the tag :data:`TAG`, which nothing else in meshchain sends with, so they
never match another message.

Examples
--------
>>> import numpy as np
>>> from mpi4py import MPI
>>> pairwise_sum(MPI.COMM_SELF, np.array([1.0, 2.0])).tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["pairwise_sum", "short_sum", "phases", "TAG"]

TAG = 32613
"""The tag of :func:`pairwise_sum`'s messages."""


def short_sum(comm, values: np.ndarray) -> np.ndarray:
    """``values`` (contiguous float64) summed over the ranks of ``comm`` in place: by
    :func:`pairwise_sum` where MPICH's ``MPI_Allreduce`` would take reduce-scatter then
    allgather (at least as many values as the largest power of two of ranks), else by
    ``MPI_Allreduce`` (one value on two ranks: one round already). Collective."""
    if comm is None or comm.size == 1:
        return values
    if len(values) >= 1 << (comm.size.bit_length() - 1):  # (two or more: size >= 2)
        return pairwise_sum(comm, values)
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
    return values


def pairwise_sum(comm, values: np.ndarray) -> np.ndarray:
    """``values`` (contiguous float64, changed in place and returned) summed over the ranks
    of ``comm`` by recursive doubling (see the module docstring; collective)."""
    other = np.empty_like(values)
    buffers = {"values": values, "other": other}
    for messages, add in phases(comm.rank, comm.size):
        if len(messages) == 2:  # a round: send ours, receive the partner's
            (_, partner, _), _ = messages
            comm.Sendrecv(values, dest=partner, sendtag=TAG, recvbuf=other, source=partner, recvtag=TAG)
        else:
            ((kind, partner, buffer),) = messages
            if kind == "send":
                comm.Send(buffers[buffer], dest=partner, tag=TAG)
            else:
                comm.Recv(buffers[buffer], source=partner, tag=TAG)
        if add:
            values += other
    return values


def phases(rank: int, size: int) -> list:
    """What :func:`pairwise_sum` does on ``rank`` of ``size``, phase by phase: ``(messages,
    add)``, the messages made together (``(kind, partner, buffer)``: ``"send"`` or
    ``"receive"``, of ``"values"`` or into ``"other"``) and whether ``other`` is then added
    to ``values``. :class:`meshchain.comm.compiled.CompiledPairwiseSum` and
    :func:`meshchain.comm.by_address.sum_all` make the same.

    >>> [add for _, add in phases(0, 3)], phases(2, 3)
    ([True, True, False], [([('send', 0, 'values')], False), ([('receive', 0, 'values')], False)])
    """
    if size == 1:
        return []
    top = 1 << (size.bit_length() - 1)  # the largest power of two <= size
    if rank >= top:  # beyond the power of two: add into rank - top, get the total back
        return [([("send", rank - top, "values")], False), ([("receive", rank - top, "values")], False)]
    extra = rank + top < size
    found = [([("receive", rank + top, "other")], True)] if extra else []
    mask = 1
    while mask < top:
        partner = rank ^ mask
        found.append(([("send", partner, "values"), ("receive", partner, "other")], True))
        mask <<= 1
    if extra:
        found.append(([("send", rank + top, "values")], False))
    return found
