"""The numba backend: generated loop modules, compiled once and cached on disk.

Each loop signature (kernel, its constants, and for every argument its kind, access
mode, dim, dtype and map arity/index) becomes one Python module in
``<cache_dir>/numba/``, named by the hash of its text. Importing it from a file lets
Numba's ``cache=True`` keep the machine code, so the next process reuses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import time
from pathlib import Path

import numpy as np

from ..core.access import Access
from ..core.errors import AccessModeError, BackendUnavailableError, CompilationError, ConfigurationError, KernelRuntimeError
from .base import Backend, combine_reductions, readonly
from .generated import save_source
from .numba_codegen import loop_source, reduction_args

__all__ = ["NumbaBackend", "import_generated"]


class NumbaBackend(Backend):
    """Compiles each loop signature with Numba and runs it over the coloured block plan."""

    name = "numba"
    needs_plan = True
    can_tile = True

    def __init__(self, runtime):
        super().__init__(runtime)
        try:
            import numba
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            raise BackendUnavailableError(f"the numba backend needs the numba package: {exc}") from None
        self._numba = numba
        self._executors: dict = {}
        self._phases: dict = {}
        self._tiled: dict = {}
        self._threads = runtime.config.threads
        set_threads(numba, self._threads)

    def restore(self) -> None:
        """Re-apply this backend's thread count (after another configuration was refused)."""
        set_threads(self._numba, self._threads)

    def run(self, loop, plan, record, targets=None) -> None:
        executor = self._executor(loop, record)
        arrays = executor.arrays(loop, plan, targets or {})
        before = len(executor.dispatcher.overloads)
        hits = _cache_hits(executor.dispatcher)
        start = time.perf_counter()
        try:
            executor.dispatcher(*arrays)
        except self._numba.core.errors.NumbaError as exc:
            raise _compile_failure(loop, executor.path, exc) from None
        except (IndexError, SystemError) as exc:
            # an IndexError raised inside a prange region surfaces as SystemError
            raise KernelRuntimeError(
                f"kernel {loop.kernel.name!r} in loop {loop.name!r}: {exc}; an index fell outside an argument view "
                f"(view shapes {[a.view_shape for a in loop.args]}); generated source: {executor.path}"
            ) from None
        elapsed = time.perf_counter() - start
        if len(executor.dispatcher.overloads) > before:
            record.time_compile += elapsed
            record.compilations += 1
            record.cache_hits += _cache_hits(executor.dispatcher) - hits
        else:
            record.time_compute += elapsed

    def run_phase(self, items) -> None:
        """Run a chain phase as ONE compiled call (Python overhead per phase, not per loop).

        The first time a phase signature is met its loops run one by one (each compiles,
        or loads from the cache, with its own error messages); after that a generated
        ``_mc_phase`` function calls every loop's ``_mc_loop`` in order.
        """
        executors = [self._executor(loop, record) for loop, _, record, _ in items]
        arrays = [ex.arrays(loop, plan, targets or {}) for ex, (loop, plan, _, targets) in zip(executors, items)]
        key = tuple((ex.module_name, len(a)) for ex, a in zip(executors, arrays))
        phase = self._phases.get(key)
        if phase is None:
            super().run_phase(items)
            self._phases[key] = self._build_phase(key)
            return
        flat = [array for group in arrays for array in group]
        elapsed, compiled = self._call_fused(phase, flat, f"chain phase of loops {[loop.name for loop, *_ in items]}")
        _share_time([(record, plan.end - plan.start) for _, plan, record, _ in items], elapsed, compiled=compiled)

    def run_tiled(self, plan, items) -> None:
        """Run a sparse-tiled chain as ONE compiled call: colours in order, the tiles of a
        colour on threads (``prange``), each tile calling every loop's ``_mc_tile`` in chain
        order. Reductions go to per-tile partial rows, combined in tile order afterwards, so
        the result does not depend on the thread count."""
        executors = [self._executor(loop, record) for loop, record, _ in items]
        arrays = [ex.operands(loop, plan.ntiles, targets or {}) for ex, (loop, _, targets) in zip(executors, items)]
        key = tuple((ex.module_name, len(a)) for ex, a in zip(executors, arrays))
        tiled = self._tiled.get(key)
        if tiled is None:
            tiled = self._tiled[key] = self._build_tiled(key)
        flat = [plan.colour_offsets, plan.tile_order]
        for position, group in enumerate(arrays):
            flat += [*plan.runs[position], *group]
        elapsed, compiled = self._call_fused(tiled, flat, f"tiled chain of loops {[loop.name for loop, _, _ in items]}")
        for ex, (loop, _, targets), group in zip(executors, items, arrays):
            partials = group[len(group) - len(ex.reductions):]
            combine_reductions(loop, targets or {}, dict(zip(ex.reductions, partials)))
        _share_time([(record, len(its)) for (_, record, _), its in zip(items, plan.iterations)], elapsed,
                    compiled=compiled)

    def _call_fused(self, function, arguments, what: str) -> tuple[float, bool]:
        """Call a generated function that runs several loops; returns ``(seconds, compiled)``
        and turns Numba's failures into meshchain errors that name ``what``."""
        before = len(function.overloads)
        start = time.perf_counter()
        try:
            function(*arguments)
        except self._numba.core.errors.NumbaError as exc:
            raise CompilationError(f"the numba backend could not compile the {what}: {_first_lines(str(exc))}") from None
        except (IndexError, SystemError) as exc:
            raise KernelRuntimeError(f"a kernel of the {what} failed: {exc}; an index fell outside an argument "
                                     f"view") from None
        return time.perf_counter() - start, len(function.overloads) > before

    def _build_tiled(self, key):
        lines = ["# Generated by meshchain: one sparse-tiled loop chain. Do not edit.", "import sys",
                 "from numba import njit as _mc_njit, prange as _mc_prange", ""]
        params, calls = ["_mc_offsets", "_mc_order"], []
        for position, (module_name, count) in enumerate(key):
            lines.append(f"_mc_f{position} = sys.modules[{module_name!r}]._mc_tile")
            names = [f"_mc_r{position}", f"_mc_lo{position}", f"_mc_hi{position}"]
            names += [f"_mc_a{position}_{j}" for j in range(count)]
            params += names
            calls.append(f"            _mc_f{position}(_mc_t, {', '.join(names)})")
        lines += ["", "", "@_mc_njit(cache=True, parallel=True, nogil=True)", f"def _mc_tiled({', '.join(params)}):",
                  "    for _mc_c in range(len(_mc_offsets) - 1):",
                  "        for _mc_k in _mc_prange(_mc_offsets[_mc_c], _mc_offsets[_mc_c + 1]):",
                  "            _mc_t = _mc_order[_mc_k]", *calls, ""]
        module, _ = import_generated("\n".join(lines), "tiled_chain", Path(self.runtime.config.cache_dir) / "numba")
        return module._mc_tiled

    def _build_phase(self, key):
        lines = ["# Generated by meshchain: one phase of a loop chain. Do not edit.", "import sys",
                 "from numba import njit as _mc_njit", ""]
        params, calls = [], []
        for position, (module_name, count) in enumerate(key):
            lines.append(f"_mc_f{position} = sys.modules[{module_name!r}]._mc_loop")
            names = [f"_mc_a{position}_{j}" for j in range(count)]
            params += names
            calls.append(f"    _mc_f{position}({', '.join(names)})")
        lines += ["", "", "@_mc_njit(cache=True, nogil=True)", f"def _mc_phase({', '.join(params)}):", *calls, ""]
        module, _ = import_generated("\n".join(lines), "chain_phase", Path(self.runtime.config.cache_dir) / "numba")
        return module._mc_phase

    def _executor(self, loop, record) -> "_Executor":
        constants = tuple(c.source for c in loop.kernel.constants())
        key = (loop.kernel, constants, loop.specs)
        executor = self._executors.get(key)
        if executor is None:
            start = time.perf_counter()
            executor = self._executors[key] = self._build(loop)
            record.time_compile += time.perf_counter() - start
        return executor

    def _build(self, loop) -> "_Executor":
        config = self.runtime.config
        safe = loop.kernel.index_safety(a.view_shape for a in loop.args)
        source = loop_source(loop, boundscheck=config.debug or not safe)
        module, path = import_generated(source, loop.kernel.name, Path(config.cache_dir) / "numba")
        return _Executor(module._mc_loop, path, loop.specs, module.__name__)


