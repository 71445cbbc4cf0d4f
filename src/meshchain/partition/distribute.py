"""Distributing a declared mesh: owners for every element, halo layers, local numbering.

Steps (all collective, all on block-distributed tables, so no rank ever holds the
whole mesh except rank 0 for ``"kway"``, whose graph is gathered there):

1. partition a seed set: ``"block"`` (the block distribution itself), ``"rib"``
   (parallel recursive inertial bisection of a coordinate dat), ``"kway"`` (METIS on
   the seed set's adjacency graph);
2. derive every other set's owners through the maps (a row follows its first target;
   a target follows the lowest-ranked row that reaches it; a subset follows its parent
   through its injection map, and maps the library composed for subsets take no part);
3. build halo layers and local numbering (:mod:`.layout`) into a
   :class:`~.layout.MeshLayout`.

The functions here take the declarations and their block rows explicitly and return
the layout; the session moves the dats' rows (:func:`moved_rows`, or a fetch by global
id) and announces the change to its caches.
"""

from __future__ import annotations

import numpy as np

from ..comm.blocks import block_offsets, block_owner
from ..comm.collectives import alltoallv, concatenated_ranges, fetch_rows
from ..core.arrays import unique_integers
from ..core.errors import ConfigurationError
from ..types.extruded import ExtrudedSet
from ..types.maps import ComposedMap
from ..types.subsets import Subset
from .grid_layout import GridParts, grid_layouts
from .layout import MeshLayout, build_layouts

__all__ = ["distribute", "deepen", "moved_rows", "check_options", "seed_set_of", "checked_seed_set",
           "derive_owners", "laid_out", "primary_maps", "seed_adjacency", "METHODS", "MAX_DEPTH"]

METHODS = ("rib", "kway", "block")
MAX_DEPTH = 48  # halo layers: enough for a grid chain of 40 sweeps (the CA stencil study's steps)


def distribute(comm, *, sets, maps, map_blocks: dict, method: str, coords_rows=None, coords_set=None,
               seed_set=None, depth: int = 1, seed: int = 0, grids: GridParts | None = None) -> MeshLayout:
    """Partition the declared mesh over ``comm`` (collective) and lay it out ``depth`` layers deep.

    ``map_blocks`` has each map's block rows by ``uid``; ``coords_rows`` the block rows of the
    coordinates for ``"rib"`` (whose set, ``coords_set``, is then the seed set by default).
    ``grids``: the structured grids (in ``sets``), laid out by their block decomposition.
    """
    grids = grids or GridParts({}, {})
    sets = [s for s in sets if not grids.holds(s)]
    if not sets:
        return laid_out(comm, sets, maps, map_blocks, {}, depth, grids=grids)
    seed_set = checked_seed_set(method, sets, maps, coords_set, seed_set)
    seed_owners = _seed_owners(comm, method, seed_set, primary_maps(maps), map_blocks, coords_rows, seed)
    owners = derive_owners(comm, sets, maps, map_blocks, seed_set, seed_owners)
    return laid_out(comm, sets, maps, map_blocks, owners, depth, grids=grids)


def deepen(comm, layout: MeshLayout, *, sets, maps, map_blocks: dict, depth: int) -> MeshLayout:
    """The same partition with halo layers ``1..depth`` (collective; ``depth`` > ``layout.depth``)."""
    if depth > MAX_DEPTH:
        raise ConfigurationError(
            f"a halo of depth {depth} is needed but at most {MAX_DEPTH} layers can be built; "
            f"shorten the loop chain or lower its maximum halo extension."
        )
    grids = layout.grids
    return laid_out(comm, [s for s in sets if not grids.holds(s)], maps, map_blocks, layout.owner_blocks, depth,
                    grids=grids)


def laid_out(comm, sets, maps, map_blocks, owners: dict, depth: int, *, grids=None) -> MeshLayout:
    """The layout of mesh ``sets`` (their owners given) and of ``grids``, ``depth`` layers deep."""
    grids = grids or GridParts({}, {})
    by_object = {m: map_blocks[m.uid] for m in maps}
    layouts, local_maps = build_layouts(comm, sets, {s: owners[s.uid] for s in sets}, maps, by_object, depth)
    grid_sets, grid_maps = grid_layouts(comm, grids.blocks, grids.boxes, depth)
    layouts.update(grid_sets)
    local_maps.update(grid_maps)
    return MeshLayout({s.uid: layout for s, layout in layouts.items()},
                      {m.uid: _local_values(m, values) for m, values in local_maps.items()},
                      depth=depth, map_sources=frozenset(m.source.uid for m in local_maps), owner_blocks=owners,
                      grids=grids)


