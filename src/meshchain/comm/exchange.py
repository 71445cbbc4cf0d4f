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

Every start of persistent requests from Python goes through :func:`start_requests` (tests
count the messages there; it is looked up when a run starts, so replacing it takes effect at
once). A captured step's compiled replay (:meth:`HaloExchange.compiled_parts`,
:mod:`meshchain.engine.replay`) starts the same requests from compiled code instead, after 32
replays: a test counting messages there keeps its steps below that, or counts the replays.

Transports
----------
``transport`` picks how the words travel (:mod:`.transports`): ``"persistent"`` (the
default: persistent requests made once), ``"p2p"`` (fresh non-blocking messages per run),
``"neighbour"`` (a neighbourhood all-to-all on a distributed-graph communicator) or
``"rma"`` (puts into a window, with active-target Post/Start/Complete/Wait). They move
the same words, so every transport gives the same bits; ``messages``, ``bytes_sent`` and
``largest`` count what this rank sends per forward run, whatever the transport.
Distributed-graph communicators and windows are *collective* objects: they are made at
the first run (every rank runs every exchange of a plan, in the same order, even with no
neighbours), never when the exchange is built (a build may fail on one rank before it
reaches a later exchange), and freed by :meth:`~HaloExchange.close`, which is then
collective too (every rank closes the exchanges it ran, in the same order).

Testing a run in flight
-----------------------
:meth:`~HaloExchange.test` (and :meth:`~HaloExchange.test_reverse`) asks, without
blocking, whether the run begun is complete; each call drives MPI's progress engine, so a
thread calling it while the thread that began the run computes (and makes no MPI call)
lets the messages move meanwhile (:class:`meshchain.comm.progress.Poller`).
:meth:`~HaloExchange.end` is still called afterwards: it returns from the (finished) wait
at once and unpacks.

Reverse exchanges
-----------------
:meth:`~HaloExchange.begin_reverse` and :meth:`~HaloExchange.end_reverse` run the plan
backwards (PetscSF's *reduce*): every rank sends the current values of its imported (halo)
rows back to the neighbour they came from, and the owner combines them into its exported
rows with ``op`` (:data:`OPS`: ``"sum"``, ``"min"``, ``"max"`` or ``"replace"``), in the
dat's own dtype, neighbour by neighbour (ascending) and in wire order within a neighbour,
so the result is the same bits on every transport. The owner's current value takes part
(``"sum"`` adds the contributions to it; ``"replace"`` keeps the last contribution). Packing
is one compiled call; combining is one compiled call per dtype among the exchange's dats
(``"replace"``: one call). Forward and reverse runs of one exchange share its buffers, so
they take turns.

Examples
--------
On one process there is nobody to talk to, so an exchange moves nothing:

>>> import numpy as np
>>> from mpi4py import MPI
>>> from meshchain.comm.exchange import HaloItem, HaloExchange
>>> values = np.arange(4.0).reshape(4, 1)
>>> exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {}, {})], tag=3)
>>> exchange.begin(); exchange.test(), exchange.idle
(True, True)
>>> exchange.end()
>>> exchange.messages, exchange.bytes_sent
(0, 0)
>>> exchange.begin_reverse("max"); exchange.end_reverse()
>>> exchange.close()
>>> rma = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {}, {})], tag=3, transport="rma")
>>> rma.transport, rma.messages
('rma', 0)
>>> rma.begin(); rma.end(); rma.close()
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from ..core import activity
from ..core.errors import MeshchainError
from .collectives import concatenated_ranges
from .hang import describe_exchange, start_transport, wait_any, wait_transport
from .packing import COMBINE, OPS, WORD, check_op, pack, row_table, scratch, typed_view, unpack, word_view
from .transports import TRANSPORTS, Transport, Wire, check_transport, make_transport

__all__ = ["HaloItem", "HaloExchange", "variable_item", "start_requests", "arrivals", "GROUPED_TAG", "TRANSPORTS",
           "OPS"]

GROUPED_TAG = 0
"""The tag of grouped messages (dats use their declaration number, >= 1, as tag)."""


