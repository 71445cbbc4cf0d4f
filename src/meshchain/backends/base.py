"""The interface every backend implements.

A backend turns a validated :class:`~meshchain.loop.ParLoop` into work: it compiles
(or fetches from its caches) an executor for the loop's signature and runs it on
the plan the inspector made. Backends never validate user input: that happened
when the loop was recorded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["Backend"]


class Backend(ABC):
    """Base class of execution backends.

    Parameters
    ----------
    runtime : meshchain.runtime.Runtime
        Gives the configuration and the inspector's plans.
    """

    name = "abstract"
    needs_plan = False

    def __init__(self, runtime):
        self.runtime = runtime

    @abstractmethod
    def run(self, loop, plan, record, targets=None) -> None:
        """Execute ``loop`` over the iterations of ``plan`` and update ``record``.

        ``plan`` is a colouring :class:`~meshchain.inspector.Plan` when ``needs_plan`` is True,
        else a :class:`Range`; both have ``start`` and ``end``. ``targets`` maps argument
        positions of reduced globals to the arrays to reduce into (default: the globals).
        """


    def run_phase(self, items) -> None:
        """Run ``(loop, plan, record, targets)`` items in order: one phase of a chain. Backends
        that can compile a whole phase into one call override this."""
        for loop, plan, record, targets in items:
            self.run(loop, plan, record, targets)


class Range:
    """Iterations ``start <= e < end`` (for backends that need no plan)."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end


def readonly(array):
    """A read-only view of ``array`` (kernels that write to READ arguments then fail)."""
    view = array.view()
    view.flags.writeable = False
    return view
