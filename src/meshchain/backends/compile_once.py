"""One compilation of a generated function per signature among processes sharing a cache.

MPI ranks run the same loops, so without coordination every rank compiles every loop at
the same moment: on a node whose ranks share the cache directory, ``P`` ranks do ``P``
times the work of one (and on an oversubscribed node, wait ``P / cores`` times as long).
:func:`compiling_alone` holds an exclusive file lock beside the function's Numba cache
index while it compiles: the first process to take it compiles and writes the disk cache;
the others, once they have the lock, find the function there and load it. The lock needs
no collective (a rank that compiles nothing never takes part) and is held only while Numba
compiles (no MPI call inside). A process waits for it at most ``WAIT_SECONDS`` (a holder
stopped in a debugger, a lock a crashed NFS client left behind), then compiles without it
and warns. Where locks are unavailable (no ``fcntl``, a function Numba does not cache, a
read-only directory) each process compiles on its own, as before. Given the signature, a
function the disk cache already holds (:func:`cached_on_disk`) is loaded without the lock:
ranks starting with a warm cache load their loops side by side instead of one after another
(on 2 ranks, Airfoil's first iteration took 327-339 ms with the lock and 182-188 without).

Examples
--------
>>> import numba
>>> @numba.njit
... def twice(x):
...     return 2 * x
>>> with compiling_alone(twice):     # not cached by Numba: nothing to share, no lock
...     twice.compile("int64(int64)") is not None
True
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings

from ..core.errors import MeshchainWarning

try:
    import fcntl
except ImportError:  # not on POSIX: no lock, each process compiles for itself
    fcntl = None

__all__ = ["compiling_alone", "cached_on_disk", "WAIT_SECONDS"]

#: the longest a process waits for another one's compilation before compiling itself
WAIT_SECONDS = 300.0


def lock_path(function) -> str | None:
    """``<Numba's cache index of function>.lock`` (an absolute path), or None where Numba keeps
    no disk cache for it: another process could not load what this one compiled."""
    cache_file = getattr(getattr(function, "_cache", None), "_cache_file", None)
    index = getattr(cache_file, "_index_path", None)
    return None if index is None else os.path.abspath(f"{index}.lock")


def cached_on_disk(function, signature) -> bool:
    """Whether Numba's disk cache of ``function`` (a dispatcher) holds ``signature`` now (its
    index, current for the function's source, names it, and the data file it names is there:
    Numba writes the index first and the data atomically after), so that
    ``function.compile(signature)`` loads it; False where that cannot be told."""
    cache = getattr(function, "_cache", None)
    try:
        files = cache._cache_file
        name = files._load_index().get(cache._index_key(signature, function.targetctx.codegen()))
        return name is not None and os.path.exists(files._data_path(name))
    except Exception:  # noqa: BLE001 - no disk cache (NullCache), or Numba's internals moved: lock as before
        return False


def _acquire(handle: int, path: str, wait: float) -> bool:
    """Take the exclusive lock on ``handle`` within ``wait`` seconds; False (with a warning) if not."""
    deadline, pause = time.monotonic() + wait, 0.001
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                warnings.warn(f"[compile-lock] waited {wait:.0f} s for {path} (another process compiling the "
                              "same loop, or a stale lock): compiling here without it", MeshchainWarning,
                              stacklevel=4)
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.005)  # a waiter sees a released lock within 5 ms


@contextlib.contextmanager
def compiling_alone(function, signature=None, *, wait: float = WAIT_SECONDS):
    """Hold the lock of ``function`` (a Numba dispatcher) for the ``with`` block: one process
    at a time compiles it, and the next loads it from the disk cache the first one wrote. With
    ``signature`` (what the block compiles) already on disk, no lock: each process loads it."""
    on_disk = signature is not None and cached_on_disk(function, signature)
    path = lock_path(function) if fcntl is not None and not on_disk else None
    handle = None
    if path is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _acquire(handle, path, wait):
                os.close(handle)
                handle = None
        except OSError:  # a read-only cache directory: compile alone, as before
            if handle is not None:
                os.close(handle)
            handle = None
        except BaseException:  # interrupted while waiting: leave no descriptor behind
            if handle is not None:
                os.close(handle)
            raise
    try:
        yield
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock
