"""Small validation helpers shared by the declaration types."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np

from ..core.access import Access
from ..core.errors import AccessModeError, DataShapeError, DeclarationError, MapError, SetMismatchError

SUPPORTED_DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64),
                    np.dtype(np.uint32), np.dtype(np.uint64))
_DTYPE_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)
_NAMED_DTYPES = {spelling: d for d in SUPPORTED_DTYPES for spelling in (d, d.type, str(d))}
"""A ``dtype=`` argument as users spell it (``np.int32``, ``np.dtype("int32")``, ``"int32"``) -> the
supported dtype it names."""
_INTEGER_RANGES = {d: (int(np.iinfo(d).min), int(np.iinfo(d).max)) for d in SUPPORTED_DTYPES if d.kind in "iu"}
_FLOAT64, _INT64 = np.dtype(np.float64), np.dtype(np.int64)


def check_count(value, what: str, *, minimum: int, error: Callable[[str], Exception] = DeclarationError) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{what} must be an integer, got {value!r} ({type(value).__name__}); pass an int.")
    if value < minimum:
        raise error(f"{what} must be >= {minimum}, got {value}.")
    return int(value)


def check_name(name, default: str) -> str:
    """Return a valid object name (a non-empty string)."""
    if name is None:
        return default
    if not isinstance(name, str) or not name:
        raise DeclarationError(f"name must be a non-empty string, got {name!r}.")
    return name


def resolve_dtype(data, dtype, what: str) -> np.dtype:
    """Pick the storage dtype from an explicit ``dtype`` or from ``data``."""
    if dtype is not None:
        try:
            chosen = np.dtype(dtype)
        except TypeError as exc:
            raise DataShapeError(f"{what}: dtype={dtype!r} is not a NumPy dtype; use one of {_DTYPE_NAMES}.") from exc
    elif data is None:
        chosen = np.dtype(np.float64)
    else:
        chosen = np.asarray(data).dtype
        if chosen == np.dtype(bool):
            raise DataShapeError(f"{what}: boolean data is not supported; pass dtype=np.int32 to store 0/1 values.")
    if chosen not in SUPPORTED_DTYPES:
        raise DataShapeError(
            f"{what}: dtype {chosen} is not supported; use one of {_DTYPE_NAMES} (e.g. pass dtype=np.float64)."
        )
    return chosen


def scalar_storage(count: int, value, dtype) -> np.ndarray | None:
    """``count`` copies of the scalar ``value`` as a fresh array of the dtype that ``dtype`` (or,
    if None, ``value``) gives, where that needs no checks beyond the ones made here: ``value``
    a Python ``float`` or ``np.float64`` stored as a float dtype, or a Python ``int`` that fits
    the dtype. None for anything else (:func:`resolve_dtype` and :func:`as_storage` decide:
    they accept more, and they word the errors). The same array those two make.

    >>> scalar_storage(2, 3, np.int32).tolist(), scalar_storage(1, 0.5, None).dtype.name
    ([3, 3], 'float64')
    >>> scalar_storage(1, 0.5, np.int32) is None, scalar_storage(1, 2**40, "int32") is None
    (True, True)
    """
    kind = type(value)
    if kind is float and dtype is None and count == 1:  # the commonest: a new Global per reduction
        return np.array((value,))
    if kind is float or kind is np.float64:
        chosen = _FLOAT64 if dtype is None else _named_dtype(dtype)
        if chosen is None or chosen.kind != "f":
            return None
    elif kind is int:
        chosen = _INT64 if dtype is None else _named_dtype(dtype)
        if chosen is None:
            return None
        low, high = _INTEGER_RANGES.get(chosen, _INTEGER_RANGES[_INT64])  # NumPy makes wider ints objects
        if not low <= value <= high:
            return None
    else:
        return None
    return np.array((value,), dtype=chosen) if count == 1 else np.full(count, value, dtype=chosen)


def _named_dtype(dtype) -> np.dtype | None:
    try:
        return _NAMED_DTYPES.get(dtype)
    except TypeError:  # not hashable: not a dtype this fast path knows
        return None


def as_storage(data, dtype: np.dtype, shape: tuple[int, ...], what: str, *, fix: str) -> np.ndarray:
    """Copy ``data`` into a fresh C-contiguous array of ``shape`` and ``dtype``.

    Accepts ``shape`` itself, the shape without a trailing extent of 1, or the values flat
    (one dimension, as OP2's C API and PyOP2 take them). Refuses casts that could lose
    information: float values that are not integers (or do not fit) into an integer dtype,
    integers that do not fit (float64 into float32 rounds, as NumPy does).

    >>> as_storage([1.0, 2.0, 3.0, 4.0], np.dtype(np.int32), (2, 2), "Dat 'q'", fix="").tolist()
    [[1, 2], [3, 4]]
    >>> as_storage([0.5], np.dtype(np.int32), (1,), "Global 'g'", fix="")
    Traceback (most recent call last):
    ...
    meshchain.core.errors.DataShapeError: Global 'g': cannot store float64 data as int32 without losing information: 0.5 is not an integer; round it first (np.rint) or pass dtype=float64.
    """
    array = np.asarray(data)
    if array.shape != shape and not (shape[-1] == 1 and array.shape == shape[:-1]):
        if not (array.ndim == 1 and len(shape) > 1 and array.size == int(np.prod(shape))):
            raise DataShapeError(f"{what}: data has shape {array.shape}, expected {shape}; {fix} (Or all "
                                 f"{int(np.prod(shape))} values flat.)")
    if array.dtype != dtype:
        if dtype.kind in "iu" and array.dtype.kind == "f":
            _check_integral(array, dtype, what)
        elif dtype.kind in "iu" and array.dtype.kind in "iu":
            pass  # signed and unsigned integers: the values must fit (checked below)
        elif not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise DataShapeError(
                f"{what}: cannot store {array.dtype} data as {dtype} without losing information; "
                f"convert the data first or pass dtype={array.dtype}."
            )
        if dtype.kind in "iu" and array.dtype.kind in "iuf" and array.size:
            info = np.iinfo(dtype)
            if array.min() < info.min or array.max() > info.max:
                wider = "np.int64" if array.min() < 0 else "np.uint64" if dtype.kind == "u" else "np.int64"
                raise DataShapeError(f"{what}: values do not fit in {dtype}; pass dtype={wider} (they range from "
                                     f"{array.min()} to {array.max()}).")
    return np.array(array, dtype=dtype, order="C", copy=True).reshape(shape)


def _check_integral(array: np.ndarray, dtype: np.dtype, what: str) -> None:
    """Refuse float ``array`` as integer ``dtype`` unless every value is a whole number."""
    bad = ~np.isfinite(array) | (array != np.trunc(array))
    if bad.any():
        raise DataShapeError(f"{what}: cannot store {array.dtype} data as {dtype} without losing information: "
                             f"{array[bad].flat[0]} is not an integer; round it first (np.rint) or pass dtype={array.dtype}.")


_uids = __import__("itertools").count()


def next_uid() -> int:
    """A number no other declared object of this process has (keys of the session's tables)."""
    return next(_uids)


def assembly_path(owner: str, access, maps, pairs) -> tuple:
    """``(row_map, col_map)`` of ``A(access, maps)`` for a matrix ``owner`` declared with the
    map ``pairs``: an INC or WRITE through one of them, else the error that says so."""
    if access not in (Access.INC, Access.WRITE):
        raise AccessModeError(f"{owner}: loops assemble into a matrix with mc.INC (add the blocks) or mc.WRITE (set "
                              f"their entries), got {access!r}; zero it with .zero() to start again.")
    try:
        row_map, col_map = maps
    except (TypeError, ValueError):
        raise MapError(f"{owner}: pass the path as a (row_map, col_map) pair, got {maps!r}.") from None
    if not any(row_map is r and col_map is c for r, c in pairs):
        names = ", ".join(f"({r.name}, {c.name})" for r, c in pairs)
        raise SetMismatchError(f"{owner}: ({getattr(row_map, 'name', row_map)}, {getattr(col_map, 'name', col_map)}) "
                               f"is not one of its map pairs ({names}); declare the matrix with it.")
    return row_map, col_map
