"""The mesh as this rank holds it: declarations, storage, layout, and what depends on them.

:class:`MeshState` is the session's part with that one job: the declarations and their
storage (:mod:`.declare`), the layout (partitioned or not, its halo depth, the set
partitioned first), and the caches that depend on the layout (block colourings, sparse
tile plans, the exclusive-path checks of indirect RW arguments). It partitions the mesh
and builds deeper halo layers; the session around it runs the pending loops first, agrees
the communication settings and tells the caches (``"partition"`` and ``"repartition"``
events), so this part sends no message of its own outside those collective steps.

Examples
--------
>>> import meshchain as mc
>>> mesh = mc.get_runtime().mesh
>>> cells = mc.Set(4, "cells")
>>> q = mc.Dat(cells, 2, None, "q")
>>> mesh.layout_of(cells).n_owned, mesh.storage(q).host.shape
(4, (4, 2))
"""

from __future__ import annotations

import time

from ..comm.agree import raise_together
from ..comm.blocks import block_offsets
from ..comm.collectives import fetch_rows, gather_rows
from ..core.errors import DeclarationError, LoopError
from ..core.storage import DataStore
from ..inspector.colouring import colour_blocks, touched_keys
from ..ir.loop import exclusivity_error
from ..partition.distribute import check_options, checked_seed_set, deepen, distribute, moved_rows, seed_set_of
from ..partition.layout import MeshLayout
from .accounting import add_planning
from .declare import Declarations
from .grids import GridLowering, is_grid_set
from .subsets import SubsetLowering

__all__ = ["MeshState"]

_LAYOUT_EVENTS = ("configure", "partition", "repartition")


