"""Progress of halo exchanges while a rank computes: ``"none"``, ``"poll"`` or ``"thread"``.

MPICH's shared-memory and TCP channels move a message only while the rank calls MPI: a
halo exchange begun before a computation (:meth:`~meshchain.comm.exchange.HaloExchange.begin`)
sends its first bytes there, but a large (rendezvous) message travels inside the
:meth:`~meshchain.comm.exchange.HaloExchange.end` that follows it. A *progress mode*
picks who calls MPI meanwhile:

``"none"``
    nobody: the messages move in ``begin`` and ``end``;
``"poll"``
    a :class:`Poller`: one communication thread per process keeps testing the exchanges in
    flight while the main thread runs compiled code that releases the GIL (and makes no
    MPI call); needs MPI at ``MPI_THREAD_SERIALIZED`` or above (mpi4py asks for
    ``MPI_THREAD_MULTIPLE`` by default);
``"thread"``
    MPICH's own asynchronous progress thread. MPICH starts it only when
    ``MPIR_CVAR_ASYNC_PROGRESS=1`` is in the environment when MPI initialises (it then
    runs at ``MPI_THREAD_MULTIPLE``): launch with ``MESHCHAIN_PROGRESS=thread`` (see
    :mod:`.world`) or with that variable set. MPICH's thread polls all the time, so it
    takes a core from each rank.

:func:`check_progress` says whether a mode can work here and why not;
:func:`measure_progress` times one exchange around a computation in each mode.

Whether asynchronous progress is on is read through MPI's tool interface (``MPI_T``:
the value of ``MPIR_CVAR_ASYNC_PROGRESS`` that MPICH read at ``MPI_Init``), else from what
the environment said when :func:`meshchain.comm.world.world_communicator` initialised
MPI, else from the environment now. MPICH asks that the variable be the same on every
rank, so every rank gets the same answer.

Examples
--------
>>> check_progress("poll")                      # one process: every known mode
'poll'
>>> check_progress("busy")
Traceback (most recent call last):
...
meshchain.core.errors.ConfigurationError: unknown progress mode 'busy': choose one of 'none', 'poll', 'thread'
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from ..core.cache import memo
from ..core.errors import ConfigurationError, MeshchainError
from .agree import agree_on_failure, raise_together
from .exchange import HaloExchange, HaloItem
from .transports import intracomm
from .world import async_progress_at_init, async_progress_requested

__all__ = ["PROGRESS_MODES", "check_progress", "async_progress_enabled", "Poller", "TURNING_PAUSE", "owed_progress",
           "measure_progress"]

PROGRESS_MODES = ("none", "poll", "thread")
"""The progress modes (see the module docstring)."""

_LAUNCH_HINT = ("set MESHCHAIN_PROGRESS=thread or MPIR_CVAR_ASYNC_PROGRESS=1 in the environment before "
                "launching (e.g. MESHCHAIN_PROGRESS=thread mpiexec -n 4 python run.py)")
_cvar_cache = memo("MPI control variables")  # fixed once MPI is initialised


# --- which modes work here -----------------------------------------------------------------------------


def check_progress(mode, comm=None) -> str:
    """``mode`` when it is a progress mode that works here, else a
    :class:`~meshchain.core.errors.ConfigurationError` that says why.

    Parameters
    ----------
    mode : str
        One of :data:`PROGRESS_MODES`.
    comm : mpi4py communicator, optional
        The communicator the exchanges run on; None (one process) accepts every known mode.

    Examples
    --------
    >>> [check_progress(mode) for mode in PROGRESS_MODES]
    ['none', 'poll', 'thread']
    """
    if not isinstance(mode, str) or mode not in PROGRESS_MODES:
        raise ConfigurationError(f"unknown progress mode {mode!r}: choose one of "
                                 + ", ".join(repr(m) for m in PROGRESS_MODES))
    if comm is None or mode == "none":
        return mode
    from mpi4py import MPI

    level = MPI.Query_thread()
    if mode == "poll" and level < MPI.THREAD_SERIALIZED:
        raise ConfigurationError(
            f"progress mode 'poll' tests messages from a second thread, which needs MPI at MPI_THREAD_SERIALIZED or "
            f"above, but MPI runs at {_level_name(level)}: leave mpi4py.rc.thread_level at 'multiple' (the default) "
            "or 'serialized', or use progress mode 'none'")
    if mode == "thread" and level != MPI.THREAD_MULTIPLE:
        raise ConfigurationError(
            f"progress mode 'thread' needs MPI at MPI_THREAD_MULTIPLE, but MPI runs at {_level_name(level)}: "
            + _LAUNCH_HINT)
    if mode == "thread" and not async_progress_enabled():
        raise ConfigurationError("progress mode 'thread' needs MPICH's asynchronous progress thread, which was not "
                                 "switched on when MPI started: " + _LAUNCH_HINT + "; or use progress mode 'poll'")
    return mode


def _level_name(level: int) -> str:
    names = ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE")
    return names[level] if 0 <= level < len(names) else f"thread level {level}"


def async_progress_enabled() -> bool:
    """Whether MPICH's asynchronous progress was switched on when MPI started.

    Read through ``MPI_T`` where MPI is initialised and its library can be found (the value
    MPICH read at ``MPI_Init``; a library without the variable has no such thread), else
    what the environment said when meshchain initialised MPI, else the environment now.
    """
    value = _async_cvar()
    if value is None:
        value = async_progress_at_init()
    if value is None:
        value = async_progress_requested()
    return bool(value)


def _async_cvar() -> int | None:
    """``MPIR_CVAR_ASYNC_PROGRESS`` through ``MPI_T`` (once per process: it cannot change
    after ``MPI_Init``); None before MPI is initialised (never initialising it) or when it
    cannot be read."""
    if "async" not in _cvar_cache:
        if "mpi4py.MPI" not in sys.modules:
            return None
        from mpi4py import MPI

        if not MPI.Is_initialized() or MPI.Is_finalized():
            return None
        _cvar_cache["async"] = _read_cvar("MPIR_CVAR_ASYNC_PROGRESS")
    return _cvar_cache["async"]


def _libmpi_path() -> str | None:
    """The file of the MPI library loaded in this process (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(("libmpi.so", "libmpi_abi.so")):
                    return fields[5].strip()
    except OSError:
        return None
    return None


def _read_cvar(name: str) -> int | None:
    """The value of the integer (or boolean) MPI control variable ``name``, read through the
    MPI tool interface with ctypes; 0 when the library has no such variable, None when the
    interface cannot be used here."""
    import ctypes

    path = _libmpi_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        provided, index, count, handle = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        value = (ctypes.c_int * 4)()  # room for any integer type; booleans are MPI_INT
        if lib.MPI_T_init_thread(ctypes.c_int(0), ctypes.byref(provided)):
            return None
    except (OSError, AttributeError):
        return None
    try:
        if lib.MPI_T_cvar_get_index(ctypes.c_char_p(name.encode()), ctypes.byref(index)):
            return 0
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) or count.value != 1:
            return None
        try:
            return None if lib.MPI_T_cvar_read(handle, value) else int(value[0])
        finally:
            lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
    finally:
        lib.MPI_T_finalize()


