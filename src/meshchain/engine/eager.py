"""Boundary-first, eager sends: where a plan's next step may post its exchange early.

A plan runs its steps one after another, each ``begin exchanges -> core -> end
exchanges -> rest``. When step ``j``'s exchange carries dats that step ``j - 1`` writes,
today's order sends them only after all of step ``j - 1`` ran. The AWM-Olsen order
(``../shared/papers/awm-olsen-overlap.txt``) is better: compute first the rows other
ranks import, send them at once, then compute the interior while they travel.

:func:`eager_splits` finds, for each such pair of steps, where the *last* loop of step
``j - 1`` can be cut: iterations ``[split, end)`` of its rest (and its exec-halo
iterations) write every exported row of the exchanged dats that this loop writes; the
iterations ``[core end, split)`` write none of them. So the plan runs the loop's
boundary part, begins step ``j``'s exchange (its packed rows are final: the loops before
ran whole), and then runs the loop's interior part while the messages travel; step ``j``
then runs its core and waits as before. Exported rows are found through the loop's own
maps, so the cut is exact for any numbering; owned rows are numbered by decreasing
distance from the partition boundary, so the interior is usually most of the loop.

Where step ``j - 1`` has nothing left to run after its boundary (everything it writes is
exported, or its rest is empty), the split still posts the exchange before the
reductions of step ``j - 1`` start, which costs nothing.

Examples
--------
The first iteration (of 6 owned) that writes an exported row, through a map:

>>> import numpy as np
>>> first_writer(np.array([[0], [1], [2], [3], [4], [5]]), np.array([False, False, False, True, False, True]),
...              n_owned=6, direct=False, columns=(0,))
3
"""

from __future__ import annotations

import numpy as np

from ..types.args import DIRECT, GLOBAL, WHOLE_MAP

__all__ = ["eager_splits", "first_writer"]


def eager_splits(session, unit, schedule) -> dict:
    """``{step: (loop position, split)}``: the steps after whose ``rest`` (restricted to
    ``[split, ...)`` for the loop at ``position``) the next step's exchanges can begin."""
    config = session.config
    if not (session.distributed and config.overlap and config.eager):
        return {}
    segments, splits = schedule.segments, {}
    for j in range(1, len(segments)):
        if not segments[j].exchanges:
            continue
        before = segments[j - 1]
        position = before.loops[-1]
        splits[j - 1] = (position, _split(session, unit, position, segments[j].exchanges))
    return splits


def _split(session, unit, position: int, exchanges) -> int:
    """The first owned iteration of loop ``position`` that writes a row the exchanges send."""
    loop, signature = unit.loops[position], unit.signature[position]
    n_owned = session.layout.of(loop.iterset).n_owned
    exported = _exported(session, unit, exchanges)
    split = n_owned
    for i, spec in enumerate(loop.specs):
        key = signature.args[i].obj
        if spec.kind == GLOBAL or not spec.access.writes or key not in exported:
            continue
        columns = tuple(range(spec.arity)) if spec.kind == WHOLE_MAP else (spec.index,)
        values = None if spec.kind == DIRECT else session.layout.values(loop.maps[spec.map_slot])
        split = min(split, first_writer(values, exported[key], n_owned=n_owned, direct=spec.kind == DIRECT,
                                        columns=columns))
    return split


def _exported(session, unit, exchanges) -> dict:
    """Per dat key, a mask of its rows that the exchanges send to some neighbour."""
    masks: dict = {}
    for spec in exchanges:
        for key, lo, hi in spec.items:
            layout = session.layout.of(unit.objects[key].dataset)
            mask = masks.get(key)
            if mask is None:
                mask = masks[key] = np.zeros(len(layout.global_ids), dtype=bool)
            for per_layer in layout.exports.values():
                for rows in per_layer[lo:hi]:
                    mask[rows] = True
    return masks


def first_writer(values, exported: np.ndarray, *, n_owned: int, direct: bool, columns) -> int:
    """The first of iterations ``[0, n_owned)`` that writes an ``exported`` row, directly
    (iteration ``e`` writes row ``e``) or through ``values[:, columns]``; ``n_owned`` if none."""
    if n_owned == 0:
        return 0
    if direct:
        hits = exported[:n_owned]
    else:
        hits = np.zeros(n_owned, dtype=bool)
        for column in columns:
            hits |= exported[np.asarray(values[:n_owned, column], dtype=np.int64)]
    found = np.flatnonzero(hits)
    return int(found[0]) if found.size else n_owned
