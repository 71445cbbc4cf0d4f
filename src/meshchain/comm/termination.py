"""How the ranks of a sparse exchange know that a round is over (termination detection).

Each function is called by :meth:`meshchain.comm.sparse.SparseExchange.finish` after the
exchange has sent every buffer (and, under a neighbourhood, a last message to each
neighbour), and returns when every message of the round addressed to this rank has been
received. While waiting, a rank keeps receiving what arrives and completing its own sends
(:meth:`~meshchain.comm.sparse.SparseExchange.progress_until`), so no rank blocks another.

``"nbx"``
    Non-blocking consensus (Hoefler, Siebert and Lumsdaine, "Scalable communication
    protocols for dynamic sparse data exchange", PPoPP 2010; PETSc's
    ``PetscCommBuildTwoSided`` NBX). Messages are synchronous sends (``Issend``): one
    completes only once its receiver has matched it. When all of a rank's sends have
    completed, it enters a non-blocking barrier (``Ibarrier``) and keeps receiving; the
    barrier completes only when every rank has entered it, that is when every message of
    the round has been matched, so nothing of the round is left to receive. Cost: one
    barrier, O(log P), no count of messages.
``"neighbourhood"``
    IPComMan's fixed neighbourhood: the last message to each neighbour (empty if there is
    nothing left to send) carries a flag and the number of messages sent to that
    neighbour in the round; a rank is done when it has the last message of every
    neighbour and as many messages as it announced. No collective at all; neighbourhoods
    must be symmetric and fixed for the round.
``"allreduce"``
    IPComMan's check for changing neighbourhoods, kept for comparison. If neighbours are
    given, first wait for their last messages as under ``"neighbourhood"``; then
    repeatedly receive what has arrived and sum, over all ranks, messages sent minus
    messages received, until the sum is zero. Every rank has sent all its messages before
    its first contribution and received counts only grow, so a zero sum means that every
    message was received. The paper uses a blocking ``MPI_Allreduce``; here it is an
    ``Iallreduce`` during which the rank keeps receiving, so a rank whose (rendezvous)
    send waits for a receiver already in the reduction cannot deadlock. IPComMan's
    message announcing a new neighbour is not needed: a discovered sender is simply
    received. Cost: at least one allreduce per round, more while messages are in transit.

Rounds are kept apart by tags: every exchange on a communicator is one round, numbered
in creation order on the communicator's private duplicate (:func:`channel_of`), and its
messages carry its number (modulo the tag upper bound) as tag. A rank may be rounds ahead
of another (it left NBX's barrier, or has all its neighbours' last messages, while a
slower rank still receives), yet its messages of the next round never match a receive of
this one.

Examples
--------
>>> from meshchain.comm.termination import TERMINATIONS
>>> TERMINATIONS
('nbx', 'neighbourhood', 'allreduce')
"""

from __future__ import annotations

import numpy as np

from ..core.cache import memo

__all__ = ["TERMINATIONS", "nbx", "neighbourhood", "allreduce", "channel_of"]

TERMINATIONS = ("nbx", "neighbourhood", "allreduce")
"""The termination detections a :class:`~meshchain.comm.sparse.SparseExchange` offers."""


def nbx(exchange) -> None:
    """Wait for every own synchronous send, then for a non-blocking barrier (receiving)."""
    exchange.progress_until(exchange.sends_done)
    barrier = exchange.comm.Ibarrier()
    exchange.progress_until(barrier.Test)


def neighbourhood(exchange) -> None:
    """Wait for the last message of every neighbour and the messages it announced."""
    exchange.progress_until(exchange.neighbours_done)


def allreduce(exchange) -> None:
    """Wait for known neighbours (if any), then sum sent minus received until zero."""
    from mpi4py import MPI

    if exchange.neighbours is not None:
        exchange.progress_until(exchange.neighbours_done)
    total = np.ones(1, dtype=np.int64)
    while total[0]:
        exchange.receive_available()
        local = np.array([exchange.messages_in_transit()], dtype=np.int64)
        request = exchange.comm.Iallreduce(local, total, op=MPI.SUM)
        exchange.progress_until(request.Test)
        exchange.count_allreduce()


# -- rounds: a private duplicate of the communicator, one tag per round -----------------

_KEYVAL = memo("MPI attribute keys")  # "rounds": the key of the cached duplicates (created once)


class _Channel:
    """A communicator's private duplicate and the number of rounds run on it."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm = comm.Dup()
        self.rounds = 0
        self.tags = int(self.comm.Get_attr(MPI.TAG_UB)) + 1

    def next_tag(self) -> int:
        """The tag of the next round (its number, modulo the tag upper bound)."""
        tag, self.rounds = self.rounds % self.tags, self.rounds + 1
        return tag


def _free_channel(comm, keyval, channel) -> None:  # pragma: no cover - runs when comm is freed
    """Attribute delete callback: free the duplicate with its communicator."""
    from mpi4py import MPI

    if not MPI.Is_finalized() and comm != MPI.COMM_WORLD and comm != MPI.COMM_SELF:
        channel.comm.Free()


def channel_of(comm) -> _Channel:
    """The private duplicate of ``comm`` and its round counter (``.comm``, ``.next_tag()``).

    Made by ``comm.Dup()`` (collective) the first time it is asked for, and cached as an
    MPI attribute of ``comm``: freed with ``comm`` (a cache keyed by handle could hand a
    later communicator, given the same handle, a stale duplicate). The attribute is not
    copied by ``Dup``, so a duplicate of ``comm`` gets its own channel.
    """
    from mpi4py import MPI

    keyval = _KEYVAL.get("rounds")
    if keyval is None:
        keyval = _KEYVAL["rounds"] = MPI.Comm.Create_keyval(delete_fn=_free_channel)
    channel = comm.Get_attr(keyval)
    if channel is None:
        channel = _Channel(comm)
        comm.Set_attr(keyval, channel)
    return channel