class HaloItem(NamedTuple):
    """One dat in an exchange: its host array and, per neighbour, the rows this rank sends
    (``exports``) and receives (``imports``), in wire order.

    ``before_pack`` and ``after_unpack`` (optional callables taking the rows) let storage
    that is not only in host memory bring the exported rows to the host first and pass the
    received rows on afterwards. A reverse run calls them too: ``before_pack`` with the
    imported rows before packing them (and with the exported rows before combining into
    them, unless the op is ``"replace"``), ``after_unpack`` with the exported rows after.
    """

    array: np.ndarray
    exports: dict
    imports: dict
    before_pack: object = None
    after_unpack: object = None


def variable_item(values: np.ndarray, pointers: np.ndarray, exports: dict, imports: dict) -> HaloItem:
    """A :class:`HaloItem` of items of variable size: row ``i`` of a CSR table is
    ``values[pointers[i]:pointers[i + 1]]``, and ``exports``/``imports`` name CSR rows per
    neighbour. Both sides must agree on each exchanged row's length when the plan is built
    (the receiver's ``pointers`` leave room for what it imports); the plan then moves the
    rows' entries like any other rows, packed in the same compiled call.

    >>> values = np.arange(6.0)[:, None]                    # rows of lengths 1, 3, 2
    >>> item = variable_item(values, np.array([0, 1, 4, 6]), {1: np.array([2, 0])}, {})
    >>> item.exports[1].tolist()                            # row 2's entries, then row 0's
    [4, 5, 0]
    """
    pointers = np.asarray(pointers, dtype=np.int64)

    def entries(rows):
        rows = np.asarray(rows, dtype=np.int64)
        return concatenated_ranges(pointers[rows], pointers[rows + 1] - pointers[rows])

    return HaloItem(values, {n: entries(r) for n, r in exports.items()}, {n: entries(r) for n, r in imports.items()})


def start_requests(requests) -> None:
    """Start persistent requests (the one place where meshchain's halo messages start)."""
    from mpi4py import MPI

    MPI.Prequest.Startall(requests)


def _start(requests) -> None:
    """The transports' starter: :func:`start_requests` as this module holds it at the call."""
    start_requests(requests)


class _Side:
    """One direction of an exchange: row table, each neighbour's word range, and the rows of
    each dat (the buffer is a view of the exchange's wire, set afterwards)."""

    def __init__(self, items, table_of: str, neighbours, widths):
        pieces, self.ranges, start = [], [], 0
        self.spans, first = {}, 0  # neighbour -> its rows' range in the table
        for neighbour in neighbours:
            for number, item in enumerate(items):
                rows = getattr(item, table_of).get(neighbour)
                if rows is not None and len(rows):
                    pieces.append((number, rows))
            words = sum(widths[v] * len(r) for v, r in pieces) - start
            if words:
                self.ranges.append((neighbour, start, start + words))
            start += words
            last = sum(len(r) for _, r in pieces)
            self.spans[neighbour], first = (first, last), last
        self.table, self.words = row_table(pieces, widths)
        self.buffer = None
        self.rows = {number: np.concatenate([rows for v, rows in pieces if v == number])
                     for number in {v for v, _ in pieces}}


class _Combine(NamedTuple):
    """The dats of one dtype, as typed views, and the send table's rows for them."""

    views: tuple
    table: np.ndarray
    words: np.ndarray
    values: np.ndarray