class _Executor:
    """A compiled loop plus the recipe for its array arguments."""

    def __init__(self, dispatcher, path: Path, specs, module_name: str):
        self.dispatcher, self.path, self.module_name = dispatcher, path, module_name
        self.reductions = reduction_args(specs)
        read_only: dict[int, bool] = {}
        for s in specs:
            read_only[s.slot] = read_only.get(s.slot, True) and s.access is Access.READ
        self.read_only = [read_only[j] for j in range(len(read_only))]

    def arrays(self, loop, plan, targets: dict) -> list:
        """Arguments of ``_mc_loop`` for a block plan."""
        return [plan.block_starts, plan.block_order, plan.colour_offsets, *self.operands(loop, plan.nblocks, targets)]

    def operands(self, loop, nparts: int, targets: dict) -> list:
        """Data, maps and one partial row per block (or tile) for each reduction: the
        arguments of ``_mc_block`` / ``_mc_tile`` after their range."""
        data = [_readonly_cached(obj) if ro else obj._data for obj, ro in zip(loop.data, self.read_only)]
        for position, array in targets.items():
            data[loop.specs[position].slot] = array
        partials = [np.empty((nparts, loop.specs[i].dim), dtype=loop.args[i].data.dtype) for i in self.reductions]
        return [*data, *(_unsigned(m) for m in loop.maps), *partials]


