"""The session: everything mutable in meshchain for one run, and the way loops get run.

A :class:`Session` holds the configuration, the communicator, the caches, the statistics,
the model's state and the backend, and its parts with one job each:
:class:`~.mesh_state.MeshState` (the declarations, their storage, the layout and what
depends on it), :class:`~.tracing.Tracing` (the trace of pending loops,
chain blocks, captured steps, forcing), :class:`~.pipeline.Pipeline` (running units:
plans), :class:`~.communication.CommunicationSettings` (the transport and progress mode)
and :class:`~.surface.Surface` (what the packages above the API use). The API layer (:mod:`meshchain.api`) creates one and
hands it to user objects through :mod:`meshchain.core.context`; below the API the
session is passed explicitly.

Evaluation is lazy. ``par_loop`` records a loop in the trace and returns. Loops run
when something forces them: reading ``dat.data``, ``dat.gather()`` or ``global.value``
runs exactly the pending loops the object depends on (dependence analysis in
:mod:`.trace`); setting ``global.value`` or writing through ``dat.data`` first runs the
loops that use the object; ``mc.flush()``, leaving a ``loop_chain`` block, completing a
chain named in the chain configuration, or the trace reaching ``config.trace_length``
loops run what is pending. Each unit (a loop, or the loops of one chain) then runs
through the pipeline (:mod:`.pipeline`).

Examples
--------
>>> import meshchain as mc
>>> session = mc.get_runtime()
>>> session.distributed, session.size, len(session.trace)
(False, 1, 0)
"""

from __future__ import annotations

import dataclasses
import gc
import time

import numpy as np

from ..backends import make_backend
from ..comm.hang import watch
from ..comm.progress import Poller, check_progress
from ..comm.transports import check_transport
from ..comm.world import world_communicator
from ..core import activity
from ..core.cache import CacheRegistry
from ..core.config import Config
from ..core.errors import ConfigurationError, LoopError
from ..core.stats import StatsRecorder
from ..core.summary import Summary
from ..model.calibrate import measure_copy_bandwidth
from ..ir.loop import make_loop
from ..partition.distribute import MAX_DEPTH
from .arithmetic import Arithmetic
from .auto import ModelState
from .capture import CapturedStep
from .communication import CommunicationSettings
from .surface import Surface
from .loops import LoopRecords
from .mesh_state import MeshState
from .grids import is_grid_set, refuse_grids
from .matrices import Matrices
from .pipeline import Pipeline
from .rebalance import rebalance
from .relayout import repartition
from .tracing import Tracing

__all__ = ["Session"]


