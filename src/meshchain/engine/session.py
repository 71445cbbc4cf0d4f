"""The one runtime object: configuration, the trace of pending loops, caches and stats.

Evaluation is lazy. ``par_loop`` records a loop in the trace and returns. Loops run
when something forces them: reading ``dat.data``, ``dat.gather()`` or
``global.value`` runs exactly the pending loops the object depends on (dependence
analysis in :mod:`meshchain.engine.trace`); setting ``global.value`` or writing through
``dat.data`` first runs the loops that use the object; ``mc.flush()``, leaving a
``loop_chain`` block, completing a chain named in the chain configuration, or the
trace reaching ``config.trace_length`` loops run what is pending.
Tests call :func:`reset_runtime` to start from a clean state.
"""

from __future__ import annotations

import time

import weakref

from ..backends import make_backend
from ..backends.base import Range
from ..core.config import Config
from ..comm.collectives import world_communicator
from ..core.errors import LoopError
from ..inspector import colour_blocks, touched_keys
from .trace import Trace
from .chains import ChainMatcher, ChainRun, load_chain_config, refuse_nesting
from ..ir.loop import make_loop
from ..model.overheads import Observations
from ..core.stats import StatsRecorder

__all__ = ["Runtime", "get_runtime", "reset_runtime", "par_loop", "flush", "configure", "stats"]


