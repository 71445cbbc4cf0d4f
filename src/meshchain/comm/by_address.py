"""MPI called by address from compiled code that the disk cache can keep.

:mod:`.compiled` finds the MPI library; compiled code calling its functions through
``ctypes`` would have their addresses written into the machine code and be compiled in every
process. The functions here take the addresses as data instead
(:func:`meshchain.comm.compiled.addresses`, one int64 array: ``MPI_Startall``,
``MPI_Waitall``, ``clock_gettime``, ``MPI_Allreduce``, ``MPI_Iallreduce``, ``MPI_Wait``,
``MPI_Testall``, ``MPI_Sendrecv``), so compiled code calling them is cached on disk like
any other (a captured step's compiled replay, :mod:`meshchain.backends.numba_replay`; the Krylov iterations of
:mod:`meshchain.linalg.compiled`). Handles are C ints (MPICH's ABI; :mod:`.compiled` says
where that holds). Importing this module does not import mpi4py (which would initialise MPI
before the session chooses its thread level).

Compiled code that times itself reads one of two clocks: :func:`clock`, seconds on the clock
``time.perf_counter`` reads (``clock_gettime``, about 36 ns a reading on an x86 VM), or
:func:`ticks`, the processor's time-stamp counter (``rdtsc``, about 9 ns), where
:func:`cycle_seconds` says it counts steadily: on x86-64 Linux whose kernel keeps time by it.

Examples
--------
>>> import numpy as np
>>> from meshchain.comm.compiled import addresses
>>> functions = addresses()
>>> functions is None or abs(clock(functions, np.zeros(2, np.int64)) - __import__("time").perf_counter()) < 1.0
True
"""

from __future__ import annotations

import functools
import platform
import time

import numba
import numpy as np
from llvmlite import ir as _llvm
from numba.core import cgutils as _cgutils
from numba.core import types as _types
from numba.extending import intrinsic

from .pairwise import TAG

__all__ = ["start_all", "wait_all", "progress_all", "clock", "ticks", "cycle_seconds", "sum_all", "start_allreduce",
           "wait_one", "start_exchange", "finish_exchange", "sum_in_pairs"]


def _as_int32(context, builder, value, kind):
    return context.cast(builder, value, kind, _types.int32)


def _as_pointer(context, builder, value, kind):
    return builder.inttoptr(context.cast(builder, value, kind, _types.intp), _llvm.IntType(8).as_pointer())


@intrinsic
def _call_int_pointer(typingctx, address, number, pointer):
    """``((int (*)(int, void *)) address)(number, pointer)``."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        function_type = _llvm.FunctionType(_llvm.IntType(32), [_llvm.IntType(32), _llvm.IntType(8).as_pointer()])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        return builder.call(function, [_as_int32(context, builder, args[1], kinds[1]),
                                       _as_pointer(context, builder, args[2], kinds[2])])

    return _types.int32(address, number, pointer), codegen


@intrinsic
def _call_int_pointer_pointer(typingctx, address, number, first, second):
    """``((int (*)(int, void *, void *)) address)(number, first, second)``."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        pointer = _llvm.IntType(8).as_pointer()
        function_type = _llvm.FunctionType(_llvm.IntType(32), [_llvm.IntType(32), pointer, pointer])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        return builder.call(function, [_as_int32(context, builder, args[1], kinds[1]),
                                       _as_pointer(context, builder, args[2], kinds[2]),
                                       _as_pointer(context, builder, args[3], kinds[3])])

    return _types.int32(address, number, first, second), codegen


