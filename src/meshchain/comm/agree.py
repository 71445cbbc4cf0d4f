"""How ranks agree: on errors, on values that must be equal, on which objects are alive.

This is the one way meshchain's ranks agree on an error. :func:`raise_together` is
called where an error may be found on some ranks only (a declaration's data, a loop's
check, a kernel failing on some elements); every rank then raises the same exception:
the one of the lowest rank that failed, with its type and message (other ranks add
``(reported by rank r)``; a rank that failed differently chains its own exception as the
cause). A rank whose own error is that one re-raises its own exception object,
traceback and cause included.
:func:`agree_on_failure` is the cheap form for the end of every execution on several
ranks: one small ``Allreduce`` when nothing failed.

Examples
--------
>>> from meshchain.comm.agree import raise_together
>>> raise_together(None, None)   # one process, nothing failed
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from ..core import activity
from ..core.errors import DataShapeError, MeshchainError

__all__ = ["raise_together", "agree_on_failure", "check_agreement", "values_if_different", "alive_everywhere",
           "same_everywhere", "abort_all"]


def raise_together(comm, error: BaseException | None) -> None:
    """Raise on every rank if ``error`` is not None on some rank (collective over ``comm``):
    one small ``Allreduce`` when no rank failed, the reports gathered only when one did."""
    agree_on_failure(comm, error)


def _raise_reported(comm, error: BaseException | None) -> None:
    with activity.waiting("collective raise_together (allgather of the errors)"):
        reports = comm.allgather(None if error is None else (type(error), str(error)))
    _raise_first(comm, reports, error)


def agree_on_failure(comm, error: BaseException | None, flag: np.ndarray | None = None) -> None:
    """:func:`raise_together` that costs one small ``Allreduce`` when no rank failed.

    ``flag`` (a preallocated int32 array of 2 elements) spares an allocation per call.
    """
    if comm is None or comm.size == 1:
        if error is not None:
            raise error
        return
    from mpi4py import MPI

    flag = np.zeros(2, dtype=np.int32) if flag is None else flag
    flag[0] = 0 if error is None else 1
    if activity.watched:
        with activity.Wait("collective agree_on_failure (Allreduce)"):
            comm.Allreduce(MPI.IN_PLACE, flag[:1], op=MPI.MAX)
    else:
        comm.Allreduce(MPI.IN_PLACE, flag[:1], op=MPI.MAX)
    if flag[0]:
        _raise_reported(comm, error)


def _raise_first(comm, reports, error) -> None:
    for rank, found in enumerate(reports):
        if found is None:
            continue
        kind, text = found
        if rank == comm.rank or (error is not None and type(error) is kind and str(error) == text):
            raise error  # its own (or the same) error: traceback and cause included
        try:
            agreed = kind(f"{text} (reported by rank {rank})")
        except Exception:  # noqa: BLE001 - an exception type that takes no message
            agreed = MeshchainError(f"{kind.__name__}: {text} (reported by rank {rank})")
        if error is not None:
            raise agreed from error
        raise agreed


def check_agreement(comm, value, what: str) -> None:
    """Raise on every rank unless ``value`` (hashable, small) is the same on every rank."""
    with activity.waiting(f"collective check_agreement of {what}"):
        values = comm.allgather(value)
    error = None
    if any(v != values[0] for v in values):
        error = DataShapeError(f"{what} differs between ranks: {values}; every rank must pass the same value.")
    raise_together(None, error)  # every rank found the same difference


def values_if_different(comm, value, error: BaseException | None) -> list | None:
    """None when every rank passed an equal ``value`` (small, with a deterministic ``repr``),
    else every rank's ``value``; raises on every rank, as :func:`raise_together`, when some
    rank's ``error`` is not None. Costs one ``Allreduce`` of three integers when the values
    agree (compared by a 63-bit hash of their ``repr``); only a difference gathers them.

    >>> values_if_different(None, ("a", 1), None) is None
    True
    """
    if comm is None or comm.size == 1:
        if error is not None:
            raise error
        return None
    from mpi4py import MPI

    digest = int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little") >> 1
    found = np.array([error is not None, digest, -digest], dtype=np.int64)
    with activity.waiting("collective values_if_different"):
        comm.Allreduce(MPI.IN_PLACE, found, op=MPI.MAX)
    if found[0]:
        _raise_reported(comm, error)
    if found[1] == -found[2]:
        return None
    with activity.waiting("collective values_if_different"):
        return comm.allgather(value)


def alive_everywhere(comm, objects) -> list:
    """The entries of ``objects`` that are not None on every rank (collective): garbage
    collection frees unreferenced objects at different times on different ranks, and
    collective steps must see the same list everywhere."""
    from mpi4py import MPI

    alive = np.array([o is not None for o in objects], dtype=np.uint8)
    everywhere = np.empty_like(alive)
    with activity.waiting("collective alive_everywhere"):
        comm.Allreduce(alive, everywhere, op=MPI.MIN)
    return [o for o, keep in zip(objects, everywhere) if keep]


def same_everywhere(comm, values) -> np.ndarray:
    """Per entry of ``values`` (ints, or None: that rank does not take part for the entry),
    whether every rank passed the same int (collective: one ``Allreduce``).

    >>> from mpi4py import MPI
    >>> same_everywhere(MPI.COMM_SELF, [3, None]).tolist()
    [True, True]
    """
    from mpi4py import MPI

    lo = -(1 << 62)
    v = np.array([lo if x is None else x for x in values] + [lo if x is None else -x for x in values], dtype=np.int64)
    with activity.waiting("collective same_everywhere"):
        comm.Allreduce(MPI.IN_PLACE, v, op=MPI.MAX)
    k = len(values)
    return (v[:k] == -v[k:]) | (v[:k] == lo)


#: Environment variable naming a directory where a rank that aborts the job also writes its
#: report, as ``rank<r>.failure.txt`` (``r``: its rank in ``COMM_WORLD``): ``mpiexec`` drops
#: output still in flight when a job is aborted. meshchain's MPI test harness sets it.
ABORT_REPORTS_VARIABLE = "MESHCHAIN_ABORT_REPORTS"
#: Seconds an aborting rank waits after printing its report, so that ``mpiexec`` forwards it.
ABORT_GRACE_SECONDS = 0.5


def abort_all(comm, what: str, exc: BaseException) -> None:
    """Print ``exc`` with this rank's number and abort every rank of ``comm``: for failures the
    ranks cannot agree on (the others would wait in a collective or for a message forever).

    The report also goes to ``$MESHCHAIN_ABORT_REPORTS/rank<r>.failure.txt`` when that
    variable names a directory, and the rank waits :data:`ABORT_GRACE_SECONDS` before
    aborting, so that the report is not lost with the job."""
    try:
        report = (f"meshchain: rank {comm.rank}: {what} failed; aborting all ranks.\n"
                  + "".join(traceback.format_exception(exc)))
        sys.stderr.write(report)
        sys.stderr.flush()
        _keep_report(report)
        time.sleep(ABORT_GRACE_SECONDS)
    finally:
        comm.Abort(1)
        os._exit(1)  # MPICH's MPI_Abort may return before the job is torn down: never go on


def _keep_report(report: str) -> None:
    """Write ``report`` under ``$MESHCHAIN_ABORT_REPORTS``, if set (best effort: the job is ending)."""
    directory = os.environ.get(ABORT_REPORTS_VARIABLE)
    if not directory:
        return
    from mpi4py import MPI

    with contextlib.suppress(OSError):
        (Path(directory) / f"rank{MPI.COMM_WORLD.rank}.failure.txt").write_text(report)
