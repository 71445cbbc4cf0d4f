"""Short sums over ranks in one message round per doubling (recursive doubling).

A solver's block reduction (an s-step method's Gram matrix: a few dozen float64 values)
is latency-bound. MPICH's ``MPI_Allreduce`` picks reduce-scatter then allgather for any
count of at least the number of ranks: two message rounds on two ranks where one would
do. Over MPICH's TCP module on this project's machines a sum of 2 to 64 float64 values on 2
ranks took 19-36 µs that way against 11-20 µs in one ``Sendrecv`` round; over shared
memory both take about 3.8 µs (``benchmarks/comm.py --parts sums`` measures it).

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

__all__ = ["pairwise_sum", "short_sum", "TAG"]

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
    size = comm.size
    if size == 1:
        return values
    rank, top = comm.rank, 1 << (size.bit_length() - 1)  # the largest power of two <= size
    other = np.empty_like(values)
    if rank >= top:  # beyond the power of two: add into rank - top, get the total back
        comm.Send(values, dest=rank - top, tag=TAG)
        comm.Recv(values, source=rank - top, tag=TAG)
        return values
    extra = rank + top < size
    if extra:
        comm.Recv(other, source=rank + top, tag=TAG)
        values += other
    mask = 1
    while mask < top:
        partner = rank ^ mask
        comm.Sendrecv(values, dest=partner, sendtag=TAG, recvbuf=other, source=partner, recvtag=TAG)
        values += other
        mask <<= 1
    if extra:
        comm.Send(values, dest=rank + top, tag=TAG)
    return values
