"""``mc.partition``: give every element an owner rank, build halos, renumber locally.

Steps (all collective, all on block-distributed tables, so no rank ever holds the
whole mesh except rank 0 for ``"kway"``, whose graph is gathered there):

1. partition a seed set: ``"block"`` (the block distribution itself), ``"rib"``
   (parallel recursive inertial bisection of a coordinate dat), ``"kway"`` (METIS on
   the seed set's adjacency graph);
2. derive every other set's owners through the maps (a row follows its first target;
   a target follows the lowest-ranked row that reaches it);
3. build halo layers and local numbering (:mod:`.layout`);
4. replace every map's values and every dat's rows by their local versions.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import ConfigurationError, DeclarationError
from ..comm.collectives import _ranges, alltoallv, block_offsets, block_owner, fetch_rows, raise_together
from .layout import build_layouts

__all__ = ["partition", "ensure_depth", "METHODS", "MAX_DEPTH"]

METHODS = ("rib", "kway", "block")
MAX_DEPTH = 16


def partition(method: str = "rib", *, coords=None, seed_set=None, depth: int = 1, seed: int = 0):
    """Distribute the declared mesh over the ranks; a no-op on one process.

    Parameters
    ----------
    method : {"rib", "kway", "block"}
        ``"rib"``: recursive inertial bisection of ``coords``, computed in parallel
        (no rank ever holds the whole mesh). ``"kway"``: METIS k-way on the seed set's
        graph gathered to rank 0 (the whole graph, about (n + nnz) * 8 bytes, must fit
        in rank 0's memory; pymetis uses 32-bit indices). ``"block"``: contiguous blocks
        of the seed set.
    coords : Dat, keyword-only
        Coordinates for ``"rib"`` (its set is the seed set).
    seed_set : Set, keyword-only
        The set partitioned first (default: ``coords``' set, else the set most maps point to).
    depth : int, keyword-only
        Halo layers to build (1 suffices for loop-by-loop execution; at most 16).
    seed : int, keyword-only
        Random seed for METIS.

    Examples
    --------
    >>> import meshchain as mc
    >>> mc.partition("block")   # one process: nothing to distribute
    """
    from ..engine.session import get_runtime

    runtime = get_runtime()
    _check_options(method, coords, depth)
    runtime.flush()
    if not runtime.distributed:
        runtime.partitioned = True
        return
    comm = runtime.comm
    raise_together(comm, DeclarationError("mc.partition was already called; declare the mesh once and partition it once.")
                   if runtime.partitioned else None)
    sets, maps, dats = runtime.declared(agreed=True)
    seed_set = _seed_set(sets, maps, coords, seed_set)
    seed_owners = _seed_owners(comm, method, seed_set, maps, coords, seed)
    owners = _derive_owners(comm, sets, maps, seed_set, seed_owners)
    layouts, local_maps = build_layouts(comm, sets, owners, maps, {m: m._block_values for m in maps}, depth)
    for s in sets:
        s._layout = layouts[s]
    for m in maps:
        _localise_map(m, local_maps[m])
    for d in dats:
        d._data = fetch_rows(comm, block_offsets(d.dataset.size, comm.size), d._data, layouts[d.dataset].global_ids)
        d._valid_depth = depth
    runtime.partitioned = True
    runtime.depth = depth
    runtime.halo_map_sources = {id(m.source) for m in maps}
    runtime.owner_blocks = owners  # O(n / ranks) per set: what deeper halos are built from


def ensure_depth(depth: int, *, flush: bool = True) -> None:
    """Make sure halo layers ``1..depth`` exist on every rank (collective); builds the missing
    layers on demand. Local numbers may change: dats keep their values (moved by global
    id), new rows are filled by the next exchange that needs them, cached plans are dropped.
    Pending loops run first unless ``flush`` is False (the executor, between loops it
    has taken from the trace).
    """
    from ..engine.session import get_runtime

    runtime = get_runtime()
    if not runtime.distributed or depth <= runtime.depth:
        return
    if depth > MAX_DEPTH:
        raise ConfigurationError(
            f"a halo of depth {depth} is needed but at most {MAX_DEPTH} layers can be built; "
            f"shorten the loop chain or lower its maximum halo extension."
        )
    if flush:
        runtime.flush()
    comm = runtime.comm
    sets, maps, dats = runtime.declared(agreed=True)
    layouts, local_maps = build_layouts(
        comm, sets, runtime.owner_blocks, maps, {m: m._block_values for m in maps}, depth
    )
    for d in dats:
        d._data = _moved_rows(d._data, d.dataset._layout.global_ids, layouts[d.dataset].global_ids)
        d._readonly_view = None
    for s in sets:
        s._layout = layouts[s]
    for m in maps:
        _localise_map(m, local_maps[m])
    runtime.forget_plans()
    runtime.depth = depth
    runtime.halo_map_sources = {id(m.source) for m in maps}


def _moved_rows(rows, old_ids, new_ids):
    """Rows indexed by ``old_ids`` placed at the positions of the same ids in ``new_ids``."""
    moved = np.empty((len(new_ids),) + rows.shape[1:], dtype=rows.dtype)
    sorter = np.argsort(new_ids, kind="stable")
    moved[sorter[np.searchsorted(new_ids, old_ids, sorter=sorter)]] = rows
    return moved


def _check_options(method, coords, depth) -> None:
    if method not in METHODS:
        raise ConfigurationError(f"partition method {method!r} is unknown; choose one of {', '.join(METHODS)}.")
    if method == "rib" and coords is None:
        raise ConfigurationError("partition('rib') needs coordinates: pass coords=<Dat of coordinates>.")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise ConfigurationError(f"depth must be an integer in [1, {MAX_DEPTH}], got {depth!r}.")


def _seed_set(sets, maps, coords, seed_set):
    if seed_set is not None:
        return seed_set
    if coords is not None:
        return coords.dataset
    pointed = {s: sum(1 for m in maps if m.target is s) for s in sets}
    return max(sets, key=lambda s: (pointed[s], s.size, -sets.index(s)))


def _seed_owners(comm, method, seed_set, maps, coords, seed):
    offsets = block_offsets(seed_set.size, comm.size)
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    if method == "block":
        return np.full(hi - lo, comm.rank, dtype=np.int64)
    from . import partitioners

    if method == "rib":
        points = np.asarray(coords._data, dtype=np.float64)
        parts = partitioners.rib(points, comm, global_ids=np.arange(lo, hi, dtype=np.int64))
    else:
        xadj, adjncy = _adjacency(comm, seed_set, maps)
        parts = partitioners.kway(xadj, adjncy, comm, seed=seed)
    return np.asarray(parts, dtype=np.int64)


def _adjacency(comm, seed_set, maps):
    """The seed set's graph (CSR over this rank's block rows, global neighbour ids)."""
    offsets = block_offsets(seed_set.size, comm.size)
    pairs = []
    for m in maps:
        if m.target is seed_set and m.arity >= 2:
            rows = m._block_values.astype(np.int64)
            for i in range(m.arity):
                for j in range(m.arity):
                    if i != j:
                        pairs.append(np.stack([rows[:, i], rows[:, j]], axis=1))
    if not pairs:  # elements sharing a target of a map from the seed set are neighbours
        for m in maps:
            if m.source is seed_set:
                pairs += _shared_target_pairs(comm, m, offsets)
    edges = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    edges = edges[edges[:, 0] != edges[:, 1]]
    received, _ = alltoallv(comm, edges, block_owner(offsets, edges[:, 0]))
    keys = np.unique(received[:, 0] * seed_set.size + received[:, 1]) if len(received) else np.zeros(0, np.int64)
    received = np.stack([keys // max(seed_set.size, 1), keys % max(seed_set.size, 1)], axis=1)
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    xadj = np.searchsorted(received[:, 0], np.arange(lo, hi + 1)).astype(np.int64)
    return xadj, received[:, 1].astype(np.int64)


def _shared_target_pairs(comm, m, seed_offsets):
    rows = m._block_values.astype(np.int64)
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
    second = _ranges(group_start, group_size)
    return [np.stack([received[first, 1], received[second, 1]], axis=1)]


def _derive_owners(comm, sets, maps, seed_set, seed_owners):
    """Owners of every set: rows follow their first target; targets the lowest referencing rank."""
    owners = {seed_set: seed_owners}
    while len(owners) < len(sets):
        follower = next((m for m in maps if m.source not in owners and m.target in owners), None)
        if follower is not None:
            offsets = block_offsets(follower.target.size, comm.size)
            first = follower._block_values[:, 0].astype(np.int64)
            owners[follower.source] = fetch_rows(comm, offsets, owners[follower.target], first)
            continue
        leader = next((m for m in maps if m.source in owners and m.target not in owners), None)
        if leader is None:
            break
        owners[leader.target] = _lowest_referencing_owner(comm, leader, owners[leader.source])
    for s in sets:
        if s not in owners:  # not connected to the seed set by any map: keep the block distribution
            offsets = block_offsets(s.size, comm.size)
            owners[s] = np.full(offsets[comm.rank + 1] - offsets[comm.rank], comm.rank, dtype=np.int64)
    return owners


def _lowest_referencing_owner(comm, m, source_owners):
    offsets = block_offsets(m.target.size, comm.size)
    targets = m._block_values.ravel().astype(np.int64)
    ranks = np.repeat(source_owners, m.arity)
    received, _ = alltoallv(comm, np.stack([targets, ranks], axis=1), block_owner(offsets, targets))
    lo, hi = offsets[comm.rank], offsets[comm.rank + 1]
    result = np.full(hi - lo, comm.size, dtype=np.int64)
    np.minimum.at(result, received[:, 0] - lo, received[:, 1])
    result[result == comm.size] = comm.rank
    return result


def _localise_map(m, local_values) -> None:
    dtype = np.int32 if len(local_values) < np.iinfo(np.int32).max else np.int64
    values = np.ascontiguousarray(local_values, dtype=dtype).reshape(-1, m.arity)
    values.flags.writeable = False
    m.values = values
    m._unsigned_view = None
