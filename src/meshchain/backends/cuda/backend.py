"""The CUDA backend: kernels translated to CUDA C, run on a GPU (``cupy``) or emulated.

``backend="cupy"`` runs on a GPU through CuPy. ``backend="cuda-emulation"`` runs the
very same generated source on the CPU (see :mod:`.emulation`); it is slow and exists
so that the GPU code paths are tested where there is no GPU.

Each loop signature (kernel, constants, argument specs, block size, increment mode)
compiles once per process (and is cached on disk: CuPy's kernel cache, or the
emulation's shared libraries). Dats stay on the device between loops
(:mod:`.residency`); globals are small and stay on the host: read globals are copied
in per launch, reductions come back as one partial row per block.

Examples
--------
>>> import meshchain as mc
>>> mc.configure(backend="cuda-emulation")
>>> cells = mc.Set(5, "cells")
>>> q = mc.Dat(cells, 1, [1.0, 2.0, 3.0, 4.0, 5.0], "q")
>>> top = mc.Global(1, -1e9, "top")
>>> @mc.kernel
... def biggest(a, m):
...     m[0] = max(m[0], a[0] * a[0])
>>> mc.par_loop(biggest, cells, q(mc.READ), top(mc.MAX))
>>> top.value.tolist()
[25.0]
>>> mc.configure(backend="numba")
"""

from __future__ import annotations

import time

import numpy as np

from ...core.access import Access
from ...core.errors import ConfigurationError, InternalError
from ...core.storage import GlobalStorage
from ...inspector import colour_blocks, touched_keys
from ...ir.loop import map_rows_of
from ...types.args import GLOBAL, INDIRECT, STENCIL, WHOLE_MAP
from ..base import Backend, arrays_of, combine_reductions
from .codegen import loop_source
from .device import check_sizes
from .halo import HALO_SOURCE, DeviceExchange, halo_mode
from .residency import device_array

__all__ = ["CudaBackend"]


