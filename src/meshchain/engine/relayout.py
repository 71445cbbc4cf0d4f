"""Live repartitioning of a session's mesh (``mc.repartition``).

The session's pending loops run first; then (collectively) the seed set is partitioned
again from where its elements are now (:func:`meshchain.partition.migrate.repartitioned`),
every other set follows through the maps, halos are rebuilt as deep as before, and every
dat's owned rows move to their new owners through the dynamic sparse exchange
(:func:`meshchain.partition.migrate.migrated_rows`). Halo copies are marked invalid (the
next loop that reads them exchanges first), globals stay as they are (every rank holds
the same value), and the ``"repartition"`` event drops every plan, schedule, colouring and
tile plan built for the old numbering.
"""

from __future__ import annotations

import numpy as np

from ..comm.agree import raise_together
from ..core.errors import DeclarationError, MeshchainError
from ..partition.distribute import check_options, seed_set_of
from ..partition.migrate import checked_weights, migrated_rows, moves_of, repartitioned

__all__ = ["repartition"]


def repartition(session, method: str, *, coords=None, weights=None, seed: int = 0) -> None:
    """Move every set's owned elements, with every dat's rows, to a new partition (see the
    module docstring). Bad input raises the same :class:`~meshchain.core.errors.MeshchainError`
    on every rank and changes nothing."""
    check_options(method, coords, 1)
    session.flush()
    if session.distributed:
        raise_together(session.comm, None if session.partitioned else DeclarationError(
            "mc.repartition moves a distributed mesh; call mc.partition(...) first."))
    sets, maps, dats = session.mesh.mesh_declared()
    seed_set = session.seed_set
    if seed_set is None and sets:
        seed_set = seed_set_of(sets, maps, None, None)
    failure, coords_rows, weight_rows = None, None, None
    try:
        if seed_set is None and (coords is not None or weights is not None):
            raise DeclarationError("mc.repartition: no mesh is declared, so there is nothing to weigh or bisect.")
        coords_rows = None if coords is None else _owned_rows_on(session, coords, seed_set, "coords")
        if weights is not None:
            given = _owned_rows_on(session, weights, seed_set, "weights") if hasattr(weights, "dataset") else weights
            weight_rows = checked_weights(given, session.n_owned(seed_set), seed_set.name)
    except MeshchainError as exc:
        failure = exc
    raise_together(session.comm, failure)
    if not session.distributed:
        return
    layout = repartitioned(session.comm, session.layout, sets=sets, maps=maps,
                           map_blocks=session.declarations.map_rows, seed_set=seed_set, method=method,
                           coords_rows=coords_rows, weights=weight_rows, seed=seed)
    moves = {}
    for d in dats:
        s = d.dataset
        if s.uid not in moves:
            moves[s.uid] = moves_of(session.comm, s, session.layout, layout)
        storage = session.storage(d)
        host = storage.host_current(write=True)
        storage.replace(migrated_rows(session.comm, host[: storage.n_owned], moves[s.uid]),
                        n_owned=layout.of(s).n_owned, valid_depth=0)
    session.layout = layout
    session.caches.notify("repartition")


def _owned_rows_on(session, d, seed_set, what: str) -> np.ndarray:
    """The owned rows of dat ``d``, which must live on ``seed_set`` (DeclarationError if not)."""
    if getattr(d, "dataset", None) is not seed_set:
        where = f" on {d.dataset.name!r}" if hasattr(d, "dataset") else ""
        raise DeclarationError(
            f"mc.repartition: {what} must be a Dat on the seed set {seed_set.name!r} (the set partitioned "
            f"first), got {getattr(d, 'name', type(d).__name__)!r}{where}.")
    storage = session.storage(d)
    return storage.host_current(write=False)[: storage.n_owned]