class MeshState:
    """Declarations, storage and layout of one session on this rank (see the module docstring).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm or None
        The session's communicator.
    caches : CacheRegistry
        Where the caches that depend on the layout are registered.
    inherit : MeshState, optional
        A state whose storage and maps' values this one takes over (one process, ``mc.reset_runtime``).
    """

    def __init__(self, comm, caches, *, inherit: "MeshState | None" = None):
        self.comm = comm
        self.distributed = comm is not None and comm.size > 1
        self.size = 1 if comm is None else comm.size
        self.store = DataStore()
        self.declarations = Declarations(self)
        self.grid_lowering = GridLowering(self.declarations, caches.cache(
            "grid arithmetic parts", limit=4096, events=("configure", "partition", "repartition")))
        if inherit is not None:
            self.store, self.declarations.map_rows = inherit.store, inherit.declarations.map_rows
            self.declarations.adopt(inherit.declarations)
        self.subset_lowering = SubsetLowering(self.declarations, distributed=self.distributed)
        self.layout = MeshLayout.serial(self.declarations.map_rows)
        self.partitioned = False
        self.seed_set = None  # the set partitioned first (mc.repartition partitions it again)
        self.colourings = caches.cache("colourings", limit=4096, events=_LAYOUT_EVENTS)
        self.tile_plans = caches.cache("tile plans", limit=256, events=_LAYOUT_EVENTS)
        self._exclusive = caches.cache("exclusive paths", limit=4096, events=("partition", "repartition"))

    # --- what this rank holds ---------------------------------------------------------------------

    def storage(self, obj):
        """The storage record of a dat or global of this session."""
        record = self.store.get(obj)
        if record is None:
            raise DeclarationError(f"{type(obj).__name__} {obj.name!r} belongs to another meshchain session "
                                   f"(mc.reset_runtime() discards every declaration); declare it again.")
        return record

    def n_owned(self, s) -> int:
        if self.distributed and not self.partitioned:
            return s.size  # not distributed yet
        return self.layout.of(s).n_owned

    def map_values(self, m):
        if self.distributed and not self.partitioned:
            return None
        return self.layout.values(m)

    def layout_of(self, s):
        """The :class:`~meshchain.partition.layout.SetLayout` of ``s`` on this rank (None on
        several ranks before ``mc.partition``)."""
        if self.distributed and not self.partitioned:
            return None
        return self.layout.of(s)

    def require_partitioned(self, d) -> None:
        if self.distributed and not self.partitioned:
            raise LoopError(
                f"Dat {d.name!r}: its data is laid out for partitioning, not yet distributed; call "
                f"mc.partition(...) before reading .data or .gather() on several ranks."
            )

    def gathered(self, d, host):
        """The owned rows ``host`` of dat ``d`` placed at their global ids, whole on every
        process run alone, on rank 0 only (None elsewhere) on several ranks."""
        if not self.distributed:
            return host[: d.dataset.size].copy()
        layout = self.layout.of(d.dataset)
        n = layout.n_owned
        return gather_rows(self.comm, layout.global_ids[:n], host[:n], d.dataset.size)

    # --- partitioning and deeper halos (collective; the session runs pending loops first) -------

    def check_partition(self, method: str, coords, depth: int) -> None:
        declared_sets = self.declarations.declared()[0]
        grids_only = bool(declared_sets) and all(is_grid_set(s) for s in declared_sets)
        check_options(method, coords, depth, needs_coords=not grids_only)

    def partition(self, method: str, *, coords, seed_set, depth: int, seed: int, blocks) -> bool:
        """Distribute the declared mesh over the ranks; False on one process (nothing moved)."""
        if not self.distributed:
            sets, maps, _ = self.declarations.declared()
            if sets:  # the arguments several ranks would refuse are refused here too
                checked_seed_set(method, sets, maps, None if coords is None else coords.dataset, seed_set)
            self.partitioned = True
            self.seed_set = seed_set if seed_set is not None else (coords.dataset if coords is not None else None)
            return False
        raise_together(self.comm, DeclarationError("mc.partition was already called; declare the mesh once and "
                                                   "partition it once.") if self.partitioned else None)
        sets, maps, dats = self.declarations.declared(agreed=True)
        grids = self.grid_lowering.parts(sets, maps, blocks, self.size)
        maps = maps + self.subset_lowering.derive(self.comm, sets, maps)
        coords_rows = None if coords is None else self.storage(coords).host
        self.seed_set = seed_set_of(sets, maps, None if coords is None else coords.dataset, seed_set)
        layout = distribute(self.comm, sets=sets, maps=maps, map_blocks=self.declarations.map_rows, method=method,
                            coords_rows=coords_rows, coords_set=None if coords is None else coords.dataset,
                            seed_set=seed_set, depth=depth, seed=seed, grids=grids)
        for d in dats:
            storage = self.storage(d)
            local = layout.of(d.dataset)
            rows_here = fetch_rows(self.comm, block_offsets(d.dataset.size, self.size), storage.host, local.global_ids)
            storage.replace(rows_here, n_owned=local.n_owned, valid_depth=depth)
        self.layout, self.partitioned = layout, True
        return True

    def mesh_declared(self):
        """The live sets, maps (with the maps composed for subsets) and dats, the same on every
        rank (collective on several ranks): what layouts are built from after partitioning."""
        sets, maps, dats = self.declarations.declared(agreed=True)
        return sets, maps + self.subset_lowering.maps(), dats

    def needs_depth(self, depth: int) -> bool:
        """Whether halo layers up to ``depth`` are missing (several ranks only)."""
        return self.distributed and depth > self.layout.depth

    def deepen(self, depth: int) -> None:
        """Build the missing halo layers ``1..depth`` (collective); dats keep their values (moved
        by global id; new rows are filled by the next exchange that needs them)."""
        sets, maps, dats = self.mesh_declared()
        layout = deepen(self.comm, self.layout, sets=sets, maps=maps, map_blocks=self.declarations.map_rows,
                        depth=depth)
        for d in dats:
            storage = self.storage(d)
            old, new = self.layout.of(d.dataset), layout.of(d.dataset)
            storage.host_current(write=True)
            storage.replace(moved_rows(storage.host, old.global_ids, new.global_ids), n_owned=new.n_owned,
                            valid_depth=storage.valid_depth)
        self.layout = layout

    # --- what plans are built from ----------------------------------------------------------------

    def check_exclusive(self, arg, name: str) -> None:
        """An indirect RW path must reach each target element once (every rank agrees)."""
        key = (arg.map.uid, arg.index)
        error = self._exclusive.get(key)
        if error is None:
            target = self.layout_of(arg.map.target)
            local = exclusivity_error(arg, name, self.layout.values(arg.map),
                                      target.global_ids if self.distributed else None)
            try:
                raise_together(self.comm if self.distributed else None, local)
                error = False
            except Exception as agreed:  # noqa: BLE001 - the agreed error, kept for the next time
                error = agreed
            self._exclusive[key] = error
        if error is not False:
            raise type(error)(str(error))

    def colouring(self, loop, start: int, end: int, *, block_size: int, recorder):
        """The block colouring of ``loop`` over ``[start, end)`` (cached by iteration set, range,
        write maps and block size; a block size of 1 colours single iterations); the time it
        took is recorded as the loop's planning in ``recorder``."""
        writes = loop.indirect_writes
        key = (loop.iterset.uid, start, end, tuple((m.uid, i) for m, i in writes), block_size)
        found = self.colourings.get(key)
        if found is None:
            began = time.perf_counter()
            layout = self.layout
            touch, nkeys = touched_keys(start, end, [(layout.values(m), i, m.target.uid,
                                                       len(layout.of(m.target).global_ids)) for m, i in writes])
            found = self.colourings[key] = colour_blocks(start, end, block_size=block_size, touch=touch, nkeys=nkeys)
            add_planning(recorder, loop.name, time.perf_counter() - began)
        return found
