"""How the packed words of a halo exchange travel: four transports, one wire layout.

A :class:`~meshchain.comm.exchange.HaloExchange` packs what it sends into one buffer
(:class:`Wire`): the *send* part holds, neighbour by neighbour, the exported rows; the
*receive* part, neighbour by neighbour, the imported ones. A transport moves the words of
each neighbour's slice of one part into the matching slice of the other part on that
neighbour, forward (send part to receive part: owners to halos) or in reverse (receive
part to send part: halos back to their owners). Every transport moves the same words, so
an exchange gives the same bits whatever its transport:

``"p2p"``
    a fresh ``comm.Isend``/``comm.Irecv`` per message and run;
``"persistent"``
    ``Send_init``/``Recv_init`` once (forward at build time, reverse at the first reverse
    run), started each run through the exchange's starter (which calls
    :func:`meshchain.comm.exchange.start_requests`), or from compiled code by a captured
    step's compiled replay (:meth:`Persistent.forward_handles`);
``"neighbour"``
    a distributed-graph communicator over the neighbours (``Create_dist_graph_adjacent``,
    not reordered) and one neighbourhood all-to-all per run: the persistent
    ``Neighbor_alltoallv_init`` (started like the persistent requests) where MPI >= 4 and
    mpi4py offer it, else ``Ineighbor_alltoallv``; the reverse direction has its own,
    mirrored communicator;
``"rma"``
    one window over the whole wire buffer (``MPI.Win.Create``) and active-target
    synchronisation: each run posts an exposure epoch to the ranks that put into this one,
    starts an access epoch to the ranks it puts to, puts each neighbour's slice at the
    displacement the neighbour gave (exchanged once, with the window's creation),
    completes the access epoch (in ``start``) and waits for the exposure epoch to end (in
    ``wait``, or in a ``test`` that finds it over). Completing in ``start`` makes ``start``
    wait until every target has posted (begun the same run), so every rank must begin the
    exchanges of a plan in the same order. The displacements come with each neighbour's
    word count: an exchange whose exports and imports disagree between two ranks fails at
    its first run, on every rank.

Testing
-------
:meth:`Transport.test` asks, without blocking, whether the run in flight in a direction is
complete (``MPI_Testall``, ``MPI_Test`` or ``MPI_Win_test``, each of which also drives
MPI's progress engine); after it said True, ``wait`` in that direction is still called and
returns at once (completed persistent requests are inactive, completed fresh ones are
``MPI_REQUEST_NULL``, and a window's exposure epoch that ``MPI_Win_test`` ended is not
waited for again). :mod:`.progress` tests from a communication thread while the main
thread computes.

Collective safety
-----------------
Creating a distributed-graph communicator or a window is collective over ``comm``: every
rank must create them, in the same order, even a rank with no neighbours. An exchange is
built by every rank in the same order, but a build may fail on one rank before it reaches
a later exchange, so a transport never creates them when it is built: it creates them at
its first run in a direction (every rank runs every exchange of a plan, in the same order)
and frees them in :meth:`Transport.close` (also collective: every rank closes the exchanges
it ran, in the same order). Closing an exchange that never ran is local, which lets a rank
whose build failed close what it made so far.

Examples
--------
>>> check_transport("rma")
'rma'
>>> "p2p" in available_transports()
True
>>> check_transport("carrier pigeon")
Traceback (most recent call last):
...
meshchain.core.errors.ConfigurationError: unknown halo transport 'carrier pigeon': choose one of 'p2p', 'persistent', 'neighbour', 'rma'
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core.errors import ConfigurationError, MeshchainError
from .packing import WORD

__all__ = ["TRANSPORTS", "check_transport", "available_transports", "Wire", "Transport", "make_transport",
           "intracomm", "post_messages"]

TRANSPORTS = ("p2p", "persistent", "neighbour", "rma")
"""The transports a halo exchange may use (see the module docstring)."""


def _missing(name: str, mpi, comm=None) -> str | None:
    """What transport ``name`` needs that the MPI module ``mpi`` (``mpi4py.MPI``) or ``comm``
    lacks, in words; ``None`` when nothing is missing."""
    version = tuple(mpi.Get_version())
    if name == "neighbour":
        if version < (3, 0):
            return f"MPI >= 3.0 for neighbourhood collectives (this library implements MPI {version[0]}.{version[1]})"
        intracomm_type, topocomm_type = getattr(mpi, "Intracomm", None), getattr(mpi, "Topocomm", None)
        lacking = [f"{kind}.{method}" for kind, owner, method in
                   (("Intracomm", intracomm_type, "Create_dist_graph_adjacent"),
                    ("Topocomm", topocomm_type, "Ineighbor_alltoallv")) if not hasattr(owner, method)]
        if lacking:
            return "mpi4py's " + " and ".join(lacking)
        if comm is not None and not hasattr(comm, "Create_dist_graph_adjacent"):
            return "an intracommunicator (this communicator cannot make a distributed graph)"
    elif name == "rma":
        window = getattr(mpi, "Win", None)
        lacking = [m for m in ("Create", "Post", "Start", "Put", "Complete", "Wait", "Free")
                   if not hasattr(window, m)]
        if window is None or lacking:
            return "one-sided communication (MPI.Win" + (f" with {', '.join(lacking)}" if window else "") + ")"
        if version < (2, 0):
            return f"MPI >= 2.0 for one-sided communication (this library implements MPI {version[0]}.{version[1]})"
        if comm is not None and getattr(comm, "is_inter", False):
            return "an intracommunicator (windows are not made over intercommunicators here)"
    return None


def available_transports(comm=None) -> tuple[str, ...]:
    """The transports this MPI library (and ``comm``, when given) offers, in :data:`TRANSPORTS` order."""
    from mpi4py import MPI

    return tuple(name for name in TRANSPORTS if _missing(name, MPI, comm) is None)


def check_transport(name, comm=None) -> str:
    """``name`` when it is a transport this MPI library (and ``comm``) offers; otherwise a
    :class:`~meshchain.core.errors.ConfigurationError` that says what is unknown or
    missing and which transports work. The same input gives the same answer on every rank."""
    if not isinstance(name, str) or name not in TRANSPORTS:
        raise ConfigurationError(f"unknown halo transport {name!r}: choose one of "
                                 + ", ".join(repr(t) for t in TRANSPORTS))
    from mpi4py import MPI

    missing = _missing(name, MPI, comm)
    if missing is not None:
        raise ConfigurationError(f"halo transport {name!r} needs {missing}; here use one of "
                                 + ", ".join(repr(t) for t in available_transports(comm)))
    return name


def intracomm(comm):
    """The ``mpi4py`` communicator behind ``comm`` (``comm`` itself, or the communicator a
    wrapper object forwards ``handle`` to), for calls that need the real object."""
    from mpi4py import MPI

    return comm if isinstance(comm, MPI.Comm) else MPI.Intracomm.fromhandle(comm.handle)


class Wire(NamedTuple):
    """The words of both directions of an exchange, in one allocation.

    ``send`` and ``receive`` are views of ``buffer`` starting at word ``send_at`` and
    ``receive_at`` (one unused word keeps them apart, so they never share an address even
    when one is empty); ``send_ranges`` and ``receive_ranges`` list, neighbour by
    neighbour (ascending), ``(neighbour, begin, end)`` word ranges of ``send`` and
    ``receive`` (neighbours with nothing to move are left out).
    """

    buffer: np.ndarray
    send: np.ndarray
    receive: np.ndarray
    send_at: int
    receive_at: int
    send_ranges: tuple
    receive_ranges: tuple

    @classmethod
    def allocate(cls, send_words: int, receive_words: int, send_ranges, receive_ranges) -> Wire:
        buffer = np.zeros(send_words + 1 + receive_words, dtype=WORD)
        receive_at = send_words + 1
        return cls(buffer, buffer[:send_words], buffer[receive_at:], 0, receive_at,
                   tuple(send_ranges), tuple(receive_ranges))


class _Direction:
    """One direction of a wire: the slices sent and received (views made once), per neighbour."""

    def __init__(self, out, out_ranges, into, into_ranges):
        self.out, self.into = out, into
        self.out_ranges, self.into_ranges = tuple(out_ranges), tuple(into_ranges)
        self.sends = [(n, out[b:e]) for n, b, e in self.out_ranges]
        self.receives = [(n, into[b:e]) for n, b, e in self.into_ranges]

    def vector(self, ranges):
        """``(counts, displacements)`` of ``ranges``, as lists (for the v-collectives)."""
        return [e - b for _, b, e in ranges], [b for _, b, _ in ranges]


class Transport:
    """Moves a wire's words (see the module docstring); one per exchange.

    ``start(reverse)`` begins a run in one direction (the sent words are packed),
    ``test(reverse)`` says whether it is complete without blocking, ``wait(reverse)`` ends
    it (the received words may be unpacked); ``close()`` frees what the transport holds.
    ``requests`` lists the MPI requests it holds now.
    """

    name = ""
    collective = False
    """Whether runs take part in collectives (then every rank runs them, neighbours or not)."""
    owes_progress = False
    """Whether a rank whose run is complete can still hold its neighbours' runs until it
    calls MPI again (see :meth:`progress`)."""

    def __init__(self, comm, wire: Wire, *, tag: int, start):
        self.comm, self.wire, self.tag, self._start = comm, wire, tag, start
        self._probe = None  # the mpi4py communicator progress() probes, made at its first call
        # nothing to do in either direction: the exchange may skip ``start`` and ``wait``
        self.idle = not self.collective and not (wire.send_ranges or wire.receive_ranges)
        self.directions = (
            _Direction(wire.send, wire.send_ranges, wire.receive, wire.receive_ranges),
            _Direction(wire.receive, wire.receive_ranges, wire.send, wire.send_ranges),
        )

    @property
    def requests(self) -> list:
        return []

    def start(self, reverse: bool = False) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def test(self, reverse: bool = False) -> bool:  # pragma: no cover - abstract
        """Whether the run in direction ``reverse`` is complete (True when none is in
        flight); never blocks, and a later ``wait(reverse)`` returns at once."""
        raise NotImplementedError

    def wait(self, reverse: bool = False) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        """Free what the transport holds (collective where it made collective objects)."""

    def receives_in_flight(self):
        """``[(neighbour, request)]`` of the forward run in flight, one receive per neighbour,
        for waiting on them one by one; None when this transport completes a run as a whole."""
        return None

    def in_flight(self, reverse: bool = False):
        """``[(neighbour, receiving, request)]`` of the run in flight in direction ``reverse``,
        one per message (``receiving``: a receive from the neighbour, else a send to it), for
        telling which neighbours' messages are outstanding (hang diagnostics); None when this
        transport completes a run as a whole."""
        return None

    def progress(self) -> None:
        """Let MPI move what this rank owes others (one nonblocking probe on the
        communicator; it receives nothing). MPI promises only weak progress: with MPICH, the
        ``"rma"`` transport's completion notices leave an origin, whose own run is complete,
        only when it calls MPI again."""
        if self._probe is None:
            self._probe = intracomm(self.comm)
        self._probe.Iprobe()


class P2P(Transport):
    """A fresh ``comm.Irecv``/``comm.Isend`` per neighbour and run (receives posted first)."""

    name = "p2p"

    def __init__(self, comm, wire, *, tag, start):
        super().__init__(comm, wire, tag=tag, start=start)
        self._flight: list = []

    @property
    def requests(self) -> list:
        return list(self._flight)

    def start(self, reverse=False):
        direction, comm, tag = self.directions[reverse], self.comm, self.tag
        flight = [comm.Irecv(view, source=n, tag=tag) for n, view in direction.receives]
        flight += [comm.Isend(view, dest=n, tag=tag) for n, view in direction.sends]
        self._flight = flight

    def test(self, reverse=False):
        if not self._flight:
            return True
        from mpi4py import MPI

        return MPI.Request.Testall(self._flight)  # complete: every request becomes REQUEST_NULL

    def wait(self, reverse=False):
        if self._flight:
            from mpi4py import MPI

            MPI.Request.Waitall(self._flight)
        self._flight = []

    def receives_in_flight(self):
        return [(n, self._flight[k]) for k, (n, _) in enumerate(self.directions[0].receives)] if self._flight else []

    def in_flight(self, reverse=False):
        direction, flight = self.directions[reverse], self._flight
        receives = [(n, True, request) for (n, _), request in zip(direction.receives, flight)]
        return receives + [(n, False, request) for (n, _), request in zip(direction.sends, flight[len(receives):])]

    def close(self):
        self.wait()


class Persistent(Transport):
    """``Send_init``/``Recv_init`` once per direction, started each run through the starter."""

    name = "persistent"

    def __init__(self, comm, wire, *, tag, start):
        super().__init__(comm, wire, tag=tag, start=start)
        self._made = [self._make(self.directions[0]), None]

    def _make(self, direction) -> list:
        comm, tag = self.comm, self.tag
        made = [comm.Send_init(view, dest=n, tag=tag) for n, view in direction.sends]
        return made + [comm.Recv_init(view, source=n, tag=tag) for n, view in direction.receives]

    @property
    def requests(self) -> list:
        return [request for made in self._made if made for request in made]

    def start(self, reverse=False):
        if self._made[reverse] is None:
            self._made[reverse] = self._make(self.directions[reverse])
        if self._made[reverse]:
            self._start(self._made[reverse])

    def forward_handles(self):
        """``(handles, statuses)``: the forward requests' C handles (int32) and room for their
        statuses, for ``MPI_Startall``/``MPI_Waitall`` called from compiled code."""
        from mpi4py import MPI

        from .compiled import _as_c_ints

        made = self._made[0]
        handles = _as_c_ints([MPI._handleof(request) for request in made])
        return handles, np.zeros(max(1, len(made)) * MPI._sizeof(MPI.Status), dtype=np.uint8)

    def test(self, reverse=False):
        if not self._made[reverse]:
            return True
        from mpi4py import MPI

        return MPI.Request.Testall(self._made[reverse])  # complete: every request becomes inactive

    def wait(self, reverse=False):
        if self._made[reverse]:
            from mpi4py import MPI

            MPI.Request.Waitall(self._made[reverse])

    def close(self):
        for request in self.requests:
            request.Free()
        self._made = [[], []]

    def receives_in_flight(self):
        made, sends = self._made[0] or [], len(self.directions[0].sends)
        return [(n, made[sends + k]) for k, (n, _) in enumerate(self.directions[0].receives)] if made else []

    def in_flight(self, reverse=False):
        direction, made = self.directions[reverse], self._made[reverse] or []
        sends = [(n, False, request) for (n, _), request in zip(direction.sends, made)]
        return sends + [(n, True, request) for (n, _), request in zip(direction.receives, made[len(sends):])]


class Neighbour(Transport):
    """A neighbourhood all-to-all on a distributed-graph communicator per direction (made at
    the direction's first run: collective)."""

    name = "neighbour"
    collective = True
    use_persistent = True
    """Use ``Neighbor_alltoallv_init`` where MPI >= 4 and mpi4py offer it (tests turn it off
    to run the ``Ineighbor_alltoallv`` path)."""

    def __init__(self, comm, wire, *, tag, start):
        super().__init__(comm, wire, tag=tag, start=start)
        self._graphs: list = [None, None]
        self._persistent: list = [None, None]
        self._flight = None

    @property
    def requests(self) -> list:
        held = [request for request in self._persistent if request is not None]
        return held + ([self._flight] if self._flight is not None else [])

    def _arguments(self, reverse):
        from mpi4py import MPI

        direction = self.directions[reverse]
        counts_out, displs_out = direction.vector(direction.out_ranges)
        counts_in, displs_in = direction.vector(direction.into_ranges)
        return ([direction.out, counts_out, displs_out, MPI.UINT32_T],
                [direction.into, counts_in, displs_in, MPI.UINT32_T])

    def _graph(self, reverse):
        if self._graphs[reverse] is None:
            from mpi4py import MPI

            direction = self.directions[reverse]
            graph = self.comm.Create_dist_graph_adjacent([n for n, _, _ in direction.into_ranges],
                                                         [n for n, _, _ in direction.out_ranges], reorder=False)
            self._graphs[reverse] = graph
            make = getattr(graph, "Neighbor_alltoallv_init", None)
            if self.use_persistent and make is not None and tuple(MPI.Get_version()) >= (4, 0):
                try:
                    self._persistent[reverse] = make(*self._arguments(reverse))
                except NotImplementedError:  # pragma: no cover - mpi4py built against an older MPI
                    self._persistent[reverse] = None
        return self._graphs[reverse]

    def start(self, reverse=False):
        graph = self._graph(reverse)
        if self._persistent[reverse] is not None:
            self._start([self._persistent[reverse]])
        else:
            self._flight = graph.Ineighbor_alltoallv(*self._arguments(reverse))

    def test(self, reverse=False):
        if self._persistent[reverse] is not None:
            return self._persistent[reverse].Test()  # complete (or never started): inactive
        return self._flight is None or self._flight.Test()  # complete: REQUEST_NULL, waited at once

    def wait(self, reverse=False):
        if self._persistent[reverse] is not None:
            self._persistent[reverse].Wait()
        elif self._flight is not None:
            self._flight.Wait()
            self._flight = None

    def close(self):
        if self._flight is not None:
            self._flight.Wait()
            self._flight = None
        for reverse in (0, 1):
            if self._persistent[reverse] is not None:
                self._persistent[reverse].Free()
                self._persistent[reverse] = None
            if self._graphs[reverse] is not None:
                self._graphs[reverse].Free()
                self._graphs[reverse] = None


class RMA(Transport):
    """Puts into a window over the wire, with Post/Start/Complete/Wait (the window, its
    groups and the neighbours' displacements are made at the first run: collective)."""

    name = "rma"
    collective = True
    owes_progress = True  # MPI_Win_complete can return before its targets may end their epoch

    def __init__(self, comm, wire, *, tag, start):
        super().__init__(comm, wire, tag=tag, start=start)
        self.window = None
        self._groups: tuple = ()
        self._puts: tuple = ()
        self._exposed = False  # an exposure epoch is open (posted, neither waited for nor tested over)

    def _open(self) -> None:
        from mpi4py import MPI

        real, wire = intracomm(self.comm), self.wire
        # where (and how many words) each neighbour puts into this rank: forward into its
        # receive slice, reverse into its send slice; -1 where it puts nothing
        where = np.full((real.size, 2, 2), -1, dtype=np.int64)
        for column, ranges, at in ((0, wire.receive_ranges, wire.receive_at), (1, wire.send_ranges, wire.send_at)):
            for n, b, e in ranges:
                where[n, column] = at + b, e - b
        there = np.empty_like(where)
        # collective, like the window's creation; it shares no tag with any halo message
        real.Alltoall([where, MPI.INT64_T], [there, MPI.INT64_T])
        puts = np.zeros((real.size, 2), dtype=np.int64)  # the words this rank puts into each rank
        for column, ranges in ((0, wire.send_ranges), (1, wire.receive_ranges)):
            for n, b, e in ranges:
                puts[n, column] = e - b
        wrong = np.argwhere(puts != np.maximum(there[:, :, 1], 0))
        problem = None if not len(wrong) else (
            f"rank {real.rank} would put {puts[tuple(wrong[0])]} words into rank {wrong[0][0]}, which expects "
            f"{max(int(there[wrong[0][0], wrong[0][1], 1]), 0)} ({'reverse' if wrong[0][1] else 'forward'})")
        if real.allreduce(problem is not None, op=MPI.LOR):  # every rank refuses, none hangs
            raise MeshchainError(f"rma halo transport: {problem or 'on another rank, an exchange'}: the exchange's "
                                 "exports and imports do not match between ranks")
        self.window = MPI.Win.Create(wire.buffer, WORD.itemsize, comm=real)
        world = real.Get_group()
        try:
            # 0: forward sources (post) = reverse targets (start); 1: forward targets = reverse sources
            self._groups = (world.Incl([n for n, _, _ in wire.receive_ranges]),
                            world.Incl([n for n, _, _ in wire.send_ranges]))
        finally:
            world.Free()
        self._puts = tuple(
            tuple(([view, MPI.UINT32_T], n, (int(there[n, reverse, 0]), view.size, MPI.UINT32_T))
                  for n, view in self.directions[reverse].sends)
            for reverse in (0, 1))

    def start(self, reverse=False):
        if self.window is None:
            self._open()
        window, direction = self.window, self.directions[reverse]
        exposed, accessed = (self._groups[0], self._groups[1]) if not reverse else (self._groups[1], self._groups[0])
        if direction.receives:
            window.Post(exposed)
            self._exposed = True
        if direction.sends:
            window.Start(accessed)
            for origin, target_rank, target in self._puts[reverse]:
                window.Put(origin, target_rank, target)
            window.Complete()

    def test(self, reverse=False):
        if self._exposed and self.window.Test():  # a True MPI_Win_test ends the epoch: no Wait then
            self._exposed = False
        return not self._exposed

    def wait(self, reverse=False):
        if self._exposed:
            self.window.Wait()
            self._exposed = False
        else:  # tested complete already: still one MPI call, for the notices this origin owes
            self.progress()

    def close(self):
        if self.window is not None:
            self.window.Free()
            self.window = None
        for group in self._groups:
            group.Free()
        self._groups, self._puts = (), ()
        self._exposed = False


def post_messages(comm, sends, receives, *, tag: int) -> list:
    """Post a fresh ``comm.Irecv`` for each ``(neighbour, buffer)`` of ``receives`` and a
    ``comm.Isend`` for each of ``sends`` (receives first), and return the requests: the
    ``"p2p"`` transport for buffers that are not a :class:`Wire`, such as the device or
    pinned host buffers of the GPU backend's exchanges (any buffer MPI accepts)."""
    requests = [comm.Irecv(buffer, source=n, tag=tag) for n, buffer in receives]
    return requests + [comm.Isend(buffer, dest=n, tag=tag) for n, buffer in sends]


_KINDS = {kind.name: kind for kind in (P2P, Persistent, Neighbour, RMA)}


def make_transport(name: str, comm, wire: Wire, *, tag: int, start) -> Transport:
    """A transport ``name`` (checked with :func:`check_transport`) moving ``wire`` over ``comm``
    with messages tagged ``tag``; ``start(requests)`` starts persistent requests."""
    return _KINDS[check_transport(name, comm)](comm, wire, tag=tag, start=start)
