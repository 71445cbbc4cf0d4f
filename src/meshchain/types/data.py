"""Dats (data on a set) and Globals (small arrays shared by all elements)."""

from __future__ import annotations

import numpy as np

from ..core.access import DAT_MODES, GLOBAL_MODES, Access
from ..core.errors import AccessModeError, DataShapeError, SetMismatchError
from ._checks import as_storage, check_count, check_name, resolve_dtype
from .args import Arg
from .maps import Map, MapIndex
from .sets import Set

__all__ = ["Dat", "Global"]


def _check_access(access, owner: str, allowed, advice: str) -> Access:
    if not isinstance(access, Access):
        raise AccessModeError(f"{owner}: access must be one of mc.READ, mc.WRITE, mc.RW, mc.INC, mc.MIN, mc.MAX, got {access!r}.")
    if access not in allowed:
        raise AccessModeError(f"{owner}: access {access.value} is not allowed; {advice}")
    return access


def _runtime():
    from ..engine.session import get_runtime

    return get_runtime()


def _runtime_partitioned(dat):
    """The runtime, refusing on several ranks to hand out data before ``mc.partition``."""
    runtime = _runtime()
    if runtime.distributed and not runtime.partitioned:
        from ..core.errors import LoopError

        raise LoopError(
            f"Dat {dat.name!r}: its data is laid out for partitioning, not yet distributed; call "
            f"mc.partition(...) before reading .data or .gather() on several ranks."
        )
    return runtime