# --- the communication thread of mode "poll" ----------------------------------------------------------


TURNING_PAUSE = 1e-3
"""Seconds between two progress calls of a :class:`Poller` whose exchanges are complete (the
first comes at once): each call wakes the thread, which slows a computation that holds the
GIL between kernels, so it is long against the poller's ``interval``."""


def owed_progress(exchanges):
    """One callable that makes the progress calls of those ``exchanges`` that
    :attr:`~meshchain.comm.exchange.HaloExchange.owes_progress` once their runs are complete,
    or None when none does: a :class:`Poller` calls it after completion, and so does the
    thread that drives the messages of an ``interior="dynamic"`` computation."""
    owing = tuple(exchange.progress for exchange in exchanges if exchange.owes_progress)
    if not owing:
        return None

    def turn() -> None:
        for progress in owing:
            progress()

    return turn


class Poller:
    """A communication thread that keeps testing halo exchanges in flight.

    Between :meth:`watch` and :meth:`release`, the thread calls
    :meth:`~meshchain.comm.exchange.HaloExchange.test` (or
    :meth:`~meshchain.comm.exchange.HaloExchange.test_reverse`, for a reverse run) on the
    exchanges still in flight, every ``interval`` seconds, until all are complete. Then,
    until :meth:`release`, it calls :meth:`~meshchain.comm.exchange.HaloExchange.progress`
    at once and then every :data:`TURNING_PAUSE` (or ``interval``, if longer) on those that
    :attr:`~meshchain.comm.exchange.HaloExchange.owes_progress`: MPI promises only weak
    progress, and a rank whose own run is complete can still hold its neighbours' (with
    MPICH, the ``"rma"`` transport's completion notices leave an origin only when it calls
    MPI). The calling thread must make no MPI call between the two (it computes, releasing
    the GIL); after :meth:`release` the poller makes none until the next :meth:`watch`. One
    thread per poller, daemon, made at the first :meth:`watch` that has something to watch.

    Parameters
    ----------
    interval : float
        Seconds between two rounds of tests (default 20 µs).

    Examples
    --------
    >>> import time
    >>> from mpi4py import MPI
    >>> values = np.array([[5.0], [0.0]])            # row 0 goes to row 1, on this rank
    >>> exchange = HaloExchange(MPI.COMM_SELF, [HaloItem(values, {0: [0]}, {0: [1]})], tag=1)
    >>> with Poller() as poller:
    ...     exchange.begin(); poller.watch([exchange]); time.sleep(0.2)  # compute here
    ...     done = poller.release()
    >>> done is not None and done < time.perf_counter()   # seen complete during the "computation"
    True
    >>> exchange.end(); exchange.close(); values[:, 0].tolist()
    [5.0, 5.0]
    """

    def __init__(self, *, interval: float = 2e-5):
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < float("inf"):
            raise ConfigurationError(f"Poller interval must be a number of seconds >= 0, not {interval!r}")
        self.interval = float(interval)
        self._thread = None
        self._wake, self._stop, self._out = threading.Event(), threading.Event(), threading.Event()
        self._out.set()
        self._work: tuple = ()
        self._turn = None  # owed_progress() of the watched exchanges
        self._turning = threading.Lock()  # held around each round of progress calls
        self._round = 0  # counts releases: a thread turning for an earlier round stops
        self._watching = self._closed = False
        self._done_at = self._error = None

    def watch(self, exchanges) -> None:
        """Start testing the runs of ``exchanges`` (already begun: forward, or reverse) from
        the thread; with nothing to watch (or only idle exchanges) the thread is not woken."""
        if self._closed:
            raise MeshchainError("this Poller is closed; make a new one")
        if self._watching:
            raise MeshchainError("this Poller already watches exchanges: release() them first")
        busy = [exchange for exchange in exchanges if not exchange.idle]
        work = tuple(exchange.test_reverse if exchange.running == "reverse" else exchange.test for exchange in busy)
        self._watching, self._work, self._turn = True, work, owed_progress(busy)
        self._done_at = None if work else time.perf_counter()
        if work:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="meshchain-poller", daemon=True)
                self._thread.start()
            self._stop.clear()
            self._out.clear()
            self._wake.set()

    def release(self) -> float | None:
        """Stop testing and return once the thread is out of MPI: the
        :func:`time.perf_counter` at which every watched exchange was seen complete (the
        time of :meth:`watch` when there was nothing to watch), None when they were not all
        complete yet (or nothing is watched). An error the thread met is raised here."""
        if not self._watching:
            return None
        self._watching = False
        if self._work:
            self._stop.set()
            try:
                self._out.wait()  # the thread is done testing
            finally:  # even if interrupted: no turning for these exchanges any more
                with self._turning:  # the thread is not in a progress call, nor will it make another
                    self._round += 1
                self._work, self._turn = (), None
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self._done_at

    def close(self) -> None:
        """Release what is watched and end the thread; closing twice does nothing."""
        if self._closed:
            return
        try:
            self.release()
        finally:
            self._closed = True
            if self._thread is not None:
                self._wake.set()
                self._thread.join()
                self._thread = None

    def __enter__(self) -> Poller:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            round_, turn, complete = self._round, self._turn, False
            try:
                complete = self._poll(self._work)
            except BaseException as error:  # noqa: BLE001 - handed to release()
                self._error = error
            finally:
                self._out.set()
            if complete and turn is not None:
                self._keep_turning(turn, round_)

    def _poll(self, pending) -> bool:
        """Test until every run is complete (True) or :meth:`release` stops it (False)."""
        while not self._stop.is_set():
            pending = [test for test in pending if not test()]
            if not pending:
                self._done_at = time.perf_counter()
                return True
            self._stop.wait(self.interval)
        return False

    def _keep_turning(self, turn, round_: int) -> None:
        """Call ``turn`` until :meth:`release` ends ``round_``; release never waits for a pause
        here (only for a round of calls in progress), and a new watch ends the pause at once."""
        pause = max(self.interval, TURNING_PAUSE)
        while True:
            with self._turning:
                if self._round != round_ or self._closed:
                    return
                try:
                    turn()
                except BaseException as error:  # noqa: BLE001 - handed to release()
                    self._error = error
                    return
            self._wake.wait(pause)


