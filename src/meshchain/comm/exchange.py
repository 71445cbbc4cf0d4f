"""Halo exchanges planned once and run many times: persistent requests, compiled packing.

A :class:`HaloExchange` brings the halos of one or more dats from one valid depth to a
deeper one. It is built once for a given layout, set of dats and depths (an executable
plan keeps it) and then run by :meth:`~HaloExchange.begin` (pack every exported row of
every dat for every neighbour into one send buffer, in one compiled call, and start the
persistent requests) and :meth:`~HaloExchange.end` (wait, and unpack every received row
in one compiled call). Messages go neighbour by neighbour: the rows of the first dat for
that neighbour, layer by layer, then the next dat's; sender and receiver know the layout
of each message from their export and import lists, so no header is sent.

``grouped`` exchanges carry every dat in one message per neighbour (a communication-
avoiding segment); otherwise one exchange carries one dat, with that dat's tag (a loop
run on its own sends one message per dat per neighbour).

Every start goes through :func:`start_requests` (tests count the messages there).

Examples
--------
On one process there is nobody to talk to, so an exchange moves nothing:

>>> import numpy as np
>>> from mpi4py import MPI
>>> from meshchain.comm.exchange import HaloItem, HaloExchange
>>> values = np.arange(4.0).reshape(4, 1)
>>> exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {}, {})], tag=3)
>>> exchange.begin(); exchange.end()
>>> exchange.messages, exchange.bytes_sent
(0, 0)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .packing import WORD, pack, row_table, unpack, word_view

__all__ = ["HaloItem", "HaloExchange", "start_requests", "GROUPED_TAG"]

GROUPED_TAG = 0
"""The tag of grouped messages (dats use their declaration number, >= 1, as tag)."""


class HaloItem(NamedTuple):
    """One dat in an exchange: its host array and, per neighbour, the rows this rank sends
    (``exports``) and receives (``imports``), in wire order.

    ``before_pack`` and ``after_unpack`` (optional callables taking the rows) let storage
    that is not only in host memory bring the exported rows to the host first and pass the
    received rows on afterwards.
    """

    array: np.ndarray
    exports: dict
    imports: dict
    before_pack: object = None
    after_unpack: object = None


def start_requests(requests) -> None:
    """Start persistent requests (the one place where meshchain's halo messages start)."""
    from mpi4py import MPI

    MPI.Prequest.Startall(requests)


class _Side:
    """One direction of an exchange: row table, buffer and each neighbour's word range."""

    def __init__(self, items, table_of: str, neighbours, widths):
        pieces, self.ranges, start = [], [], 0
        for neighbour in neighbours:
            for number, item in enumerate(items):
                rows = getattr(item, table_of).get(neighbour)
                if rows is not None and len(rows):
                    pieces.append((number, rows))
            words = sum(widths[v] * len(r) for v, r in pieces) - start
            if words:
                self.ranges.append((neighbour, start, start + words))
            start += words
        self.table, words = row_table(pieces, widths)
        self.buffer = np.empty(words, dtype=WORD)
        self.rows = {number: np.concatenate([rows for v, rows in pieces if v == number])
                     for number in {v for v, _ in pieces}}


class HaloExchange:
    """A planned exchange of ``items`` (see the module docstring).

    Attributes
    ----------
    messages, bytes_sent, largest : int
        Messages this rank sends per run, their bytes, and the largest one.
    """

    def __init__(self, comm, items, *, tag: int):
        self.items = tuple(items)
        self.views = tuple(word_view(item.array) for item in self.items)
        widths = [view.shape[1] for view in self.views]
        neighbours = sorted({n for item in self.items for n in (*item.exports, *item.imports)})
        self.send = _Side(self.items, "exports", neighbours, widths)
        self.receive = _Side(self.items, "imports", neighbours, widths)
        self.requests = []
        for neighbour, begin, end in self.send.ranges:
            self.requests.append(comm.Send_init(self.send.buffer[begin:end], dest=neighbour, tag=tag))
        for neighbour, begin, end in self.receive.ranges:
            self.requests.append(comm.Recv_init(self.receive.buffer[begin:end], source=neighbour, tag=tag))
        sizes = [(end - begin) * WORD.itemsize for _, begin, end in self.send.ranges]
        self.messages, self.bytes_sent, self.largest = len(sizes), sum(sizes), max(sizes, default=0)
        self._staged = [(n, item) for n, item in enumerate(self.items)
                        if item.before_pack is not None or item.after_unpack is not None]

    def begin(self) -> None:
        """Pack the exported rows (one compiled call) and start every message."""
        for number, item in self._staged:
            if item.before_pack is not None and number in self.send.rows:
                item.before_pack(self.send.rows[number])
        if len(self.send.table):
            pack(self.send.buffer, self.views, self.send.table)
        if self.requests:
            start_requests(self.requests)

    def end(self) -> None:
        """Wait for every message and unpack the received rows (one compiled call)."""
        if self.requests:
            from mpi4py import MPI

            MPI.Request.Waitall(self.requests)
        if len(self.receive.table):
            unpack(self.receive.buffer, self.views, self.receive.table)
        for number, item in self._staged:
            if item.after_unpack is not None and number in self.receive.rows:
                item.after_unpack(self.receive.rows[number])

    def close(self) -> None:
        """Free the persistent requests (the exchange cannot run afterwards)."""
        for request in self.requests:
            request.Free()
        self.requests = []