class Dat:
    """Data attached to every element of a set: an array of shape ``(set.size, dim)``.

    Parameters
    ----------
    dataset : Set
        The set the data lives on.
    dim : int
        Values per element (``>= 1``).
    data : array_like, optional
        Initial values, shape ``(size, dim)`` (or ``(size,)`` when ``dim == 1``); copied.
        ``None`` gives zeros.
    name : str, optional
    dtype : numpy dtype, keyword-only
        float64 (default), float32, int32 or int64.

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> nodes = mc.Set(3, "nodes")
    >>> x = mc.Dat(nodes, 2, np.arange(6.0).reshape(3, 2), "x")
    >>> x.data[2].tolist()
    [4.0, 5.0]
    """

    is_global = False

    def __init__(self, dataset, dim, data=None, name=None, *, dtype=None):
        self.name = check_name(name, "dat")
        if not isinstance(dataset, Set):
            raise DataShapeError(f"Dat {self.name!r}: dataset must be a meshchain.Set, got {type(dataset).__name__}.")
        self.dataset = dataset
        self.dim = check_count(dim, f"Dat {self.name!r} dim", minimum=1, error=DataShapeError)
        self._tag = 1  # MPI tag: set from the (agreed) declaration order on several ranks
        self._valid_depth = 0
        self._device_copy = None  # the values on a GPU (meshchain.backends.cuda.residency)
        runtime = _runtime()
        if runtime.distributed:
            self._data = self._distributed_storage(runtime, data, dtype)
        else:
            self.dtype, self._data = self._storage(data, dtype, dataset.size)

    def _storage(self, data, dtype, rows: int):
        what = f"Dat {self.name!r} on {self.dataset.name!r}"
        chosen = resolve_dtype(data, dtype, what)
        if data is None:
            return chosen, np.zeros((rows, self.dim), dtype=chosen)
        fix = f"pass one row of {self.dim} values per element of {self.dataset.name!r}."
        return chosen, as_storage(data, chosen, (rows, self.dim), what, fix=fix)

    def _distributed_storage(self, runtime, data, dtype):
        """Block rows (before mc.partition) or local rows (after), validated on all ranks together."""
        from ..comm.collectives import block_offsets, fetch_rows, raise_together
        from ..comm.inputs import to_block_rows

        comm, n = runtime.comm, self.dataset.size
        offsets = block_offsets(n, comm.size)
        rows = to_block_rows(comm, data, n, f"Dat {self.name!r} on {self.dataset.name!r}")
        error = None
        try:
            self.dtype, block = self._storage(rows, dtype, int(offsets[comm.rank + 1] - offsets[comm.rank]))
        except DataShapeError as exc:
            error = exc
        raise_together(comm, error)
        self._tag = runtime.declare(self, (self.name, self.dataset.name, self.dim, self.dtype.str)) % 32000 + 1
        if not runtime.partitioned:
            return block
        self._valid_depth = runtime.depth
        return fetch_rows(comm, offsets, block, self.dataset._layout.global_ids)

    @property
    def _data(self) -> np.ndarray:
        """The host array of owned and halo rows, made current; the caller may write to it,
        so a device copy becomes stale (see :mod:`meshchain.backends.cuda.residency`)."""
        if self._device_copy is not None:
            self._device_copy.to_host(self._host, write=True)
        return self._host

    @_data.setter
    def _data(self, array: np.ndarray) -> None:
        self._device_copy = None
        self._host = array

    def _host_data(self) -> np.ndarray:
        """The host array, made current, for reading only (a device copy stays current)."""
        if self._device_copy is not None:
            self._device_copy.to_host(self._host, write=False)
        return self._host

    def _read_rows(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (halo packing): gathered where the values are current."""
        if self._device_copy is not None:
            return self._device_copy.read_rows(self._host, rows)
        return self._host[rows]

    def _write_rows(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Store rows ``rows`` (halo unpacking) wherever the values are current."""
        if self._device_copy is not None:
            self._device_copy.write_rows(self._host, rows, values)
        else:
            self._host[rows] = values

    def __call__(self, access, path=None) -> Arg:
        """Make a loop argument: ``dat(mode)`` (direct), ``dat(mode, map[i])`` or ``dat(mode, map)``."""
        owner = f"Dat {self.name!r}"
        access = _check_access(access, owner, DAT_MODES, "dats take READ, WRITE, RW or INC (MIN/MAX are for Globals).")
        if path is None:
            return Arg(self, access)
        if isinstance(path, MapIndex):
            map_, index = path.map, path.index
        elif isinstance(path, Map):
            map_, index = path, None
        else:
            raise SetMismatchError(f"{owner}: the path must be a Map or map[i], got {type(path).__name__}.")
        if map_.target is not self.dataset:
            raise SetMismatchError(
                f"{owner} lives on {self.dataset.name!r} but map {map_.name!r} points to {map_.target.name!r}; "
                f"use a map whose target is {self.dataset.name!r}."
            )
        return Arg(self, access, map_, index)

    @property
    def data(self) -> np.ndarray:
        """The owned values, shape ``(n_owned, dim)`` in local numbering (all of them on one
        process); forces pending loops. Writable: halo copies are then considered stale.

        On several ranks this is collective — every rank must access ``.data`` of the same dat
        at the same point — because it changes which halos the next loop exchanges. Use
        :attr:`data_ro` to look at the values on some ranks only (e.g. to print on rank 0).
        """
        _runtime_partitioned(self).force_write(self)
        self._valid_depth = 0
        return self._data[: self.dataset.n_owned]

    @property
    def data_ro(self) -> np.ndarray:
        """A read-only view of the owned values; forces pending loops."""
        _runtime().force_read(self)
        _runtime_partitioned(self)
        view = self._host_data()[: self.dataset.n_owned].view()
        view.flags.writeable = False
        return view

    @property
    def data_with_halos(self) -> np.ndarray:
        """Read-only view of owned and halo values (for debugging; halos may be stale)."""
        _runtime().force_read(self)
        view = self._host_data().view()
        view.flags.writeable = False
        return view

    def gather(self):
        """The global array in the original global numbering on rank 0 (``None`` elsewhere).

        Examples
        --------
        >>> import meshchain as mc
        >>> d = mc.Dat(mc.Set(2, "s"), 1, [3.0, 4.0], "d")
        >>> d.gather().ravel().tolist()
        [3.0, 4.0]
        """
        runtime = _runtime_partitioned(self)
        runtime.force_read(self)
        layout = self.dataset._layout
        if layout is None:
            return self._host_data()[: self.dataset.size].copy()
        from ..comm.gather import gather_rows

        n = layout.n_owned
        return gather_rows(runtime.comm, layout.global_ids[:n], self._host_data()[:n], self.dataset.size)

    def __repr__(self) -> str:
        return f"Dat({self.dataset.name}, {self.dim}, {self.name!r}, dtype={self.dtype})"


class Global:
    """A small array shared by every element: read by kernels or reduced into.

    Parameters
    ----------
    dim : int
        Number of values (``>= 1``).
    value : scalar or array_like, optional
        Initial value(s), default 0.
    name : str, optional
    dtype : numpy dtype, keyword-only
        float64 (default for float values), float32, int32 or int64.

    Examples
    --------
    >>> import meshchain as mc
    >>> total = mc.Global(1, 0.0, "total")
    >>> total.value.tolist()
    [0.0]
    """

    is_global = True

    def __init__(self, dim, value=0.0, name=None, *, dtype=None):
        self.name = check_name(name, "global")
        self.dim = check_count(dim, f"Global {self.name!r} dim", minimum=1, error=DataShapeError)
        self.dtype = resolve_dtype(value, dtype, f"Global {self.name!r}")
        self._data = self._coerce(value)
        self._pending = None  # a reduction over ranks still in flight

    def _coerce(self, value) -> np.ndarray:
        what = f"Global {self.name!r}"
        array = np.asarray(value)
        if array.ndim == 0:
            array = np.full(self.dim, array)
        return as_storage(array, self.dtype, (self.dim,), what, fix=f"pass a scalar or {self.dim} values.")

    def __call__(self, access, path=None) -> Arg:
        """Make a loop argument: ``glob(mc.READ)`` or a reduction ``INC``/``MIN``/``MAX``."""
        owner = f"Global {self.name!r}"
        if path is not None:
            raise SetMismatchError(f"{owner}: globals are not reached through maps; call {self.name}(mode) without a map.")
        _check_access(
            access, owner, GLOBAL_MODES,
            "a global is shared by all elements, so it can only be read (READ) or reduced into (INC, MIN, MAX); "
            "to change it, set .value between loops.",
        )
        return Arg(self, access)

    @property
    def value(self) -> np.ndarray:
        """A copy of the current value, shape ``(dim,)``, the same on every rank; forces
        pending loops and reductions."""
        _runtime().force_read(self)
        self.settle()
        return self._data.copy()

    @value.setter
    def value(self, new) -> None:
        """Set the value (every rank must set the same value)."""
        _runtime().force_write(self)
        self.settle()
        self._data[...] = self._coerce(new)

    @property
    def _host(self) -> np.ndarray:
        """The values (globals always live on the host; dats name their host array so too)."""
        return self._data

    def settle(self) -> None:
        """Finish a reduction over ranks that is still in flight."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.finish(self._data)

    def __repr__(self) -> str:
        return f"Global({self.dim}, {self.name!r}, dtype={self.dtype})"
