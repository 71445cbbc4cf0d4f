"""A neighbourhood that grows as ranks discover each other, round after round.

IPComMan keeps, per rank, the set of ranks it exchanges with; when an application sends
to a rank outside it (elements migrate next to a new part), both sides add each other,
and later rounds can end by counting within the neighbourhood instead of a global check.
:class:`Neighbourhood` does that over :class:`~meshchain.comm.sparse.SparseExchange`
rounds: a round whose pattern may leave the neighbourhood uses a termination that
discovers senders (``"nbx"`` or ``"allreduce"``); afterwards every rank adds the ranks it
sent to and received from, which keeps the neighbourhood symmetric, so the next rounds may
use ``"neighbourhood"`` termination (no collective at all).

Examples
--------
>>> import numpy as np
>>> from mpi4py import MPI
>>> hood = Neighbourhood(MPI.COMM_SELF)
>>> exchange = hood.round(termination="nbx")
>>> exchange.post(0, np.arange(2, dtype=np.int64))
>>> [bytes(item) == np.arange(2, dtype=np.int64).tobytes() for _, item in hood.finish(exchange)]
[True]
>>> hood.neighbours     # own rank is never a neighbour
()
"""

from __future__ import annotations

from .sparse import SparseExchange

__all__ = ["Neighbourhood"]


class Neighbourhood:
    """The ranks this rank exchanges with on ``comm`` (symmetric over the ranks), grown by
    every round run through it. ``neighbours``: the starting set (the same relation on
    every rank: ``a`` lists ``b`` if and only if ``b`` lists ``a``)."""

    def __init__(self, comm, neighbours=()):
        self.comm = comm
        self.neighbours = tuple(sorted({int(n) for n in neighbours} - {comm.rank}))
        self.discovered: list = []  # per round: the ranks added by it

    def round(self, *, termination: str = "neighbourhood", **options) -> SparseExchange:
        """A :class:`SparseExchange` over the current neighbourhood (collective when run).
        ``"neighbourhood"`` termination may send to the neighbours only; ``"nbx"`` and
        ``"allreduce"`` may send anywhere, and whoever is reached joins."""
        return SparseExchange(self.comm, termination=termination, neighbours=self.neighbours, **options)

    def finish(self, exchange: SparseExchange) -> list:
        """``exchange.finish()``, then add every rank it sent to or received from."""
        received = exchange.finish()
        known = set(self.neighbours)
        grown = known | set(exchange.stats["neighbours"])
        self.discovered.append(tuple(sorted(grown - known)))
        self.neighbours = tuple(sorted(grown - {self.comm.rank}))
        return received