class Session:
    """Everything mutable in meshchain (see the module docstring). Use ``mc.get_runtime()``."""

    def __init__(self, config: Config | None = None, *, comm=None, inherit=None):
        """``inherit``: a session on one process whose declarations (and their values) this one,
        also on one process, takes over (``mc.reset_runtime`` keeps what users declared)."""
        self.config = config if config is not None else Config.from_env()
        self.comm = comm if comm is not None else world_communicator()
        self.distributed = self.comm is not None and self.comm.size > 1
        self.size = 1 if self.comm is None else self.comm.size
        self.rank = 0 if self.comm is None else self.comm.rank
        watch(self.config, self.comm)  # hang diagnostics (hang_timeout)
        self.caches = CacheRegistry()
        self.recorder = StatsRecorder()
        self.mesh = mesh = MeshState(self.comm, self.caches, inherit=inherit.mesh if (
            inherit is not None and not self.distributed and not inherit.distributed) else None)
        self.store, self.declarations, self.grid_lowering = mesh.store, mesh.declarations, mesh.grid_lowering
        self.colourings, self.tile_plans = mesh.colourings, mesh.tile_plans
        self.storage, self.n_owned, self.map_values, self.layout_of = (mesh.storage, mesh.n_owned, mesh.map_values,
                                                                       mesh.layout_of)
        # grid loops are lowered to maps for some backends: a new backend checks them again
        self.loop_records = LoopRecords(self.caches, self._checked_loop, mesh.storage,
                                        mesh.subset_lowering.lowered_args)
        self.pipeline = Pipeline(self)
        self.matrices = Matrices(self)
        self.model = ModelState(self)
        self.tracing = Tracing(self.config, loop_of=self.loop_records.loop, assemble=self.matrices.record_assembly,
                               execute=self.pipeline.execute)  # when loops run
        self.trace = self.tracing.trace
        tracing = self.tracing
        self.record, self.flush, self.force_read, self.force_write = (tracing.record, tracing.flush,
                                                                      tracing.force_read, tracing.force_write)
        self.run_entries, self.open_chain, self.close_chain = tracing.run_entries, tracing.open_chain, tracing.close_chain
        self.begin_capture, self.end_capture, self.after_failure = (tracing.begin_capture, tracing.end_capture,
                                                                    tracing.after_failure)
        self._backend = None
        self.surface = Surface(self)  # what linalg and io use of the session
        self.arithmetic = Arithmetic(self.record, self.global_value, set_value=self.set_global_value,
                                     in_use=self.tracing.in_use)  # x += y, x.inner(y), ... as loops
        self.communication = CommunicationSettings(self)  # the transport and progress mode, agreed at partition
        self._poller = None  # the communication thread of progress="poll", made at first use
        self._copy_measured = None  # the copy bandwidth the summary measured, when no calibration has one

    # --- declarations (called by the user objects, through meshchain.core.context) -------------------

    def declare_set(self, s) -> None:
        self.declarations.set(s)

    def declare_map(self, m, values) -> None:
        self.declarations.map(m, values)

    def declare_dat(self, d, data, dtype) -> np.dtype:
        chosen, storage = self.declarations.dat(d, data, dtype)
        self.store.add(d, storage)
        if self.tracing.capturing is not None:
            self.tracing.capturing.made.append(d)
        return chosen

    def declare_global(self, g, value: np.ndarray) -> None:
        self.store.add(g, self.declarations.global_(value))
        if self.tracing.capturing is not None:
            self.tracing.capturing.made.append(g)

    @property
    def layout(self):
        """The mesh layout on this rank (:attr:`.mesh_state.MeshState.layout`)."""
        return self.mesh.layout

    @layout.setter
    def layout(self, layout) -> None:
        self.mesh.layout = layout

    @property
    def partitioned(self) -> bool:
        return self.mesh.partitioned

    @property
    def seed_set(self):
        """The set partitioned first (``mc.repartition`` partitions it again)."""
        return self.mesh.seed_set

    # --- values (dat.data, glob.value, dat.gather()) -----------------------------------------------

    def dat_values(self, d, *, write: bool, halos: bool = False) -> np.ndarray:
        """``d``'s owned rows (with ``halos``: all rows), after the loops they depend on ran;
        with ``write`` the caller may change them, so its halo copies are stale."""
        storage = self.storage(d)
        if write:
            self.mesh.require_partitioned(d)
            self.force_write(d)
            storage.valid_depth = 0
            return storage.host_current(write=True)[: storage.n_owned]
        self.force_read(d)
        if not halos:
            self.mesh.require_partitioned(d)
        view = storage.host_current(write=False)
        view = (view if halos else view[: storage.n_owned]).view()
        view.flags.writeable = False
        return view

    def gather(self, d):
        self.mesh.require_partitioned(d)
        self.force_read(d)
        return self.mesh.gathered(d, self.storage(d).host_current(write=False))

    def global_value(self, g) -> np.ndarray:
        storage = self.storage(g)
        self.force_read(g)
        storage.settle()
        value = storage.value.copy()
        value.flags.writeable = False  # a copy: writing to it would change nothing (set glob.value instead)
        return value

    def set_global_value(self, g, new) -> None:
        storage = self.storage(g)
        self.force_write(g)
        storage.settle()
        if type(new) is float and g.dtype.kind == "f":  # the common case: what coerce would make, without the array
            storage.value[...] = new
        else:
            storage.value[...] = g.coerce(new)

    # --- recording (see :mod:`.tracing`; the session checks each loop once per structure) ----------------

    def capture(self, fn, options) -> CapturedStep:
        """``fn`` as a step captured once and replayed, run in this session."""
        return CapturedStep(fn, options, lambda: self)

    def _checked_loop(self, kernel, iterset, args, name):
        if self.distributed and not self.partitioned:  # no loop is checked (or cached) before
            label = name or getattr(kernel, "name", getattr(kernel, "__name__", "?"))
            raise LoopError(
                f"par_loop {label!r}: running on {self.size} ranks but the mesh is not partitioned; "
                f"call mc.partition(...) after declaring the mesh and before the first loop."
            )
        exclusive = self.mesh.check_exclusive
        loop = make_loop(kernel, iterset, args, name, exclusive=exclusive,
                         layered=self.backend.layer_arithmetic)
        if is_grid_set(iterset) and (self.distributed or not self.backend.grid_arithmetic):  # run through maps
            loop = self.grid_lowering.lowered(loop, exclusive=exclusive)
        for obj in loop.data:
            self.storage(obj)  # declared in this session
        return loop

    # --- configuration and backend --------------------------------------------------------------------

    @property
    def backend(self):
        if self._backend is None:
            backend = make_backend(self.config.backend, self.config, self.caches, distributed=self.distributed)
            check_interior(self.config, backend)
            self._backend = backend
        return self._backend

    @property
    def transport(self) -> str:
        """The halo-exchange transport in use (see :mod:`.communication`; no MPI call)."""
        return self.communication.transport

    @property
    def progress(self) -> str:
        """The progress mode in use (see :mod:`.communication`; no MPI call)."""
        return self.communication.progress

    def overlap(self):
        """How plans run computation beside messages (:class:`~meshchain.engine.plans.Overlap`)."""
        from .plans import Overlap

        progress = self.progress if self.distributed else "none"
        if progress == "poll" and self._poller is None:
            self._poller = Poller()
        return Overlap(progress, self._poller if progress == "poll" else None)

    def reconfigure(self, **options) -> None:
        """Apply new options; if they are refused, the session keeps its old configuration."""
        new = self.config.replace(**options)
        self.flush()
        old_config, old_backend = self.config, self._backend
        fresh = (new.backend != old_config.backend or new.threads != old_config.threads
                 or new.cache_dir != old_config.cache_dir)
        self.config = new
        try:
            if self.distributed and new.transport != "auto":
                check_transport(new.transport, self.comm)
            if self.distributed and new.progress != "auto":
                check_progress(new.progress, self.comm)
            if fresh or old_backend is None:
                self._backend = None
                self.backend  # build now, so that bad options fail inside configure()
            else:
                old_backend.config = new
                old_backend.validate()
            check_interior(new, self.backend)
        except Exception:
            self.config, self._backend = old_config, old_backend
            if old_backend is not None:
                old_backend.config = old_config
                old_backend.restore()
            raise
        self.tracing.configure(new)
        watch(new, self.comm)
        if _planned(new) != _planned(old_config):  # the profile and the hang watch change no plan
            self.communication.forget()
            self.communication.agree()  # collective, like configure itself
            self.caches.notify("configure")

    # --- partitioning ----------------------------------------------------------------------------------

    def partition(self, method: str, *, coords=None, seed_set=None, depth: int = 1, seed: int = 0,
                  blocks=None) -> None:
        """``mc.partition``: distribute the declared mesh over the ranks (a no-op on one)."""
        self.mesh.check_partition(method, coords, depth)
        self.flush()
        if self.mesh.partition(method, coords=coords, seed_set=seed_set, depth=depth, seed=seed, blocks=blocks):
            self.communication.agree()
            self.caches.notify("partition")

    def repartition(self, method: str, *, coords=None, weights=None, seed: int = 0) -> None:
        """``mc.repartition`` (see :func:`.relayout.repartition`)."""
        self._refuse_grids("mc.repartition")
        repartition(self, method, coords=coords, weights=weights, seed=seed)

    def rebalance(self, method: str, *, coords=None, seed: int = 0):
        """``mc.rebalance`` (see :func:`.rebalance.rebalance`)."""
        self._refuse_grids("mc.rebalance")
        return rebalance(self, method, coords=coords, seed=seed)

    def _refuse_grids(self, what: str) -> None:
        """Raise, on every rank, where the program has a grid (collective). A grid no longer
        referenced but kept by a reference cycle is no part of it: garbage is collected first,
        and only grids alive on every rank count."""
        gc.collect()
        refuse_grids(self.declarations.declared(agreed=True)[0], what)

    def deepen(self, depth: int, *, flush: bool = False) -> None:
        """Make sure halo layers ``1..depth`` exist on every rank (collective); builds the
        missing ones. Dats keep their values (moved by global id; new rows are filled by the
        next exchange that needs them) and plans are dropped. Pending loops run first when
        ``flush`` (the pipeline, between loops it has taken from the trace, passes False)."""
        if not self.mesh.needs_depth(depth):
            return
        if flush:
            self.flush()
        self.mesh.deepen(depth)
        self.caches.notify("repartition")

    def ensure_depth(self, depth: int) -> None:
        """:meth:`deepen`, pending loops first (refuses more than can be built)."""
        if depth > MAX_DEPTH:
            raise ConfigurationError(f"a halo of depth {depth} is needed but at most {MAX_DEPTH} layers can be built; "
                                     f"shorten the loop chain or lower its maximum halo extension.")
        self.deepen(depth, flush=True)

    # --- plans' building blocks -----------------------------------------------------------------------

    def colouring(self, loop, start: int, end: int, *, block_size: int | None = None):
        """The block colouring of ``loop`` over ``[start, end)`` (``block_size`` defaults to
        the configured one; see :meth:`.mesh_state.MeshState.colouring`)."""
        block_size = self.config.block_size if block_size is None else block_size
        return self.mesh.colouring(loop, start, end, block_size=block_size, recorder=self.recorder)

    def close(self) -> None:
        """Release what plans hold outside Python (persistent MPI requests, device buffers); the
        session cannot run loops afterwards. Pending loops are discarded."""
        self.trace.take()
        self.pipeline.plans.clear()
        self.matrices.close()
        if self._poller is not None:
            self._poller.close()
            self._poller = None

    # --- statistics and the model ---------------------------------------------------------------------

    def statistics(self, *, reset: bool = False, all_ranks: bool = False, summary: bool = False):
        """A snapshot of the statistics (``mc.stats()``), pending loops run first; ``summary``:
        the :class:`~meshchain.core.summary.Summary` over every rank instead (collective)."""
        self.flush()
        seconds = time.perf_counter() - self.recorder.started
        if self._backend is not None:
            self._backend.settle()  # GPU launches are timed by events, read once they are done
        self.model.predict(self.recorder.accounts)
        distributed = self.distributed
        snapshot = self.recorder.snapshot(self.config.backend, self.communication.reported("transport") if distributed else "",
                                          self.communication.reported("progress") if distributed else "",
                                          self.config.interior if distributed else "")
        snapshot = dataclasses.replace(snapshot, caches=self.caches.counts())
        if reset:
            self.recorder.reset()
            self.caches.reset_counts()
        if summary:
            with activity.waiting("collective mc.stats(summary=True) (allgather)"):
                gathered = self.comm.allgather((snapshot, seconds)) if distributed else [(snapshot, seconds)]
            return Summary.of([s for s, _ in gathered], seconds=[t for _, t in gathered],
                              copy_bandwidth=self._copy_bandwidth())
        if all_ranks and self.comm is not None:
            with activity.waiting("collective mc.stats(all_ranks=True) (allgather)"):
                snapshot = snapshot.combined(self.comm.allgather(snapshot))
        return snapshot

    def _copy_bandwidth(self) -> tuple:
        """``(bytes/s, where from)`` of a large copy: the calibration's, else measured now (once;
        collective on several ranks)."""
        calibration = self.model.current_calibration()
        if calibration is not None and calibration.copy_bandwidth > 0:
            return calibration.copy_bandwidth, f"calibration of {calibration.created or 'unknown date'}"
        if self._copy_measured is None:
            self._copy_measured = measure_copy_bandwidth(self.comm if self.distributed else None)
        return self._copy_measured, "measured now, one thread per rank; mc.model.calibrate() keeps one"

    def calibrate(self, *, save: bool, repeats: int, sizes, apply: bool = False):
        """``mc.model.calibrate()`` on this session (collective): pending loops run first."""
        self.flush()
        return self.model.calibrate(save=save, repeats=repeats, sizes=sizes, apply=apply)

    def apply_calibration(self, calibration):
        """``mc.model.apply(calibration)`` on this session (collective)."""
        self.flush()
        return self.model.apply(calibration)

    def calibration_key(self):
        """What a calibration taken now would hold for (:class:`~meshchain.model.keys.CalibrationKey`)."""
        return self.model.key()

    @property
    def calibration(self):
        return self.model.calibration


def _planned(config) -> Config:
    """``config`` without the options that change no plan (profiling, hang diagnostics)."""
    return config.replace(profile=None, hang_timeout=None, hang_action="report")


def check_interior(config, backend) -> None:
    """Refuse ``interior="dynamic"`` on a backend that cannot hand out chunks of blocks."""
    if config.interior == "dynamic" and not getattr(backend, "can_chunk", False):
        raise ConfigurationError(f"interior='dynamic' needs a backend that runs blocks in chunks on threads (numba); "
                                 f"the {backend.name} backend runs each phase as one call: use interior='static'.")