# --- timing the modes ----------------------------------------------------------------------------------


def measure_progress(comm, compute, *, nbytes: int = 65536, repeats: int = 7, modes=None) -> dict:
    """Median seconds of ``begin(); compute(); end()`` of a halo exchange in each progress mode.

    Collective over ``comm``. The exchange swaps ``nbytes`` with each ring neighbour
    (ranks ``rank - 1`` and ``rank + 1``, persistent requests, on a duplicate of ``comm``);
    ``compute`` is any callable that releases the GIL and makes no MPI call (a compiled
    kernel). ``"poll"`` runs a :class:`Poller` around ``compute``; ``"none"`` and
    ``"thread"`` run the same code (``"thread"`` differs in how MPI was started).

    Parameters
    ----------
    comm : mpi4py communicator or None
    compute : callable
    nbytes : int
        Bytes sent to each neighbour.
    repeats : int
        Timed runs per mode (after one untimed run per mode), interleaved between modes.
    modes : sequence of str, optional
        Default: ``"none"``, ``"poll"`` where every rank accepts it, and ``"thread"`` where
        :func:`check_progress` accepts it on every rank; modes given are checked, and one
        refused on any rank raises :class:`~meshchain.core.errors.ConfigurationError` on every rank.

    Returns
    -------
    dict
        ``{mode: seconds}``, rank 0's medians, the same on every rank; empty on one process.

    Examples
    --------
    >>> import time
    >>> measure_progress(None, lambda: time.sleep(1e-3))
    {}
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ConfigurationError(f"measure_progress: nbytes must be a positive int, not {nbytes!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigurationError(f"measure_progress: repeats must be a positive int, not {repeats!r}")
    if comm is None or comm.size == 1:
        return {}
    chosen = _agreed_modes(comm, modes)
    ring = intracomm(comm).Dup()
    try:
        times = _time_modes(ring, compute, chosen, nbytes, repeats)
    finally:
        ring.Free()
    medians = {mode: float(np.median(seconds)) for mode, seconds in times.items()}
    return comm.bcast(medians if comm.rank == 0 else None, root=0)


def _agreed_modes(comm, modes) -> tuple[str, ...]:
    """The modes to time: those given (every rank checks them, and all raise if one refuses),
    or every mode that every rank accepts."""
    if modes is not None:
        error = None
        try:
            chosen = tuple(check_progress(mode, comm) for mode in modes)
        except ConfigurationError as refused:
            error = refused
        raise_together(comm, error)
        return chosen
    accepted = []
    for mode in PROGRESS_MODES:
        try:
            accepted.append(check_progress(mode, comm))
        except ConfigurationError:
            pass
    everywhere = comm.allgather(accepted)
    return tuple(mode for mode in PROGRESS_MODES if all(mode in found for found in everywhere))


def _ring_exchange(comm, nbytes: int) -> HaloExchange:
    """An exchange sending ``nbytes`` (rounded up to 8) to each of ranks ``rank ± 1``."""
    rank, size = comm.rank, comm.size
    neighbours = sorted({(rank - 1) % size, (rank + 1) % size})
    rows = -(-nbytes // 8)
    halo = len(neighbours) * rows
    values = np.zeros((2 * halo, 1))
    exports = {n: np.arange(i * rows, (i + 1) * rows) for i, n in enumerate(neighbours)}
    imports = {n: halo + np.arange(i * rows, (i + 1) * rows) for i, n in enumerate(neighbours)}
    return HaloExchange(comm, [HaloItem(values, exports, imports)], tag=0, transport="persistent")


def _time_modes(comm, compute, modes, nbytes: int, repeats: int) -> dict:
    """Seconds of each timed run of each mode (round 0 is not timed)."""
    exchange, poller, times = _ring_exchange(comm, nbytes), Poller(), {mode: [] for mode in modes}
    try:
        for round_number in range(repeats + 1):
            for mode in modes:
                comm.Barrier()
                seconds, error = None, None
                try:
                    seconds = _timed_run(exchange, compute, poller if mode == "poll" else None)
                except Exception as failed:  # noqa: BLE001 - every rank raises it, below
                    error = failed
                agree_on_failure(comm, error)
                if round_number:
                    times[mode].append(seconds)
    finally:
        poller.close()
        exchange.close()
    return times


def _timed_run(exchange: HaloExchange, compute, poller: Poller | None) -> float:
    """Seconds of ``begin(); compute(); end()`` (with ``poller`` watching around ``compute``)."""
    start = time.perf_counter()
    exchange.begin()
    try:
        if poller is not None:
            poller.watch((exchange,))
        try:
            compute()
        finally:
            if poller is not None:
                poller.release()
    finally:
        exchange.end()
    return time.perf_counter() - start
