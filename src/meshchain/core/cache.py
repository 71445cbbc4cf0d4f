"""The one cache utility: bounded mappings that name the events which make them stale.

Every cache meshchain keeps (loop structures, colourings, chain schedules, executable
plans, compiled executors, tile plans, model decisions) is a :class:`Cache` obtained
from the session's :class:`CacheRegistry`. A cache holds at most ``limit`` entries (the
oldest goes first) and names its *invalidation events*; the session announces an event
with :meth:`CacheRegistry.notify` and every cache that named it is emptied at once:

``"configure"``
    an option that changes generated code or plans (backend, threads, block size, ...);
``"partition"``
    the mesh was distributed over the ranks (local numbering appears);
``"repartition"``
    local numbering changed (deeper halo layers were built, elements moved).

A cache may also run ``on_drop(value)`` for every entry it lets go (plans hand their
statistics to the recorder that way, so nothing counted is lost on eviction).

Each cache counts what it was given (``misses``: every entry stored under a new key, that
is, built because a look-up found nothing) and, where its user counts them, what was found
(``hits``: the plans and schedules the pipeline reused; ``None`` for a cache whose look-ups
are not counted, such as those on the per-``par_loop`` path, to keep it cheap).
``mc.stats()`` reports them (:meth:`CacheRegistry.counts`), as PyOP2's instrumented
caches do, so a loop that builds a new plan at every step shows at a glance.

What belongs to the process rather than a session (a plain function's kernel wrapper, a
value MPI fixes at start-up, interned chain options) is kept in a *memo* from :func:`memo`,
registered by name in :data:`MEMOS`: keyed weakly (``weak=True``: an entry goes with its
key object) or bounded by ``limit``. What the solvers keep per operator is the session's
(a weakly keyed cache, ``Cache(..., weak=True)``).

Examples
--------
>>> from meshchain.core.cache import CacheRegistry
>>> caches = CacheRegistry()
>>> plans = caches.cache("plans", limit=2, events=("configure",), counts_hits=True)
>>> plans["a"] = 1; plans["b"] = 2; plans["c"] = 3      # the oldest goes first
>>> sorted(plans.keys()), plans.get("a")
(['b', 'c'], None)
>>> caches.notify("partition"); len(plans)               # not one of its events
2
>>> caches.notify("configure"); len(plans)
0
>>> plans.hits += 1                                      # counted by the cache's user
>>> caches.counts()["plans"]
CacheCounts(name='plans', hits=1, misses=3, entries=0)
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

from .errors import InternalError

__all__ = ["Cache", "CacheRegistry", "CacheCounts", "EVENTS", "MEMOS", "memo", "bounded"]

EVENTS = frozenset({"configure", "partition", "repartition"})


class CacheCounts(NamedTuple):
    """One cache's counters: ``hits`` (None: not counted), ``misses`` (entries built) and the
    ``entries`` it holds now."""

    name: str
    hits: int | None
    misses: int
    entries: int


class Cache:
    """A bounded mapping emptied by the events it names (see the module docstring).

    ``get`` is the underlying dict's own ``get``: a hit costs one dict look-up (with ``weak``,
    a weak reference to the key is made too; the caller adds it to ``hits`` if the cache was
    made with ``counts_hits``); storing under a new key adds one to ``misses``.
    """

    __slots__ = ("name", "limit", "events", "on_drop", "_entries", "get", "hits", "misses")

    def __init__(self, name: str, *, limit: int, events=(), on_drop=None, counts_hits: bool = False,
                 weak: bool = False):
        unknown = set(events) - EVENTS
        if unknown:
            raise InternalError(f"cache {name!r}: unknown invalidation event(s) {sorted(unknown)}; known: {sorted(EVENTS)}")
        if limit < 1:
            raise InternalError(f"cache {name!r}: limit must be >= 1, got {limit}")
        self.name, self.limit, self.events, self.on_drop = name, limit, frozenset(events), on_drop
        self._entries = weakref.WeakKeyDictionary() if weak else {}  # weak: an entry goes with its key
        self.get = self._entries.get
        self.hits = 0 if counts_hits else None
        self.misses = 0

    def __setitem__(self, key, value) -> None:
        entries = self._entries
        if key not in entries:
            self.misses += 1
            if len(entries) >= self.limit:
                oldest = next(iter(entries))
                self._drop(entries.pop(oldest))
        entries[key] = value

    def __getitem__(self, key):
        return self._entries[key]

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self):
        return self._entries.keys()

    def values(self):
        return self._entries.values()

    def pop(self, key, default=None):
        if key not in self._entries:
            return default
        value = self._entries.pop(key)
        self._drop(value)
        return value

    def clear(self) -> None:
        dropped = list(self._entries.values())
        self._entries.clear()
        for value in dropped:
            self._drop(value)

    def _drop(self, value) -> None:
        if self.on_drop is not None:
            self.on_drop(value)

    def __repr__(self) -> str:
        return f"Cache({self.name!r}, {len(self)}/{self.limit}, events={sorted(self.events)})"


class CacheRegistry:
    """The caches of one session, and the events that empty them."""

    def __init__(self):
        self._caches: dict[str, Cache] = {}
        self.generation = 0  # events so far: what was built before an event may be stale

    def cache(self, name: str, *, limit: int, events=(), on_drop=None, counts_hits: bool = False,
              weak: bool = False) -> Cache:
        """A new cache registered under ``name`` (``weak``: keyed weakly, an entry goes with its
        key object); one registered earlier under that name (by a backend made anew) is emptied
        and replaced (its counters carry over)."""
        earlier = self._caches.pop(name, None)
        made = self._caches[name] = Cache(name, limit=limit, events=events, on_drop=on_drop, counts_hits=counts_hits,
                                          weak=weak)
        if earlier is not None:
            earlier.clear()
            made.misses = earlier.misses
            if made.hits is not None and earlier.hits is not None:
                made.hits = earlier.hits
        return made

    def notify(self, event: str) -> None:
        """Empty every cache that names ``event``."""
        if event not in EVENTS:
            raise InternalError(f"unknown invalidation event {event!r}; known: {sorted(EVENTS)}")
        self.generation += 1
        for cache in self._caches.values():
            if event in cache.events:
                cache.clear()

    def sizes(self) -> dict:
        """Entries held by each cache, by name (for diagnostics)."""
        return {name: len(cache) for name, cache in self._caches.items()}

    def counts(self) -> dict:
        """Each cache's :class:`CacheCounts`, by name."""
        return {name: CacheCounts(name, cache.hits, cache.misses, len(cache)) for name, cache in self._caches.items()}

    def reset_counts(self) -> None:
        """Start every cache's counters again from zero (``mc.stats(reset=True)``)."""
        for cache in self._caches.values():
            cache.misses = 0
            if cache.hits is not None:
                cache.hits = 0

    def __getitem__(self, name: str) -> Cache:
        return self._caches[name]


MEMOS: dict = {}
"""The process's memos by name (see the module docstring)."""


def memo(name: str, *, weak: bool = False, limit: int | None = None):
    """A process-wide memo registered as ``name``: a ``WeakKeyDictionary`` (``weak``) or a
    dict, emptied when it reaches ``limit`` entries (the caller checks with :func:`bounded`).

    >>> wrappers = memo("doctest wrappers", weak=True)
    >>> MEMOS["doctest wrappers"] is wrappers
    True
    """
    if name in MEMOS:  # a module imported again
        return MEMOS[name]
    made = MEMOS[name] = weakref.WeakKeyDictionary() if weak else {}
    if limit is not None:
        _LIMITS[name] = limit
    return made


_LIMITS: dict = {}


def bounded(name: str) -> None:
    """Empty the memo ``name`` when it holds its ``limit`` entries (before storing another)."""
    found = MEMOS[name]
    if len(found) >= _LIMITS[name]:
        found.clear()
