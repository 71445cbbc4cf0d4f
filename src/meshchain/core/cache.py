"""The one cache utility: bounded mappings that name the events which make them stale.

Every cache meshchain keeps (validated loops, colourings, chain schedules, executable
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

Examples
--------
>>> from meshchain.core.cache import CacheRegistry
>>> caches = CacheRegistry()
>>> plans = caches.cache("plans", limit=2, events=("configure",))
>>> plans["a"] = 1; plans["b"] = 2; plans["c"] = 3      # the oldest goes first
>>> sorted(plans.keys()), plans.get("a")
(['b', 'c'], None)
>>> caches.notify("partition"); len(plans)               # not one of its events
2
>>> caches.notify("configure"); len(plans)
0
"""

from __future__ import annotations

__all__ = ["Cache", "CacheRegistry", "EVENTS"]

EVENTS = frozenset({"configure", "partition", "repartition"})


class Cache:
    """A bounded mapping emptied by the events it names (see the module docstring).

    ``get`` is the underlying dict's own ``get``: a hit costs one dict look-up.
    """

    __slots__ = ("name", "limit", "events", "on_drop", "_entries", "get")

    def __init__(self, name: str, *, limit: int, events=(), on_drop=None):
        unknown = set(events) - EVENTS
        if unknown:
            raise ValueError(f"cache {name!r}: unknown invalidation event(s) {sorted(unknown)}; known: {sorted(EVENTS)}")
        if limit < 1:
            raise ValueError(f"cache {name!r}: limit must be >= 1, got {limit}")
        self.name, self.limit, self.events, self.on_drop = name, limit, frozenset(events), on_drop
        self._entries: dict = {}
        self.get = self._entries.get

    def __setitem__(self, key, value) -> None:
        entries = self._entries
        if key not in entries and len(entries) >= self.limit:
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

    def cache(self, name: str, *, limit: int, events=(), on_drop=None) -> Cache:
        """A new cache registered under ``name``; one registered earlier under that name (by a
        backend made anew) is emptied and replaced."""
        earlier = self._caches.pop(name, None)
        if earlier is not None:
            earlier.clear()
        made = self._caches[name] = Cache(name, limit=limit, events=events, on_drop=on_drop)
        return made

    def notify(self, event: str) -> None:
        """Empty every cache that names ``event``."""
        if event not in EVENTS:
            raise ValueError(f"unknown invalidation event {event!r}; known: {sorted(EVENTS)}")
        for cache in self._caches.values():
            if event in cache.events:
                cache.clear()

    def sizes(self) -> dict:
        """Entries held by each cache, by name (for diagnostics)."""
        return {name: len(cache) for name, cache in self._caches.items()}

    def __getitem__(self, name: str) -> Cache:
        return self._caches[name]
