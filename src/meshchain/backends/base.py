"""The interface every backend implements.

A backend turns a validated :class:`~meshchain.ir.loop.ParLoop` into work: it compiles
(or fetches from its caches) an executor for the loop's signature and runs it on
the plan the inspector made. Backends never validate user input: that happened
when the loop was recorded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..core.access import Access
from ..types.args import GLOBAL

__all__ = ["Backend", "reduced_targets", "combine_reductions"]


class Backend(ABC):
    """Base class of execution backends.

    Parameters
    ----------
    runtime : meshchain.engine.session.Runtime
        Gives the configuration and the inspector's plans.
    """

    name = "abstract"
    needs_plan = False
    can_tile = False

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

    def halo_exchanges(self, comm, items, *, grouped: bool) -> list:
        """Post the exchanges that bring ``items`` (``[(dat, lo, hi), ...]``) from valid depth
        ``lo`` to ``hi``: one grouped message per neighbour, or one per dat and neighbour.
        Each has ``finish()`` and counts ``messages``, ``bytes_sent`` (and, grouped, ``largest``).
        Backends that keep dats elsewhere than in host memory override this."""
        from ..comm.p2p import Exchange
        from ..comm.grouped import GroupedExchange

        if grouped:
            return [GroupedExchange(comm, items)]
        return [Exchange(comm, dat, lo, hi) for dat, lo, hi in items]

    def validate(self, config) -> None:
        """Refuse options this backend cannot honour here (raises ConfigurationError)."""

    def settle(self) -> None:
        """Wait for work still running asynchronously and account its times (``mc.stats()``)."""

    def run_indices(self, loop, elements, record, targets=None) -> None:
        """Run ``loop`` on the listed iterations ``elements`` (ascending). Backends that
        tile by this generic path implement it."""
        raise NotImplementedError(f"the {self.name} backend cannot run listed iterations")

    def run_tiled(self, plan, items) -> None:
        """Run a sparse-tiled chain: ``plan`` is a :class:`~meshchain.inspector.tiling.TilePlan`
        and ``items`` its loops as ``(loop, record, targets)``. Colours in order, tiles of a
        colour one after another here, every loop of a tile in chain order. Reductions go to
        private arrays and are combined at the end, so a loop that reads a global sees its
        value from before the chain, as it would untiled (the runtime never tiles a read
        after a reduction of the same global)."""
        private = [reduced_targets(loop, targets or {}) for loop, _, targets in items]
        running = [{**(targets or {}), **mine} for (_, _, targets), mine in zip(items, private)]
        for c in range(plan.ncolours):
            for t in plan.tile_order[plan.colour_offsets[c] : plan.colour_offsets[c + 1]]:
                for position, (loop, record, _) in enumerate(items):
                    its = plan.iterations[position][plan.starts[position][t] : plan.starts[position][t + 1]]
                    if len(its):
                        self.run_indices(loop, its, record, running[position])
        for (loop, _, targets), arrays in zip(items, private):
            combine_reductions(loop, targets or {}, {i: a[None] for i, a in arrays.items()})


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


def reduced_targets(loop, targets: dict) -> dict:
    """Fresh arrays for the globals ``loop`` reduces: zeros for INC, the current value for
    MIN and MAX (argument position -> array)."""
    private = {}
    for i, arg in enumerate(loop.args):
        if arg.kind == GLOBAL and arg.access is not Access.READ:
            current = targets.get(i, arg.data._data)
            private[i] = np.zeros_like(current) if arg.access is Access.INC else current.copy()
    return private


def combine_reductions(loop, targets: dict, partials: dict) -> None:
    """Fold ``partials[i]`` (shape ``(nparts, dim)``) into argument ``i``'s target, in order."""
    for i, values in partials.items():
        arg = loop.args[i]
        target = targets.get(i, arg.data._data)
        if not len(values):
            continue
        if arg.access is Access.INC:
            target += values.sum(axis=0, dtype=target.dtype)
        elif arg.access is Access.MIN:
            np.minimum(target, values.min(axis=0), out=target)
        else:
            np.maximum(target, values.max(axis=0), out=target)
