"""The trace: loops recorded by ``par_loop`` and not yet executed.

Examples
--------
>>> from meshchain.lazy.trace import Trace
>>> t = Trace()
>>> t.append("loop"); len(t)
1
>>> t.take(), len(t)
(['loop'], 0)
"""

from __future__ import annotations

__all__ = ["Trace"]


class Trace:
    """An ordered list of pending loops; ``take()`` hands them over for execution."""

    def __init__(self):
        self._loops: list = []

    def append(self, loop) -> None:
        self._loops.append(loop)

    def take(self) -> list:
        """Remove and return every pending loop, in recording order."""
        loops, self._loops = self._loops, []
        return loops

    def __len__(self) -> int:
        return len(self._loops)

    def __bool__(self) -> bool:
        return bool(self._loops)
