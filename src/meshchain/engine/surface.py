"""The engine as the packages above the API see it: what ``linalg`` and ``io`` may use.

Solvers and parallel I/O need more than the user interface (a solver works on the owned
rows of its vectors in place, an output writer on the local rows of maps), but not the
session's internals. :class:`Surface` is that small interface, one per session
(``meshchain.api.engine_surface()``): the communicator, the storage of an object, a set's
owned size and local layout, a map's local rows, the live declarations, running pending
loops, an object's values, marking halos stale, how computation overlaps messages, captured
steps, and the matrices. ``tests/test_layering.py`` rejects any other way into the session from those
packages.

Examples
--------
>>> import meshchain as mc
>>> surface = mc.api.engine_surface()
>>> cells = mc.Set(3, "cells")
>>> surface.distributed, surface.comm, surface.n_owned(cells)
(False, None, 3)
"""

from __future__ import annotations

from ..core.cache import EVENTS
from .chains import ChainOptions

__all__ = ["Surface"]

SOLVER_CACHE_LIMIT = 2 ** 62
"""No limit, in effect, on the operators a :meth:`Surface.solver_cache` keeps something for:
evicting one would make its work vectors be declared again on the ranks that evicted it, and
on several ranks every rank must declare alike (an entry of a dead operator not yet collected
would count on one rank and not on another)."""


class Surface:
    """What ``meshchain.linalg`` and ``meshchain.io`` use of a session (see the module docstring)."""

    __slots__ = ("_session",)

    def __init__(self, session):
        self._session = session

    @property
    def distributed(self) -> bool:
        """Whether the session runs on several ranks."""
        return self._session.distributed

    @property
    def comm(self):
        """The session's communicator on several ranks, None on one process."""
        session = self._session
        return session.comm if session.distributed else None

    @property
    def backend_name(self) -> str:
        return self._session.config.backend

    @property
    def matrices(self):
        """The session's matrices (:class:`~meshchain.engine.matrices.Matrices`)."""
        return self._session.matrices

    def storage(self, obj):
        """The storage record of a dat or global (its arrays, valid halo depth)."""
        return self._session.storage(obj)

    def storages(self, objs) -> tuple:
        """The storage records of several dats or globals, in order (:meth:`storage` of each, in
        one call)."""
        records = self._session.store.records_of(objs)
        if None in records:
            for obj in objs:
                self._session.storage(obj)  # raises for the one this session does not know
        return records

    def n_owned(self, s) -> int:
        """How many elements of set ``s`` this rank owns."""
        return self._session.n_owned(s)

    def layout_of(self, s):
        """The local layout of set ``s`` (None on several ranks before partitioning)."""
        return self._session.layout_of(s)

    def map_rows(self, m):
        """Map ``m``'s rows as declared, before partitioning (block rows on several ranks)."""
        return self._session.declarations.map_rows[m.uid]

    def declared(self, *, agreed: bool = False):
        """The live sets, maps and dats, in declaration order (``agreed``: alive on every rank; collective)."""
        return self._session.declarations.declared(agreed=agreed)

    def dat_values(self, d, *, write: bool, halos: bool = False):
        """``d``'s owned rows (``halos``: all rows) after the loops they depend on ran; ``write``: to change them."""
        return self._session.dat_values(d, write=write, halos=halos)

    def run_pending(self, obj=None) -> None:
        """Run the pending loops ``obj``'s value depends on (every pending loop when None)."""
        if obj is None:
            self._session.flush()
        else:
            self._session.force_read(obj)

    def halos_stale(self, d) -> None:
        """``d``'s halo copies no longer hold its owners' values (its owned rows were changed in place)."""
        self._session.storage(d).valid_depth = 0

    def capture(self, fn, *, name: str):
        """``fn`` as a step captured once and replayed (:mod:`.capture`), loop by loop on several ranks."""
        return self._session.capture(fn, ChainOptions.of(name, False))

    def refuse_in_capture(self, what: str) -> None:
        """Raise :class:`~meshchain.CaptureError` if a step is being captured now: ``what`` (a
        solve, say) cannot be part of its replays."""
        recording = self._session.tracing.capturing
        if recording is not None:
            recording.refuse(what)

    def solver_cache(self, name: str):
        """This session's cache ``name`` of what the solvers keep per operator between solves
        (work vectors, set-ups: :mod:`meshchain.linalg`), made at first use and registered with
        the session's caches (``mc.stats()`` counts it). Keyed weakly: an entry goes with a
        LinearOperator the user drops (a Mat lives as long as its session). Emptied when the
        mesh is partitioned, repartitioned or given deeper halo layers, or when a new
        configuration changes plans; gone with the session, so it never keeps an old session
        alive."""
        caches = self._session.caches
        try:
            return caches[name]
        except KeyError:
            return caches.cache(name, limit=SOLVER_CACHE_LIMIT, events=EVENTS, counts_hits=True, weak=True)

    def overlap(self):
        """How computation runs beside messages in flight (:class:`~meshchain.engine.plans.Overlap`)."""
        return self._session.overlap()
