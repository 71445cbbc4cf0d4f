"""Dynamic sparse data exchange: packed messages to ranks that the receiver does not know.

Each rank has items (byte strings) for some ranks; no rank knows who will send to it. A
:class:`SparseExchange` packs the items of one round per destination into buffers of at
most ``buffer_limit`` bytes (an item too large for one goes alone, in a message of its
own), sends a buffer as soon as the next item would overflow it (non-blocking), recycles
buffers whose send completed (a free pool), and ends the round by one of three
termination detections (:data:`TERMINATIONS`, see
:mod:`.termination`). This is the dynamic neighbourhood exchange of IPComMan (Ovcharenko
et al., "Neighborhood communication paradigm to increase scalability in large-scale
dynamic scientific applications", Parallel Computing 2012) with the NBX consensus of
Hoefler, Siebert and Lumsdaine (PPoPP 2010) as the default termination.
:func:`exchange_rows` is a drop-in replacement for
:func:`meshchain.comm.collectives.alltoallv` built on it, with nothing O(P) per rank.

Message format (every message a multiple of 8 bytes)::

    int64 header[4]: flags (1 = last message to this neighbour), sequence number of
                     the message from this sender to this receiver in this round,
                     number of items, messages announced (last messages only)
    the items' bytes, one after another, zero-padded to 8 bytes
    int64 lengths[number of items]

Rounds and communicators: every message goes over a private duplicate of the user's
communicator, made (``comm.Dup()``, collective) the first time an exchange is created
on that communicator and cached as an MPI attribute of it (freed with it; see
:func:`.termination.channel_of`). Each exchange
is one *round*; the tag of a round is its number on that communicator (modulo the tag
upper bound), so a rank that has finished round k and sends for round k+1 never feeds a
slower rank still receiving round k, whatever the termination mode. Hence every rank of
the communicator creates the same exchanges in the same order and finishes each one
exactly once (an exchange is collective over its communicator).

Examples
--------
On one process every item is a self-send, delivered without MPI:

>>> import numpy as np
>>> from mpi4py import MPI
>>> from meshchain.comm.sparse import SparseExchange, exchange_rows
>>> exchange = SparseExchange(MPI.COMM_SELF, buffer_limit=64)
>>> exchange.post(0, np.arange(3, dtype=np.int16))
>>> exchange.post(0, np.array([7], dtype=np.int16))
>>> [(source, item.view(np.int16).tolist()) for source, item in exchange.finish()]
[(0, [0, 1, 2]), (0, [7])]
>>> exchange.stats["items_received"], exchange.stats["messages_sent"]
(2, 0)
>>> rows, sources = exchange_rows(MPI.COMM_SELF, np.arange(6.0).reshape(3, 2), np.zeros(3, dtype=int))
>>> rows.tolist(), sources.tolist()
([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], [0, 0, 0])
"""

from __future__ import annotations

import os
import time

import numpy as np

from ..core.errors import ConfigurationError, MeshchainError
from . import termination as _termination
from .termination import TERMINATIONS, channel_of

__all__ = ["SparseExchange", "exchange_rows", "TERMINATIONS", "DEFAULT_BUFFER_LIMIT", "DEFAULT_MAX_IN_FLIGHT",
           "HEADER_BYTES", "channel_of", "TOTALS", "reset_totals"]

DEFAULT_BUFFER_LIMIT = 65536
"""Default largest message, in bytes (header and item lengths included)."""
DEFAULT_MAX_IN_FLIGHT = 16
"""Default number of this rank's messages of one exchange that may be in flight at once."""
HEADER_BYTES = 32
"""Bytes of a message's fixed header (4 int64: flags, sequence, items, announced)."""
LAST = 1
"""Header flag of the last message to a neighbour (it carries the number of messages)."""


