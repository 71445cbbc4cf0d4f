"""Sparse tiling inspector: cut a chain into tiles that run every loop on one block of the mesh.

After Strout et al. (2014) and Luporini et al. (ACM TOMS 2019, SLOPE). A *seed* loop's
iterations are cut into tiles of ``tile_size`` (runs of the mesh numbering, or compact
blobs grown through the mesh: ``partition=``); the tiles
are projected forward (to later loops) and backward (to earlier loops) through the
elements the loops touch, and coloured. Execution runs colours in order, the tiles of
one colour on threads, and each tile runs every loop of the chain on its iterations.

What makes that order correct. Only elements of dats the chain writes matter (two
reads of one element never conflict); the inspector calls them *tracked* and gives each
a key. Tiles are projected in the execution order of their colours:

- forward: an iteration of a loop after the seed joins the tile of highest colour that
  touched any of its keys before it, so it runs after every earlier conflicting access;
- backward: an iteration of a loop before the seed joins the tile of lowest colour that
  touches any of its keys after it.

That is only an order if two tiles of one colour never touch a common key (they would
also race on threads). Tiles grow while they are projected, so the inspector checks the
whole footprint after projecting; where two same-coloured tiles meet it adds the pair to
the conflict graph, re-colours and projects again. Every round adds a pair, so it ends
(at worst with one colour per tile: a sequential order, which is always legal).

Everything here is pure: arrays in, a :class:`TilePlan` out.

Examples
--------
A chain of two loops over a path of 6 edges and 7 nodes: ``inc`` increments both nodes of
each edge, then ``scale`` runs over the nodes directly.

>>> import numpy as np
>>> from meshchain.inspector.tiling import TileLoop, tile_chain, check_colouring
>>> edges = np.array([[i, i + 1] for i in range(6)])           # keys of the node dat: 0..6
>>> loops = [TileLoop(0, 6, edges), TileLoop(0, 7, np.arange(7)[:, None])]
>>> plan = tile_chain(loops, nkeys=7, tile_size=2, seed=0)
>>> plan.ntiles, plan.tile_colours.tolist()        # tile 1 runs after tiles 0 and 2
(3, [0, 1, 0])
>>> [plan.tiles_of(0).tolist(), plan.tiles_of(1).tolist()]
[[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 1, 2, 2]]
>>> check_colouring(plan, loops)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..core.access import Access
from ..core.errors import MeshchainError

__all__ = ["TileLoop", "TilePlan", "tile_chain", "single_tile_plan", "chain_footprints", "check_colouring", "MAX_ROUNDS"]

MAX_ROUNDS = 32
"""Re-colouring rounds before the inspector gives every tile its own colour."""


@dataclass(frozen=True)
class TileLoop:
    """One loop of a chain as the tiling inspector sees it.

    Attributes
    ----------
    start, end : int
        The loop runs iterations ``[start, end)``.
    keys : ndarray of int64, shape (end - start, ncolumns)
        Row ``i`` lists the tracked elements (keys ``0 <= k < nkeys``) that iteration
        ``start + i`` reads or writes.
    """

    start: int
    end: int
    keys: np.ndarray

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class TilePlan:
    """Tiles of a chain, their colours and every loop's iterations per tile.

    Attributes
    ----------
    tile_size : int
        Seed iterations per tile (the last tile may have fewer).
    seed : int
        Position of the seed loop in the chain.
    tile_colours : ndarray of int64, shape (ntiles,)
    tile_order : ndarray of int64, shape (ntiles,)
        Tiles sorted by colour (stable).
    colour_offsets : ndarray of int64, shape (ncolours + 1,)
        Colour ``c`` is ``tile_order[colour_offsets[c]:colour_offsets[c + 1]]``.
    starts : tuple of ndarray of int64, each of shape (ntiles + 1,)
        Loop ``l`` runs ``iterations[l][starts[l][t]:starts[l][t + 1]]`` in tile ``t``.
    iterations : tuple of ndarray of int64
        Loop ``l``'s iterations grouped by tile, ascending inside a tile.
    runs : tuple of (ndarray, ndarray, ndarray)
        Loop ``l``'s iterations per tile as runs of consecutive iterations: tile ``t`` runs
        ``range(lo[r], hi[r])`` for ``r`` in ``range(offsets[t], offsets[t + 1])``, where
        ``offsets, lo, hi = runs[l]`` (executors loop over plain ranges, as untiled).
    rounds : int
        Projections made (1 when the first colouring held).
    """

    tile_size: int
    seed: int
    tile_colours: np.ndarray
    tile_order: np.ndarray
    colour_offsets: np.ndarray
    starts: tuple
    iterations: tuple
    runs: tuple
    rounds: int

    @property
    def ntiles(self) -> int:
        return len(self.tile_colours)

    @property
    def ncolours(self) -> int:
        return len(self.colour_offsets) - 1

    def tiles_of(self, position: int) -> np.ndarray:
        """The tile of each iteration of loop ``position``, in iteration order."""
        starts, iterations = self.starts[position], self.iterations[position]
        tiles = np.repeat(np.arange(self.ntiles, dtype=np.int64), np.diff(starts))
        out = np.empty_like(tiles)
        out[iterations - (iterations.min() if len(iterations) else 0)] = tiles
        return out


PARTITIONS = ("natural", "grown")


def tile_chain(loops, *, nkeys: int, tile_size: int, seed: int | None = None, partition: str = "natural") -> TilePlan:
    """Tile, project and colour a chain (see the module notes).

    Parameters
    ----------
    loops : sequence of TileLoop
        The chain's loops in execution order.
    nkeys : int
        Keys are ``0 <= k < nkeys``.
    tile_size : int, keyword-only
        Seed iterations per tile.
    seed : int or None, keyword-only
        The seed loop; default the loop with most iterations nearest the middle of the
        chain (tiles then grow through half the chain each way, not all of it).
    partition : {"natural", "grown"}, keyword-only
        How the seed's iterations are cut: ``"natural"``, runs of ``tile_size`` consecutive
        iterations (for a mesh numbered with locality, as generated, RCM-ordered or OP2
        meshes are, a tile is then one contiguous stretch of every array, which hardware
        prefetching streams); ``"grown"``, compact blobs grown breadth-first through shared
        elements (fewer conflicts, but a blob is many short stretches of memory: on this
        project's meshes it ran up to 2x slower than ``"natural"``).

    Returns
    -------
    TilePlan
    """
    loops = list(loops)
    if not loops:
        raise MeshchainError("tile_chain needs at least one loop.")
    if isinstance(tile_size, bool) or not isinstance(tile_size, (int, np.integer)) or tile_size < 1:
        raise MeshchainError(f"tile_size must be a positive integer, got {tile_size!r}.")
    if seed is None:
        seed = _default_seed([loop.size for loop in loops])
    if not 0 <= seed < len(loops):
        raise MeshchainError(f"seed {seed} is not a loop of this {len(loops)}-loop chain.")
    if partition not in PARTITIONS:
        raise MeshchainError(f"partition must be one of {PARTITIONS}, got {partition!r}.")
    flat, key_offsets, ncols, sizes = _flatten(loops, nkeys)
    nkeys = max(int(nkeys), 1)
    if partition == "grown":
        seed_tiles = _grow_tiles(flat, key_offsets[seed], ncols[seed], sizes[seed], nkeys, int(tile_size))
    else:
        seed_tiles = np.arange(sizes[seed], dtype=np.int64) // int(tile_size)
    ntiles = int(seed_tiles.max()) + 1 if len(seed_tiles) else 1

    only_seed = sizes.copy()
    only_seed[np.arange(len(sizes)) != seed] = 0
    seed_assign = np.zeros(int(sizes.sum()), dtype=np.int64)
    offsets = _assign_offsets(sizes)
    seed_assign[offsets[seed] : offsets[seed + 1]] = seed_tiles
    pairs = _unique_pairs(_sharing_pairs(flat, key_offsets, ncols, only_seed, seed_assign, offsets, nkeys, ntiles),
                          ntiles)
    starts, neighbours, _ = _adjacency(pairs, ntiles)
    colours = _recolour(np.full(ntiles, -1, dtype=np.int64), starts, neighbours, ntiles, np.arange(ntiles))
    rounds = 0
    while True:
        rounds += 1
        assign = _project(flat, key_offsets, ncols, sizes, offsets, seed, seed_tiles, colours, ntiles, nkeys)
        found = _unique_pairs(_sharing_pairs(flat, key_offsets, ncols, sizes, assign, offsets, nkeys, ntiles), ntiles)
        clashing = _same_colour_tiles(found, colours)
        if not len(clashing):
            break
        if rounds == MAX_ROUNDS:
            colours = np.arange(ntiles, dtype=np.int64)  # one tile per colour: always legal
            continue
        pairs = _unique_pairs(np.concatenate((pairs, found)), ntiles)
        colours = _recolour(colours, *_adjacency(pairs, ntiles), clashing)
    return _plan(loops, int(tile_size), seed, colours, assign, offsets, ntiles, rounds)


def _default_seed(sizes) -> int:
    largest = max(sizes)
    middle = (len(sizes) - 1) / 2
    return min((abs(l - middle), l) for l, size in enumerate(sizes) if size == largest)[1]


def check_colouring(plan: TilePlan, loops) -> None:
    """Raise :class:`MeshchainError` unless ``plan`` is a legal tiling of ``loops``.

    Checks, from the plan alone: every iteration of every loop is in exactly one tile; two
    tiles of one colour never touch a common key; and wherever iterations of two loops
    touch a common key they run in chain order (same tile, or the earlier loop's tile has
    the lower colour).
    """
    for l, loop in enumerate(loops):
        if not np.array_equal(np.sort(plan.iterations[l]), np.arange(loop.start, loop.end)):
            raise MeshchainError(f"loop {l}: the tiles do not hold each iteration exactly once.")
    keys = [loop.keys.ravel() for loop in loops]
    tiles = [np.repeat(plan.tiles_of(l), loop.keys.shape[1]) for l, loop in enumerate(loops)]
    _check_disjoint(plan, np.concatenate(keys + [np.zeros(0, np.int64)]),
                    np.concatenate(tiles + [np.zeros(0, np.int64)]))
    nkeys = _nkeys(loops)
    for a in range(len(loops)):
        for b in range(a + 1, len(loops)):
            _check_order(plan.tile_colours, keys[a], tiles[a], keys[b], tiles[b], nkeys, (a, b))


def _check_disjoint(plan: TilePlan, keys, tiles) -> None:
    """No key is touched by two tiles of one colour."""
    pairs = np.unique(np.stack((keys, tiles), axis=1), axis=0)
    colours = plan.tile_colours[pairs[:, 1]]
    by_key_colour = np.unique(np.stack((pairs[:, 0], colours), axis=1), axis=0, return_counts=True)
    clashes = by_key_colour[0][by_key_colour[1] > 1]
    if len(clashes):
        key, colour = (int(v) for v in clashes[0])
        shared = pairs[(pairs[:, 0] == key) & (colours == colour), 1].tolist()
        raise MeshchainError(f"tiles {shared} all have colour {colour} and touch key {key}.")


def _check_order(colours, keys_a, tiles_a, keys_b, tiles_b, nkeys, loops) -> None:
    """Every tile of the earlier loop touching a key runs before (or is) every tile of the
    later loop touching it."""
    big = np.iinfo(np.int64).max
    latest_a = np.full(nkeys, -1, dtype=np.int64)
    np.maximum.at(latest_a, keys_a, colours[tiles_a])
    earliest_b = np.full(nkeys, big, dtype=np.int64)
    np.minimum.at(earliest_b, keys_b, colours[tiles_b])
    both = (latest_a >= 0) & (earliest_b < big)
    bad = both & (earliest_b < latest_a)
    tie = both & (earliest_b == latest_a)
    if np.any(tie):  # equal colours are legal only for one and the same tile
        single = np.ones(nkeys, dtype=bool)
        ids = []
        for k, t, extreme in ((keys_a, tiles_a, latest_a), (keys_b, tiles_b, earliest_b)):
            at = colours[t] == extreme[k]
            low, high = np.full(nkeys, big, dtype=np.int64), np.full(nkeys, -1, dtype=np.int64)
            np.minimum.at(low, k[at], t[at])
            np.maximum.at(high, k[at], t[at])
            single &= low == high
            ids.append(low)
        bad |= tie & ~(single & (ids[0] == ids[1]))
    if np.any(bad):
        key = int(np.flatnonzero(bad)[0])
        raise MeshchainError(f"key {key}: loop {loops[0]} (tile colour {int(latest_a[key])}) may run after loop "
                             f"{loops[1]} (tile colour {int(earliest_b[key])}).")


def _nkeys(loops) -> int:
    return max([int(loop.keys.max()) + 1 for loop in loops if loop.keys.size] + [1])


def _flatten(loops, nkeys: int):
    sizes = np.array([loop.size for loop in loops], dtype=np.int64)
    ncols = np.empty(len(loops), dtype=np.int64)
    parts = []
    for l, loop in enumerate(loops):
        keys = np.asarray(loop.keys, dtype=np.int64)
        if keys.ndim != 2 or keys.shape[0] != loop.size:
            raise MeshchainError(f"loop {l}: keys must have shape ({loop.size}, ncolumns), got {keys.shape}.")
        if keys.size and (keys.min() < 0 or keys.max() >= nkeys):
            raise MeshchainError(f"loop {l}: keys must lie in [0, {nkeys}).")
        ncols[l] = keys.shape[1]
        parts.append(keys.ravel())
    key_offsets = np.concatenate(([0], np.cumsum([p.size for p in parts]))).astype(np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return flat, key_offsets, ncols, sizes


def _assign_offsets(sizes) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def _plan(loops, tile_size, seed, colours, assign, offsets, ntiles, rounds) -> TilePlan:
    colours = colours.astype(np.int64)
    order = np.argsort(colours, kind="stable").astype(np.int64)
    counts = np.bincount(colours, minlength=1)
    colour_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    starts, iterations, runs = [], [], []
    for l, loop in enumerate(loops):
        s, its = _group_by_tile(assign[offsets[l] : offsets[l + 1]], ntiles, loop.start)
        starts.append(s)
        iterations.append(its)
        runs.append(_runs(s, its))
    return TilePlan(tile_size, seed, colours, order, colour_offsets, tuple(starts), tuple(iterations), tuple(runs),
                    rounds)


def single_tile_plan(iterations) -> TilePlan:
    """A plan of one tile running ``iterations[l]`` (ascending) of each loop ``l``: what a
    backend's ``tiled`` call runs for one boundary task (:mod:`meshchain.inspector.tasks`).

    >>> import numpy as np
    >>> plan = single_tile_plan([np.array([4, 5, 9]), np.array([], dtype=np.int64)])
    >>> plan.ntiles, [r[1].tolist() for r in plan.runs], [r[2].tolist() for r in plan.runs]
    (1, [[4, 9], []], [[6, 10], []])
    """
    iterations = tuple(np.ascontiguousarray(its, dtype=np.int64) for its in iterations)
    starts = tuple(np.array([0, len(its)], dtype=np.int64) for its in iterations)
    zero = np.zeros(1, dtype=np.int64)
    return TilePlan(max((len(its) for its in iterations), default=0), 0, zero, zero.copy(),
                    np.array([0, 1], dtype=np.int64), starts, iterations,
                    tuple(_runs(s, its) for s, its in zip(starts, iterations)), 1)


def _runs(starts, iterations):
    """``(offsets, lo, hi)``: each tile's iterations as runs of consecutive numbers."""
    first = np.ones(len(iterations), dtype=bool)
    first[1:] = np.diff(iterations) != 1
    first[starts[:-1][starts[:-1] < len(iterations)]] = True
    begin = np.flatnonzero(first)
    lo = iterations[begin]
    hi = np.append(iterations[begin[1:] - 1], iterations[-1] if len(iterations) else 0) + 1 if len(begin) else lo
    offsets = np.searchsorted(begin, starts).astype(np.int64)
    return offsets, np.ascontiguousarray(lo, dtype=np.int64), np.ascontiguousarray(hi, dtype=np.int64)


# --- compiled kernels ------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _grow_tiles(flat, base, ncol, n, nkeys, tile_size):  # pragma: no cover - compiled
    """Seed tiles grown breadth-first through shared keys, so they are compact blobs of the
    mesh, not thin stretches of its numbering. Each tile starts next to the previous one
    (from what its search left queued), or at the first iteration not yet in a tile."""
    tiles = np.full(n, -1, dtype=np.int64)
    if ncol == 0:
        for i in range(n):
            tiles[i] = i // tile_size
        return tiles
    count = np.zeros(nkeys + 1, dtype=np.int64)
    for p in range(base, base + n * ncol):
        count[flat[p] + 1] += 1
    for k in range(nkeys):
        count[k + 1] += count[k]
    fill = count[:-1].copy()
    users = np.empty(n * ncol, dtype=np.int64)
    for i in range(n):
        for j in range(ncol):
            k = flat[base + i * ncol + j]
            users[fill[k]] = i
            fill[k] += 1
    queue = np.empty(n, dtype=np.int64)
    head = tail = 0
    cursor = 0
    tile = 0
    placed = 0
    while placed < n:
        start = -1
        while head < tail and start < 0:  # continue next to the previous tile's frontier
            i = queue[head]
            head += 1
            for j in range(ncol):
                k = flat[base + i * ncol + j]
                for p in range(count[k], count[k + 1]):
                    if tiles[users[p]] < 0:
                        start = users[p]
                        break
                if start >= 0:
                    break
        while start < 0:
            if tiles[cursor] < 0:
                start = cursor
            cursor += 1
        head = tail = 0
        queue[tail] = start
        tail += 1
        tiles[start] = tile
        size = 1
        while head < tail and size < tile_size:
            i = queue[head]
            head += 1
            for j in range(ncol):
                k = flat[base + i * ncol + j]
                for p in range(count[k], count[k + 1]):
                    u = users[p]
                    if tiles[u] < 0 and size < tile_size:
                        tiles[u] = tile
                        size += 1
                        queue[tail] = u
                        tail += 1
        placed += size
        tile += 1
    return tiles


@njit(cache=True, nogil=True)
def _group_by_tile(tiles, ntiles, start):  # pragma: no cover - compiled
    """Counting sort of iterations by tile (stable: ascending inside a tile)."""
    starts = np.zeros(ntiles + 1, dtype=np.int64)
    for i in range(len(tiles)):
        starts[tiles[i] + 1] += 1
    for t in range(ntiles):
        starts[t + 1] += starts[t]
    fill = starts[:-1].copy()
    out = np.empty(len(tiles), dtype=np.int64)
    for i in range(len(tiles)):
        out[fill[tiles[i]]] = start + i
        fill[tiles[i]] += 1
    return starts, out


@njit(cache=True, nogil=True)
def _project(flat, key_offsets, ncols, sizes, offsets, seed, seed_tiles, colours, ntiles, nkeys):  # pragma: no cover
    """Tile of every iteration of every loop (concatenated), given the tiles' colours."""
    assign = np.empty(offsets[-1], dtype=np.int64)
    last = np.full(nkeys, -1, dtype=np.int64)
    for l in range(seed, len(sizes)):
        _project_loop(l == seed, flat, key_offsets[l], ncols[l], sizes[l], assign, offsets[l], seed_tiles,
                      colours, ntiles, last, 1)
    first = np.full(nkeys, -1, dtype=np.int64)
    for l in range(seed, len(sizes)):
        _touch(flat, key_offsets[l], ncols[l], sizes[l], assign, offsets[l], colours, first, -1)
    for l in range(seed - 1, -1, -1):
        _project_loop(False, flat, key_offsets[l], ncols[l], sizes[l], assign, offsets[l], seed_tiles,
                      colours, ntiles, first, -1)
    return assign


@njit(cache=True, nogil=True)
def _project_loop(is_seed, flat, base, ncol, n, assign, out, seed_tiles, colours, ntiles, mark, sign):  # pragma: no cover
    """One loop: each iteration joins the tile of most extreme colour (sign 1: highest, -1:
    lowest) among ``mark`` of its keys (an iteration no key constrains gets the tile at its
    proportional position); then the loop's iterations mark their keys. Marks of the loop
    itself do not constrain it: iterations of one loop need no order among themselves."""
    for i in range(n):
        if is_seed:
            t = seed_tiles[i]
        else:
            t = -1
            for j in range(ncol):
                u = mark[flat[base + i * ncol + j]]
                if u >= 0 and (t < 0 or sign * colours[u] > sign * colours[t]):
                    t = u
            if t < 0:
                t = i * ntiles // n
        assign[out + i] = t
    _touch(flat, base, ncol, n, assign, out, colours, mark, sign)


@njit(cache=True, nogil=True)
def _touch(flat, base, ncol, n, assign, out, colours, mark, sign):  # pragma: no cover - compiled
    for i in range(n):
        t = assign[out + i]
        for j in range(ncol):
            k = flat[base + i * ncol + j]
            u = mark[k]
            if u < 0 or sign * colours[t] > sign * colours[u]:
                mark[k] = t


@njit(cache=True, nogil=True)
def _sharing_pairs(flat, key_offsets, ncols, sizes, assign, offsets, nkeys, ntiles):  # pragma: no cover - compiled
    """Pairs ``(a, b)``, ``a < b``, of tiles that touch a common key (duplicates possible).

    A first pass finds the keys more than one tile touches; only those are sorted."""
    first = np.full(nkeys, -1, dtype=np.int64)
    shared = np.zeros(nkeys + 1, dtype=np.int64)
    for l in range(len(sizes)):
        for i in range(sizes[l]):
            t = assign[offsets[l] + i]
            for j in range(ncols[l]):
                k = flat[key_offsets[l] + i * ncols[l] + j]
                if first[k] < 0:
                    first[k] = t
                elif first[k] != t:
                    shared[k + 1] = 1
    # count the touches of shared keys, then sort them by key
    count = np.zeros(nkeys + 1, dtype=np.int64)
    for l in range(len(sizes)):
        for p in range(key_offsets[l], key_offsets[l] + sizes[l] * ncols[l]):
            k = flat[p]
            if shared[k + 1]:
                count[k + 1] += 1
    for k in range(nkeys):
        count[k + 1] += count[k]
    fill = count[:-1].copy()
    tiles = np.empty(count[-1], dtype=np.int64)
    for l in range(len(sizes)):
        for i in range(sizes[l]):
            t = assign[offsets[l] + i]
            for j in range(ncols[l]):
                k = flat[key_offsets[l] + i * ncols[l] + j]
                if shared[k + 1]:
                    tiles[fill[k]] = t
                    fill[k] += 1
    distinct = _compact_rows(count, tiles, ntiles)  # distinct tiles per key; then all pairs of them
    npairs = 0
    for k in range(nkeys):
        d = distinct[k + 1] - distinct[k]
        npairs += d * (d - 1) // 2
    pairs = np.empty((npairs, 2), dtype=np.int64)
    q = 0
    for k in range(nkeys):
        for a in range(distinct[k], distinct[k + 1]):
            for b in range(a + 1, distinct[k + 1]):
                x, y = tiles[a], tiles[b]
                pairs[q, 0] = min(x, y)
                pairs[q, 1] = max(x, y)
                q += 1
    return pairs


@njit(cache=True, nogil=True)
def _adjacency(pairs, ntiles):  # pragma: no cover - compiled
    """Symmetric adjacency (CSR, duplicates removed) of the tile conflict graph."""
    degree = np.zeros(ntiles + 1, dtype=np.int64)
    for q in range(len(pairs)):
        degree[pairs[q, 0] + 1] += 1
        degree[pairs[q, 1] + 1] += 1
    for t in range(ntiles):
        degree[t + 1] += degree[t]
    fill = degree[:-1].copy()
    neighbours = np.empty(degree[-1], dtype=np.int64)
    for q in range(len(pairs)):
        a, b = pairs[q, 0], pairs[q, 1]
        neighbours[fill[a]] = b
        fill[a] += 1
        neighbours[fill[b]] = a
        fill[b] += 1
    starts = _compact_rows(degree, neighbours, ntiles)
    return starts, neighbours[: starts[-1]], ntiles


@njit(cache=True, nogil=True)
def _compact_rows(bounds, values, nvalues):  # pragma: no cover - compiled
    """Drop repeated values within each CSR row ``values[bounds[r]:bounds[r + 1]]`` (values
    ``< nvalues``), compacting in place; returns the new row bounds."""
    stamp = np.full(nvalues, -1, dtype=np.int64)
    out = np.zeros(len(bounds), dtype=np.int64)
    write = 0
    for r in range(len(bounds) - 1):
        for p in range(bounds[r], bounds[r + 1]):
            v = values[p]
            if stamp[v] != r:
                stamp[v] = r
                values[write] = v
                write += 1
        out[r + 1] = write
    return out


@njit(cache=True, nogil=True)
def _same_colour_tiles(pairs, colours):  # pragma: no cover - compiled
    """The later tile of every pair that shares a colour (sorted, distinct)."""
    marked = np.zeros(len(colours), dtype=np.bool_)
    for q in range(len(pairs)):
        if colours[pairs[q, 0]] == colours[pairs[q, 1]]:
            marked[pairs[q, 1]] = True
    return np.flatnonzero(marked)


@njit(cache=True, nogil=True)
def _unique_pairs(pairs, ntiles):  # pragma: no cover - compiled
    starts, neighbours, _ = _adjacency(pairs, ntiles)
    count = 0
    for t in range(ntiles):
        for p in range(starts[t], starts[t + 1]):
            if neighbours[p] > t:
                count += 1
    out = np.empty((count, 2), dtype=np.int64)
    q = 0
    for t in range(ntiles):
        for p in range(starts[t], starts[t + 1]):
            if neighbours[p] > t:
                out[q, 0] = t
                out[q, 1] = neighbours[p]
                q += 1
    return out


@njit(cache=True, nogil=True)
def _recolour(colours, starts, neighbours, ntiles, tiles):  # pragma: no cover - compiled
    """Give each of ``tiles`` (in order) the lowest colour none of its coloured neighbours
    has (colour -1: not coloured yet). All tiles in tile order is first-fit colouring."""
    colours = colours.copy()
    taken = np.full(ntiles + 1, -1, dtype=np.int64)
    for t in tiles:
        for p in range(starts[t], starts[t + 1]):
            if colours[neighbours[p]] >= 0:
                taken[colours[neighbours[p]]] = t
        c = 0
        while taken[c] == t:
            c += 1
        colours[t] = c
    return colours


# --- footprints of real loops ------------------------------------------------------------------


def chain_footprints(items, *, values, rows) -> tuple[list[TileLoop], int]:
    """The :class:`TileLoop` of each ``(loop, start, end)`` and the number of keys.

    ``values(map)`` gives a map's values in local numbering, ``rows(set)`` the rows a set
    has here (owned and halo). An argument is tracked when some loop of ``items`` writes
    its dat. Keys are the elements of the tracked dats' sets (one key range per set, not
    per dat: two dats on one element share its key, which orders their accesses more
    strictly than needed but halves the work for the usual several dats per set). Reads
    of dats no loop writes are not tracked: they never conflict.
    """
    written = {id(a.data) for loop, _, _ in items for a in loop.args if not a.data.is_global and a.access.writes}
    lengths: dict[int, int] = {}
    for loop, _, _ in items:
        for arg in loop.args:
            if id(arg.data) in written:
                key = id(arg.data.dataset)
                lengths[key] = max(lengths.get(key, 0), rows(arg.data.dataset))
    bases = dict(zip(lengths, np.concatenate(([0], np.cumsum(list(lengths.values()))))))
    nkeys = int(sum(lengths.values()))
    loops = []
    for loop, start, end in items:
        paths = {}
        for arg in loop.args:
            if id(arg.data) in written:
                paths.setdefault((id(arg.data.dataset), id(arg.map), arg.index), arg)
        columns = [_columns(arg, start, end, values) + bases[id(arg.data.dataset)] for arg in paths.values()]
        keys = np.hstack(columns) if columns else np.zeros((end - start, 0), dtype=np.int64)
        loops.append(TileLoop(start, end, np.ascontiguousarray(keys, dtype=np.int64)))
    return loops, nkeys


def _columns(arg, start: int, end: int, values) -> np.ndarray:
    if arg.map is None:
        return np.arange(start, end, dtype=np.int64)[:, None]
    picked = values(arg.map)[start:end]
    return (picked if arg.index is None else picked[:, arg.index : arg.index + 1]).astype(np.int64)