def moved_rows(rows, old_ids, new_ids):
    """Rows indexed by ``old_ids`` placed at the positions of the same ids in ``new_ids``.

    Rows whose id is not in ``new_ids`` are left behind: a deeper layout is built from the
    maps still alive on every rank, so a halo element that only a garbage-collected map
    reached is no longer imported. (Owned elements never go; rows new in ``new_ids`` stay
    unset until an exchange fills them.)

    >>> moved_rows(np.array([[1], [2], [3]]), np.array([10, 30, 20]), np.array([20, 10, 40]))[:2].tolist()
    [[3], [1]]
    """
    moved = np.empty((len(new_ids),) + rows.shape[1:], dtype=rows.dtype)
    if not len(new_ids) or not len(old_ids):
        return moved
    sorter = np.argsort(new_ids, kind="stable")
    positions = sorter[np.minimum(np.searchsorted(new_ids, old_ids, sorter=sorter), len(new_ids) - 1)]
    kept = new_ids[positions] == old_ids
    moved[positions[kept]] = rows[kept]
    return moved


def check_options(method, coords, depth, *, needs_coords: bool = True) -> None:
    """Refuse a partition method, coordinates or depth that cannot work (every rank alike);
    ``needs_coords`` False: the program has only grids, which ``"rib"`` leaves to their blocks."""
    if method not in METHODS:
        raise ConfigurationError(f"partition method {method!r} is unknown; choose one of {', '.join(METHODS)}.")
    if method == "rib" and coords is None and needs_coords:
        raise ConfigurationError("partition('rib') needs coordinates: pass coords=<Dat of coordinates>.")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise ConfigurationError(f"depth must be an integer in [1, {MAX_DEPTH}], got {depth!r}.")


def checked_seed_set(method: str, sets, maps, coords_set, seed_set):
    """The seed set (:func:`seed_set_of`) after refusing a subset as the seed or the
    coordinates' set, and ``"rib"`` coordinates of another set than the seed set (the same
    arguments on every rank: every rank raises; on one process too, so that a script refused on
    several ranks is refused when it is tried on one)."""
    for role, chosen in (("seed_set", seed_set), ("the coordinates' set", coords_set)):
        if isinstance(chosen, Subset):
            raise ConfigurationError(f"partition: {role} {chosen.name!r} is a Subset, which follows its parent's "
                                     f"partition; partition by {chosen.parent.name!r} (or a set it is part of).")
    seed_set = seed_set_of(sets, maps, coords_set, seed_set)
    if method == "rib" and coords_set is not None and seed_set is not coords_set:
        raise ConfigurationError(
            f"partition('rib') bisects the coordinates, which belong to set {coords_set.name!r}, but the seed set "
            f"is {seed_set.name!r}: pass coordinates of {seed_set.name!r} or leave seed_set out.")
    return seed_set


def seed_set_of(sets, maps, coords_set, seed_set):
    """The set partitioned first: ``seed_set`` if given, else the coordinates' set, else
    the set most maps point to (the largest on a tie; a subset only when every set is one)."""
    if seed_set is not None:
        return seed_set
    if coords_set is not None:
        return coords_set
    maps = primary_maps(maps)
    candidates = [s for s in sets if not isinstance(s, Subset)] or sets
    pointed = {s: sum(1 for m in maps if m.target is s) for s in candidates}
    return max(candidates, key=lambda s: (pointed[s], s.size, -sets.index(s)))


def primary_maps(maps) -> list:
    """``maps`` without those the library composed for subsets (they repeat declared rows)."""
    return [m for m in maps if not isinstance(m, ComposedMap)]


def _may_follow(m) -> bool:
    """Whether ``m``'s rows may take their owners from its targets: a subset's only through
    its injection map."""
    return not isinstance(m.source, Subset) or m is m.source.injection


def _seed_owners(comm, method, seed_set, maps, map_blocks, coords_rows, seed):
    offsets = block_offsets(seed_set.size, comm.size)
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    if method == "block":
        return np.full(hi - lo, comm.rank, dtype=np.int64)
    from . import partitioners

    if method == "rib":
        points = np.asarray(coords_rows, dtype=np.float64)
        parts = partitioners.rib(points, comm, global_ids=np.arange(lo, hi, dtype=np.int64))
    else:
        xadj, adjncy = seed_adjacency(comm, seed_set, maps, map_blocks)
        parts = partitioners.kway(xadj, adjncy, comm, seed=seed)
    return np.asarray(parts, dtype=np.int64)