def _pad(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 8."""
    return -(-nbytes // 8) * 8


class _Packet:
    """A message being filled: its buffer, the bytes of items written, their lengths."""

    __slots__ = ("buffer", "used", "lengths", "pooled")

    def __init__(self, buffer: np.ndarray, pooled: bool = True):
        self.buffer, self.used, self.lengths, self.pooled = buffer, 0, [], pooled

    def size_with(self, nbytes: int) -> int:
        """The message's size in bytes if one more item of ``nbytes`` were added."""
        return HEADER_BYTES + _pad(self.used + nbytes) + 8 * (len(self.lengths) + 1)

    def add(self, data: np.ndarray) -> None:
        self.buffer[HEADER_BYTES + self.used: HEADER_BYTES + self.used + data.size] = data
        self.used += data.size
        self.lengths.append(data.size)

    def seal(self, flags: int, sequence: int, announced: int) -> np.ndarray:
        """Write padding, lengths and header; return the message (a view of the buffer)."""
        end = HEADER_BYTES + _pad(self.used)
        self.buffer[HEADER_BYTES + self.used: end] = 0
        size = end + 8 * len(self.lengths)
        self.buffer[end:size].view(np.int64)[:] = self.lengths
        self.buffer[:HEADER_BYTES].view(np.int64)[:] = (flags, sequence, len(self.lengths), announced)
        return self.buffer[:size]


class SparseExchange:
    """One round of a dynamic sparse exchange on ``comm`` (see the module docstring).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        Every rank of it creates this exchange (in the same order as all others on
        ``comm``) and calls :meth:`finish` once.
    termination : {"nbx", "neighbourhood", "allreduce"}
        How ranks know the round is over (:mod:`.termination`). ``"nbx"`` (default):
        synchronous sends and a non-blocking barrier. ``"neighbourhood"``: no collective;
        ``neighbours`` is required and fixed. ``"allreduce"``: IPComMan's global check.
    neighbours : iterable of int, optional
        The ranks this rank exchanges with; must be symmetric (``a`` lists ``b`` if and
        only if ``b`` lists ``a``) for ``"neighbourhood"`` and ``"allreduce"``, where each
        neighbour gets a last message (possibly empty) with the number of messages sent
        to it. ``"neighbourhood"`` may send to these ranks only; ``"nbx"`` and
        ``"allreduce"`` may send anywhere (other ranks are discovered). Own rank is ignored.
    buffer_limit : int
        Largest message in bytes, header and item lengths included. An item that does
        not fit into an empty message of this size is sent alone, in a message of its own.
    ordered : bool
        Items always come back by source rank, then in posting order: MPI does not let
        messages from one sender with one tag overtake each other. ``ordered=True`` in
        addition sorts each source's messages by the sequence number in their header and
        checks that none is missing or repeated (a sort per round; the order is the same).
    max_in_flight : int
        Messages of this exchange that may be in flight; a :meth:`post` that would send
        one more first waits for one to complete, receiving meanwhile. This bounds the
        buffers allocated (``stats["buffers_allocated"]``) and the memory in flight.
    timeout : float, optional
        Seconds a wait may go without any message arriving or completing before it raises
        :class:`~meshchain.core.errors.MeshchainError` (for example for a neighbourhood
        that is not symmetric); ``None`` (default): wait as long as it takes.

    Attributes
    ----------
    comm, tag
        The private duplicate of ``comm`` that carries the messages, and this round's tag.
    stats : dict
        See :attr:`stats`.
    """

    def __init__(self, comm, *, termination: str = "nbx", neighbours=None, buffer_limit: int = DEFAULT_BUFFER_LIMIT,
                 ordered: bool = False, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, timeout: float | None = None):
        self.rank, self.size = comm.rank, comm.size
        if termination not in TERMINATIONS:
            raise ConfigurationError(f"unknown termination {termination!r}; use one of {', '.join(TERMINATIONS)}")
        self.termination = termination
        self.neighbours = _check_neighbours(neighbours, termination, self.rank, self.size)
        self.buffer_limit = _check_positive_int("buffer_limit", buffer_limit)
        self.max_in_flight = _check_positive_int("max_in_flight", max_in_flight)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise ConfigurationError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout, self.ordered = timeout, bool(ordered)
        channel = channel_of(comm)
        self.comm, self.tag = channel.comm, channel.next_tag()
        self._capacity = max(HEADER_BYTES, self.buffer_limit - self.buffer_limit % 8)
        self._open: dict = {}          # destination -> _Packet being filled
        self._in_flight: list = []     # (request, buffer or None)
        self._pool: list = []          # free buffers
        self._sequence: dict = {}      # destination -> messages sent
        self._received: dict = {}      # source -> messages received
        self._announced: dict = {}     # source -> messages announced by its last message
        self._messages: list = []      # (source, sequence, items)
        self._local: list = []         # items sent to this rank
        self._state = "posting"
        self._status = None
        self._counts = dict(messages_sent=0, bytes_sent=0, buffers_allocated=0, items_sent=0, items_received=0,
                            messages_received=0, allreduces=0)

    # -- sending -----------------------------------------------------------------------

    def post(self, dest: int, item: np.ndarray) -> None:
        """Send ``item`` (a numpy array of a fixed-size dtype, sent as its raw bytes) to ``dest``.

        The item is copied into the buffer for ``dest`` (so ``item`` may be changed
        afterwards); a buffer that cannot take it is sent at once. Items for this rank
        stay local (no MPI). Waits, receiving meanwhile, only when ``max_in_flight``
        messages are in flight. A refused item (bad destination or dtype) changes nothing.
        """
        self._check_state("post")
        dest = self._check_destination(dest)
        data = _as_bytes(item)
        self._counts["items_sent"] += 1
        if dest == self.rank:
            self._local.append(data.copy())
            self._counts["items_received"] += 1
            return
        packet = self._open.get(dest)
        if packet is not None and packet.size_with(data.size) > self.buffer_limit:
            self._send(dest, self._open.pop(dest))
            packet = None
        alone = HEADER_BYTES + _pad(data.size) + 8
        if alone > self.buffer_limit:  # a message of its own, in a buffer of its size
            packet = _Packet(self._allocate(alone), pooled=False)
            packet.add(data)
            self._send(dest, packet)
            return
        if packet is None:
            packet = self._open[dest] = _Packet(self._take_buffer())
        packet.add(data)

    def _send(self, dest: int, packet: _Packet, *, last: bool = False) -> None:
        """Seal ``packet`` and start sending it (after waiting for room in flight)."""
        from mpi4py import MPI

        self.progress_until(lambda: len(self._in_flight) < self.max_in_flight)
        sequence = self._sequence.get(dest, 0)
        self._sequence[dest] = sequence + 1
        message = packet.seal(LAST if last else 0, sequence, sequence + 1 if last else 0)
        start = self.comm.Issend if self.termination == "nbx" else self.comm.Isend
        request = start([message, MPI.BYTE], dest=dest, tag=self.tag)
        self._in_flight.append((request, packet.buffer if packet.pooled else None))
        self._counts["messages_sent"] += 1
        self._counts["bytes_sent"] += message.size

    def _flush(self) -> None:
        """Send every partly filled buffer; under a neighbourhood, a last message to each."""
        last = self.neighbours if self.termination != "nbx" and self.neighbours is not None else ()
        for dest in sorted(set(self._open) - set(last)):
            self._send(dest, self._open.pop(dest))
        for dest in last:
            packet = self._open.pop(dest, None) or _Packet(self._take_buffer())
            self._send(dest, packet, last=True)

    def _take_buffer(self) -> np.ndarray:
        if not self._pool:
            self._test_sends()
        return self._pool.pop() if self._pool else self._allocate(self._capacity)

    def _allocate(self, nbytes: int) -> np.ndarray:
        self._counts["buffers_allocated"] += 1
        return np.empty(nbytes, dtype=np.uint8)

    def _test_sends(self) -> bool:
        """Move the buffers of completed sends to the pool; whether any completed."""
        pending = []
        for request, buffer in self._in_flight:
            if not request.Test():
                pending.append((request, buffer))
            elif buffer is not None:
                self._pool.append(buffer)
        done = len(pending) < len(self._in_flight)
        self._in_flight = pending
        return done

    # -- receiving ---------------------------------------------------------------------

    def receive_available(self) -> bool:
        """Receive every message of this round that has arrived; whether there was one."""
        from mpi4py import MPI

        if self._status is None:
            self._status = MPI.Status()
        got = False
        while True:
            message = self.comm.Improbe(MPI.ANY_SOURCE, self.tag, self._status)
            if message is None:
                return got
            buffer = np.empty(self._status.Get_count(MPI.BYTE), dtype=np.uint8)
            message.Recv([buffer, MPI.BYTE])
            self._accept(self._status.Get_source(), buffer)
            got = True

    def _accept(self, source: int, buffer: np.ndarray) -> None:
        """Unpack one received message (its items are views of ``buffer``)."""
        flags, sequence, count, announced = (int(v) for v in buffer[:HEADER_BYTES].view(np.int64))
        lengths = buffer[buffer.size - 8 * count:].view(np.int64)
        ends = HEADER_BYTES + np.cumsum(lengths)
        items = [buffer[end - length: end] for end, length in zip(ends.tolist(), lengths.tolist())]
        self._messages.append((source, sequence, items))
        self._received[source] = self._received.get(source, 0) + 1
        self._counts["messages_received"] += 1
        self._counts["items_received"] += count
        if flags & LAST:
            self._announced[source] = announced
        if self.termination == "neighbourhood" and source not in self.neighbours:
            raise ConfigurationError(
                f"rank {self.rank} received a message from rank {source}, which is not among its neighbours "
                f"{list(self.neighbours)}; neighbourhoods must be symmetric (add {source} to rank {self.rank}'s)")

    def neighbours_done(self) -> bool:
        """Whether the last message of every neighbour and all it announced have arrived."""
        return all(self._announced.get(n, -1) == self._received.get(n, 0) for n in self.neighbours)

    def progress_until(self, done) -> None:
        """Receive and complete sends until ``done()`` is true (polling, backing off when idle)."""
        idle, since = 0, time.monotonic()
        while not done():
            if self.receive_available() | self._test_sends():
                idle, since = 0, time.monotonic()
                continue
            idle += 1
            if self.timeout is not None and time.monotonic() - since > self.timeout:
                raise MeshchainError(self._stuck())
            if idle < 1000:  # nothing to do: let other ranks on this core run, then back off
                os.sched_yield()
            else:
                time.sleep(min(1e-3, 1e-6 * 2 ** min(idle - 1000, 10)))

    def _stuck(self) -> str:
        missing = [n for n in (self.neighbours or ()) if self._announced.get(n, -1) != self._received.get(n, 0)]
        return (f"sparse exchange (termination {self.termination!r}) on rank {self.rank}: nothing arrived or "
                f"completed for {self.timeout} s; {len(self._in_flight)} sends pending, neighbours not finished: "
                f"{missing}; every rank must finish every exchange, and neighbourhoods must be symmetric")

    # -- the end of the round ----------------------------------------------------------

    def finish(self) -> list:
        """Flush, receive everything, detect the end of the round (collective).

        Returns
        -------
        list of (int, numpy.ndarray)
            ``(source, item)`` for every item sent to this rank, exactly once, by source
            rank ascending and, within one source, in posting order; ``item`` is a uint8
            array of the posted bytes (a view of the received message).
        """
        self._check_state("finish")
        self._state = "finishing"
        self._flush()
        getattr(_termination, self.termination)(self)
        self.progress_until(lambda: not self._in_flight)
        self._state = "finished"
        self._pool.clear()
        _account(self.stats)
        return self._deliver()

    def sends_done(self) -> bool:
        """Whether every message this rank sent has completed."""
        return not self._in_flight

    def messages_in_transit(self) -> int:
        """Messages this rank sent minus the messages it received (for the global check)."""
        return self._counts["messages_sent"] - self._counts["messages_received"]

    def count_allreduce(self) -> None:
        """Count one global check (for :attr:`stats`)."""
        self._counts["allreduces"] += 1

    def _deliver(self) -> list:
        messages = self._messages + [(self.rank, 0, self._local)]
        if self.ordered:
            messages.sort(key=lambda message: (message[0], message[1]))
            for source in self._received:
                sequences = [s for r, s, _ in messages if r == source]
                if sequences != list(range(len(sequences))):
                    raise MeshchainError(f"sparse exchange: messages from rank {source} arrived with sequence "
                                         f"numbers {sequences}, not 0..{len(sequences) - 1}")
        else:
            messages.sort(key=lambda message: message[0])
        return [(source, item) for source, _, items in messages for item in items]

    @property
    def stats(self) -> dict:
        """Counters of this rank's side of the round.

        ``messages_sent``, ``bytes_sent``, ``messages_received`` (MPI messages; self-sends
        are none), ``buffers_allocated`` (distinct buffers ever allocated, pooled or for a
        lone large item), ``items_sent`` and ``items_received`` (self-sends included),
        ``allreduces`` (global checks run), ``neighbours_discovered`` (sorted ranks that
        sent to this rank and were not in ``neighbours``) and ``neighbours`` (sorted ranks
        exchanged with: the given neighbours, destinations and sources; never own rank).
        """
        given = set(self.neighbours or ())
        return dict(self._counts, neighbours_discovered=sorted(set(self._received) - given),
                    neighbours=sorted(given | set(self._sequence) | set(self._received)))

    # -- checks ------------------------------------------------------------------------

    def _check_state(self, action: str) -> None:
        if self._state != "posting":
            raise ConfigurationError(f"cannot {action}: this sparse exchange was already finished (state "
                                     f"{self._state!r}); create a new SparseExchange for the next round")

    def _check_destination(self, dest) -> int:
        if isinstance(dest, bool) or not isinstance(dest, int | np.integer) or not 0 <= dest < self.size:
            raise ConfigurationError(f"destination {dest!r} is not a rank of the communicator "
                                     f"(0..{self.size - 1}); pass an int in that range")
        dest = int(dest)
        if self.termination == "neighbourhood" and dest != self.rank and dest not in self.neighbours:
            raise ConfigurationError(f"destination {dest} is not among rank {self.rank}'s neighbours "
                                     f"{list(self.neighbours)}; add it to neighbours (on both sides) or use "
                                     f"termination='nbx'")
        return dest


TOTALS: dict = {}
"""This process's sparse-exchange rounds so far: ``rounds``, summed ``messages_sent``,
``bytes_sent``, ``buffers_allocated``, and the largest of a round's ``messages_sent``,
``buffers_allocated`` and partner count (``most_messages``, ``most_buffers``,
``most_partners``). For tests and benchmarks that check the cost stays bounded by the
neighbourhood; :func:`reset_totals` empties it."""


def reset_totals() -> None:
    """Start :data:`TOTALS` afresh."""
    TOTALS.clear()


def _account(stats: dict) -> None:
    TOTALS["rounds"] = TOTALS.get("rounds", 0) + 1
    for key in ("messages_sent", "bytes_sent", "buffers_allocated"):
        TOTALS[key] = TOTALS.get(key, 0) + stats[key]
    for key, value in (("most_messages", stats["messages_sent"]), ("most_buffers", stats["buffers_allocated"]),
                       ("most_partners", len(stats["neighbours"]))):
        TOTALS[key] = max(TOTALS.get(key, 0), value)


def _as_bytes(item) -> np.ndarray:
    """The bytes of ``item`` as a 1-D uint8 array (a view when ``item`` is contiguous)."""
    array = np.asarray(item)
    if array.dtype.hasobject:
        raise ConfigurationError(f"cannot send an array of dtype {array.dtype} (it holds Python objects); "
                                 "send numeric or fixed-size data")
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_neighbours(neighbours, termination: str, rank: int, size: int):
    """``neighbours`` as a sorted tuple without own rank (None if not given)."""
    if neighbours is None:
        if termination == "neighbourhood":
            raise ConfigurationError("termination='neighbourhood' needs neighbours (the ranks this rank sends "
                                     "to and receives from); pass neighbours=[...] or use termination='nbx'")
        return None
    ranks = np.asarray(list(neighbours) if not isinstance(neighbours, np.ndarray) else neighbours)
    if ranks.size and (ranks.dtype.kind not in "iu" or ranks.min() < 0 or ranks.max() >= size):
        raise ConfigurationError(f"neighbours {ranks.tolist()} must be ranks of the communicator (0..{size - 1})")
    return tuple(int(r) for r in np.unique(ranks) if r != rank)


def exchange_rows(comm, rows: np.ndarray, destinations: np.ndarray, *, termination: str = "nbx", neighbours=None,
                  buffer_limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Send row ``i`` of ``rows`` to rank ``destinations[i]``; collective over ``comm``.

    A drop-in replacement for :func:`meshchain.comm.collectives.alltoallv` with no
    all-to-all: every rank passes ``rows`` of the same dtype and trailing shape (any
    fixed-size dtype). The rows for one destination are gathered in one vectorised step
    and posted as one item (or, with ``buffer_limit``, as items of as many rows as fit
    into a message) to a :class:`SparseExchange` (``termination`` and ``neighbours`` as
    there).

    Parameters
    ----------
    buffer_limit : int, optional
        Largest message in bytes; ``None`` (default): one message per destination.

    Returns
    -------
    received : numpy.ndarray
        The rows received, by source rank ascending (rows from one source keep their
        order), with the dtype and trailing shape of ``rows`` (``(0,) + rows.shape[1:]``
        when nothing arrives).
    sources : numpy.ndarray
        The int64 source rank of each received row.
    """
    rows = np.ascontiguousarray(rows)
    destinations = np.asarray(destinations)
    if rows.ndim == 0 or destinations.shape != rows.shape[:1] or (destinations.size and destinations.dtype.kind
                                                                    not in "iu"):
        raise ConfigurationError(f"destinations (shape {destinations.shape}, dtype {destinations.dtype}) must be "
                                 f"integers, one per row of rows (shape {rows.shape})")
    bad = (destinations < 0) | (destinations >= comm.size)
    if bad.any():
        raise ConfigurationError(f"destination {destinations[bad][0]} (of row {int(np.argmax(bad))}) is not a rank "
                                 f"of the communicator (0..{comm.size - 1})")
    exchange = SparseExchange(comm, termination=termination, neighbours=neighbours,
                              buffer_limit=DEFAULT_BUFFER_LIMIT if buffer_limit is None else buffer_limit)
    row_bytes = rows.dtype.itemsize * int(np.prod(rows.shape[1:], dtype=np.int64))
    order = np.argsort(destinations, kind="stable")
    ordered = rows[order]
    targets, starts, counts = np.unique(destinations[order], return_index=True, return_counts=True)
    step = max(1, (exchange._capacity - HEADER_BYTES - 8) // max(row_bytes, 1))
    for target, start, count in zip(targets.tolist(), starts.tolist(), counts.tolist()):
        chunk = count if buffer_limit is None or row_bytes == 0 else step
        for first in range(start, start + count, chunk):
            block = ordered[first: min(first + chunk, start + count)]
            exchange.post(target, block if row_bytes else np.array([len(block)], dtype=np.int64))
    received = exchange.finish()
    if row_bytes:
        lengths = np.array([item.size // row_bytes for _, item in received], dtype=np.int64)
        data = np.concatenate([item for _, item in received]) if received else np.zeros(0, dtype=np.uint8)
        values = data.view(rows.dtype).reshape((-1,) + rows.shape[1:])
    else:
        lengths = np.array([int(item.view(np.int64)[0]) for _, item in received], dtype=np.int64)
        values = np.empty((int(lengths.sum()),) + rows.shape[1:], dtype=rows.dtype)
    sources = np.repeat(np.array([source for source, _ in received], dtype=np.int64), lengths)
    return values, sources
