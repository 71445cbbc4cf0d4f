"""Assertions that every rank of a parallel test agrees on (no rank is left waiting).

Each is collective: call it on every rank of ``comm`` (``MPI.COMM_WORLD`` by default). It
raises the same :class:`AssertionError` on every rank, naming the ranks (and, for dats, the
worst element by its global id) where the check failed.

Examples
--------
>>> import numpy as np
>>> from meshchain.testing import parallel_assert, assert_same_on_all_ranks
>>> parallel_assert(1 + 1 == 2, "arithmetic")
>>> assert_same_on_all_ranks(np.arange(3))
"""

from __future__ import annotations

import pickle

import numpy as np

__all__ = ["parallel_assert", "assert_same_on_all_ranks", "assert_gathered_close"]


def _world(comm):
    if comm is not None:
        return comm
    from mpi4py import MPI

    return MPI.COMM_WORLD


def parallel_assert(assertion, msg: str = "", *, participating: bool = True, comm=None) -> None:
    """Assert ``assertion`` on every rank at once: if it is false (or, given a callable,
    returns false or raises) on any participating rank, every rank raises.

    Parameters
    ----------
    assertion : bool or callable
        The condition on this rank; a callable is called, and an exception it raises counts
        as a failure (its message is reported).
    msg : str
        Added to the error.
    participating : bool, keyword-only
        False: this rank only takes part in the agreement.
    comm : mpi4py communicator, keyword-only
    """
    outcome, detail = True, ""
    if participating:
        try:
            outcome = bool(assertion() if callable(assertion) else assertion)
        except Exception as exc:  # noqa: BLE001 - reported on every rank
            outcome, detail = False, f"{type(exc).__name__}: {exc}"
    gathered = _world(comm).allgather((outcome, detail))
    failed = [rank for rank, (ok, _) in enumerate(gathered) if not ok]
    if failed:
        details = "; ".join(f"rank {rank}: {text}" for rank, (_, text) in enumerate(gathered) if text)
        raise AssertionError(f"parallel assertion failed on rank(s) {failed}" + (f": {msg}" if msg else "")
                             + (f" ({details})" if details else ""))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return pickle.dumps(a) == pickle.dumps(b)


def assert_same_on_all_ranks(obj, msg: str = "", *, comm=None) -> None:
    """Assert that ``obj`` (a number, an array, anything picklable) is the same on every rank
    as on rank 0: arrays bit for bit (NaNs equal), other objects by their pickles."""
    comm = _world(comm)
    reference = comm.bcast(obj, root=0)
    parallel_assert(_same(obj, reference), msg or f"{_short(obj)} differs from rank 0's {_short(reference)}",
                    comm=comm)


def _short(obj) -> str:
    text = repr(obj)
    return text if len(text) <= 120 else text[:117] + "..."


def assert_gathered_close(dat, expected, *, rtol: float = 1e-12, atol: float = 0.0, comm=None) -> None:
    """Assert that ``dat.gather()`` (collective) is close to ``expected`` (the whole array in
    global numbering, needed on rank 0 only): ``|got - expected| <= atol + rtol * |expected|``.
    On failure every rank raises, naming the worst element's global id and both values.
    """
    gathered = dat.gather()
    verdict = None
    if gathered is not None:  # rank 0
        verdict = _compare(np.asarray(gathered), np.asarray(expected), rtol, atol, getattr(dat, "name", "dat"))
    verdict = _world(comm).bcast(verdict, root=0)
    if verdict:
        raise AssertionError(verdict)


def _compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, name: str) -> str | None:
    if want.shape != got.shape:
        want = want.reshape(got.shape) if want.size == got.size else want
    if want.shape != got.shape:
        return f"Dat {name!r}: gathered shape {got.shape}, expected {want.shape}"
    excess = np.abs(got - want) - (atol + rtol * np.abs(want))
    excess = np.where(np.isnan(excess), np.inf, excess)
    if not excess.size or excess.max() <= 0:
        return None
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
    bad = int(np.count_nonzero(excess > 0))
    return (f"Dat {name!r}: {bad} of {excess.size} values differ beyond rtol={rtol:g}, atol={atol:g}; worst at "
            f"global id {worst[0]}" + (f", component {worst[1]}" if len(worst) > 1 else "")
            + f": got {got[worst]!r}, expected {want[worst]!r}")
