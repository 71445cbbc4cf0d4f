"""Small validation helpers shared by the declaration types."""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np

from ..core.errors import DataShapeError, DeclarationError

SUPPORTED_DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64))
_DTYPE_NAMES = ", ".join(str(d) for d in SUPPORTED_DTYPES)


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


def as_storage(data, dtype: np.dtype, shape: tuple[int, ...], what: str, *, fix: str) -> np.ndarray:
    """Copy ``data`` into a fresh C-contiguous array of ``shape`` and ``dtype``.

    Accepts ``shape`` itself or, when the trailing extent is 1, the shape without it.
    Refuses casts that could lose information (float -> int, int64 -> int32 overflow).
    """
    array = np.asarray(data)
    if array.shape != shape and not (shape[-1] == 1 and array.shape == shape[:-1]):
        raise DataShapeError(f"{what}: data has shape {array.shape}, expected {shape}; {fix}")
    if array.dtype != dtype:
        if not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise DataShapeError(
                f"{what}: cannot store {array.dtype} data as {dtype} without losing information; "
                f"convert the data first or pass dtype={array.dtype}."
            )
        if dtype.kind == "i" and array.dtype.kind in "iu" and array.size:
            info = np.iinfo(dtype)
            if array.min() < info.min or array.max() > info.max:
                raise DataShapeError(f"{what}: values do not fit in {dtype}; pass dtype=np.int64.")
    return np.array(array, dtype=dtype, order="C", copy=True).reshape(shape)


_uids = __import__("itertools").count()


def next_uid() -> int:
    """A number no other declared object of this process has (keys of the session's tables)."""
    return next(_uids)
