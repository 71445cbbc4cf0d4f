"""The interface every backend implements: prepared calls for the phases of a plan.

A backend turns validated :class:`~meshchain.ir.loop.ParLoop` records into work. The
engine hands it the *runs* of one phase of a plan (:class:`PhaseRun`: a loop, an
iteration range, the storage of the loop's dats and globals, its maps' local values,
where its reductions go, and the range's block colouring when the backend asked for one)
and gets back a prepared call: compiling, caching executors and preparing arguments
happen once, when the plan is built; the call itself only runs. Backends never look at
the session: the configuration and a cache registry are handed to them.

Backends never validate user input: that happened when the loop was recorded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import numpy as np

from ..comm.exchange import HaloExchange, HaloItem
from ..comm.progress import PROGRESS_MODES
from ..comm.transports import TRANSPORTS
from ..core.access import Access
from ..core.errors import ConfigurationError
from ..types.args import GLOBAL

__all__ = ["Backend", "PhaseRun", "reduced_targets", "combine_reductions", "readonly", "arrays_of"]


class PhaseRun(NamedTuple):
    """Iterations ``[start, end)`` of ``loop``.

    ``data`` are the storage records of the loop's dats and globals in slot order
    (:class:`~meshchain.core.storage.DatStorage`, :class:`~meshchain.core.storage.GlobalStorage`),
    ``maps`` its maps' values in local numbering in map-slot order, ``targets`` the arrays
    that receive the reductions of globals by argument position (empty: the globals
    themselves), ``colouring`` the block colouring of the range (a
    :class:`~meshchain.inspector.colouring.BlockColouring`) when :meth:`Backend.colouring_block_size`
    asked for one, ``timer(seconds)`` where a backend that times its work itself (a GPU's
    events) reports the run's compute time.
    """

    loop: object
    start: int
    end: int
    data: tuple
    maps: tuple
    targets: dict
    colouring: object = None
    timer: object = None


class Backend(ABC):
    """Base class of execution backends.

    Parameters
    ----------
    config : meshchain.core.config.Config
        The options (threads, block size, cache directory, debug, GPU options).
    caches : meshchain.core.cache.CacheRegistry
        Where the backend registers its caches (compiled executors, device copies of maps).
    distributed : bool
        Whether the session runs on several ranks.
    """

    name = "abstract"
    transports = TRANSPORTS  # how its halo exchanges may move messages (see meshchain.comm.transports)
    progress_modes = PROGRESS_MODES  # how its exchanges may progress during computation (meshchain.comm.progress)
    can_tile = False
    grid_arithmetic = True  # runs structured-grid loops by index arithmetic (else they come lowered to maps)
    layer_arithmetic = False  # finds an extruded map's targets per layer by arithmetic (ArgSpec.layers)
    can_chunk = False  # True: chunked() schedules a phase's blocks dynamically on threads
    times_itself = False  # True: compute times come through PhaseRun.timer, not the engine's clock

    def __init__(self, config, caches, *, distributed: bool = False):
        self.config, self.caches, self.distributed = config, caches, distributed

    def colouring_block_size(self, loop) -> int | None:
        """The block size of the colouring the runs of ``loop`` need (None: no colouring)."""
        return None

    @abstractmethod
    def phase(self, runs, report):
        """A prepared call that runs ``runs`` (:class:`PhaseRun`) in order.

        ``report(loop, seconds, compiled, cache_hits)`` is told about every compilation
        (or load from a cache) made while preparing. Errors in compiling raise here.
        """

    def replay(self, calls, exchanges: int, program, arguments, report, *, reductions=(), ticks: bool = False):
        """A callable running a captured step's plan whole in compiled code, bound to the argument
        tuple ``arguments`` (``calls``: its prepared calls, ``exchanges`` halo exchanges,
        ``program`` the operations in order, ``reductions`` whether each reduction over ranks is an
        increment, ``ticks`` its stamps read the time-stamp counter: see
        :mod:`meshchain.backends.numba_replay`), or None: this backend replays in Python."""
        return None

    def repeater(self, call, report):
        """What makes the prepared call ``call`` (of :meth:`phase`) several times in a row in
        compiled code, with its arguments of the moment (a call rebound to other objects runs
        with theirs): an object with ``prepare()`` (compiles, or loads, what the arguments' types
        need; ``report(seconds, compiled, cache_hits)`` is told), ``run(times)`` and ``done``
        (the calls the last ``run`` completed, also when one raised); or None: this backend
        repeats it in Python."""
        return None

    def threads_in_use(self) -> int:
        """Compute threads per rank (what a calibration's loop costs depend on)."""
        return 1

    def chunk_workers(self) -> int:
        """Worker threads :meth:`chunked` uses beside the calling thread (0: it cannot chunk)."""
        return 0

    def chunked(self, runs, report, *, workers: int, chunk_blocks: int = 1):
        """A :class:`~meshchain.backends.threads.ChunkedCall` running ``runs`` as :meth:`phase`
        does, bit for bit, its blocks handed out ``chunk_blocks`` at a time to ``workers``
        threads and to the thread that calls ``run(driver)`` once its communication is done
        (None: no run has iterations). Only backends with ``can_chunk`` implement it.

        Examples
        --------
        >>> import meshchain as mc
        >>> from meshchain.backends import make_backend
        >>> backend = make_backend("reference", mc.get_runtime().config, mc.get_runtime().caches)
        >>> try:
        ...     backend.chunked([], None, workers=2)
        ... except mc.ConfigurationError as err:
        ...     print(str(err)[:69])
        the reference backend cannot schedule interior iterations dynamically
        """
        raise ConfigurationError(f"the {self.name} backend cannot schedule interior iterations dynamically (on "
                                 f"threads, in chunks of blocks); use the numba backend")

    def may_fail(self, loop) -> bool:
        """Whether running ``loop`` can raise (then the ranks agree on failures after every
        execution of a plan that runs it; the same answer on every rank)."""
        return True

    def tiled(self, plan, runs, report):
        """A prepared call that runs a sparse-tiled group: ``plan`` is a
        :class:`~meshchain.inspector.tiling.TilePlan`, ``runs`` its loops (ranges unused).
        Colours in order, tiles of a colour one after another here, every loop of a tile
        in chain order. Reductions go to private arrays and are combined at the end, so a
        loop that reads a global sees its value from before the group, as it would untiled
        (the engine never tiles a read after a reduction of the same global)."""
        prepared = [self.listed(run, report) for run in runs]

        def call():
            private = [reduced_targets(run.loop, arrays_of(run)) for run in runs]
            for c in range(plan.ncolours):
                for t in plan.tile_order[plan.colour_offsets[c]: plan.colour_offsets[c + 1]]:
                    for position, run in enumerate(prepared):
                        its = plan.iterations[position][plan.starts[position][t]: plan.starts[position][t + 1]]
                        if len(its):
                            run(its, private[position])
            for run, arrays in zip(runs, private):
                combine_reductions(run.loop, arrays_of(run), {i: a[None] for i, a in arrays.items()})

        return call

    def listed(self, run, report):
        """A prepared call ``f(elements, targets)`` running ``run``'s loop on the listed
        iterations (ascending), reducing into ``targets``; backends that tile by the
        generic path of :meth:`tiled` implement it."""
        raise ConfigurationError(f"the {self.name} backend cannot run listed iterations")

    def halo_exchange(self, comm, items, *, tag: int, transport: str = "persistent"):
        """An exchange of ``items`` (``(storage, exports, imports)``: a dat's storage and, per
        neighbour, the rows sent and received, in wire order), with ``begin()``, ``end()``,
        ``close()``, ``messages``, ``bytes_sent`` and ``largest``, moved by ``transport`` (see
        :mod:`meshchain.comm.transports`). Host exchanges pack in compiled code; rows of a dat
        whose values are on a device are brought over first. Backends that keep dats
        elsewhere override this."""
        return HaloExchange(comm, [HaloItem(storage.host, exports, imports,
                                            storage.rows_to_host if storage.device is not None else None,
                                            storage.rows_from_host if storage.device is not None else None)
                                   for storage, exports, imports in items], tag=tag, transport=transport)

    def prepare_data(self, storage, *, write: bool) -> None:
        """Make a dat's values usable by this backend before a plan that uses it is built."""
        storage.host_current(write=write)

    def validate(self) -> None:
        """Refuse options this backend cannot honour here (raises ConfigurationError)."""

    def settle(self) -> None:
        """Wait for work still running asynchronously and hand its times to ``timers``."""

    def restore(self) -> None:
        """Re-apply this backend's process-wide settings (after another configuration was refused)."""


def arrays_of(run) -> dict:
    """``run``'s reduction targets: its own, or the globals' values (argument position -> array)."""
    targets = dict(run.targets)
    for i, arg in enumerate(run.loop.args):
        if arg.kind == GLOBAL and arg.access is not Access.READ and i not in targets:
            targets[i] = run.data[run.loop.specs[i].slot].value
    return targets


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
            current = targets[i]
            private[i] = np.zeros_like(current) if arg.access is Access.INC else current.copy()
    return private


def combine_reductions(loop, targets: dict, partials: dict) -> None:
    """Fold ``partials[i]`` (shape ``(nparts, dim)``) into argument ``i``'s target, in order."""
    for i, values in partials.items():
        arg = loop.args[i]
        target = targets[i]
        if not len(values):
            continue
        if arg.access is Access.INC:
            target += values.sum(axis=0, dtype=target.dtype)
        elif arg.access is Access.MIN:
            np.minimum(target, values.min(axis=0), out=target)
        else:
            np.maximum(target, values.max(axis=0), out=target)
