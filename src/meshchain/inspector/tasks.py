"""Boundary tasks: the iterations that wait for halos, grouped by the neighbours they need.

On several ranks a step of a plan runs its core while the halo messages travel, then the
rest: the iterations that touch received rows. Run in bulk, the rest waits for every
message. Cut into *tasks*, each group of iterations starts as soon as the messages it
needs have arrived (the runtime's "tiles as tasks" of the PaRSEC stencil study).

:func:`boundary_tasks` finds the groups. Each neighbour gets a bit; a row received from
neighbour ``k`` starts with mask ``1 << k``, every other row with 0. The rest's runs are
visited in program order; an iteration needs the union of the masks of every row it
touches (reads or writes: a write must not be overwritten by a later unpack, nor run
before an earlier iteration that reads the row), and then adds its need to the mask of
every row it touches, so a later iteration sharing a row needs at least as much. The
iterations with equal need form one task. If an iteration depends on another (an earlier
one that touches a common row), its need contains the other's: tasks run in order of
their number of neighbours, each task's runs in program order, respect every dependence.

Examples
--------
Rows 3 and 4 arrive from neighbours 0 and 1; the first loop's iterations 0-2 touch rows
``i`` and ``i + 2``, the second loop's iteration 0 touches row 2:

>>> import numpy as np
>>> imports = {"u": {0: np.array([3]), 1: np.array([4])}}
>>> touched = [(3, [("u", np.array([[0, 2], [1, 3], [2, 4]]))]), (1, [("u", np.array([[2]]))])]
>>> tasks = boundary_tasks(touched, imports, {"u": 5}, [0, 1])
>>> [(t.mask, [(run, e.tolist()) for run, e in t.parts]) for t in tasks]
[(0, [(0, [0])]), (1, [(0, [1])]), (2, [(0, [2]), (1, [0])])]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Task", "boundary_tasks", "MAX_NEIGHBOURS"]

MAX_NEIGHBOURS = 63
"""Neighbours a mask can name (bits of a signed 64-bit integer)."""


class Task(NamedTuple):
    """Iterations that need the messages of the neighbours in ``mask`` (bit ``k``: the
    ``k``-th neighbour): ``parts`` lists ``(run, elements)``, elements as offsets into the
    run's range, ascending, runs in program order."""

    mask: int
    parts: tuple


def boundary_tasks(touched, imports: dict, rows: dict, neighbours) -> list[Task] | None:
    """The tasks of a step's rest (None when there are more than :data:`MAX_NEIGHBOURS`).

    Parameters
    ----------
    touched : list, one entry per run of the rest in program order
        ``(iterations, [(dat, rows)])``: the run's number of iterations, every dat its loop
        touches and, per iteration, the rows it touches, shape ``(iterations, k)``.
    imports : dict
        ``{dat: {neighbour: rows received}}`` for the step's exchanges.
    rows : dict
        ``{dat: number of rows}`` (owned and halo).
    neighbours : sequence of int
        The neighbours, in bit order.

    Returns
    -------
    list of Task
        Sorted by number of neighbours, then mask.
    """
    if len(neighbours) > MAX_NEIGHBOURS:
        return None
    bit = {n: np.int64(1) << np.int64(k) for k, n in enumerate(neighbours)}
    masks = {dat: np.zeros(count, dtype=np.int64) for dat, count in rows.items()}
    for dat, by_neighbour in imports.items():
        for neighbour, received in by_neighbour.items():
            masks[dat][np.asarray(received, dtype=np.int64)] |= bit[neighbour]
    needs = []
    for iterations, run in touched:
        need = np.zeros(iterations, dtype=np.int64)
        for dat, touched_rows in run:
            need |= np.bitwise_or.reduce(masks[dat][touched_rows], axis=1)
        for dat, touched_rows in run:
            np.bitwise_or.at(masks[dat], touched_rows, need[:, None])
        needs.append(need)
    return _grouped(needs)


def _grouped(needs) -> list[Task]:
    parts: dict = {}
    for run, need in enumerate(needs):
        for mask in np.unique(need):
            parts.setdefault(int(mask), []).append((run, np.flatnonzero(need == mask)))
    order = sorted(parts, key=lambda mask: (bin(mask).count("1"), mask))
    return [Task(mask, tuple(parts[mask])) for mask in order]
