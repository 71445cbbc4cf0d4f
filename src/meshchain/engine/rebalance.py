"""Load balance from measured costs (``mc.rebalance``).

Every loop's compute seconds and iterations are in the statistics (:mod:`.accounting`).
:func:`rebalance` turns them into a weight per element of the seed set (the set
``mc.partition`` partitioned) and moves the mesh with the weighted repartitioning of
:func:`.relayout.repartition`:

* each loop's cost per iteration is its compute seconds summed over the ranks divided by
  its iterations summed over the ranks (one ``Allreduce``), so one rank's noise does not
  weigh its elements alone, while a loop that runs on some ranks only (boundary
  conditions, AWM-Olsen's PML layers) weighs exactly the elements that cause it;
* an owned iteration of a loop over the seed set adds its cost to its element; one over
  another set adds it to the seed element its first map into the seed set names (a
  boundary edge to its cell); a loop over a set with no such map spreads its owned
  iterations' cost evenly over the rank's seed elements.

The loops measured are those run since the statistics were last reset
(``mc.stats(reset=True)``); the statistics are kept (they describe the old partition).

Examples
--------
>>> import meshchain as mc
>>> mc.rebalance()   # one process: nothing to balance, nothing moves
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core.errors import DeclarationError
from .relayout import repartition

__all__ = ["rebalance", "Rebalance", "element_weights"]


class Rebalance(NamedTuple):
    """What :func:`rebalance` measured: ``costs`` (seconds per iteration by loop name), the
    seed set's owned ``weights`` on this rank before the move, and ``imbalance`` (max/mean
    over ranks of the summed weights before the move)."""

    costs: dict
    weights: np.ndarray
    imbalance: float


def rebalance(session, method: str = "rib", *, coords=None, seed: int = 0) -> Rebalance | None:
    """Weigh the seed set's elements by measured cost and repartition (see the module docstring)."""
    session.flush()
    if not session.distributed:
        return None
    if session.seed_set is None:
        repartition(session, method, coords=coords, seed=seed)  # refuses on every rank, says why
        return None
    loops = _loops_run(session)
    costs = _costs(session.comm, session.recorder.loops, sorted(loops))
    weights = element_weights(session, loops, costs)
    total = np.array([weights.sum()], dtype=np.float64)
    sums = np.empty(session.size, dtype=np.float64)
    session.comm.Allgather(total, sums)
    imbalance = float(sums.max() / sums.mean()) if sums.mean() > 0 else float("nan")
    repartition(session, method, coords=coords, weights=weights, seed=seed)
    return Rebalance(costs, weights, imbalance)


def _loops_run(session) -> dict:
    """Loop name -> one recorded loop of that name (its set and maps)."""
    found = {}
    for unit in session.pipeline.units.values():
        for loop in unit.loops:
            found.setdefault(loop.name, loop)
    return found


def _costs(comm, records, names) -> dict:
    """Seconds per iteration of each loop, summed over ranks (rank 0's names, agreed)."""
    names = comm.bcast(names, root=0)
    local = np.zeros((2, len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        record = records.get(name)
        if record is not None:
            local[:, j] = record.time_compute, record.iterations
    summed = np.empty_like(local)
    comm.Allreduce(local, summed)
    return {name: float(seconds / count) if count else 0.0 for name, seconds, count in zip(names, *summed)}


def element_weights(session, loops: dict, costs: dict) -> np.ndarray:
    """This rank's owned seed elements' weights from ``costs`` (see the module docstring);
    a small floor keeps every weight positive (an element with no measured work still costs
    its storage and exchanges)."""
    seed_set = session.seed_set
    n_seed = session.n_owned(seed_set)
    weights = np.zeros(n_seed, dtype=np.float64)
    for name, cost in costs.items():
        loop = loops.get(name)
        if loop is None or cost <= 0:
            continue
        n = session.n_owned(loop.iterset)
        if loop.iterset is seed_set:
            weights += cost
            continue
        into = next((m for m in loop.maps if m.source is loop.iterset and m.target is seed_set), None)
        if into is None:
            if n_seed:
                weights += cost * n / n_seed
            continue
        targets = np.asarray(session.layout.values(into)[:n, 0], dtype=np.int64)
        owned = targets[targets < n_seed]
        np.add.at(weights, owned, cost)
    floor = weights.mean() * 1e-3 if n_seed and weights.mean() > 0 else 1.0
    if not np.all(np.isfinite(weights)):
        raise DeclarationError("mc.rebalance: measured costs are not finite; run the loops again after "
                               "mc.stats(reset=True).")
    return weights + floor