def _share_time(shares, elapsed: float, *, compiled: bool) -> None:
    """Split a fused call's time over its loops' records by ``(record, iterations)``."""
    total = sum(n for _, n in shares) or 1
    for record, n in shares:
        if compiled:
            record.time_compile += elapsed * n / total
        else:
            record.time_compute += elapsed * n / total
    if compiled:
        shares[0][0].compilations += 1


def _unsigned(map_):
    """The map's values viewed as unsigned integers (validated >= 0): indexing with them
    needs no negative-index wraparound in the compiled code."""
    view = getattr(map_, "_unsigned_view", None)
    if view is None:
        view = map_.values.view(np.dtype(map_.values.dtype.str.replace("i", "u")))
        map_._unsigned_view = view
    return view


def _readonly_cached(obj):
    view = getattr(obj, "_readonly_view", None)
    if view is None or view.base is not obj._data:
        view = readonly(obj._data)
        obj._readonly_view = view
    return view


def set_threads(numba, threads) -> None:
    """Set Numba's thread count, refusing more than its pool has."""
    available = numba.config.NUMBA_NUM_THREADS
    wanted = available if threads is None else threads
    if wanted > available:
        raise ConfigurationError(
            f"threads={threads} but Numba's pool has {available} threads; set NUMBA_NUM_THREADS={threads} "
            f"in the environment before starting Python."
        )
    numba.set_num_threads(wanted)


def import_generated(source: str, name: str, directory: Path):
    """Write ``source`` to ``directory/<name>_<hash>.py`` (once) and import it.

    Returns ``(module, path)``. The file is written atomically, so concurrent
    processes (MPI ranks) can share a cache directory.
    """
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    stem = f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{digest}"
    path = directory / f"{stem}.py"
    module_name = f"_meshchain_generated_{stem}"
    if module_name in sys.modules:
        return sys.modules[module_name], path
    save_source(directory, stem, ".py", source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CompilationError(f"generated module {path} failed to import: {type(exc).__name__}: {exc}") from None
    sys.modules[module_name] = module
    return module, path


def _cache_hits(dispatcher) -> int:
    stats = getattr(dispatcher, "stats", None)
    return sum(stats.cache_hits.values()) if stats is not None else 0


def _compile_failure(loop, path, exc) -> Exception:
    message = str(exc)
    if "readonly" in message.lower() or "read-only" in message.lower():
        return AccessModeError(
            f"kernel {loop.kernel.name!r} in loop {loop.name!r} writes to an argument declared READ; declare it "
            f"WRITE, RW or INC. Generated source: {path}\nNumba said: {_first_lines(message)}"
        )
    return CompilationError(
        f"the numba backend could not compile kernel {loop.kernel.name!r} (loop {loop.name!r}, defined at "
        f"{loop.kernel.filename}:{loop.kernel.first_line}). Generated source: {path}\n"
        f"Numba said: {_first_lines(message)}"
    )


def _first_lines(message: str, count: int = 12) -> str:
    lines = [line for line in message.splitlines() if line.strip()]
    return "\n".join(lines[:count])
