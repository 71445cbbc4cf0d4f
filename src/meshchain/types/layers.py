"""The rows of extruded maps (:class:`~meshchain.types.maps.ExtrudedMap`): every layer's from
the bottom layer's and the per-column offset, column by column, and those of the interior facets.

Examples
--------
>>> import numpy as np
>>> layered(np.array([[0, 4]]), (1, 2), 3).tolist()
[[0, 4], [1, 6], [2, 8]]
>>> facet_rows(np.array([[0, 4]]), (1, 2), 3).tolist()
[[0, 4, 1, 6], [1, 6, 2, 8], [2, 8, 2, 8]]
>>> follows_layers(np.array([[0, 4], [1, 6], [2, 8]]), (1, 2), 3, 3)
True
>>> follows_layers(np.array([[0, 4], [1, 6], [5, 8]]), (1, 2), 3, 3)
False
"""

from __future__ import annotations

import numpy as np

from ..core.errors import MapError
from .block import Block

__all__ = ["checked_offset", "bottom_rows", "layered", "facet_rows", "follows_layers"]


def checked_offset(offset, arity: int, name) -> tuple:
    array = np.asarray(offset)
    if array.ndim == 0:
        array = np.full(arity, array)
    if array.shape != (arity,) or array.dtype.kind not in "iu":
        raise MapError(f"Map {name!r}: offset must be {arity} integers (one per map column) or one integer, got "
                       f"{offset!r}.")
    return tuple(int(v) for v in array)


def bottom_rows(values, source, arity: int, name):
    """The declared bottom-layer rows: a global array, ``mc.Block`` rows of the base set, or None."""
    if values is None:
        return None
    rows = values.rows if isinstance(values, Block) else np.asarray(values)
    if rows.ndim == 1 and rows.size % arity == 0:
        rows = rows.reshape(-1, arity)
    if rows.ndim != 2 or rows.shape[1] != arity or rows.dtype.kind not in "iuf":
        raise MapError(f"Map {name!r}: values must be the bottom layer's rows, shape ({source.base.size}, {arity}) "
                       f"(one per element of {source.base.name!r}), got shape {rows.shape} of {rows.dtype}.")
    if not isinstance(values, Block) and len(rows) != source.base.size:
        raise MapError(f"Map {name!r}: values have {len(rows)} rows; an extruded map takes one row per column "
                       f"({source.base.size} for {source.base.name!r}), the bottom layer's, plus offset=.")
    rows = np.array(rows, dtype=np.int64) if rows.dtype.kind != "f" else rows.copy()
    rows.flags.writeable = False
    return Block(rows) if isinstance(values, Block) else rows


def _rows_of(values):
    return values.rows if isinstance(values, Block) else values


def _rewrapped(values, rows):
    return Block(rows) if isinstance(values, Block) else rows


def layered(bottom, offset: tuple, layers: int):
    """Every layer's rows, column by column: row ``c * layers + l`` is ``bottom[c] + l * offset``."""
    if bottom is None:
        return None
    rows = _rows_of(bottom)
    steps = np.arange(layers, dtype=rows.dtype)[None, :, None] * np.asarray(offset, dtype=rows.dtype)
    return _rewrapped(bottom, (rows[:, None, :] + steps).reshape(-1, rows.shape[1]))


def facet_rows(bottom, offset: tuple, layers: int):
    """Rows of the interior-facet map: each layer's targets, then those of the layer above (the
    top layer's own again, where there is none)."""
    if bottom is None:
        return None
    here = _rows_of(layered(bottom, offset, layers))
    n = here.shape[0]
    above = np.empty_like(here)
    above[:-1] = here[1:]
    if n:
        top = np.arange(layers - 1, n, layers)
        above[top] = here[top]
    return _rewrapped(bottom, np.concatenate([here, above], axis=1))


def follows_layers(rows, offset: tuple, layers: int, count: int) -> bool:
    """Whether rows ``[0, count)`` of ``rows`` (a map's, in some numbering of its source and
    target) are each their column's bottom row plus ``layer * offset``, row ``e`` being layer
    ``e % layers`` of the column whose bottom row is ``e - e % layers``: what a loop that finds
    an extruded map's targets per layer by arithmetic relies on (see
    :attr:`~meshchain.ir.loop.ArgSpec.layers`). Always so for :func:`layered` rows; on a rank,
    so where the local numbering keeps the columns of the source and the target whole and in order."""
    rows = np.asarray(rows)[:count]
    elements = np.arange(len(rows))
    lay = elements % layers
    expected = rows[elements - lay] + lay[:, None] * np.asarray(offset, dtype=rows.dtype)
    return bool(np.array_equal(rows, expected))