class CudaBackend(Backend):
    """Runs loops as generated ``__global__`` functions on ``device`` (see :mod:`.device`)."""

    can_tile = True
    grid_arithmetic = False  # structured-grid loops come lowered to maps (meshchain.engine.grids)
    layer_arithmetic = True  # an extruded map's targets per layer by arithmetic (see .codegen)
    transports = ("p2p",)
    # no "poll": kernels are launched asynchronously, so the host thread is free to drive the
    # messages while the device computes the core; a polling thread would add nothing
    progress_modes = ("none", "thread")
    times_itself = True  # kernel times come from the device (CUDA events), not the host's clock

    def __init__(self, config, caches, *, distributed: bool = False, device):
        super().__init__(config, caches, distributed=distributed)
        self.device = device
        self.name = device.name
        self._executors = caches.cache(f"{device.name} loop modules", limit=1024)
        self._maps = caches.cache(f"{device.name} maps", limit=1024, events=("partition", "repartition"))
        self._colourings = caches.cache(f"{device.name} colourings", limit=1024, events=("partition", "repartition"))
        self._halo_kernel = None
        self._none = device.upload(np.zeros(1, dtype=np.int64))
        self.validate()

    def validate(self) -> None:
        """On several ranks, ``gpu_halos="direct"`` needs a CUDA-aware MPI; device exchanges
        post point-to-point messages (host or device buffers), so ``transport`` must be
        ``"p2p"`` or ``"auto"``; ``progress`` must be one of :attr:`progress_modes` or ``"auto"``."""
        if self.config.transport not in ("auto",) + self.transports:
            raise ConfigurationError(
                f"transport {self.config.transport!r} is not available with the {self.name} backend: its halo "
                f"exchanges pack on the device and post point-to-point messages from device or pinned host "
                f"buffers; use transport='p2p' or 'auto'.")
        if self.config.progress not in ("auto",) + self.progress_modes:
            raise ConfigurationError(
                f"progress mode {self.config.progress!r} is not available with the {self.name} backend: its "
                f"kernels run asynchronously while this thread drives the messages, so there is nothing for a "
                f"polling thread to do; use progress={' or '.join(map(repr, ('auto',) + self.progress_modes))}.")
        if self.distributed:
            halo_mode(self.config.gpu_halos, self.device)

    @property
    def threads(self) -> int:
        return self.config.gpu_threads

    def colouring_block_size(self, loop) -> int | None:
        if _coloured(self.config, loop):
            return 1
        return None

    def prepare_data(self, storage, *, write: bool) -> None:
        """Dats move to the device lazily, launch by launch (:mod:`.residency`)."""

    def phase(self, runs, report):
        prepared = [(run, self._executor(run.loop, report)) for run in runs if run.end > run.start]
        if not prepared:
            return None

        def call():
            for run, executor in prepared:
                if executor.coloured:
                    for elements in self._colouring(run):
                        self._launch(run, executor, None, elements=elements, count=len(elements))
                else:
                    self._launch(run, executor, None, start=run.start, count=run.end - run.start)

        return call

    def listed(self, run, report):
        executor = self._executor(run.loop, report)

        def execute(elements, targets):
            elements = np.ascontiguousarray(elements, dtype=np.int64)
            lists = self._colouring_of_list(run, elements) if executor.coloured else [elements]
            for picked in lists:
                self._launch(run, executor, targets, elements=self.device.upload(picked), count=len(picked))

        return execute

    def settle(self) -> None:
        self.device.settle()

    # --- halo exchanges (see :mod:`.halo`) ------------------------------------------------------

    def halo_exchange(self, comm, items, *, tag: int, transport: str = "p2p"):
        """An exchange packed, staged and unpacked on the device (one for all ``items``);
        its messages are point-to-point (``transport`` is always ``"p2p"`` here, see :meth:`validate`)."""
        return DeviceExchange(self, comm, items, tag=tag,
                              staged=halo_mode(self.config.gpu_halos, self.device))

    def halo_kernel(self):
        """The compiled pack/unpack kernel (:data:`~.halo.HALO_SOURCE`)."""
        if self._halo_kernel is None:
            self._halo_kernel = self.device.compile(HALO_SOURCE, "the halo packing kernel")
        return self._halo_kernel

    # --- compilation ----------------------------------------------------------------------------

    def _executor(self, loop, report) -> "_DeviceExecutor":
        config = self.config
        constants = tuple(c.source for c in loop.kernel.constants())
        key = (loop.kernel, constants, loop.specs, config.gpu_threads, config.gpu_increments, config.fp_contract)
        executor = self._executors.get(key)
        if executor is None:
            if any(s.kind == STENCIL or s.grid for s in loop.specs):  # the session lowers them to maps
                raise InternalError(f"loop {loop.name!r}: a structured-grid loop reached the cupy backend unlowered")
            check_sizes(loop)
            began = time.perf_counter()
            coloured = _coloured(config, loop)
            source = loop_source(loop, threads=config.gpu_threads, colour=coloured)
            what = f"kernel {loop.kernel.name!r} (loop {loop.name!r})"
            executor = self._executors[key] = _DeviceExecutor(
                self.device.compile(source.text, what, contract=config.fp_contract), source, coloured, loop.specs)
            report(loop, time.perf_counter() - began, True, 0)
        return executor

    # --- launching ------------------------------------------------------------------------------

    def _launch(self, run, executor, targets, *, start=0, elements=None, count: int) -> None:
        if count <= 0:
            return
        loop = run.loop
        targets = arrays_of(run) if targets is None else {**arrays_of(run), **targets}
        device, threads = self.device, self.threads
        grid = (count + threads - 1) // threads
        operands = []
        for kind, number in executor.source.params:
            if kind == "data":
                operands.append(self._data_operand(run.data[number], executor.slots[number], targets))
            elif kind == "map":
                operands.append(self._map(run.maps[number]))
            else:
                operands.append(device.empty((grid, loop.specs[number].dim), np.dtype(loop.specs[number].dtype)))
        listed = elements is not None
        arguments = [int(start), int(count), elements if listed else self._none, np.int32(1 if listed else 0), *operands]
        device.launch(executor.function, grid, threads, arguments, run.timer)  # asynchronous on a GPU
        partials = {i: device.to_host(operands[-len(executor.source.reductions) + k])
                    for k, i in enumerate(executor.source.reductions)}
        combine_reductions(loop, targets, partials)

    def _data_operand(self, record, use, targets: dict):
        """A data slot's device array; ``use`` is the argument position of a global, or
        whether the loop writes the dat."""
        if isinstance(record, GlobalStorage):
            return self.device.upload(targets.get(use, record.value))
        return device_array(self.device, record, write=use)

    def _map(self, values):
        entry = self._maps.get(id(values))
        if entry is None or entry[0] is not values:
            entry = self._maps[id(values)] = (values, self.device.upload(np.ascontiguousarray(values, dtype=np.int32)))
        return entry[1]

    # --- colouring (increments="colour") --------------------------------------------------------

    def _colouring(self, run) -> list:
        """The iterations of the run by colour, on the device: iterations of one colour never
        increment the same element (the engine coloured single iterations)."""
        plan = run.colouring
        cached = self._colourings.get(id(plan))
        if cached is None or cached[1] is not plan:
            order = plan.block_order + run.start  # block b of size 1 is iteration start + b
            lists = [order[plan.colour_offsets[c]:plan.colour_offsets[c + 1]] for c in range(plan.ncolours)]
            cached = self._colourings[id(plan)] = ([self.device.upload(e) for e in lists], plan)
        return cached[0]

    def _colouring_of_list(self, run, elements: np.ndarray) -> list:
        """Colours of listed iterations (a sparse tile): greedy, in list order."""
        end, specs = int(elements.max()) + 1, run.loop.specs
        writes = [(map_rows_of(specs[i], run.maps[specs[i].map_slot], np.arange(end)), None, id(a.map.target),
                   len(run.data[specs[i].slot].host))
                  for i, a in enumerate(run.loop.args) if a.map is not None and a.access is not Access.READ]
        touch, nkeys = touched_keys(0, end, writes)
        picked = np.ascontiguousarray(touch[elements])
        plan = colour_blocks(0, len(elements), block_size=1, touch=picked, nkeys=nkeys)
        return [elements[plan.block_order[plan.colour_offsets[c]:plan.colour_offsets[c + 1]]]
                for c in range(plan.ncolours)]


class _DeviceExecutor:
    """A compiled loop; ``slots[slot]`` is, for a global, its argument position (the reduction
    target may be redirected there), for a dat whether the loop writes it."""

    __slots__ = ("function", "source", "coloured", "slots")

    def __init__(self, function, source, coloured: bool, specs):
        self.function, self.source, self.coloured = function, source, coloured
        self.slots = {}
        for position, s in enumerate(specs):
            if s.kind == GLOBAL:
                self.slots.setdefault(s.slot, position)
            else:
                self.slots[s.slot] = self.slots.get(s.slot, False) or s.access is not Access.READ


def _increments_through_maps(loop) -> bool:
    return any(s.access is Access.INC and s.kind in (INDIRECT, WHOLE_MAP) for s in loop.specs)


def _coloured(config, loop) -> bool:
    """Whether ``loop`` runs by colours: increments through maps with ``gpu_increments="colour"``,
    and always a MIN or MAX through a map (CUDA has no atomic min or max of doubles)."""
    if config.gpu_increments == "colour" and _increments_through_maps(loop):
        return True
    return any(s.access in (Access.MIN, Access.MAX) and s.kind in (INDIRECT, WHOLE_MAP) for s in loop.specs)
