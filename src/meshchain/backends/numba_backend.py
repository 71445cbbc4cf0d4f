"""The numba backend: generated loop modules, compiled once and cached on disk.

Each loop signature (kernel, its constants, and for every argument its kind, access
mode, dim, dtype and map arity/index) becomes one Python module in
``<cache_dir>/numba/``, named by the hash of its text. Importing it from a file lets
Numba's ``cache=True`` keep the machine code, so the next process reuses it.

A phase of several runs is one call of a generated ``_mc_phase`` (:mod:`.numba_fused`).
Everything is compiled (or loaded from the disk cache) when the plan is built, each loop
on its own first so that an error names it; the prepared call then calls the compiled
entry point with arguments prepared once: no type dispatch, no allocation.

:meth:`NumbaBackend.chunked` prepares the same phase for dynamic scheduling on Python
threads (:mod:`.threads`): each chunk of consecutive blocks of a colour is one call of the
loop module's ``_mc_blocks``, and ``_mc_reduce`` combines the partial rows afterwards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..core.access import Access
from ..core.errors import AccessModeError, BackendUnavailableError, CompilationError, ConfigurationError, KernelRuntimeError
from ..core.storage import GlobalStorage
from .base import Backend, arrays_of, combine_reductions, readonly
from .compile_once import compiling_alone
from .generated import save_source
from .numba_codegen import loop_source, reduction_args
from .native_call import native_address
from .numba_fused import phase_source, repeat_source, tiled_source
from .numba_replay import ReplayCall, replay_source
from .threads import ChunkedCall, WorkerPool

__all__ = ["NumbaBackend", "import_generated", "set_threads", "slp_vectorizing"]


class NumbaBackend(Backend):
    """Compiles each loop signature with Numba and runs it over the coloured block plan."""

    name = "numba"
    can_tile = True
    can_chunk = True
    layer_arithmetic = True

    def __init__(self, config, caches, *, distributed: bool = False):
        super().__init__(config, caches, distributed=distributed)
        try:
            import numba
        except ImportError as exc:  # pragma: no cover - numba is a dependency
            raise BackendUnavailableError(f"the numba backend needs the numba package: {exc}") from exc
        self._numba = numba
        self._threads = config.threads if config.threads is not None or not distributed else threads_per_rank(numba)
        set_threads(numba, self._threads)
        self._directory = Path(config.cache_dir) / "numba"
        self._executors = caches.cache("numba loop modules", limit=4096)
        self._fused = caches.cache("numba fused modules", limit=1024)
        self._entries = caches.cache("numba entry points", limit=8192, counts_hits=True)
        self._natives = caches.cache("numba entry point addresses", limit=8192)
        self._pools: dict[int, WorkerPool] = {}

    def restore(self) -> None:
        set_threads(self._numba, self._threads)

    def colouring_block_size(self, loop) -> int:
        return self.config.block_size

    def may_fail(self, loop) -> bool:
        """Only a loop compiled with index checks can raise while it runs (Numba's NumPy error
        model raises nothing for arithmetic; unchecked indices are proven in bounds)."""
        return self._checked(loop)

    def _checked(self, loop) -> bool:
        """Whether ``loop`` is compiled with index checks: debug, or indices the analysis
        (:func:`meshchain.ir.analysis.index_safety`) could not prove in bounds."""
        return self.config.debug or not loop.kernel.index_safety(a.view_shape for a in loop.args)

    # --- prepared calls ---------------------------------------------------------------------------

    def phase(self, runs, report):
        runs = [run for run in runs if run.end > run.start]
        if not runs:
            return None
        parallel = self._threaded(run.colouring.colour_offsets for run in runs)  # one choice for the phase
        parts = [self._operands(run, report, parallel=parallel) for run in runs]
        names = [run.loop.name for run in runs]
        if len(parts) == 1:
            executor, arguments, entry = parts[0]
            function = executor.dispatcher if parallel else executor.serial
            return _Call(entry, tuple(arguments), names, executor.path, runs, function=function)
        calls, arrays = _shared_arrays([arguments[4:] for _, arguments, _ in parts])
        plan, index = _concatenated([_colouring(run) for run in runs])
        natives = [self._native(executor.dispatcher if parallel else executor.serial, arguments)
                   for executor, arguments, _ in parts]
        addresses = np.array([address for address, _ in natives], dtype=np.int64)
        source = phase_source([(signature, call) for (_, signature), call in zip(natives, calls)], len(arrays))
        function = self._generated("_mc_phase", source, "chain_phase")
        arguments = (plan, index, addresses, self._serial(), *arrays)
        entry = self._compile(function, arguments, runs[0].loop, report, what=f"chain phase of loops {names}")
        return _Call(entry, arguments, names, None, runs, function=function)

    def repeater(self, call, report):
        """A :class:`_Repeater` of ``call`` (a prepared call of :meth:`phase`): a generated
        ``_mc_repeat`` (:func:`~.numba_fused.repeat_source`) calls its compiled entry point by
        address ``times`` times; None where the call is not such a prepared call."""
        if getattr(call, "function", None) is None:
            return None
        return _Repeater(self, call, report)

    def replay(self, calls, exchanges: int, program, arguments, report, *, reductions=(), ticks: bool = False):
        """A captured step's compiled replay (or a piece of it), a
        :class:`~.numba_replay.ReplayCall` bound to ``arguments`` (:mod:`.numba_replay`):
        ``calls``, prepared calls of :meth:`phase` (their ``function``), ``exchanges``
        exchanges, ``program`` the operations in order,
        ``reductions`` per reduction over ranks whether it is an increment, ``ticks``: its clock
        is the time-stamp counter. None where a call is not such a prepared call."""
        if any(getattr(call, "function", None) is None for call in calls):
            return None
        natives = [self._native(call.function, call.arguments) for call in calls]
        source = replay_source([signature for _, signature in natives], exchanges, program, reductions,
                               ticks=ticks)
        function = self._generated("_mc_replay", source, "replay")
        call = ReplayCall(function, np.array([address for address, _ in natives], dtype=np.int64))
        call.bind(arguments)
        call.entry = self._compile(function, (call.boxed,), None, report, what="replay of a captured step")
        return call

    def threads_in_use(self) -> int:
        """Numba's threads in use on this rank."""
        return self._numba.get_num_threads()

    def chunk_workers(self) -> int:
        """Worker threads for :meth:`chunked` beside the calling thread: Numba's threads minus one."""
        return max(self._numba.get_num_threads() - 1, 0)

    def chunked(self, runs, report, *, workers: int, chunk_blocks: int = 1):
        """The phase of ``runs`` as a :class:`~.threads.ChunkedCall`: per run and colour, a
        group of ``_mc_blocks`` calls of ``chunk_blocks`` consecutive positions of the colour's
        block order; a run's ``_mc_reduce`` follows its last colour (as its own group when a
        later run follows, so that run sees the reduced globals, as in :meth:`phase`)."""
        if workers < 0 or chunk_blocks < 1:
            raise ConfigurationError(f"chunked scheduling needs workers >= 0 and chunk_blocks >= 1, not "
                                     f"workers={workers}, chunk_blocks={chunk_blocks}")
        runs = [run for run in runs if run.end > run.start]
        if not runs:
            return None
        groups, finish = [], []
        for position, run in enumerate(runs):
            blocks, reduce = self._chunked_run(run, report, chunk_blocks)
            groups += blocks
            if reduce is not None and position < len(runs) - 1:
                groups.append([reduce])
            elif reduce is not None:
                finish.append(reduce)
        call = _Call(None, (), [run.loop.name for run in runs], None, runs)
        if len(runs) == 1:
            call.path = self._executor(runs[0].loop, report).path
        return ChunkedCall(groups, finish, pool=self._pool(workers), failure=call.wrapped)

    def _chunked_run(self, run, report, chunk_blocks: int):
        """``run``'s groups of ``_mc_blocks`` chunks (one per colour) and its ``_mc_reduce``
        call (None without reductions)."""
        executor, arguments = self._arguments(run, report)
        starts, order, offsets = _colouring(run)
        operands = tuple(arguments[4:])
        blocks = self._compile(executor.blocks, (0, 0, starts, order, *operands), run.loop, report,
                               path=executor.path)
        groups = [[(blocks, (lo, min(lo + chunk_blocks, last), starts, order, *operands))
                   for lo in range(first, last, chunk_blocks)]
                  for first, last in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        if not executor.reductions:
            return groups, None
        reduce = self._compile(executor.reduce, operands, run.loop, report, path=executor.path)
        return groups, (reduce, operands)

    def _pool(self, workers: int) -> WorkerPool:
        pool = self._pools.get(workers)
        if pool is None:
            pool = self._pools[workers] = WorkerPool(workers)
        return pool

    def tiled(self, plan, runs, report):
        """One compiled call for the whole tiled group: colours in order, the tiles of a colour
        on threads, each tile calling every loop's ``_mc_tile`` in chain order. Reductions go
        to per-tile partial rows, combined in tile order afterwards, so the result does not
        depend on the thread count."""
        offsets, index = _concatenated([plan.runs[position] for position in range(len(runs))])
        parts = []
        for position, run in enumerate(runs):
            executor = self._executor(run.loop, report)
            operands = executor.operands(run, plan.ntiles)
            tile_arguments = (np.int64(0), offsets, index, 3 * position, *operands)
            self._compile(executor.tile, tile_arguments, run.loop, report, path=executor.path)
            parts.append((executor, operands, self._native(executor.tile, tile_arguments)))
        calls, arrays = _shared_arrays([operands for _, operands, _ in parts])
        natives = [native for _, _, native in parts]
        addresses = np.array([address for address, _ in natives], dtype=np.int64)
        calls = [(signature, call) for (_, signature), call in zip(natives, calls)]
        source = tiled_source(calls, len(arrays), parallel=self._threaded([plan.colour_offsets]))
        function = self._generated("_mc_tiled", source, "tiled_chain")
        arguments = (plan.colour_offsets, plan.tile_order, offsets, index, addresses, self._serial(), *arrays)
        names = [run.loop.name for run in runs]
        entry = self._compile(function, arguments, runs[0].loop, report, what=f"tiled chain of loops {names}")
        call = _Call(entry, arguments, names, None, runs, function=function)
        reductions = [(run.loop, arrays_of(run), dict(zip(executor.reductions,
                                                        operands[len(operands) - len(executor.reductions):])))
                      for run, (executor, operands, _) in zip(runs, parts) if executor.reductions]
        if not reductions:
            return call

        def tiled_with_reductions():
            call()
            for loop, targets, partials in reductions:
                combine_reductions(loop, targets, partials)

        return tiled_with_reductions

    # --- compilation ------------------------------------------------------------------------------

    def _operands(self, run, report, *, parallel: bool):
        """The loop's executor, its arguments for this run, and its entry point compiled for them:
        ``_mc_loop``, or where its phase has no colour that could run on two threads (``parallel``
        false) ``_mc_loop_serial``. Compiled here even inside a phase, so that a failure names
        the loop and its generated file."""
        executor, arguments = self._arguments(run, report)
        function = executor.dispatcher if parallel else executor.serial
        return executor, arguments, self._compile(function, arguments, run.loop, report, path=executor.path)

    def _arguments(self, run, report):
        """The loop's executor and the arguments of its ``_mc_loop`` for this run: colouring
        (block starts, order and colour offsets in one array, their offsets, and 0: where in those
        the run's three are), the serial flag, then ``_mc_block``'s operands."""
        executor = self._executor(run.loop, report)
        plan, index = _concatenated([_colouring(run)])
        arguments = [plan, index, 0, self._serial(), *executor.operands(run, run.colouring.nblocks)]
        return executor, arguments

    def _serial(self) -> bool:
        """Whether Numba runs one thread (loops then skip starting a thread team)."""
        return self._numba.get_num_threads() == 1

    def _threaded(self, colour_offsets) -> bool:
        """Whether a call over these colourings can run blocks on two threads: more than one
        thread, and a colour of two blocks or more (otherwise the serial entry points run the
        same blocks in the same order, with no parallel region to compile)."""
        return not self._serial() and any(len(o) > 1 and int(np.diff(o).max()) > 1 for o in colour_offsets)

    def _executor(self, loop, report) -> "_Executor":
        constants = tuple(c.source for c in loop.kernel.constants())
        key = (loop.kernel, constants, loop.specs, self.config.debug, self.config.fp_contract)
        executor = self._executors.get(key)
        if executor is None:
            began = time.perf_counter()
            source = loop_source(loop, boundscheck=self._checked(loop), contract=self.config.fp_contract)
            module, path = import_generated(source, loop.kernel.name, self._directory)
            executor = self._executors[key] = _Executor(module, path, loop.specs)
            report(loop, time.perf_counter() - began, False, 0)
        return executor

    def _generated(self, function: str, source: str, name: str):
        found = self._fused.get(source)
        if found is None:
            module, _ = import_generated(source, name, self._directory)
            found = self._fused[source] = getattr(module, function)
        return found

    def _compile(self, function, arguments, loop, report, *, path=None, what=None):
        """``function``'s entry point for ``arguments``' types (compiled, or loaded from the disk
        cache, unless it already was); errors name the loop (or ``what``) and the source.

        Entry points are remembered by :func:`_type_key` of the arguments, which tells apart
        what Numba's types tell apart, at a fraction of the cost of ``numba.typeof`` (which
        took a third of a plan's build: a loop with a new Dat or Global builds one)."""
        types = tuple(map(_type_key, arguments))
        if None in types:  # an argument the key does not describe: ask Numba every time
            return self._entry_point(function, arguments, loop, report, path=path, what=what)
        key = (function, types)
        entries = self._entries
        found = entries.get(key)
        if found is not None:
            entries.hits += 1
            return found
        entry = entries[key] = self._entry_point(function, arguments, loop, report, path=path, what=what)
        return entry

    def _native(self, function, arguments) -> tuple[int, str]:
        """The address of ``function``'s entry point for ``arguments`` (compiled already) and the
        text of its argument types, for a call by address (:func:`.native_call.native_address`),
        remembered by the argument types as :meth:`_compile` remembers entry points. The address
        stays valid: every generated module stays in ``sys.modules`` (:func:`import_generated`),
        and with it its dispatchers and their compiled code."""
        types = tuple(map(_type_key, arguments))
        if None in types:
            return native_address(function, arguments)
        key = (function, types)
        found = self._natives.get(key)
        if found is None:
            found = self._natives[key] = native_address(function, arguments)
        return found

    def _entry_point(self, function, arguments, loop, report, *, path=None, what=None):
        signature = tuple(self._numba.typeof(a) for a in arguments)
        overload = function.overloads.get(signature)
        if overload is not None:
            return overload.entry_point
        hits = _cache_hits(function)
        began = time.perf_counter()
        try:
            with compiling_alone(function, signature), slp_vectorizing(self._numba):
                entry = function.compile(signature)
        except self._numba.core.errors.NumbaError as exc:
            if what is not None and path is None:
                raise CompilationError(f"the numba backend could not compile the {what}: "
                                       f"{_first_lines(str(exc))}") from exc
            raise _compile_failure(loop, path, exc) from exc
        hit = _cache_hits(function) - hits
        report(loop, time.perf_counter() - began, True, hit)
        return entry


class _Call:
    """A prepared call of a compiled function: runs a phase with arguments bound once. It
    keeps the loops' names (and of one loop, its kernel's name and argument view shapes, for
    error messages), not the loops: a plan holds no user object beyond its bound arrays."""

    __slots__ = ("entry", "arguments", "names", "path", "function", "_single")

    def __init__(self, entry, arguments, names, path, runs, *, function=None):
        """``function``: the Numba dispatcher whose compiled ``entry`` this is (None: the call
        cannot be part of a compiled replay, :meth:`NumbaBackend.replay`)."""
        self.entry, self.arguments, self.names, self.path = entry, arguments, names, path
        self.function = function
        self._single = None
        if len(runs) == 1:
            loop = runs[0].loop
            self._single = (loop.kernel.name, loop.name, [a.view_shape for a in loop.args])

    def __call__(self) -> None:
        try:
            self.entry(*self.arguments)
        except (IndexError, SystemError) as exc:  # an IndexError inside a prange region surfaces as SystemError
            raise self._failure(exc) from exc

    def rebind(self, substitutions) -> None:
        """Put the arrays of ``substitutions`` (``(position, array)``, each alike the one it
        replaces: see :mod:`meshchain.engine.rebind`) in place of the bound arguments."""
        arguments = list(self.arguments)
        for position, array in substitutions:
            arguments[position] = array
        self.arguments = tuple(arguments)

    def wrapped(self, exc: BaseException) -> BaseException:
        """The exception to raise for ``exc`` raised by these runs' compiled code."""
        return self._failure(exc) if isinstance(exc, (IndexError, SystemError)) else exc

    def _failure(self, exc) -> KernelRuntimeError:
        if self._single is not None:
            kernel, name, shapes = self._single
            return KernelRuntimeError(
                f"kernel {kernel!r} in loop {name!r}: {exc}; an index fell outside an argument view "
                f"(view shapes {shapes}); generated source: {self.path}")
        return KernelRuntimeError(f"a kernel of the chain phase of loops {self.names} failed: {exc}; an index fell "
                                  f"outside an argument view")


class _Repeater:
    """A prepared call made several times in one compiled call (:meth:`NumbaBackend.repeater`):
    :meth:`prepare` compiles (or loads) ``_mc_repeat`` for the call's argument types of the
    moment, :meth:`run` makes the call ``times`` times, ``done`` the calls completed. An index
    error in a kernel raises as the call's own does (:class:`~meshchain.core.errors.KernelRuntimeError`)."""

    __slots__ = ("_backend", "_call", "_report", "_counter", "_made")

    def __init__(self, backend, call, report):
        self._backend, self._call, self._report = backend, call, report
        self._counter = np.zeros(1, dtype=np.int64)
        self._made: dict = {}  # the argument types' text -> (compiled _mc_repeat entry point, the call's address)

    def prepare(self) -> tuple:
        backend, call = self._backend, self._call
        address, signature = backend._native(call.function, call.arguments)
        made = self._made.get(signature)
        if made is None:
            function = backend._generated("_mc_repeat", repeat_source(signature, len(call.arguments)), "repeat")
            entry = backend._compile(function, (1, self._counter, address, *call.arguments), None,
                                     lambda _, *reported: self._report(*reported), what="repeat of a captured step")
            made = self._made[signature] = (entry, address)
        return made

    def run(self, times: int) -> None:
        entry, address = self.prepare()
        self._counter[0] = 0
        try:
            entry(times, self._counter, address, *self._call.arguments)
        except (IndexError, SystemError) as exc:
            raise self._call.wrapped(exc) from exc

    @property
    def done(self) -> int:
        return int(self._counter[0])


class _Executor:
    """A generated loop module plus the recipe for its array arguments."""

    def __init__(self, module, path: Path, specs):
        self.dispatcher, self.serial, self.tile = module._mc_loop, module._mc_loop_serial, module._mc_tile
        self.blocks, self.reduce = module._mc_blocks, module._mc_reduce
        self.path, self.module_name, self.specs = path, module.__name__, specs
        self.reductions = reduction_args(specs)
        read_only: dict[int, bool] = {}
        for s in specs:
            read_only[s.slot] = read_only.get(s.slot, True) and s.access is Access.READ
        self.read_only = [read_only[j] for j in range(len(read_only))]

    def operands(self, run, nparts: int) -> list:
        """Data, maps and one partial row per block (or tile) for each reduction: the
        arguments of ``_mc_block`` / ``_mc_tile`` after their range."""
        data = []
        for record, ro in zip(run.data, self.read_only):
            array = record.value if isinstance(record, GlobalStorage) else record.host
            data.append(readonly(array) if ro else array)
        for position, array in run.targets.items():
            data[self.specs[position].slot] = array
        partials = [np.empty((nparts, self.specs[i].dim), dtype=np.dtype(self.specs[i].dtype)) for i in self.reductions]
        return [*data, *(_unsigned(values) for values in run.maps), *partials]


def _shared_arrays(groups):
    """Each array once (by identity): ``(per group, the indices of its arrays; the arrays)``."""
    arrays, seen, calls = [], {}, []
    for group in groups:
        indices = []
        for array in group:
            key = id(array)
            if key not in seen:
                seen[key] = len(arrays)
                arrays.append(array)
            indices.append(seen[key])
        calls.append(tuple(indices))
    return calls, arrays


def _colouring(run):
    """``run``'s block starts, block order and colour offsets."""
    colouring = run.colouring
    return colouring.block_starts, colouring.block_order, colouring.colour_offsets


def _concatenated(groups):
    """Every group's int64 arrays in one array, and the offsets of each (three per group)."""
    parts = [np.asarray(a, dtype=np.int64) for group in groups for a in group]
    offsets = np.concatenate(([0], np.cumsum([len(p) for p in parts]))).astype(np.int64)
    joined = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return np.ascontiguousarray(joined), offsets


def _type_key(value):
    """What Numba's type of ``value`` depends on: an array's dtype, dimensions, layout,
    writeability and alignment; a bool's, float's or NumPy scalar's type; an int's type if it
    fits int64. None for anything else (a tuple, a larger int): no key, Numba types it.
    Equal keys mean equal Numba types.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.zeros((3, 2))
    >>> _type_key(a) == _type_key(np.ones((5, 7))), _type_key(a) == _type_key(a[:, 0])
    (True, False)
    >>> _type_key(True) == _type_key(1), _type_key(2**70), _type_key((1, 2))
    (False, None, None)
    """
    if isinstance(value, np.ndarray):
        flags = value.flags
        layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
        return (type(value), value.dtype, value.ndim, layout, flags.writeable, flags.aligned)
    if type(value) is int:
        return int if -2**63 <= value < 2**63 else None
    if type(value) in (bool, float) or isinstance(value, np.generic):
        return type(value)
    return None


def _unsigned(values):
    """Map values viewed as unsigned integers (validated >= 0): indexing with them needs no
    negative-index wraparound in the compiled code."""
    return values.view(np.dtype(values.dtype.str.replace("i", "u")))


def threads_per_rank(numba) -> int:
    """Numba's threads shared out among the MPI ranks on this node (MPICH's ``MPI_LOCALNRANKS``,
    Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``; else every rank is taken to share this node), so
    that ranks do not oversubscribe the cores: threads that spin for cores another rank's
    threads hold make every parallel loop many times slower."""
    local = os.environ.get("MPI_LOCALNRANKS") or os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if not local:
        from mpi4py import MPI

        local = MPI.COMM_WORLD.Get_size()
    return max(1, numba.config.NUMBA_NUM_THREADS // max(int(local), 1))


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
        raise CompilationError(f"generated module {path} failed to import: {type(exc).__name__}: {exc}") from exc
    sys.modules[module_name] = module
    return module, path


@contextmanager
def slp_vectorizing(numba):
    """Compile with LLVM's superword-level (SLP) vectorizer on, for meshchain's own compiles only.

    Numba leaves it off by default (``NUMBA_SLP_VECTORIZE=0``). A kernel body reads and writes a
    node's components side by side (``a[i, 0] -= d; a[i, 1] -= d; ...``); gcc's ``-O3`` packs such
    statements into vector instructions and Numba without SLP does not, which made MG-CFD's indirect
    loops 4-40 % slower than OP2's C. It reorders no floating-point operation (no fast-math), so
    results are unchanged bit for bit. Numba reads the setting when it builds each pass manager,
    under its compiler lock, so other compiles (a user's ``@njit`` functions) keep their own.

    Examples
    --------
    >>> import numba
    >>> with slp_vectorizing(numba):
    ...     numba.config.SLP_VECTORIZE
    1
    >>> numba.config.SLP_VECTORIZE == int(os.environ.get("NUMBA_SLP_VECTORIZE", 0))
    True
    """
    from numba.core.compiler_lock import global_compiler_lock

    with global_compiler_lock:
        saved, numba.config.SLP_VECTORIZE = numba.config.SLP_VECTORIZE, 1
        try:
            yield
        finally:
            numba.config.SLP_VECTORIZE = saved


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
