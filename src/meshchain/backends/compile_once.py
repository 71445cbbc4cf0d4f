"""One compilation of a generated function per signature among processes sharing a cache.

MPI ranks run the same loops, so without coordination every rank compiles every loop at
the same moment: on a node whose ranks share the cache directory, ``P`` ranks do ``P``
times the work of one (and on an oversubscribed node, wait ``P / cores`` times as long).
:func:`compiling_alone` holds an exclusive file lock beside the generated module while a
function compiles: the first process to take it compiles and writes Numba's disk cache;
the others, once they have the lock, find the function there and load it. The lock needs
no collective (a rank that compiles nothing never takes part), is held only while Numba
compiles (no MPI call inside), and goes with the process if it dies. Where locks are
unavailable (no ``fcntl``, a read-only directory) each process compiles on its own, as
before.

Examples
--------
>>> import numba
>>> @numba.njit
... def twice(x):
...     return 2 * x
>>> with compiling_alone(twice):
...     twice.compile("int64(int64)") is not None
True
"""

from __future__ import annotations

import contextlib
import os

try:
    import fcntl
except ImportError:  # not on POSIX: no lock, each process compiles for itself
    fcntl = None

__all__ = ["compiling_alone"]


def _lock_path(function) -> str | None:
    """``<module file>.<function name>.lock`` beside the file the function was defined in."""
    code = getattr(getattr(function, "py_func", None), "__code__", None)
    if code is None or not os.path.isfile(code.co_filename):
        return None
    return f"{code.co_filename}.{function.py_func.__name__}.lock"


@contextlib.contextmanager
def compiling_alone(function):
    """Hold the lock of ``function`` (a Numba dispatcher) for the ``with`` block: one process
    at a time compiles it, and the next loads it from the disk cache the first one wrote."""
    path = _lock_path(function) if fcntl is not None else None
    handle = None
    if path is not None:
        try:
            handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            if handle is not None:
                os.close(handle)
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock
