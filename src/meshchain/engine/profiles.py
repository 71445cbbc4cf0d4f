"""Recording a session's profile: ``mc.profile()`` blocks and ``config.profile``.

A profile block runs what is pending, records everything run inside it (the loops
pending at its end included) and writes the trace when it ends (collective on several
ranks: every rank enters and leaves the block). On an error inside the block on several
ranks, each rank writes its own events to ``<path stem>.rank<r><suffix>`` instead (no
collective: the other ranks may not have reached the end of the block).

``config.profile`` (``MESHCHAIN_PROFILE``) records the whole run: from the session's
start, or from ``mc.configure(profile=...)``, to the process's exit (or the next
``mc.configure(profile=...)``), then writes the trace.

Examples
--------
>>> import meshchain as mc
>>> cells = mc.Set(3, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> one = mc.Kernel.from_source("def one(a):\\n    a[0] = 1.0\\n")
>>> with mc.profile() as profile:       # no path: kept in memory
...     mc.par_loop(one, cells, q(mc.WRITE))
>>> profile.path is None, "loop one" in {e["name"] for e in profile.events}
(True, True)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..core import profiling

__all__ = ["Profile", "profile_block", "SessionProfile"]


class Profile:
    """What a profile block recorded: ``events`` (this rank's, in the trace-event format),
    ``path`` (the file written on this rank, or None) and ``seconds`` (the block's length)."""

    def __init__(self, profiler):
        self._profiler = profiler
        self.events: list = []
        self.path: Path | None = None
        self.seconds = 0.0

    def __repr__(self) -> str:
        return f"Profile({len(self.events)} events, {self.seconds:.3f} s, path={self.path})"

    def _finish(self, *, collective: bool) -> None:
        profiler = self._profiler
        profiler.close()
        self.seconds = profiler.closed_at - profiler.origin
        self.events = profiler.trace_events()
        if not collective and profiler.comm is not None and profiler.path is not None:
            path = profiler.path
            profiler.path = path.with_name(f"{path.stem}.rank{profiler.rank}{path.suffix}")
            profiler.comm = None  # each rank writes its own
        self.path = profiler.write()


@contextlib.contextmanager
def profile_block(session, path):
    """The context manager of ``mc.profile(path)`` on ``session``."""
    session.flush()
    profiler = profiling.start(path, comm=session.comm if session.distributed else None)
    result = Profile(profiler)
    failed = True
    try:
        yield result
        session.flush()
        failed = False
    finally:
        profiling.stop(profiler)
        result._finish(collective=not (failed and session.distributed))


class SessionProfile:
    """The profile ``config.profile`` asks for, kept in step with the configuration."""

    def __init__(self):
        self.profiler = None

    def follow(self, session) -> None:
        """Start, switch or end the session-wide profile as ``session.config.profile`` says
        (collective on several ranks, like ``mc.configure``)."""
        wanted = session.config.profile
        current = self.profiler
        if current is not None and (wanted is None or Path(wanted) != current.path):
            self.finish()
        if wanted is not None and self.profiler is None:
            self.profiler = profiling.start(wanted, comm=session.comm if session.distributed else None)

    def finish(self) -> None:
        """Stop and write the session-wide profile (at exit, or when the option changes)."""
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiling.stop(profiler)
            profiler.write()