@intrinsic
def _call_int_pointer_pointer_pointer(typingctx, address, number, first, second, third):
    """``((int (*)(int, void *, void *, void *)) address)(number, first, second, third)``."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        pointer = _llvm.IntType(8).as_pointer()
        function_type = _llvm.FunctionType(_llvm.IntType(32), [_llvm.IntType(32), pointer, pointer, pointer])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        return builder.call(function, [_as_int32(context, builder, args[1], kinds[1]),
                                       *[_as_pointer(context, builder, value, kind)
                                         for value, kind in zip(args[2:], kinds[2:])]])

    return _types.int32(address, number, first, second, third), codegen


@intrinsic
def _call_allreduce(typingctx, address, send, receive, count, datatype, op, comm):
    """``((int (*)(void *, void *, int, int, int, int)) address)(send, receive, count, datatype,
    op, comm)``: ``MPI_Allreduce`` with handles that are C ints (MPICH's ABI)."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        pointer, i32 = _llvm.IntType(8).as_pointer(), _llvm.IntType(32)
        function_type = _llvm.FunctionType(i32, [pointer, pointer, i32, i32, i32, i32])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        return builder.call(function, [_as_pointer(context, builder, args[1], kinds[1]),
                                       _as_pointer(context, builder, args[2], kinds[2]),
                                       *[_as_int32(context, builder, value, kind)
                                         for value, kind in zip(args[3:], kinds[3:])]])

    return _types.int32(address, send, receive, count, datatype, op, comm), codegen


@intrinsic
def _call_iallreduce(typingctx, address, send, receive, count, datatype, op, comm, request):
    """``((int (*)(void *, void *, int, int, int, int, void *)) address)(...)``: ``MPI_Iallreduce``."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        pointer, i32 = _llvm.IntType(8).as_pointer(), _llvm.IntType(32)
        function_type = _llvm.FunctionType(i32, [pointer, pointer, i32, i32, i32, i32, pointer])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        return builder.call(function, [_as_pointer(context, builder, args[1], kinds[1]),
                                       _as_pointer(context, builder, args[2], kinds[2]),
                                       *[_as_int32(context, builder, value, kind)
                                         for value, kind in zip(args[3:7], kinds[3:7])],
                                       _as_pointer(context, builder, args[7], kinds[7])])

    return _types.int32(address, send, receive, count, datatype, op, comm, request), codegen


@intrinsic
def _call_pointer_pointer(typingctx, address, first, second):
    """``((int (*)(void *, void *)) address)(first, second)``: ``MPI_Wait``."""
    def codegen(context, builder, signature, args):
        kinds = signature.args
        pointer = _llvm.IntType(8).as_pointer()
        function_type = _llvm.FunctionType(_llvm.IntType(32), [pointer, pointer])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        return builder.call(function, [_as_pointer(context, builder, args[1], kinds[1]),
                                       _as_pointer(context, builder, args[2], kinds[2])])

    return _types.int32(address, first, second), codegen


_CLOCK_MONOTONIC = 1  # Linux's clockid_t of CLOCK_MONOTONIC (what time.perf_counter reads)


@numba.njit(cache=True, nogil=True)
def start_all(functions, requests):
    """``MPI_Startall`` of ``requests`` (C handles); ``functions``: the addresses. The MPI error code."""
    if len(requests) == 0:
        return 0
    return _call_int_pointer(functions[0], len(requests), requests.ctypes.data)


@numba.njit(cache=True, nogil=True)
def wait_all(functions, requests, statuses):
    """``MPI_Waitall`` of ``requests`` (statuses into ``statuses``); the MPI error code."""
    if len(requests) == 0:
        return 0
    return _call_int_pointer_pointer(functions[1], len(requests), requests.ctypes.data, statuses.ctypes.data)


@numba.njit(cache=True, nogil=True)
def clock(functions, scratch):
    """Seconds on the clock ``time.perf_counter`` reads (CLOCK_MONOTONIC); ``scratch``: two int64."""
    _call_int_pointer(functions[2], _CLOCK_MONOTONIC, scratch.ctypes.data)
    return scratch[0] + 1.0e-9 * scratch[1]


@intrinsic
def ticks(typingctx):
    """The time-stamp counter (``llvm.readcyclecounter``: ``rdtsc`` on x86-64), in compiled
    code only; its ticks are :func:`cycle_seconds` seconds each. Read it only where that is not
    None (on other processors the instruction may not be allowed)."""
    def codegen(context, builder, signature, args):
        function = _cgutils.get_or_insert_function(builder.module, _llvm.FunctionType(_llvm.IntType(64), []),
                                                   "llvm.readcyclecounter")
        return builder.call(function, [])

    return _types.int64(), codegen


@numba.njit(cache=True, nogil=True)
def read_ticks():
    """:func:`ticks`, from Python."""
    return ticks()


_STEADY_FLAGS = ("constant_tsc", "nonstop_tsc")
_CLOCKSOURCE = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
_CPUINFO = "/proc/cpuinfo"


def counter_is_steady() -> bool:
    """Whether the time-stamp counter counts wall-clock time here: an x86-64 processor whose
    counter runs at one rate in every power state (``constant_tsc``, ``nonstop_tsc``) and a
    Linux kernel that keeps its own time by it (so it agrees across cores)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open(_CLOCKSOURCE) as source:
            if source.read().strip() != "tsc":
                return False
        with open(_CPUINFO) as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return False
    return all(flag in flags for flag in _STEADY_FLAGS)


@functools.lru_cache(maxsize=None)
def cycle_seconds(spin: float = 0.005):
    """Seconds per tick of :func:`ticks`, measured once per process against
    ``time.perf_counter`` over ``spin`` seconds (busy; within 1e-4 on a VM), or None
    where :func:`counter_is_steady` is False (then time compiled code with :func:`clock`).

    >>> rate = cycle_seconds()
    >>> rate is None or 1e-11 < rate < 1e-8   # between 100 GHz and 100 MHz
    True
    """
    if not counter_is_steady():
        return None
    read_ticks()  # compiled (or loaded) before it is timed

    def pair():  # a reading of both clocks: of 5 tries the one least apart (not interrupted)
        tries = []
        for _ in range(5):
            before = time.perf_counter()
            count = read_ticks()
            after = time.perf_counter()
            tries.append((after - before, count, 0.5 * (before + after)))
        return min(tries)[1:]

    first, began = pair()
    while time.perf_counter() - began < spin:
        pass
    last, ended = pair()
    return (ended - began) / (last - first) if last > first else None


@intrinsic
def _call_sendrecv(typingctx, address, send, count, datatype, destination, tag, receive, source, comm, status):
    """``MPI_Sendrecv(send, count, datatype, destination, tag, receive, count, datatype, source,
    tag, comm, status)`` at ``address``, handles and ranks as C ints (MPICH's ABI)."""

    def codegen(context, builder, signature, args):
        kinds = signature.args
        pointer, i32 = _llvm.IntType(8).as_pointer(), _llvm.IntType(32)
        function_type = _llvm.FunctionType(i32, [pointer, i32, i32, i32, i32, pointer, i32, i32, i32, i32, i32,
                                                 pointer])
        function = builder.inttoptr(context.cast(builder, args[0], kinds[0], _types.intp), function_type.as_pointer())
        count, datatype, destination, tag, source, comm = (
            _as_int32(context, builder, args[k], kinds[k]) for k in (2, 3, 4, 5, 7, 8))
        return builder.call(function, [_as_pointer(context, builder, args[1], kinds[1]), count, datatype, destination,
                                       tag, _as_pointer(context, builder, args[6], kinds[6]), count, datatype, source,
                                       tag, comm, _as_pointer(context, builder, args[9], kinds[9])])

    return _types.int32(address, send, count, datatype, destination, tag, receive, source, comm, status), codegen


@numba.njit(cache=True, nogil=True)
def sum_all(functions, values, out, handles):
    """``out[:values.size] = sum over ranks of values`` (float64, contiguous; collective)
    with ``handles`` ``[comm, MPI_DOUBLE, MPI_SUM, rank, size, MPI_PROC_NULL]``
    (:func:`.compiled.handles`): as
    :func:`meshchain.comm.pairwise.short_sum` sums, so with its bits: by recursive doubling
    (:func:`_doubling_sum`) where MPICH's ``MPI_Allreduce`` would take two message rounds
    (reduce-scatter then allgather: at least as many values as the largest power of two of
    ranks), else by ``MPI_Allreduce`` (also with only ``[comm, datatype, op]``); the MPI error code."""
    if len(handles) > 5 and handles[4] > 1 and values.size >= _largest_power_of_two(handles[4]):
        return _doubling_sum(functions, values, out, handles)
    return _call_allreduce(functions[3], values.ctypes.data, out.ctypes.data, values.size, handles[1], handles[2],
                           handles[0])


@numba.njit(cache=True, nogil=True)
def _largest_power_of_two(size):
    top = 1
    while 2 * top <= size:
        top *= 2
    return top


@numba.njit(cache=True, nogil=True)
def _doubling_sum(functions, values, out, handles):
    """``out = values`` summed over ranks with the messages and additions of
    :func:`meshchain.comm.pairwise.pairwise_sum` (tag :data:`~meshchain.comm.pairwise.TAG`),
    each round one ``MPI_Sendrecv``; the MPI error code."""
    rank, size, nobody = handles[3], handles[4], handles[5]
    top = _largest_power_of_two(size)
    total = out[:values.size]
    total[:] = values
    other, status = np.empty_like(total), np.empty(_STATUS_BYTES, np.uint8)
    if rank >= top:  # beyond the power of two: ours into a partner, the total back from it
        error = _round(functions, total, other, handles, rank - top, nobody, status)
        return error or _round(functions, other, total, handles, nobody, rank - top, status)
    extra = rank + top < size
    error = 0
    if extra:
        error = _round(functions, total, other, handles, nobody, rank + top, status)
        total += other
    mask = 1
    while mask < top and not error:
        error = _round(functions, total, other, handles, rank ^ mask, rank ^ mask, status)
        total += other
        mask *= 2
    if extra and not error:
        error = _round(functions, total, other, handles, rank + top, nobody, status)
    return error


_STATUS_BYTES = 64  # room for one MPI_Status (MPICH's: 20 bytes)


@numba.njit(cache=True, nogil=True)
def _round(functions, send, receive, handles, destination, source, status):
    """``send`` to ``destination`` and ``receive`` from ``source`` (either may be MPI_PROC_NULL)."""
    return _call_sendrecv(functions[7], send.ctypes.data, send.size, handles[1], destination, TAG,
                          receive.ctypes.data, source, handles[0], status.ctypes.data)


@numba.njit(cache=True, nogil=True)
def progress_all(functions, requests, flag, statuses):
    """``MPI_Testall`` of ``requests`` (``flag``: one int32, set when all are complete): lets the
    library move their messages (over MPICH's TCP module they move only inside MPI calls); the
    MPI error code. A completed persistent request is inactive: a later :func:`wait_all` returns
    at once for it."""
    if len(requests) == 0:
        return 0
    return _call_int_pointer_pointer_pointer(functions[6], len(requests), requests.ctypes.data, flag.ctypes.data,
                                             statuses.ctypes.data)


@numba.njit(cache=True, nogil=True)
def sum_in_pairs(functions, values, other, requests, phases, statuses):
    """``values`` summed over the ranks in place by the phases of persistent requests of
    :class:`meshchain.comm.compiled.CompiledPairwiseSum` (``phases[k]``: the first and end
    request started and waited for together, and whether ``other`` is then added): the
    messages and additions of :func:`meshchain.comm.pairwise.pairwise_sum`, so its bits
    (collective); the MPI error code."""
    for k in range(phases.shape[0]):
        chosen = requests[phases[k, 0]:phases[k, 1]]
        error = start_all(functions, chosen)
        if error:
            return error
        error = wait_all(functions, chosen, statuses)
        if error:
            return error
        if phases[k, 2]:
            for i in range(len(values)):
                values[i] += other[i]
    return 0


@numba.njit(cache=True, nogil=True)
def start_exchange(functions, x, rows, send, requests):
    """Pack ``x[rows]`` into ``send`` and start the exchange's persistent ``requests``
    (:class:`.compiled.CompiledExchange`); the MPI error code."""
    for k in range(len(rows)):
        send[k] = x[rows[k]]
    return start_all(functions, requests)


@numba.njit(cache=True, nogil=True)
def finish_exchange(functions, x, rows, receive, requests, statuses):
    """Wait for ``requests`` and unpack ``receive`` into ``x[rows]``; the MPI error code."""
    error = wait_all(functions, requests, statuses)
    for k in range(len(rows)):
        x[rows[k]] = receive[k]
    return error


@numba.njit(cache=True, nogil=True)
def start_allreduce(functions, values, out, handles, request):
    """``MPI_Iallreduce``: start ``out = values reduced over ranks`` (contiguous; collective)
    with ``handles`` ``[comm, datatype, op]`` (:func:`.compiled.handles`: float64 and
    ``MPI_SUM``), its request into ``request`` (one C int) for :func:`wait_one`; the MPI error code."""
    return _call_iallreduce(functions[4], values.ctypes.data, out.ctypes.data, values.size, handles[1], handles[2],
                            handles[0], request.ctypes.data)


@numba.njit(cache=True, nogil=True)
def wait_one(functions, request, status):
    """``MPI_Wait`` for ``request`` (one C int; ``status``: room for an ``MPI_Status``); the MPI error code."""
    return _call_pointer_pointer(functions[5], request.ctypes.data, status.ctypes.data)
