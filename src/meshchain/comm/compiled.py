"""MPI called from compiled code: sums over ranks and halo exchanges inside a Numba loop.

A loop that runs many iterations inside one compiled call on several ranks (the Krylov
methods' iterations, :mod:`meshchain.linalg.compiled`) cannot return to Python for each
exchange and reduction. This module gives it the MPI library's own functions, which
compiled code calls by address (:func:`addresses`, :mod:`.by_address`: the addresses are
data, so the compiled code is cached on disk like any other), and the objects they work on:

* :func:`handles` -- a communicator, ``MPI_DOUBLE`` and ``MPI_SUM`` as the C handles
  ``MPI_Allreduce`` takes, and the rank, size and ``MPI_PROC_NULL`` for the rounds of
  recursive doubling that replace it where it would take two (:func:`.by_address.sum_all`);
* :class:`CompiledExchange` -- a halo exchange of one float64 vector with persistent
  requests made once (``Send_init``/``Recv_init``, by mpi4py), run by
  :func:`.by_address.start_exchange` (pack the exported values, ``MPI_Startall``) and
  :func:`.by_address.finish_exchange` (``MPI_Waitall``, unpack the imported values) with the
  owned work between the two (``MPI_Testall`` may be called during that work,
  :func:`.by_address.progress_all`: over a network module that moves messages only inside
  MPI calls, MPICH over TCP, the messages then travel while the rank computes instead of
  when it waits);
* :class:`CompiledPairwiseSum` -- a short sum over ranks by recursive doubling with persistent
  requests (:func:`meshchain.comm.pairwise.pairwise_sum`'s messages and bits).

The same MPI calls as mpi4py's on the same buffers, and the same messages and additions as
:func:`meshchain.comm.pairwise.short_sum`'s: the results are the same bits.

:func:`available` says whether this works with the MPI library loaded (an ABI whose handles
are C ints, as MPICH's, and the library found among the process's mapped files); callers run
their Python loop otherwise.

Examples
--------
>>> import numpy as np
>>> from mpi4py import MPI
>>> from meshchain.comm.by_address import sum_all
>>> from meshchain.comm.compiled import addresses, available, handles
>>> out = np.zeros(2)
>>> available() and sum_all(addresses(), np.array([1.0, 2.0]), out, handles(MPI.COMM_SELF)) == 0
True
>>> out.tolist()
[1.0, 2.0]
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from mpi4py import MPI

from . import pairwise

__all__ = ["available", "handles", "CompiledExchange", "CompiledReduction", "addresses", "CompiledPairwiseSum",
           "abort_on_error"]


@functools.lru_cache(maxsize=None)
def _library():
    """The MPI library mpi4py loaded (a ctypes handle), or None."""
    if any(MPI._sizeof(kind) != ctypes.sizeof(ctypes.c_int) for kind in (MPI.Comm, MPI.Request, MPI.Datatype, MPI.Op)):
        return None  # handles are pointers (Open MPI's ABI): not supported here
    try:  # through mpi4py's extension: its own libmpi, not another copy mapped in the process
        library = ctypes.CDLL(MPI.__file__)  # (a petsc4py built against another MPICH: uninitialised)
        library.MPI_Allreduce  # noqa: B018 - reachable from it
    except (OSError, AttributeError):
        return None
    return library


def available() -> bool:
    """Whether compiled code can call MPI here (see the module docstring)."""
    return _library() is not None


def handles(comm) -> np.ndarray:
    """``[comm, MPI_DOUBLE, MPI_SUM, rank, size, MPI_PROC_NULL]`` as the C ints
    :func:`.by_address.sum_all` takes (the rank and size: its rounds of recursive doubling)."""
    return _as_c_ints([MPI._handleof(comm), MPI._handleof(MPI.DOUBLE), MPI._handleof(MPI.SUM), comm.rank, comm.size,
                       MPI.PROC_NULL]).astype(np.int64)


def _as_c_ints(values) -> np.ndarray:
    """Handles (mpi4py gives them as unsigned numbers) as the C ints they are."""
    return np.array([value & 0xFFFFFFFF for value in values], dtype=np.uint32).view(np.int32)


class CompiledExchange:
    """A halo exchange of one float64 vector ``x`` (``dim`` values per row) run from compiled
    code: per neighbour the rows sent (``exports``) and received (``imports``), in wire order.

    The arguments of :func:`.by_address.start_exchange` and :func:`.by_address.finish_exchange` are attributes:
    ``send_at``/``send`` (flat positions in ``x`` and the send buffer), ``receive_at``/
    ``receive``, ``requests`` (the persistent requests' C handles) and ``statuses``;
    :func:`meshchain.comm.by_address.progress_all` takes ``requests``, ``flag`` and ``statuses``.
    :meth:`close` frees the requests.
    """

    def __init__(self, comm, exports: dict, imports: dict, dim: int, *, tag: int):
        def flat(rows):
            rows = np.asarray(rows, dtype=np.int64)
            return (rows[:, None] * dim + np.arange(dim)).reshape(-1)

        sends = [(n, flat(exports[n])) for n in sorted(exports)]
        receives = [(n, flat(imports[n])) for n in sorted(imports)]
        self.send_at = np.concatenate([at for _, at in sends]) if sends else np.zeros(0, dtype=np.int64)
        self.receive_at = np.concatenate([at for _, at in receives]) if receives else np.zeros(0, dtype=np.int64)
        self.send, self.receive = np.zeros(len(self.send_at)), np.zeros(len(self.receive_at))
        self.flag = np.zeros(1, dtype=np.int32)  # progress_all's: all complete
        self._requests, begin = [], 0
        for n, at in sends:
            self._requests.append(comm.Send_init(self.send[begin:begin + len(at)], dest=n, tag=tag))
            begin += len(at)
        begin = 0
        for n, at in receives:
            self._requests.append(comm.Recv_init(self.receive[begin:begin + len(at)], source=n, tag=tag))
            begin += len(at)
        self.requests = _as_c_ints([MPI._handleof(r) for r in self._requests])
        self.statuses = np.zeros(max(1, len(self._requests)) * MPI._sizeof(MPI.Status), dtype=np.uint8)

    def close(self) -> None:
        for request in self._requests:
            request.Free()
        self._requests, self.requests = [], np.zeros(0, dtype=np.int32)


def abort_on_error(comm, what: str, code: int, error=None) -> None:
    """MPI error ``code`` (nonzero) returned by compiled code on this rank, while doing
    ``what``: the other ranks may wait for this one in a collective, so every rank is aborted
    (:func:`meshchain.comm.agree.abort_all`) with ``error`` (the exception class, by default
    :class:`~meshchain.core.errors.MeshchainError`) saying so."""
    from ..core.errors import MeshchainError
    from .agree import abort_all

    abort_all(comm, what, (error or MeshchainError)(f"MPI error {code}: {MPI.Get_error_string(code)}"))


# --- a short sum by recursive doubling, from compiled code ----------------------------------------


class CompiledPairwiseSum:
    """:func:`meshchain.comm.pairwise.pairwise_sum` of one buffer, ``values`` (contiguous
    float64, summed in place; kept as ``values``), run from compiled code by
    :func:`meshchain.comm.by_address.sum_in_pairs`: the same
    messages (tag :data:`~meshchain.comm.pairwise.TAG`, partners and rounds) as persistent
    requests made once, the same additions, so the same bits. The arguments of
    ``sum_in_pairs`` after ``values`` are attributes: ``other`` (what a partner sends),
    ``requests`` (C handles), ``phases`` (per phase of requests started and waited for
    together: its first and end request and whether ``other`` is then added) and
    ``statuses``. :meth:`close` frees the requests.

    >>> import numpy as np
    >>> values = np.array([1.0, 2.0])
    >>> pairs = CompiledPairwiseSum(MPI.COMM_SELF, values)
    >>> from meshchain.comm.by_address import sum_in_pairs
    >>> functions = addresses()
    >>> functions is None or sum_in_pairs(functions, values, pairs.other, pairs.requests, pairs.phases,
    ...                                   pairs.statuses) == 0
    True
    >>> values.tolist(), pairs.phases.shape
    ([1.0, 2.0], (0, 3))
    >>> pairs.close()
    """

    def __init__(self, comm, values: np.ndarray):
        self.values, self.other = values, np.empty_like(values)
        buffers = {"values": values, "other": self.other}

        def persistent(kind, partner, buffer):
            if kind == "send":
                return comm.Send_init(buffers[buffer], dest=partner, tag=pairwise.TAG)
            return comm.Recv_init(buffers[buffer], source=partner, tag=pairwise.TAG)

        phases = [([persistent(*message) for message in messages], add)
                  for messages, add in pairwise.phases(comm.rank, comm.size)]
        self._requests = [request for requests, _ in phases for request in requests]
        self.requests = _as_c_ints([MPI._handleof(r) for r in self._requests])
        bounds, begin = [], 0
        for requests, add in phases:
            bounds.append((begin, begin + len(requests), int(add)))
            begin += len(requests)
        self.phases = np.array(bounds, dtype=np.int64).reshape(-1, 3)
        self.statuses = np.zeros(2 * MPI._sizeof(MPI.Status), dtype=np.uint8)

    def close(self) -> None:
        for request in self._requests:
            request.Free()
        self._requests, self.requests = [], np.zeros(0, dtype=np.int32)
        self.phases = np.zeros((0, 3), dtype=np.int64)


# --- a reduction over ranks started in compiled code ----------------------------------------------


class CompiledReduction:
    """What compiled code needs to start ``MPI_Iallreduce`` of ``values`` with ``op`` over
    ``comm`` (:func:`.by_address.start_allreduce`) and wait for it (:func:`.by_address.wait_one`):
    ``handles`` (``[comm, datatype, op]``, C ints), ``request`` (one C int) and ``status``;
    :meth:`request_object` hands the request it started to mpi4py (to be waited for in Python).

    >>> import numpy as np
    >>> reduction = CompiledReduction(MPI.COMM_SELF, np.zeros(2), MPI.MAX)
    >>> reduction.handles.dtype, reduction.request.shape
    (dtype('int32'), (1,))
    """

    __slots__ = ("handles", "request", "status")

    def __init__(self, comm, values: np.ndarray, op):
        datatype = MPI._typedict[values.dtype.char]  # the datatype mpi4py gives the same array
        self.handles = _as_c_ints([MPI._handleof(comm), MPI._handleof(datatype), MPI._handleof(op)])
        self.request = _as_c_ints([MPI._handleof(MPI.REQUEST_NULL)])
        self.status = np.zeros(MPI._sizeof(MPI.Status), dtype=np.uint8)

    def request_object(self):
        """The request compiled code started last, as an mpi4py ``Request``."""
        return MPI.Request.fromhandle(int(self.request.view(np.uint32)[0]))


# --- the addresses of the calls by address (:mod:`.by_address`) -----------------------------------


@functools.lru_cache(maxsize=None)
def addresses() -> np.ndarray:
    """``[MPI_Startall, MPI_Waitall, clock_gettime, MPI_Allreduce, MPI_Iallreduce, MPI_Wait,
    MPI_Testall, MPI_Sendrecv]``'s addresses in this process (int64), for the calls by address of
    :mod:`.by_address` (``start_all``, ``wait_all``, ``clock``, ``sum_all``, ``start_allreduce``,
    ``wait_one``, ``progress_all``, ``sum_all`` again); None where
    :func:`available` is False or the C library has no ``clock_gettime``."""
    library = _library()
    if library is None:
        return None
    try:
        clock_gettime = ctypes.CDLL(None).clock_gettime
    except (OSError, AttributeError):
        return None
    functions = (library.MPI_Startall, library.MPI_Waitall, clock_gettime, library.MPI_Allreduce,
                 library.MPI_Iallreduce, library.MPI_Wait, library.MPI_Testall, library.MPI_Sendrecv)
    found = np.array([ctypes.cast(function, ctypes.c_void_p).value for function in functions], dtype=np.int64)
    found.flags.writeable = False
    return found
