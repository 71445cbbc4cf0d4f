"""Where the values of dats and globals live: storage records the engine owns.

User objects (:class:`~meshchain.types.Dat`, :class:`~meshchain.types.Global`) are
declarations only; their values are held by a :class:`DatStorage` or
:class:`GlobalStorage` in the session's :class:`DataStore`, looked up by the object's
``uid``. Plans keep direct references to storage records, so running a plan never
looks anything up.

A dat's storage has the host array of its owned and halo rows (owned first, in local
numbering), the depth to which its halo rows are valid, its message tag on several
ranks, and optionally a copy on a device (:mod:`meshchain.backends.cuda.residency`),
which keeps the host array current on demand. A global's storage has its value and the
reduction over ranks still in flight, if any.

Examples
--------
>>> import numpy as np
>>> from meshchain.core.storage import DatStorage
>>> storage = DatStorage(np.zeros((3, 2)), n_owned=3)
>>> storage.host_current(write=True).shape, storage.valid_depth
((3, 2), 0)
"""

from __future__ import annotations

import operator
import weakref

import numpy as np

from . import profiling as _profiling

__all__ = ["DatStorage", "GlobalStorage", "DataStore"]

_REDUCTION_WAIT = _profiling.label("reduction wait", "reduction")


class DatStorage:
    """The values of one dat on this rank (see the module docstring).

    Attributes
    ----------
    host : ndarray
        Owned and halo rows, shape ``(rows, dim)``; may be stale while ``device`` is newer.
    n_owned : int
        Rows this rank owns (a prefix of ``host``).
    valid_depth : int
        Halo layers whose rows hold current values.
    tag : int
        MPI tag of the dat's own halo messages (the same on every rank).
    device : object or None
        A device copy with ``to_host(host, write=...)``, ``read_rows``, ``write_rows`` and
        ``state`` (see :mod:`meshchain.backends.cuda.residency`).
    """

    __slots__ = ("host", "n_owned", "valid_depth", "tag", "device", "_flat")

    def __init__(self, host: np.ndarray, *, n_owned: int, valid_depth: int = 0, tag: int = 1):
        self.host, self.n_owned, self.valid_depth, self.tag = host, n_owned, valid_depth, tag
        self.device, self._flat = None, None

    def flat(self, n: int) -> np.ndarray:
        """The first ``n`` values of the host array (rows after rows) as one flat view, what
        the Krylov solvers work on; the same view again while the host array is the same.

        >>> storage = DatStorage(np.arange(6.0).reshape(3, 2), n_owned=2)
        >>> storage.flat(4).tolist(), storage.flat(4) is storage.flat(4)
        ([0.0, 1.0, 2.0, 3.0], True)
        """
        kept = self._flat
        if kept is not None and kept[0] is self.host and len(kept[1]) == n:
            return kept[1]
        view = self.host.reshape(-1)[:n]
        self._flat = (self.host, view)
        return view

    def host_current(self, *, write: bool) -> np.ndarray:
        """The host array, made current; with ``write`` the caller may change it, so a device
        copy becomes stale."""
        if self.device is not None:
            self.device.to_host(self.host, write=write)
        return self.host

    def replace(self, host: np.ndarray, *, n_owned: int, valid_depth: int) -> None:
        """New rows (after the mesh was partitioned or its halos rebuilt); a device copy is
        dropped, since its rows no longer match."""
        self.host, self.n_owned, self.valid_depth, self.device = host, n_owned, valid_depth, None
        self._flat = None  # a view of the old rows: it would keep them alive

    def rows_to_host(self, rows: np.ndarray) -> None:
        """Make rows ``rows`` of the host array current (before a host exchange packs them)."""
        if self.device is not None:
            self.host[rows] = self.device.read_rows(self.host, rows)

    def rows_from_host(self, rows: np.ndarray) -> None:
        """Pass rows ``rows``, just received into the host array, on to a device copy."""
        if self.device is not None:
            self.device.write_rows(self.host, rows, self.host[rows])


class GlobalStorage:
    """The value of one global (the same on every rank once reductions are finished)."""

    __slots__ = ("value", "pending")

    def __init__(self, value: np.ndarray):
        self.value = value
        self.pending = None  # a reduction over ranks in flight: finish(value) completes it

    def settle(self) -> None:
        """Finish a reduction over ranks that is still in flight."""
        pending = self.pending
        if pending is not None:
            self.pending = None
            profiler = _profiling.active
            began = _profiling._clock() if profiler is not None else 0.0
            pending.finish(self.value)
            if profiler is not None:
                profiler.span(getattr(pending, "label", _REDUCTION_WAIT), began, _profiling._clock())


_uid = operator.attrgetter("uid")


class DataStore:
    """The storage of every live dat and global of one session, by the object's ``uid``.

    An entry goes when its object is garbage-collected.
    """

    def __init__(self):
        self._records: dict[int, object] = {}
        self._watched: dict[int, weakref.ref] = {}  # uid -> a weak reference whose callback drops the entry

    def add(self, obj, record) -> None:
        uid = obj.uid
        self._records[uid] = record
        self._watched[uid] = weakref.ref(obj, lambda _, uid=uid: self._drop(uid))  # cheaper than weakref.finalize

    def _drop(self, uid: int) -> None:
        self._records.pop(uid, None)
        self._watched.pop(uid, None)

    def get(self, obj):
        """The record of ``obj``, or None if this session does not know it."""
        return self._records.get(obj.uid)

    def records_of(self, objects) -> tuple:
        """The records of ``objects``, in order (None for one this session does not know)."""
        return tuple(map(self._records.get, map(_uid, objects)))  # C-level: every unit bound to new objects

    def __len__(self) -> int:
        return len(self._records)
