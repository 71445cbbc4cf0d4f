"""Halo layers and local numbering of a partitioned mesh (DESIGN §3).

Input: every set's owner ranks and every map's rows, in block distribution (rank r
holds global ids ``block_offsets(n, P)[r:r+2]``). Output, on each rank, a
:class:`SetLayout` per set and the local values of every map.

Layers (OP2's exec and non-exec halos, to any depth). Every element a rank holds has a
*data layer* (from which depth on its values are present) and an *exec layer* (from
which execution depth on the rank runs it redundantly). Owned elements have both 0.
Layer k: every row of a map ``S -> T`` that reaches an element of T whose data layer
is below k gets exec layer k (and data layer k if it had none); then the targets of
the rows of exec layer k (at k = 1 also of the owned rows) get data layer k. One hop:
elements that are only imported do not pull in their own targets, so maps that form a
cycle (cells -> cells) do not drag the mesh in. A set no map starts from is only ever
iterated by direct loops, which need nothing but the element's own rows: every element
of its halo runs from its data layer on (OP2's CA back-end extends every set's halo the
same way), so a chain can compute such a set redundantly as deep as it needs.
Membership is kept as (element, rank) pairs at the element's block owner; layers *pull*
the memberships of each row's targets and *push* memberships to targets, all vectorised.

Numbering (per set, per rank): owned elements sorted by decreasing distance from the
partition boundary (``level``; interior first), then halo elements by exec layer (those
never run last), data layer, owner rank and global id. Core, owned and owned plus the
exec halo to any depth are prefixes; exchanges go by data layer with explicit lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..comm.blocks import block_offsets, block_owner
from ..core.arrays import unique_integers
from ..core.errors import DeclarationError, InternalError
from ..types.layers import follows_layers
from ..types.maps import ColumnsMap
from ..comm.collectives import alltoallv, concatenated_ranges, fetch_csr, fetch_rows
from ..comm.reductions import min_everywhere

__all__ = ["SetLayout", "MeshLayout", "build_layouts", "layouts_of_regions", "order_region", "to_local", "INTERIOR",
           "MAX_LEVEL"]

INTERIOR = np.iinfo(np.int32).max  # level of owned elements far from any partition boundary
MAX_LEVEL = 50  # levels are told apart up to here (core ranges for halo depths up to 48); deeper is INTERIOR
# (structured grids cap their levels lower: see layouts_of_regions and grid_layout.level_cap)


@dataclass
class SetLayout:
    """How one set is laid out on this rank.

    Attributes
    ----------
    global_ids : ndarray of int64
        Global id of each local element, in local order.
    n_owned : int
    exec_ends : ndarray of int64
        ``exec_ends[e]``: owned elements plus those run at execution depth ``e``
        (a prefix; ``exec_ends[0] == n_owned``).
    data_layers, exec_layers : ndarray of int64
        Per local element: data layer and exec layer (``depth + 1``: never run).
    levels : ndarray of int32
        Distance of each owned element from the partition boundary (non-increasing), up
        to the set's cap (see :func:`layouts_of_regions`).
    owners : ndarray of int32
        Owner rank of each local element.
    imports, exports : dict
        ``{neighbour: [indices of data layer 1, of data layer 2, ...]}``: local indices
        received from / sent to each neighbour, in matching order.
    covered_depths : ndarray of int64 or None
        ``covered_depths[e]``: :meth:`covered` agreed over the ranks (the minimum), set by
        :func:`build_layouts`; every rank must reach the same validity decisions.
    """

    global_ids: np.ndarray
    n_owned: int
    exec_ends: np.ndarray
    data_layers: np.ndarray
    exec_layers: np.ndarray
    levels: np.ndarray
    owners: np.ndarray
    imports: dict = field(default_factory=dict)
    exports: dict = field(default_factory=dict)
    covered_depths: np.ndarray | None = None

    @property
    def depth(self) -> int:
        return len(self.exec_ends) - 1

    def exec_end(self, depth: int) -> int:
        """End of the prefix run at execution depth ``depth``."""
        return int(self.exec_ends[min(depth, self.depth)])

    def covered(self, depth: int) -> int:
        """Largest ``d`` such that every element of data layers ``<= d`` is run at execution
        depth ``depth``: how deep a dat written directly by such a loop is valid (the same
        on every rank once :func:`build_layouts` agreed it)."""
        if self.covered_depths is not None:
            return int(self.covered_depths[min(depth, self.depth)])
        return self.local_covered(depth)

    def local_covered(self, depth: int) -> int:
        """:meth:`covered` from this rank's elements only."""
        d = 0
        while d < self.depth and np.all(self.exec_layers[self.data_layers == d + 1] <= depth):
            d += 1
        return d

    def core(self, threshold: int) -> int:
        """Number of owned elements (a prefix) whose level exceeds ``threshold``."""
        return int(np.count_nonzero(self.levels > threshold))

    @property
    def neighbours(self) -> list[int]:
        return sorted(set(self.imports) | set(self.exports))


    @classmethod
    def whole(cls, size: int) -> "SetLayout":
        """The layout of a set that is not distributed: every element owned, no halo."""
        zeros = np.zeros(size, dtype=np.int64)
        return cls(np.arange(size, dtype=np.int64), size, np.array([size], dtype=np.int64), zeros, zeros,
                   np.full(size, INTERIOR, dtype=np.int32), np.zeros(size, dtype=np.int32),
                   covered_depths=np.zeros(1, dtype=np.int64))


