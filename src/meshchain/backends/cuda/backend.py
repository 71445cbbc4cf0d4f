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
from ...comm.grouped import GROUPED_TAG
from ...inspector import colour_blocks, touched_keys
from ...types.args import GLOBAL, INDIRECT, WHOLE_MAP
from ..base import Backend, combine_reductions
from .codegen import loop_source
from .device import check_sizes
from .halo import HALO_SOURCE, DeviceExchange, HaloPattern, halo_mode
from .residency import device_array

__all__ = ["CudaBackend"]


class CudaBackend(Backend):
    """Runs loops as generated ``__global__`` functions on ``device`` (see :mod:`.device`)."""

    can_tile = True

    def __init__(self, runtime, device):
        super().__init__(runtime)
        self.device = device
        self.name = device.name
        self._executors: dict = {}
        self._maps: dict = {}
        self._colourings: dict = {}
        self._patterns: dict = {}
        self._halo_kernel = None
        self._none = device.upload(np.zeros(1, dtype=np.int64))
        self.validate(runtime.config)

    def validate(self, config) -> None:
        """On several ranks, ``gpu_halos="direct"`` needs a CUDA-aware MPI."""
        if self.runtime.distributed:
            halo_mode(config.gpu_halos, self.device)

    @property
    def threads(self) -> int:
        return self.runtime.config.gpu_threads

    def run(self, loop, plan, record, targets=None) -> None:
        executor = self._executor(loop, record)
        if executor.coloured:
            for elements in self._colouring(loop, plan.start, plan.end, record):
                self._launch(loop, executor, record, targets, elements=elements, count=len(elements))
            return
        self._launch(loop, executor, record, targets, start=plan.start, count=plan.end - plan.start)

    def run_indices(self, loop, elements, record, targets=None) -> None:
        elements = np.ascontiguousarray(elements, dtype=np.int64)
        executor = self._executor(loop, record)
        if executor.coloured:
            for picked in self._colouring_of_list(loop, elements):
                self._launch(loop, executor, record, targets, elements=self.device.upload(picked), count=len(picked))
            return
        self._launch(loop, executor, record, targets, elements=self.device.upload(elements), count=len(elements))

    def settle(self) -> None:
        self.device.settle()

    # --- halo exchanges (see :mod:`.halo`) ------------------------------------------------------

    def halo_exchanges(self, comm, items, *, grouped: bool) -> list:
        """Exchanges packed, staged and unpacked on the device: one for all ``items`` when
        ``grouped``, else one per dat (with the dat's own tag, as the host exchanges)."""
        if grouped:
            return [DeviceExchange(self, comm, items, tag=GROUPED_TAG)]
        return [DeviceExchange(self, comm, [item], tag=item[0]._tag) for item in items]

    def halo_pattern(self, items) -> HaloPattern:
        """The cached :class:`HaloPattern` of an exchange of ``items``."""
        staged = halo_mode(self.runtime.config.gpu_halos, self.device)
        key = (tuple((id(dat), lo, hi, dat._host.shape, dat._host.dtype.str) for dat, lo, hi in items), staged)
        pattern = self._patterns.get(key)
        if pattern is None or not pattern.matches(items):
            dropped = [pattern] if pattern is not None else []
            if len(self._patterns) > 256:
                dropped = list(self._patterns.values())
                self._patterns.clear()
            for old in dropped:  # their pinned buffers go back to a pool: no copy may still read them
                if old.inbound is not None:
                    self.device.wait(old.inbound)
            pattern = self._patterns[key] = HaloPattern(self.device, items, staged=staged)
        return pattern

    def halo_kernel(self):
        """The compiled pack/unpack kernel (:data:`~.halo.HALO_SOURCE`)."""
        if self._halo_kernel is None:
            self._halo_kernel = self.device.compile(HALO_SOURCE, "the halo packing kernel")
        return self._halo_kernel

    # --- compilation ----------------------------------------------------------------------------

    def _executor(self, loop, record) -> "_Executor":
        config = self.runtime.config
        constants = tuple(c.source for c in loop.kernel.constants())
        key = (loop.kernel, constants, loop.specs, config.gpu_threads, config.gpu_increments)
        executor = self._executors.get(key)
        if executor is None:
            check_sizes(loop)
            began = time.perf_counter()
            coloured = config.gpu_increments == "colour" and _increments_through_maps(loop)
            source = loop_source(loop, threads=config.gpu_threads, colour=coloured)
            what = f"kernel {loop.kernel.name!r} (loop {loop.name!r})"
            executor = self._executors[key] = _Executor(self.device.compile(source.text, what), source, coloured,
                                                           loop.specs)
            record.time_compile += time.perf_counter() - began
            record.compilations += 1
        return executor

    # --- launching ------------------------------------------------------------------------------

    def _launch(self, loop, executor, record, targets, *, start=0, elements=None, count: int) -> None:
        if count <= 0:
            return
        targets = targets or {}
        device, threads = self.device, self.threads
        grid = (count + threads - 1) // threads
        operands = []
        for kind, number in executor.source.params:
            if kind == "data":
                operands.append(self._data_operand(loop.data[number], executor.slots[number], targets))
            elif kind == "map":
                operands.append(self._map(loop.maps[number]))
            else:
                operands.append(device.empty((grid, loop.specs[number].dim), loop.args[number].data.dtype))
        listed = elements is not None
        arguments = [int(start), int(count), elements if listed else self._none, np.int32(1 if listed else 0), *operands]
        device.launch(executor.function, grid, threads, arguments, record)  # asynchronous on a GPU
        partials = {i: device.to_host(operands[-len(executor.source.reductions) + k])
                    for k, i in enumerate(executor.source.reductions)}
        combine_reductions(loop, targets, partials)

    def _data_operand(self, obj, use, targets: dict):
        """A data slot's device array; ``use`` is the argument position of a global, or
        whether the loop writes the dat."""
        if obj.is_global:
            return self.device.upload(targets.get(use, obj._data))
        return device_array(self.device, obj, write=use)

    def _map(self, map_):
        entry = self._maps.get(id(map_))
        if entry is None or entry[0] is not map_.values:
            values = np.ascontiguousarray(map_.values, dtype=np.int32)
            entry = self._maps[id(map_)] = (map_.values, self.device.upload(values), map_)
        return entry[1]

    # --- colouring (increments="colour") --------------------------------------------------------

    def _colouring(self, loop, start: int, end: int, record) -> list:
        """The iterations of ``[start, end)`` by colour, on the device: iterations of one colour
        never increment the same element. The runtime's plan cache colours single iterations
        (and forgets them when the mesh is partitioned); this keeps their device copies."""
        plan = self.runtime.plan_for(loop, start, end, record, block_size=1)
        cached = self._colourings.get(id(plan))
        if cached is None or cached[1] is not plan:
            order = plan.block_order + start  # block b of size 1 is iteration start + b
            lists = [order[plan.colour_offsets[c]:plan.colour_offsets[c + 1]] for c in range(plan.ncolours)]
            cached = self._colourings[id(plan)] = ([self.device.upload(e) for e in lists], plan)
            record.colours = max(record.colours, plan.ncolours)
        return cached[0]

    def _colouring_of_list(self, loop, elements: np.ndarray) -> list:
        """Colours of listed iterations (a sparse tile): greedy, in list order."""
        touch, nkeys = touched_keys(0, int(elements.max()) + 1, loop.indirect_writes)
        picked = np.ascontiguousarray(touch[elements])
        plan = colour_blocks(0, len(elements), block_size=1, touch=picked, nkeys=nkeys)
        return [elements[plan.block_order[plan.colour_offsets[c]:plan.colour_offsets[c + 1]]]
                for c in range(plan.ncolours)]


class _Executor:
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
