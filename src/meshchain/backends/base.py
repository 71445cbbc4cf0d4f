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
    def run(self, loop, plan, record) -> None:
        """Execute ``loop`` over ``plan`` (None when ``needs_plan`` is False); update ``record``."""


def readonly(array):
    """A read-only view of ``array`` (kernels that write to READ arguments then fail)."""
    view = array.view()
    view.flags.writeable = False
    return view