class MeshLayout:
    """How the whole mesh is laid out on this rank: a :class:`SetLayout` per set and the
    local values of every map (both by the object's ``uid``), the halo layers built, the
    sets that maps start from (their halos can be run), and the owners of this rank's
    block rows of each set (what deeper halos are built from).

    :meth:`serial` is the layout of a mesh on one process: no halo, every set's layout
    made on first use, every map's values the declared ones.

    Examples
    --------
    >>> import meshchain as mc
    >>> from meshchain.partition.layout import MeshLayout
    >>> cells = mc.Set(3, "cells")
    >>> layout = MeshLayout.serial({})
    >>> layout.of(cells).n_owned, layout.depth, layout.distributed
    (3, 0, False)
    """

    def __init__(self, sets: dict, maps: dict, *, depth: int, map_sources=frozenset(), owner_blocks=None,
                 distributed: bool = True, grids=None):
        self.sets, self.maps, self.depth = sets, maps, depth
        self.grids = grids  # the structured grids' block counts and box maps (GridParts), if any
        self.map_sources = frozenset(map_sources)
        self.owner_blocks = owner_blocks
        self.distributed = distributed
        self._follow_layers: dict = {}  # map uid -> whether its local rows follow its layers

    @classmethod
    def serial(cls, map_values: dict) -> "MeshLayout":
        return cls({}, map_values, depth=0, distributed=False)

    def of(self, s) -> SetLayout:
        """The layout of set ``s``."""
        layout = self.sets.get(s.uid)
        if layout is None:
            if self.distributed:
                raise DeclarationError(f"Set {s.name!r} is not part of this session's mesh (it was declared "
                                       f"in another session, or after mc.partition); declare it again.")
            layout = self.sets[s.uid] = SetLayout.whole(s.size)
        return layout

    def values(self, m):
        """Map ``m``'s values in local numbering (None when it has none here). A
        :class:`~meshchain.types.maps.ColumnsMap`'s are derived from its base map's on first use."""
        found = self.maps.get(m.uid)
        if found is None and isinstance(m, ColumnsMap):
            base = None if m.base is None else self.values(m.base)
            if m.base is None or base is not None:
                found = self.maps[m.uid] = m.local_values(base, len(self.of(m.source).global_ids))
        return found

    def follows_layers(self, m) -> bool:
        """Whether the local rows of extruded map ``m`` that may run here follow its layers
        (:func:`~meshchain.types.layers.follows_layers`), so that a loop over every layer of its
        source may find its targets by arithmetic on this rank (checked once per layout)."""
        found = self._follow_layers.get(m.uid)
        if found is None:
            values, source = self.values(m), self.of(m.source)
            found = values is not None and follows_layers(values, m.offset, m.source.layers,
                                                          source.exec_end(self.depth))
            self._follow_layers[m.uid] = found
        return found