def seed_adjacency(comm, seed_set, maps, map_blocks):
    """The seed set's graph (CSR over this rank's block rows, global neighbour ids)."""
    offsets = block_offsets(seed_set.size, comm.size)
    pairs = []
    for m in maps:
        if m.target is seed_set and m.arity >= 2:
            rows = map_blocks[m.uid].astype(np.int64)
            for i in range(m.arity):
                for j in range(m.arity):
                    if i != j:
                        pairs.append(np.stack([rows[:, i], rows[:, j]], axis=1))
    if not pairs:  # elements sharing a target of a map from the seed set are neighbours
        for m in maps:
            if m.source is seed_set:
                pairs += _shared_target_pairs(comm, m, map_blocks[m.uid], offsets)
    edges = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    edges = edges[edges[:, 0] != edges[:, 1]]
    received, _ = alltoallv(comm, edges, block_owner(offsets, edges[:, 0]))
    keys = unique_integers(received[:, 0] * seed_set.size + received[:, 1]) if len(received) else np.zeros(0, np.int64)
    received = np.stack([keys // max(seed_set.size, 1), keys % max(seed_set.size, 1)], axis=1)
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    xadj = np.searchsorted(received[:, 0], np.arange(lo, hi + 1)).astype(np.int64)
    return xadj, received[:, 1].astype(np.int64)


def _shared_target_pairs(comm, m, block_rows, seed_offsets):
    rows = block_rows.astype(np.int64)
    lo = seed_offsets[comm.rank]
    sources = np.repeat(np.arange(lo, lo + rows.shape[0], dtype=np.int64), m.arity)
    targets = rows.ravel()
    target_offsets = block_offsets(m.target.size, comm.size)
    received, _ = alltoallv(comm, np.stack([targets, sources], axis=1), block_owner(target_offsets, targets))
    if not len(received):
        return []
    received = received[np.lexsort((received[:, 1], received[:, 0]))]
    # every pair of sources sharing a target: element j of a group [s, s + g) pairs with s .. s + g - 1
    starts = np.concatenate(([0], np.flatnonzero(np.diff(received[:, 0])) + 1))
    sizes = np.diff(np.concatenate((starts, [len(received)])))
    group_start, group_size = np.repeat(starts, sizes), np.repeat(sizes, sizes)
    first = np.repeat(np.arange(len(received)), group_size)
    second = concatenated_ranges(group_start, group_size)
    return [np.stack([received[first, 1], received[second, 1]], axis=1)]


def derive_owners(comm, sets, maps, map_blocks, seed_set, seed_owners) -> dict:
    """Owners of every set (by ``uid``): rows follow their first target; targets the lowest
    referencing rank; a subset its parent (through its injection map only). A set no map
    connects to the seed set keeps the block distribution (and its subsets follow it). The
    layers of a column of an :class:`~meshchain.ExtrudedSet` stay together, with the owner of
    its bottom layer (the seed set's before anything follows it, and every extruded set's)."""
    maps = primary_maps(maps)
    owners = {seed_set: whole_columns(comm, seed_set, seed_owners)}
    while len(owners) < len(sets):
        follower = next((m for m in maps if m.source not in owners and m.target in owners and _may_follow(m)), None)
        if follower is not None:
            offsets = block_offsets(follower.target.size, comm.size)
            first = map_blocks[follower.uid][:, 0].astype(np.int64)
            owners[follower.source] = fetch_rows(comm, offsets, owners[follower.target], first)
            continue
        leader = next((m for m in maps if m.source in owners and m.target not in owners
                       and not isinstance(m.target, Subset)), None)
        if leader is not None:
            owners[leader.target] = _lowest_referencing_owner(comm, leader, map_blocks[leader.uid],
                                                              owners[leader.source])
            continue
        alone = next((s for s in sets if s not in owners and not isinstance(s, Subset)), None)
        if alone is None:
            break
        offsets = block_offsets(alone.size, comm.size)  # not connected to the seed set: the block distribution
        owners[alone] = np.full(offsets[comm.rank + 1] - offsets[comm.rank], comm.rank, dtype=np.int64)
    return {s.uid: whole_columns(comm, s, owned) for s, owned in owners.items()}


def whole_columns(comm, s, owners: np.ndarray) -> np.ndarray:
    """``owners`` (this rank's block of set ``s``'s) with every element of an extruded set's
    column given its bottom element's owner (columns are numbered contiguously); unchanged for
    other sets. Collective over the ranks when ``s`` is extruded."""
    if not isinstance(s, ExtrudedSet):
        return owners
    offsets = block_offsets(s.size, comm.size)
    ids = np.arange(offsets[comm.rank], offsets[comm.rank + 1], dtype=np.int64)
    return fetch_rows(comm, offsets, owners, ids - ids % s.layers)


def _lowest_referencing_owner(comm, m, block_rows, source_owners):
    offsets = block_offsets(m.target.size, comm.size)
    targets = block_rows.ravel().astype(np.int64)
    ranks = np.repeat(source_owners, m.arity)
    received, _ = alltoallv(comm, np.stack([targets, ranks], axis=1), block_owner(offsets, targets))
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    result = np.full(hi - lo, comm.size, dtype=np.int64)
    np.minimum.at(result, received[:, 0] - lo, received[:, 1])
    result[result == comm.size] = comm.rank
    return result


def _local_values(m, local_values) -> np.ndarray:
    dtype = np.int32 if len(local_values) < np.iinfo(np.int32).max else np.int64
    values = np.ascontiguousarray(local_values, dtype=dtype).reshape(-1, m.arity)
    values.flags.writeable = False
    return values