class Runtime:
    """Holds everything mutable in meshchain. Use :func:`get_runtime`, do not build one."""

    def __init__(self, config: Config | None = None, *, comm=None):
        self.config = config if config is not None else Config.from_env()
        self.trace = Trace()
        self.recorder = StatsRecorder()
        self._plans: dict = {}
        self.chain_plans: dict = {}
        self.ca_decisions: dict = {}
        self.chain_profiles: dict = {}
        self.observations = Observations()
        self.fitted_machine = None  # (calibration, observations seen, Machine with fitted overheads)
        self.predictions: dict = {}
        self.calibration = None  # meshchain.model.Calibration, set by calibrate() or loaded
        self.calibration_looked_up = False
        self.tile_plans: dict = {}
        self._loops: dict = {}
        self._backend = None
        self.open_run: ChainRun | None = None
        self.matcher = ChainMatcher(load_chain_config(self.config.chains) if self.config.chains else ())
        self.comm = comm if comm is not None else world_communicator()
        self.distributed = self.comm is not None and self.comm.size > 1
        self.partitioned = False
        self.depth = 0
        self.halo_map_sources: set = set()
        self._declared: list = []

    def forget_plans(self) -> None:
        """Drop cached execution plans and per-map checks (after local numbers changed)."""
        from ..ir import loop as loop_module

        self._plans.clear()
        self.chain_plans.clear()
        self.ca_decisions.clear()
        self.chain_profiles.clear()
        self.tile_plans.clear()
        loop_module._exclusive_cache.clear()

    def map_sources(self) -> set:
        """``id`` of every set that a map the halos were built from starts from (their halos
        can be run); the same on every rank."""
        return self.halo_map_sources

    def declare(self, obj, agreed) -> int:
        """Record a declaration made on several ranks; ``agreed`` must match on every rank.

        Returns its position in the declaration order, the same on every rank (dats use it
        as their MPI message tag)."""
        from ..comm.inputs import check_agreement

        check_agreement(self.comm, (type(obj).__name__, agreed), f"{type(obj).__name__} declaration {agreed!r}")
        self._declared.append(weakref.ref(obj))
        return len(self._declared)

    def declared(self, *, agreed: bool = False):
        """The live sets, maps and dats declared so far, in declaration order.

        With ``agreed=True`` (collective) only the objects alive on every rank: garbage
        collection frees unreferenced objects at different times on different ranks, and
        collective steps (building halos) must see the same list everywhere.
        """
        from ..types import Dat, Map, Set

        objects = [r() for r in self._declared]
        if agreed and self.distributed:
            objects = _alive_everywhere(self.comm, objects)
        pick = lambda kind: [o for o in objects if isinstance(o, kind)]  # noqa: E731
        return pick(Set), pick(Map), pick(Dat)

    @property
    def backend(self):
        if self._backend is None:
            self._backend = make_backend(self.config.backend, self)
        return self._backend

    def reconfigure(self, **options) -> None:
        """Apply new options; if they are refused, the runtime keeps its old configuration."""
        new = self.config.replace(**options)
        self.flush()
        old_config, old_backend = self.config, self._backend
        if new.backend != old_config.backend or new.threads != old_config.threads or new.cache_dir != old_config.cache_dir:
            self._backend = None
        self.config = new
        try:
            self.backend.validate(new)  # build now, so that bad options fail inside configure()
        except Exception:
            self.config, self._backend = old_config, old_backend
            if old_backend is not None and hasattr(old_backend, "restore"):
                old_backend.restore()
            raise
        if new.block_size != old_config.block_size:
            self._plans.clear()
        if new.chains != old_config.chains:
            self.matcher = ChainMatcher(load_chain_config(new.chains) if new.chains else ())

    # --- recording and forcing --------------------------------------------------------------

    def record(self, loop) -> None:
        if self.open_run is not None:
            chain, completed = self.open_run, []
        else:
            chain, completed = self.matcher.feed(loop.name)
        if chain is not None:
            chain.loops += 1
        self.trace.append(loop, chain)
        for run in completed:
            self.run_entries(self.trace.take_chain(run))
        if len(self.trace) >= self.config.trace_length:
            self.flush()

    def validated_loop(self, kernel, iterset, args, name):
        """:func:`make_loop`, remembered for calls with the same kernel, set, arguments and name
        (a time loop records the same loops again and again; the checks need not rerun). The
        remembered loop keeps its objects alive, so their ids cannot be reused meanwhile."""
        try:
            key = (id(kernel), id(iterset), name,
                   tuple((id(a.data), a.access, id(a.map), a.index) for a in args))
        except AttributeError:  # not loop arguments: make_loop says what is wrong
            return make_loop(kernel, iterset, args, name)
        loop = self._loops.get(key)
        if loop is None:
            if len(self._loops) >= 4096:
                self._loops.clear()
            loop = self._loops[key] = make_loop(kernel, iterset, args, name)
        return loop

    def open_chain(self, options) -> ChainRun:
        """Start recording loops into a chain (``with mc.loop_chain(...)``)."""
        refuse_nesting(self.open_run, options)
        self.open_run = ChainRun(options)
        return self.open_run

    def close_chain(self, run: ChainRun, *, force: bool) -> None:
        """End a chain block; run the chain (and what it depends on) unless ``force`` is False
        (the block raised: its loops stay pending, like any recorded loop)."""
        if self.open_run is run:
            self.open_run = None
        if force:
            self.run_entries(self.trace.take_chain(run))

    def flush(self) -> None:
        """Run every pending loop."""
        self.run_entries(self.trace.take())

    def force_read(self, obj) -> None:
        """Run the pending loops ``obj``'s value depends on."""
        if self.trace:
            self.run_entries(self.trace.take_needed(obj, write=False))

    def force_write(self, obj) -> None:
        """Run the pending loops that must see ``obj`` before the user overwrites it."""
        if self.trace:
            self.run_entries(self.trace.take_needed(obj, write=True))

    def run_entries(self, entries) -> None:
        """Run trace entries in order: consecutive loops of one chain run as that chain."""
        units = _units(entries)
        for position, (chain, loops) in enumerate(units):
            try:
                if chain is None:
                    self.execute(loops[0])
                else:
                    self.execute_chain(chain, loops)
            except Exception as exc:
                later = [loop.name for _, rest in units[position + 1 :] for loop in rest]
                dropped = self.trace.take()
                if later or dropped:
                    exc.add_note(
                        f"meshchain: {len(later) + len(dropped)} pending loop(s) were discarded: "
                        f"{', '.join(later + [e.loop.name for e in dropped])}"
                    )
                raise

    # --- execution ------------------------------------------------------------------------------

    def execute(self, loop) -> None:
        record = self.recorder.loop(loop.name)
        if self.distributed:
            from .execute import abort_on_failure, run_loop

            abort_on_failure(self, f"loop {loop.name!r}", lambda: run_loop(self, loop, record))
            return
        self.run_range(loop, 0, loop.iterset.size, record)
        _count_serial(record, loop.iterset.size)

    def execute_chain(self, run: ChainRun, loops) -> None:
        """Run ``loops``, recorded in chain ``run``, as one chain."""
        record = self.recorder.chain(run.options.name)
        record.executions += 1
        record.loops += len(loops)
        records = [self.recorder.loop(loop.name) for loop in loops]
        tiling = None
        if run.options.tile_size is not None:
            from .tiled import Tiling

            tiling = Tiling(run.options.tile_size, run.options.name, record)
            record.tile_size = run.options.tile_size
        if not self.distributed:
            record.mode = "serial"
            began = time.perf_counter()
            self.run_ranges([(loop, 0, loop.iterset.size, rec, None) for loop, rec in zip(loops, records)],
                            tiling=tiling)
            record.time_total += time.perf_counter() - began
            for loop, rec in zip(loops, records):
                _count_serial(rec, loop.iterset.size)
            return
        from .chain import run_chain
        from .execute import abort_on_failure

        began = time.perf_counter()
        abort_on_failure(self, f"chain {run.options.name!r}",
                         lambda: run_chain(self, run.options, loops, records, record, tiling))
        record.time_total += time.perf_counter() - began

    def run_ranges(self, items, *, tiling=None) -> None:
        """Run ``(loop, start, end, record, targets)`` items in order (one phase of a chain):
        one backend call for the whole phase where the backend can fuse it; sparse-tiled
        when ``tiling`` (a :class:`meshchain.engine.tiled.Tiling`) is given."""
        if tiling is not None:
            from .tiled import run_tiled

            run_tiled(self, items, tiling)
            return
        items = [item for item in items if item[2] > item[1]]
        if not items:
            return
        if len(items) == 1:
            loop, start, end, record, targets = items[0]
            self.run_range(loop, start, end, record, targets)
            return
        backend = self.backend
        planned = []
        for loop, start, end, record, targets in items:
            if backend.needs_plan:
                plan = self.plan_for(loop, start, end, record)
                record.colours = max(record.colours, plan.ncolours)
            else:
                plan = Range(start, end)
            planned.append((loop, plan, record, targets))
        backend.run_phase(planned)

    def run_range(self, loop, start: int, end: int, record, targets=None) -> None:
        """Run iterations ``[start, end)`` of ``loop`` on the backend."""
        if end <= start:
            return
        backend = self.backend
        if backend.needs_plan:
            plan = self.plan_for(loop, start, end, record)
            record.colours = max(record.colours, plan.ncolours)
        else:
            plan = Range(start, end)
        backend.run(loop, plan, record, targets)

    def plan_for(self, loop, start: int, end: int, record, *, block_size: int | None = None):
        """The block-colouring plan of ``loop`` over ``[start, end)`` (cached by iteration
        set, range, write maps and block size; ``block_size`` defaults to the configured one,
        1 colours single iterations)."""
        writes = loop.indirect_writes
        block_size = self.config.block_size if block_size is None else block_size
        key = (loop.iterset, start, end, tuple((id(m), i) for m, i in writes), block_size)
        plan = self._plans.get(key)
        if plan is None:
            began = time.perf_counter()
            touch, nkeys = touched_keys(start, end, writes)
            plan = colour_blocks(start, end, block_size=block_size, touch=touch, nkeys=nkeys)
            self._plans[key] = (plan, tuple(m for m, _ in writes))  # keep the maps alive with the key
            record.time_plan += time.perf_counter() - began
            return plan
        return plan[0]


