"""Access modes of loop arguments.

Examples
--------
>>> import meshchain as mc
>>> mc.INC.writes, mc.READ.writes
(True, False)
"""

from __future__ import annotations

import enum

__all__ = ["Access", "READ", "WRITE", "RW", "INC", "MIN", "MAX"]


class Access(enum.Enum):
    """How a kernel touches an argument."""

    READ = "READ"
    WRITE = "WRITE"
    RW = "RW"
    INC = "INC"
    MIN = "MIN"
    MAX = "MAX"

    @property
    def writes(self) -> bool:
        """True when the kernel may modify the argument."""
        return self is not Access.READ

    @property
    def reads_old_value(self) -> bool:
        """True when the kernel sees the argument's value from before the loop."""
        return self in (Access.READ, Access.RW)

    @property
    def is_reduction(self) -> bool:
        """True for the modes that combine contributions (``INC``, ``MIN``, ``MAX``)."""
        return self in (Access.INC, Access.MIN, Access.MAX)

    def __repr__(self) -> str:
        return f"mc.{self.value}"

    # members are singletons: hash by identity (Enum's own hash runs Python code; loop
    # arguments are cached by access mode, so this is on every par_loop's path)
    __hash__ = object.__hash__


READ = Access.READ
WRITE = Access.WRITE
RW = Access.RW
INC = Access.INC
MIN = Access.MIN
MAX = Access.MAX

DAT_MODES = frozenset({READ, WRITE, RW, INC, MIN, MAX})
GLOBAL_MODES = frozenset({READ, INC, MIN, MAX})
