"""The session context: how user-facing objects find the session that runs their loops.

Users declare sets, maps, dats and globals and read ``dat.data`` or ``glob.value``
without naming a session. Those objects live in :mod:`meshchain.types`, below the
engine, so they cannot import it; they ask :func:`current` instead, and the API layer
(:mod:`meshchain.api`, the only module that holds the global session) installs the
provider when it is imported. Only user-facing entry points use this: the engine
hands its session down explicitly, and a test enforces that no other layer reaches
for the context.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.core import context
>>> context.current() is mc.get_runtime()
True
"""

from __future__ import annotations

__all__ = ["install", "current"]

_provider = None


def install(provider) -> None:
    """Make ``provider()`` the way to the current session (called by :mod:`meshchain.api`)."""
    global _provider
    _provider = provider


def current():
    """The current session."""
    if _provider is None:
        from .errors import ConfigurationError

        raise ConfigurationError("no meshchain session: import meshchain (its API creates the session) before "
                                 "declaring sets, maps, dats or globals.")
    return _provider()
