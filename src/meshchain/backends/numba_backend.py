"""The numba backend: generated loop modules, compiled once and cached on disk.

Each loop signature (kernel, its constants, and for every argument its kind, access
mode, dim, dtype and map arity/index) becomes one Python module in
``<cache_dir>/numba/``, named by the hash of its text. Importing it from a file lets
Numba's ``cache=True`` keep the machine code, so the next process reuses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from ..access import Access
from ..errors import AccessModeError, BackendUnavailableError, CompilationError, ConfigurationError, KernelRuntimeError
from .base import Backend, readonly
from .numba_codegen import loop_source, reduction_args

__all__ = ["NumbaBackend", "import_generated"]


class NumbaBackend(Backend):
    """Compiles each loop signature with Numba and runs it over the coloured block plan."""

    name = "numba"
    needs_plan = True

    def __init__(self, runtime):
        super().__init__(runtime)
        try:
            import numba
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            raise BackendUnavailableError(f"the numba backend needs the numba package: {exc}") from None
        self._numba = numba
        self._executors: dict = {}
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
        return _Executor(module._mc_loop, path, loop.specs)


class _Executor:
    """A compiled loop plus the recipe for its array arguments."""

    def __init__(self, dispatcher, path: Path, specs):
        self.dispatcher, self.path = dispatcher, path
        self.reductions = reduction_args(specs)
        read_only: dict[int, bool] = {}
        for s in specs:
            read_only[s.slot] = read_only.get(s.slot, True) and s.access is Access.READ
        self.read_only = [read_only[j] for j in range(len(read_only))]

    def arrays(self, loop, plan, targets: dict) -> list:
        data = [
            _readonly_cached(obj) if ro else obj._data for obj, ro in zip(loop.data, self.read_only)
        ]
        for position, array in targets.items():
            data[loop.specs[position].slot] = array
        maps = [_unsigned(m) for m in loop.maps]
        partials = [
            np.empty((plan.nblocks, loop.specs[i].dim), dtype=loop.args[i].data.dtype) for i in self.reductions
        ]
        return [plan.block_starts, plan.block_order, plan.colour_offsets, *data, *maps, *partials]


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
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            temporary = directory / f".{stem}.{os.getpid()}.tmp"
            temporary.write_text(source)
            os.replace(temporary, path)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write generated code to {directory} ({exc}); set MESHCHAIN_CACHE_DIR or "
            f"mc.configure(cache_dir=...) to a writable directory."
        ) from None
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
