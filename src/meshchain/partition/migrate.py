"""Live repartitioning: new owners for a distributed mesh, and moving rows to them.

:func:`repartitioned` computes a new partition of a mesh that is already distributed
(``mc.repartition``): the seed set is partitioned from where its elements are now
(``"rib"`` from the owned coordinates, ``"kway"`` from the seed set's graph in block
distribution, ``"block"``), optionally weighted per element for load balance; the owners
of the other sets follow through the maps exactly as in :func:`~.distribute.distribute`,
and halo layers are rebuilt as deep as before.

:func:`migrated_rows` moves a dat's owned rows from their old owners to their new ones
with the dynamic sparse exchange (:func:`meshchain.comm.sparse.exchange_rows`: every rank
sends only to the ranks that receive its elements, no all-to-all), and places them in the
new local numbering. Halo rows are left zero: the caller marks the dat's halo invalid, so
the next loop that reads it exchanges first.

Every function here is collective over ``comm``.
"""

from __future__ import annotations

import numpy as np

from ..comm.blocks import block_offsets, block_owner
from ..comm.collectives import fetch_rows
from ..comm.sparse import exchange_rows
from ..core.errors import DeclarationError, InternalError
from . import partitioners
from .distribute import derive_owners, laid_out, primary_maps, seed_adjacency
from .layout import MeshLayout

__all__ = ["repartitioned", "checked_weights", "Moves", "moves_of", "migrated_rows"]


def repartitioned(comm, layout: MeshLayout, *, sets, maps, map_blocks: dict, seed_set, method: str,
                  coords_rows=None, weights=None, seed: int = 0) -> MeshLayout:
    """The layout of a new partition of the distributed mesh ``layout`` (same halo depth).

    ``coords_rows`` (for ``"rib"``) and ``weights`` are given for the seed set's owned
    elements, in local order.
    """
    owned = layout.of(seed_set)
    ids = owned.global_ids[: owned.n_owned].astype(np.int64)
    offsets = block_offsets(seed_set.size, comm.size)
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    if method == "rib":
        parts = partitioners.rib(np.asarray(coords_rows, dtype=np.float64), comm, global_ids=ids, weights=weights)
        seed_owners = _to_blocks(comm, ids, np.asarray(parts, dtype=np.int64), offsets)
    elif method == "kway":
        block_weights = None if weights is None else _to_blocks(comm, ids, np.asarray(weights, np.float64), offsets)
        xadj, adjncy = seed_adjacency(comm, seed_set, primary_maps(maps), map_blocks)
        parts = partitioners.kway(xadj, adjncy, comm, seed=seed, weights=block_weights)
        seed_owners = np.asarray(parts, dtype=np.int64)
    else:  # "block" (weights would not change contiguous blocks)
        seed_owners = np.full(hi - lo, comm.rank, dtype=np.int64)
    owners = derive_owners(comm, sets, maps, map_blocks, seed_set, seed_owners)
    return laid_out(comm, sets, maps, map_blocks, owners, layout.depth)


def checked_weights(weights, n_owned: int, set_name: str) -> np.ndarray:
    """``weights`` of the seed set's ``n_owned`` owned elements as float64, or a
    DeclarationError that says what is wrong (wrong shape, not finite, negative)."""
    try:
        values = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DeclarationError(f"mc.repartition: weights could not be read as numbers ({exc}); pass one "
                               f"non-negative weight per owned element of {set_name!r}.") from exc
    if values.ndim == 2 and values.shape[1:] == (1,):
        values = values[:, 0]
    if values.shape != (n_owned,):
        raise DeclarationError(f"mc.repartition: weights have shape {values.shape}, but this rank owns {n_owned} "
                               f"elements of the seed set {set_name!r}; pass one weight per owned element "
                               f"(shape ({n_owned},), local order, as in dat.data), or a Dat on {set_name!r}.")
    bad = ~np.isfinite(values) | (values < 0)
    if bad.any():
        raise DeclarationError(f"mc.repartition: weight {values[bad][0]!r} of owned element {int(np.flatnonzero(bad)[0])} "
                               f"of {set_name!r} is negative or not finite; weights must be finite and >= 0.")
    return values


def _to_blocks(comm, ids: np.ndarray, values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Values given at owned global ``ids``, as this rank's rows of the block distribution."""
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    received, _ = exchange_rows(comm, np.ascontiguousarray(values), block_owner(offsets, ids))
    where, _ = exchange_rows(comm, ids, block_owner(offsets, ids))
    out = np.zeros(hi - lo, dtype=values.dtype)
    out[where - lo] = received
    return out


class Moves:
    """Where one set's owned elements go: ``destinations`` (new owner of each old owned
    element, local order) and ``arrivals`` (new local position of each row this rank
    receives, in the order :func:`~meshchain.comm.sparse.exchange_rows` delivers them)."""

    __slots__ = ("destinations", "arrivals", "n_new")

    def __init__(self, destinations: np.ndarray, arrivals: np.ndarray, n_new: int):
        self.destinations, self.arrivals, self.n_new = destinations, arrivals, n_new


def moves_of(comm, s, old: MeshLayout, new: MeshLayout) -> Moves:
    """How set ``s``'s owned elements move from ``old`` to ``new`` (collective)."""
    before, after = old.of(s), new.of(s)
    ids = before.global_ids[: before.n_owned].astype(np.int64)
    destinations = fetch_rows(comm, block_offsets(s.size, comm.size), new.owner_blocks[s.uid], ids)
    arrived, _ = exchange_rows(comm, ids, destinations)
    owned_now = after.global_ids[: after.n_owned].astype(np.int64)
    order = np.argsort(owned_now, kind="stable")
    positions = order[np.searchsorted(owned_now, arrived, sorter=order)] if len(arrived) else arrived
    if len(arrived) != after.n_owned or (len(arrived) and not np.array_equal(owned_now[positions], arrived)):
        raise InternalError(f"set {s.name!r}: {len(arrived)} owned elements arrived for {after.n_owned} new owned "
                           f"ones; the repartition lost or duplicated elements (a meshchain bug)")
    return Moves(destinations.astype(np.int64), positions.astype(np.int64), len(after.global_ids))


def migrated_rows(comm, rows: np.ndarray, moves: Moves) -> np.ndarray:
    """``rows`` (a dat's owned rows, old local order) moved to their new owners: the new
    local array (owned rows placed, halo rows zero)."""
    owned = np.ascontiguousarray(rows)
    arrived, _ = exchange_rows(comm, owned, moves.destinations)
    result = np.zeros((moves.n_new,) + owned.shape[1:], dtype=owned.dtype)
    result[moves.arrivals] = arrived
    return result