class HaloExchange:
    """A planned exchange of ``items`` over ``comm`` (see the module docstring).

    Parameters
    ----------
    comm : mpi4py communicator (or an object forwarding to one)
    items : sequence of HaloItem
    tag : int
        The tag of this exchange's messages.
    transport : str
        One of :data:`TRANSPORTS` (default ``"persistent"``); an unknown one, or one this
        MPI library lacks, raises :class:`~meshchain.core.errors.ConfigurationError` (the
        same on every rank).

    Attributes
    ----------
    transport : str
        The transport's name.
    messages, bytes_sent, largest : int
        Messages this rank sends per (forward) run, their bytes, and the largest one.
    tag : int
        The tag of its messages.
    label : str or None
        What hang reports call the exchange (``"'q', 'r'"``: the dats it moves; the engine
        sets it), else None (they give its tag).
    """

    def __init__(self, comm, items, *, tag: int, transport: str = "persistent"):
        self.transport = check_transport(transport, comm)
        self.items = tuple(items)
        self.views = tuple(word_view(item.array) for item in self.items)
        widths = [view.shape[1] for view in self.views]
        neighbours = sorted({n for item in self.items for n in (*item.exports, *item.imports)})
        self.send = _Side(self.items, "exports", neighbours, widths)
        self.receive = _Side(self.items, "imports", neighbours, widths)
        wire = Wire.allocate(self.send.words, self.receive.words, self.send.ranges, self.receive.ranges)
        self.send.buffer, self.receive.buffer = wire.send, wire.receive
        sizes = [(end - begin) * WORD.itemsize for _, begin, end in self.send.ranges]
        self.messages, self.bytes_sent, self.largest = len(sizes), sum(sizes), max(sizes, default=0)
        self._staged = [(n, item) for n, item in enumerate(self.items)
                        if item.before_pack is not None or item.after_unpack is not None]
        self._combines = None  # made at the first combining reverse run
        self._checked: set = set()  # ops already accepted for these dats
        self._state = None  # None (idle), "forward", the op of a reverse run, or "closed"
        self._transport = make_transport(transport, comm, wire, tag=tag, start=_start)
        self.label, self.tag = None, tag

    @property
    def requests(self) -> list:
        """The MPI requests the exchange holds now (none once closed)."""
        return self._transport.requests

    @property
    def rebindable(self) -> bool:
        """Whether :meth:`rebind` can swap the dats' arrays (no rows are staged through a device)."""
        return not self._staged

    def rebind(self, arrays) -> None:
        """Exchange the rows of ``arrays`` instead of the items' arrays (one each, of the same
        shape and dtype: other dats of the same layout); only between runs."""
        if self._staged or self._state is not None:
            raise MeshchainError("a halo exchange can be rebound only between runs and without staged rows")
        arrays = list(arrays)
        if len(arrays) != len(self.items) or any(a.shape != item.array.shape or a.dtype != item.array.dtype
                                                 for a, item in zip(arrays, self.items)):
            raise MeshchainError("a halo exchange can be rebound only to arrays of its items' shapes and dtypes")
        self.items = tuple(item._replace(array=array) for item, array in zip(self.items, arrays))
        self.views = tuple(word_view(array) for array in arrays)
        self._combines = None

    def compiled_parts(self):
        """What compiled code needs to run this exchange forward itself: ``(send buffer, word
        views, send table, receive buffer, receive table, request handles, statuses)``, for
        :func:`~meshchain.comm.packing.pack`, :func:`~meshchain.comm.by_address.start_all`,
        :func:`~meshchain.comm.by_address.wait_all` and :func:`~meshchain.comm.packing.unpack`
        (the same calls in the same order as :meth:`begin` and :meth:`end`). None where that
        cannot be: a transport other than ``"persistent"``, rows staged through a device, a run
        in flight. Valid until :meth:`rebind` (new views) or :meth:`close`."""
        if self._staged or self._state is not None or self.transport != "persistent":
            return None
        handles, statuses = self._transport.forward_handles()
        return (self.send.buffer, self.views, self.send.table, self.receive.buffer, self.receive.table, handles,
                statuses)

    @property
    def idle(self) -> bool:
        """Whether runs of this exchange make no MPI call on this rank (nothing to send or
        receive, and a transport that takes no part in collectives)."""
        return self._transport.idle

    @property
    def owes_progress(self) -> bool:
        """Whether this rank, its run complete, can still hold its neighbours' runs until it
        calls MPI again (the ``"rma"`` transport; see :meth:`progress`)."""
        return self._transport.owes_progress and not self._transport.idle

    def progress(self) -> None:
        """Let MPI move what this rank owes its neighbours, without testing or ending a run
        (see :class:`~meshchain.comm.progress.Poller`); nothing when the exchange is idle."""
        if self._state == "closed":
            raise MeshchainError("this halo exchange is closed; build a new one")
        if not self._transport.idle:
            self._transport.progress()

    @property
    def running(self) -> str | None:
        """``"forward"`` or ``"reverse"`` while a run begun is in flight, else None."""
        return "forward" if self._state == "forward" else "reverse" if self._state in OPS else None

    def _refuse(self, what: str):
        if self._state == "closed":
            raise MeshchainError("this halo exchange is closed; build a new one")
        raise MeshchainError(f"a halo exchange cannot begin a {what} run while a "
                             f"{'forward' if self._state == 'forward' else 'reverse'} run is in flight; end that first")

    def _stage(self, hook: str, rows) -> None:
        for number, item in self._staged:
            call = getattr(item, hook)
            if call is not None and number in rows:
                call(rows[number])

    # --- forward: owners to halos ------------------------------------------------------------------

    def begin(self) -> None:
        """Pack the exported rows (one compiled call) and start every message."""
        if self._state is not None:
            self._refuse("forward")
        if self._staged:
            self._stage("before_pack", self.send.rows)
        if len(self.send.table):
            pack(self.send.buffer, self.views, self.send.table)
        if not self._transport.idle:
            if activity.watched and self._transport.collective:  # its start may wait for others
                start_transport(self._transport, False, describe_exchange(self, False))
            else:
                self._transport.start(False)
        self._state = "forward"

    def end(self) -> None:
        """Wait for every message and unpack the received rows (one compiled call)."""
        if self._state != "forward":
            raise MeshchainError("end() of a halo exchange needs a forward run begun by begin()")
        if not self._transport.idle:
            if activity.watched:  # polled and noted for hang diagnostics
                wait_transport(self._transport, False, describe_exchange(self, False))
            else:
                self._transport.wait(False)
        self._state = None
        if len(self.receive.table):
            unpack(self.receive.buffer, self.views, self.receive.table)
        if self._staged:
            self._stage("after_unpack", self.receive.rows)

    @property
    def arrives_by_neighbour(self) -> bool:
        """Whether a forward run's messages can be waited for neighbour by neighbour
        (:func:`arrivals`): the transport keeps one receive per neighbour and no rows are
        staged through a device."""
        return not self._staged and (self._transport.idle or type(self._transport).receives_in_flight
                                     is not Transport.receives_in_flight)

    def receives_in_flight(self) -> list:
        """``[(neighbour, request)]`` of the forward run in flight (see :func:`arrivals`)."""
        if self._state != "forward":
            raise MeshchainError("receives_in_flight() of a halo exchange needs a forward run begun by begin()")
        return [] if self._transport.idle else self._transport.receives_in_flight()

    def unpack_from(self, neighbour: int) -> None:
        """Unpack the rows received from ``neighbour`` (its receive is complete)."""
        first, last = self.receive.spans.get(neighbour, (0, 0))
        if last > first:
            unpack(self.receive.buffer, self.views, self.receive.table[first:last])

    def finish(self) -> None:
        """End a forward run whose received rows were all unpacked by :meth:`unpack_from`:
        wait for the sends."""
        if self._state != "forward":
            raise MeshchainError("finish() of a halo exchange needs a forward run begun by begin()")
        if not self._transport.idle:
            if activity.watched:  # polled and noted for hang diagnostics
                wait_transport(self._transport, False, describe_exchange(self, False))
            else:
                self._transport.wait(False)
        self._state = None

    def test(self) -> bool:
        """Whether the forward run begun by :meth:`begin` is complete (True at once when the
        exchange is :attr:`idle`), without blocking.

        May be called from another thread while the thread that called :meth:`begin` makes
        no MPI call; :meth:`end` must still be called (it then waits no more) to unpack.

        Examples
        --------
        >>> import numpy as np
        >>> from mpi4py import MPI
        >>> values = np.array([[1.0], [0.0]])          # row 0 goes to row 1, on this rank
        >>> exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0]}, {0: [1]})], tag=5)
        >>> exchange.begin()
        >>> while not exchange.test():
        ...     pass
        >>> exchange.end(); values[:, 0].tolist()
        [1.0, 1.0]
        >>> exchange.close()
        """
        if self._state != "forward":
            raise MeshchainError("test() of a halo exchange needs a forward run begun by begin()")
        return self._transport.idle or self._transport.test(False)

    # --- reverse: halo contributions back to their owners ---------------------------------------------

    def begin_reverse(self, op: str = "sum") -> None:
        """Pack the imported rows (one compiled call) and send them back to their owners,
        to be combined with ``op`` (one of :data:`OPS`) by :meth:`end_reverse`."""
        if not (isinstance(op, str) and op in self._checked):
            check_op(op, {item.array.dtype for item in self.items})
            self._checked.add(op)
        if self._state is not None:
            self._refuse("reverse")
        if self._staged:
            self._stage("before_pack", self.receive.rows)
        if len(self.receive.table):
            pack(self.receive.buffer, self.views, self.receive.table)
        if not self._transport.idle:
            if activity.watched and self._transport.collective:  # its start may wait for others
                start_transport(self._transport, True, describe_exchange(self, True))
            else:
                self._transport.start(True)
        self._state = op

    def end_reverse(self) -> None:
        """Wait for the contributions and combine them into the exported rows (neighbours
        ascending, then wire order; one compiled call per dtype, or one for ``"replace"``)."""
        op = self._state
        if op not in OPS:
            raise MeshchainError("end_reverse() of a halo exchange needs a reverse run begun by begin_reverse()")
        if not self._transport.idle:
            if activity.watched:  # polled and noted for hang diagnostics
                wait_transport(self._transport, True, describe_exchange(self, True))
            else:
                self._transport.wait(True)
        self._state = None
        if len(self.send.table):
            if op == "replace":
                unpack(self.send.buffer, self.views, self.send.table)
            else:
                if self._staged:
                    self._stage("before_pack", self.send.rows)
                for combine in self._combined():
                    COMBINE[op](self.send.buffer, combine.views, combine.table, combine.words, combine.values)
        if self._staged:
            self._stage("after_unpack", self.send.rows)

    def test_reverse(self) -> bool:
        """:meth:`test` for the reverse run begun by :meth:`begin_reverse` (then call
        :meth:`end_reverse`)."""
        if self._state not in OPS:
            raise MeshchainError("test_reverse() of a halo exchange needs a reverse run begun by begin_reverse()")
        return self._transport.idle or self._transport.test(True)

    def _combined(self) -> tuple:
        """One :class:`_Combine` per dtype among the dats that receive contributions (made once)."""
        if self._combines is None:
            table, by_dtype = self.send.table, {}
            for number in np.unique(table[:, 0]).tolist():
                by_dtype.setdefault(self.items[number].array.dtype, []).append(number)
            combines = []
            for dtype, group in by_dtype.items():
                local = np.full(len(self.items), -1, dtype=np.int64)
                local[group] = np.arange(len(group))
                part = np.ascontiguousarray(table[np.isin(table[:, 0], group)])
                part[:, 0] = local[part[:, 0]]
                combines.append(_Combine(tuple(typed_view(self.items[n].array) for n in group), part,
                                         *scratch(dtype)))
            self._combines = tuple(combines)
        return self._combines

    def close(self) -> None:
        """Free what the exchange holds (persistent requests; the communicators and windows of
        the ``"neighbour"`` and ``"rma"`` transports, collectively); a run still in flight is
        waited for first. The exchange cannot run afterwards; closing twice does nothing."""
        if self._state == "closed":
            return
        if self._state is not None:
            self._transport.wait(self._state != "forward")
        self._transport.close()
        self._state = "closed"


def arrivals(exchanges):
    """Wait for the forward runs of ``exchanges`` (begun, all :attr:`~HaloExchange.arrives_by_neighbour`)
    neighbour by neighbour: unpack each message as it completes and yield a neighbour's rank
    once all its messages have arrived, in the order they arrive; then wait for the sends.
    Requests another thread completed meanwhile (a progress poller testing the whole run)
    count as arrived.

    Examples
    --------
    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> values = np.array([[1.0], [0.0]])
    >>> exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0]}, {0: [1]})], tag=6)
    >>> exchange.begin()
    >>> list(arrivals([exchange])), values[:, 0].tolist()
    ([0], [1.0, 1.0])
    >>> exchange.close()
    """
    from mpi4py import MPI

    owners, requests, left = [], [], {}
    for exchange in exchanges:
        for neighbour, request in exchange.receives_in_flight():
            owners.append((neighbour, exchange))
            requests.append(request)
            left[neighbour] = left.get(neighbour, 0) + 1
    pending = set(range(len(requests)))
    while pending:
        index, done = MPI.Request.Testany(requests)
        if not done and activity.watched:  # noted for hang diagnostics, backing off
            what = " and ".join(describe_exchange(x) for x in exchanges) + " (boundary tasks)"
            index, done = wait_any(requests, what, {n for n, _ in owners}, {owners[i][0] for i in pending})
        while not done:  # MPI's Waitany spins without yielding: on an oversubscribed core it
            os.sched_yield()  # would starve the neighbour that is sending to this rank
            index, done = MPI.Request.Testany(requests)
        # UNDEFINED: every request left was completed elsewhere (a progress thread's Testall)
        for position in sorted(pending) if index == MPI.UNDEFINED else (index,):
            pending.discard(position)
            neighbour, exchange = owners[position]
            exchange.unpack_from(neighbour)
            left[neighbour] -= 1
            if not left[neighbour]:
                yield neighbour
    for exchange in exchanges:
        exchange.finish()