# --- membership pairs ---------------------------------------------------------------------


class _Members:
    """(element, rank, layer) triples of one set, kept at the element's block owner."""

    def __init__(self, nranks: int, ids, ranks, layers):
        self.nranks = nranks
        self.ids, self.ranks, self.layers = ids, ranks, layers
        self._sort()

    def _sort(self):
        keys = self.ids * self.nranks + self.ranks
        order = np.argsort(keys, kind="stable")
        self.ids, self.ranks, self.layers = self.ids[order], self.ranks[order], self.layers[order]
        self.keys = keys[order]

    def add(self, ids, ranks, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Add pairs not present yet (with ``layer``); return the new ones."""
        keys = unique_integers(ids * self.nranks + ranks)
        new = keys[~np.isin(keys, self.keys, assume_unique=True)]
        new_ids, new_ranks = new // self.nranks, new % self.nranks
        self.ids = np.concatenate((self.ids, new_ids))
        self.ranks = np.concatenate((self.ranks, new_ranks))
        self.layers = np.concatenate((self.layers, np.full(len(new), layer, dtype=np.int64)))
        self._sort()
        return new_ids, new_ranks

    def layers_of(self, ids, ranks, missing: int) -> np.ndarray:
        """Layer of each (id, rank) pair; ``missing`` where the pair is absent."""
        keys = ids * self.nranks + ranks
        positions = np.searchsorted(self.keys, keys)
        found = positions < len(self.keys)
        found[found] = self.keys[positions[found]] == keys[found]
        result = np.full(len(keys), missing, dtype=np.int64)
        result[found] = self.layers[positions[found]]
        return result

    def csr(self, lo: int, hi: int):
        """Member ranks of block rows ``lo..hi-1`` as CSR (pointers, ranks)."""
        starts = np.searchsorted(self.ids, np.arange(lo, hi + 1))
        return (starts - starts[0]).astype(np.int64), self.ranks[starts[0] : starts[-1]]


def build_layouts(comm, sets, owner_blocks: dict, maps, map_blocks: dict, depth: int):
    """Build every set's :class:`SetLayout` and every map's local values on this rank.

    Parameters
    ----------
    sets : sequence of Set
    owner_blocks : dict Set -> ndarray
        Owner rank of each of this rank's block rows of the set.
    maps : sequence of Map
    map_blocks : dict Map -> ndarray
        This rank's block rows of the map (global target ids).
    depth : int
        Halo layers to build.
    """
    P, rank = comm.size, comm.rank
    offsets = {s: block_offsets(s.size, P) for s in sets}
    data, execs, owned = {}, {}, {}
    for s in sets:
        ids = np.arange(offsets[s][rank], offsets[s][rank + 1], dtype=np.int64)
        ranks = owner_blocks[s].astype(np.int64)
        data[s] = _Members(P, ids, ranks, np.zeros(len(ids), dtype=np.int64))
        execs[s] = _Members(P, ids.copy(), ranks.copy(), np.zeros(len(ids), dtype=np.int64))
        owned[s] = (ids, ranks)
    for layer in range(1, depth + 1):
        # exec layer: rows reaching data of layer < k (every map sees the same data, so the
        # result does not depend on the order the maps were declared in)
        pulled = [(m.source, _pull(comm, m, map_blocks[m], offsets, data)) for m in maps]
        run_here = {s: owned[s] if layer == 1 else _empty() for s in sets}
        for source, (ids, ranks) in pulled:
            new = execs[source].add(ids, ranks, layer)
            data[source].add(*new, layer)
            run_here[source] = _join(run_here[source], new)
        _push(comm, maps, map_blocks, offsets, data, run_here, layer)
    return _finish(comm, sets, maps, map_blocks, offsets, data, execs, depth)


def _empty():
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


def _join(a, b):
    return np.concatenate((a[0], b[0])), np.concatenate((a[1], b[1]))


def _pull(comm, m, block_rows, offsets, members):
    """``(rows, ranks)``: rows of ``m`` (this rank's block) and each rank whose region holds one
    of their targets."""
    source, target = m.source, m.target
    lo = offsets[source][comm.rank]
    if block_rows.size:
        unique_targets, inverse = unique_integers(block_rows, return_inverse=True)
    else:
        unique_targets, inverse = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    t_lo, t_hi = offsets[target][comm.rank], offsets[target][comm.rank + 1]
    pointers, ranks = members[target].csr(t_lo, t_hi)
    got_pointers, got_ranks = fetch_csr(comm, offsets[target], pointers, ranks, unique_targets)
    counts = np.diff(got_pointers)[inverse]
    row_of_target = np.repeat(np.arange(block_rows.shape[0], dtype=np.int64), block_rows.shape[1])
    rows = np.repeat(row_of_target, counts)
    pair_ranks = got_ranks[concatenated_ranges(got_pointers[:-1][inverse], counts)]
    return rows + lo, pair_ranks.astype(np.int64)


def _push(comm, maps, map_blocks, offsets, data, run_here, layer) -> None:
    """The targets of the rows run at this layer get this data layer (one hop)."""
    for m in maps:
        ids, ranks = run_here[m.source]
        lo = offsets[m.source][comm.rank]
        rows = map_blocks[m][ids - lo]
        targets = rows.ravel().astype(np.int64)
        target_ranks = np.repeat(ranks, rows.shape[1])
        destinations = block_owner(offsets[m.target], targets)
        got_ids, _ = alltoallv(comm, targets, destinations)
        got_ranks, _ = alltoallv(comm, target_ranks, destinations)
        data[m.target].add(got_ids, got_ranks, layer)


def _finish(comm, sets, maps, map_blocks, offsets, data, execs, depth):
    never = depth + 1  # exec layer of elements that are only imported
    sources = {m.source for m in maps}
    provisional = {}
    for s in sets:
        mem = data[s]
        lo = offsets[s][comm.rank]
        owner_of = np.empty(offsets[s][comm.rank + 1] - lo, dtype=np.int64)
        owner_of[mem.ids[mem.layers == 0] - lo] = mem.ranks[mem.layers == 0]
        if s in sources:
            exec_layer = execs[s].layers_of(mem.ids, mem.ranks, never)
        else:  # only direct loops run over it: any element whose data is here can run
            exec_layer = mem.layers.copy()
        payload = np.stack([mem.ids, mem.layers, exec_layer, owner_of[mem.ids - lo]], axis=1)
        region, _ = alltoallv(comm, payload, mem.ranks)
        provisional[s] = order_region(region)
    local_maps = {}
    for m in maps:
        gids, _, exec_layers, _, _ = provisional[m.source]
        rows = fetch_rows(comm, offsets[m.source], map_blocks[m], gids)
        local_maps[m] = to_local(rows, provisional[m.target][0], exec_layers <= depth, m)
    return layouts_of_regions(comm, sets, maps, provisional, local_maps, depth)


def layouts_of_regions(comm, sets, maps, provisional, local_maps, depth, *, caps=None):
    """Every set's :class:`SetLayout` and every map's local values from each set's region
    on this rank (``provisional[s]``: global ids, data layers, exec layers, owners in
    :func:`order_region`'s order, and the number owned) and the maps' rows in that numbering:
    levels, the final numbering, exchange lists and the agreed covered depths (collective).

    ``caps`` (set -> level): that set's owned elements at or above the level are told apart
    no further: they come first, by global id, and form its core for thresholds below the cap
    (deeper thresholds get no core); structured grids use it to keep a block's middle row-major.
    """
    levels = _levels(sets, maps, provisional, local_maps, depth)
    for s, cap in (caps or {}).items():
        levels[s] = np.minimum(levels[s], cap).astype(np.int32)
    layouts, permutations = {}, {}
    for s in sets:
        gids, data_layers, exec_layers, owners, n_owned = provisional[s]
        order = _owned_order(levels[s], gids[:n_owned])
        perm = np.concatenate((order, np.arange(n_owned, len(gids))))
        permutations[s] = perm
        ends = np.array([np.count_nonzero(exec_layers <= k) for k in range(depth + 1)], dtype=np.int64)
        layouts[s] = SetLayout(gids[perm], n_owned, ends, data_layers[perm], exec_layers[perm],
                               levels[s][order], owners[perm].astype(np.int32))
    for m in maps:
        inverse = np.empty(len(permutations[m.target]), dtype=np.int64)
        inverse[permutations[m.target]] = np.arange(len(inverse))
        local_maps[m] = inverse[local_maps[m][permutations[m.source]]]
    for s in sets:
        _exchange_lists(comm, layouts[s])
        _agree_covered(comm, layouts[s])
    return layouts, local_maps


def _agree_covered(comm, layout: SetLayout) -> None:
    local = np.array([layout.local_covered(e) for e in range(layout.depth + 1)], dtype=np.int64)
    layout.covered_depths = min_everywhere(comm, local)


def order_region(region):
    """Provisional order: owned by global id, then halo by (exec layer, data layer, owner, id)."""
    gids, data_layers, exec_layers, owners = region[:, 0], region[:, 1], region[:, 2], region[:, 3]
    order = np.lexsort((gids, owners, data_layers, exec_layers))
    return gids[order], data_layers[order], exec_layers[order], owners[order], int(np.count_nonzero(data_layers == 0))


def to_local(rows, local_gids, runnable, m):
    """Local indices of map targets. Rows of elements that are never run (imported only) may
    point outside the rank's elements: those entries become 0 and are never used."""
    if not len(local_gids):
        return np.zeros(rows.shape, dtype=np.int64)
    sorter = np.argsort(local_gids, kind="stable")
    positions = np.minimum(np.searchsorted(local_gids, rows, sorter=sorter), len(local_gids) - 1)
    local = sorter[positions]
    present = local_gids[local] == rows
    if not np.all(present[runnable]):
        raise InternalError(f"map {m.name!r}: a target of a row that may run is not local (halo construction bug)")
    return np.where(present, local, 0).astype(np.int64)


def _levels(sets, maps, provisional, local_maps, depth):
    """Distance of owned elements from non-owned ones, by the same two steps as the layers.

    Halo elements have level 0; owned targets of exec-halo rows have level 1 (the exec halo
    writes them after the exchange). A row at level ``k`` then has its targets at levels
    ``k - 1`` or ``k``, never more: what the chain executor's core ranges rely on.
    """
    level = {}
    for s in sets:
        n_owned = provisional[s][4]
        lv = np.full(len(provisional[s][0]), INTERIOR, dtype=np.int64)
        lv[n_owned:] = 0
        level[s] = lv
    for m in maps:  # owned targets of the exec halo
        rows = local_maps[m]
        runs = (level[m.source] == 0) & (provisional[m.source][2] <= depth)
        if rows.size and runs.any():
            targets = unique_integers(rows[runs])
            level[m.target][targets[level[m.target][targets] == INTERIOR]] = 1
    # Breadth first from the halo: the rows reaching level k - 1 are those with a target at
    # exactly k - 1 (one at a lower level would have put them at a lower level already), so
    # each step looks only at the rows of the elements the step before put at k - 1, through
    # each map's rows by target (not at every row of every map, once per level).
    by_target = {m: _rows_by_target(local_maps[m], len(level[m.target])) for m in maps}
    previous = {s: np.flatnonzero(level[s] == 0) for s in sets}
    for k in range(1, MAX_LEVEL + 1):
        fresh = {s: [np.flatnonzero(level[s] == k)] if k == 1 else [] for s in sets}  # (the exec halo's targets)
        for m in maps:  # rows reaching level k-1
            pointers, rows_of = by_target[m]
            sources = rows_of[concatenated_ranges(pointers[previous[m.target]], np.diff(pointers)[previous[m.target]])]
            hit = unique_integers(sources[level[m.source][sources] == INTERIOR])
            level[m.source][hit] = k
            fresh[m.source].append(hit)
        reached = _closure(maps, local_maps, level, _joined(fresh), k)
        # Done when nothing is at level k: only rows reaching level k can be at k + 1. Not
        # "when step k assigned nothing": the exec halo's targets are at level 1 before step 1,
        # and where no owned row reaches the halo, step 1 assigns nothing, yet the rows that
        # reach those targets are at level 2.
        if not any(len(r) for r in reached.values()):
            break
        previous = reached
    return {s: level[s][: provisional[s][4]].astype(np.int32) for s in sets}


def _closure(maps, local_maps, level, frontier: dict, k: int) -> dict:
    """Every element at level ``k`` per set: ``frontier`` (put there), then the targets of rows at
    level ``k`` still interior, until none is (each element's rows looked at once)."""
    reached = dict(frontier)
    while any(len(f) for f in frontier.values()):
        grown = {s: [] for s in reached}
        for m in maps:
            rows = local_maps[m][frontier[m.source]]
            if rows.size == 0:
                continue
            targets = unique_integers(rows)
            hit = targets[level[m.target][targets] == INTERIOR]
            level[m.target][hit] = k
            grown[m.target].append(hit)
        frontier = _joined(grown)
        reached = {s: np.concatenate((reached[s], frontier[s])) for s in reached}
    return reached


def _joined(found: dict) -> dict:
    """Per set, the arrays found joined into one."""
    return {s: np.concatenate(arrays) if arrays else np.zeros(0, np.int64) for s, arrays in found.items()}


def _rows_by_target(rows: np.ndarray, n_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pointers, sources)``: the rows (source elements) of a local map with each target,
    as CSR over the targets (a row once per entry naming the target)."""
    flat = rows.ravel()
    order = np.argsort(flat, kind="stable")
    pointers = np.zeros(n_targets + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=n_targets), out=pointers[1:])
    return pointers, order // max(rows.shape[1], 1)


def _owned_order(levels, gids):
    return np.lexsort((gids, -levels.astype(np.int64)))


def _exchange_lists(comm, layout: SetLayout) -> None:
    """Import lists (by owner and layer) and the owners' matching export lists."""
    n_owned, gids, owners = layout.n_owned, layout.global_ids, layout.owners
    halo = np.arange(n_owned, len(gids))
    layer_of = layout.data_layers[halo]
    request = np.stack([gids[halo], layer_of], axis=1) if len(halo) else np.zeros((0, 2), np.int64)
    received, sources = alltoallv(comm, request, owners[halo].astype(np.int64))
    sorter = np.argsort(gids[:n_owned], kind="stable")
    owned_positions = sorter[np.searchsorted(gids[:n_owned], received[:, 0], sorter=sorter)] if len(received) else []
    for neighbour in np.unique(owners[halo]):
        mine = halo[owners[halo] == neighbour]
        layout.imports[int(neighbour)] = [mine[layer_of[mine - n_owned] == k] for k in range(1, layout.depth + 1)]
    for neighbour in np.unique(sources):
        picked = sources == neighbour
        positions = np.asarray(owned_positions)[picked]
        layers = received[picked, 1]
        layout.exports[int(neighbour)] = [positions[layers == k] for k in range(1, layout.depth + 1)]