def _alive_everywhere(comm, objects) -> list:
    import numpy as np
    from mpi4py import MPI

    alive = np.array([o is not None for o in objects], dtype=np.uint8)
    everywhere = np.empty_like(alive)
    comm.Allreduce(alive, everywhere, op=MPI.MIN)
    return [o for o, keep in zip(objects, everywhere) if keep]


def _units(entries) -> list:
    """Group trace entries into ``(chain or None, [loops])``: consecutive loops of one chain
    form one unit, every other loop its own."""
    units: list = []
    for entry in entries:
        if entry.chain is not None and units and units[-1][0] is entry.chain:
            units[-1][1].append(entry.loop)
        else:
            units.append((entry.chain, [entry.loop]))
    return units


def _count_serial(record, iterations: int) -> None:
    record.calls += 1
    record.iterations += iterations
    record.core_iterations += iterations


_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    """The process's runtime (created on first use from ``MESHCHAIN_*`` variables)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime()
    return _runtime


def reset_runtime(*, comm=None, **options) -> Runtime:
    """Drop all pending loops, caches and statistics; start again from env + ``options``.

    ``comm`` (keyword-only) selects the MPI communicator (default: ``COMM_WORLD`` when
    started by an MPI launcher, else none).
    """
    global _runtime
    _runtime = Runtime(Config.from_env().replace(**options), comm=comm)
    return _runtime


def par_loop(kernel, iterset, *args, name=None) -> None:
    """Apply ``kernel`` to every element of ``iterset``.

    Parameters
    ----------
    kernel : Kernel
        Takes one view per argument.
    iterset : Set
        The set to iterate over.
    *args : Arg
        ``dat(mode)``, ``dat(mode, map[i])``, ``dat(mode, map)`` or ``glob(mode)``.
    name : str, keyword-only
        Loop name for statistics and chain configuration (default: the kernel's name).

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> nodes, edges = mc.Set(3, "nodes"), mc.Set(2, "edges")
    >>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2]], "e2n")
    >>> deg = mc.Dat(nodes, 1, None, "deg", dtype=np.int32)
    >>> @mc.kernel
    ... def count(a, b):
    ...     a[0] += 1
    ...     b[0] += 1
    >>> mc.par_loop(count, edges, deg(mc.INC, e2n[0]), deg(mc.INC, e2n[1]))
    >>> deg.data[:, 0].tolist()
    [1, 2, 1]
    """
    runtime = get_runtime()
    if runtime.distributed and not runtime.partitioned:
        label = name or getattr(kernel, "name", getattr(kernel, "__name__", "?"))
        raise LoopError(
            f"par_loop {label!r}: running on {runtime.comm.size} ranks but the mesh is not partitioned; "
            f"call mc.partition(...) after declaring the mesh and before the first loop."
        )
    runtime.record(runtime.validated_loop(kernel, iterset, args, name))


def flush() -> None:
    """Execute every pending loop now."""
    get_runtime().flush()


def configure(**options) -> None:
    """Change options (see :class:`~meshchain.core.config.Config`); pending loops run first.

    Examples
    --------
    >>> import meshchain as mc
    >>> mc.configure(block_size=256)
    >>> mc.get_runtime().config.block_size
    256
    >>> mc.configure(block_size=2048)
    """
    get_runtime().reconfigure(**options)


def stats(*, reset: bool = False, all_ranks: bool = False):
    """A snapshot of per-loop statistics (:class:`~meshchain.core.stats.Stats`).

    ``reset`` clears them; ``all_ranks`` (collective) sums the counters and times over the
    ranks (``neighbours`` is the maximum).
    """
    runtime = get_runtime()
    runtime.flush()
    if runtime._backend is not None:
        runtime._backend.settle()  # GPU launches are timed by events, read once they are done
    snapshot = runtime.recorder.snapshot(runtime.config.backend)
    if reset:
        runtime.recorder.reset()
    if all_ranks and runtime.comm is not None:
        snapshot = snapshot.combined(runtime.comm.allgather(snapshot))
    return snapshot


from ..core import context as _context  # noqa: E402

_context.install(get_runtime)
