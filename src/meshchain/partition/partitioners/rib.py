"""Recursive inertial bisection, in parallel and bitwise independent of the number of ranks
(see the package docstring), in stages: checks agreed over ranks, then per level of the
bisection the groups' exact centroids and inertia tensors, their principal axes, and an
exact parallel radix selection of each group's lower side."""

from __future__ import annotations

import numpy as np

from ...comm.agree import same_everywhere
from ...comm.blocks import as_integer, block_offsets
from ...comm.reductions import count_before, max_everywhere, sum_everywhere
from ...core.errors import DeclarationError
from .exact import _exact_means, _principal_axes, _order_keys, _DIGIT, _RADIX
from .agreed import _agree, _checked_weights, _weight_units

__all__ = ["rib"]


# ------------------------------------------------------------------------- RIB


def rib(coords, comm, *, nparts: int | None = None, global_ids=None, weights=None) -> np.ndarray:
    """Recursive inertial bisection of a distributed point set, in parallel.

    The elements of each group of parts are split at the (weighted) median of their
    projection on the group's principal inertial axis (the eigenvector of the
    largest eigenvalue of the covariance of their coordinates about the centroid);
    a group of ``P`` parts gives ``P // 2`` parts to the lower side and the rest to
    the upper side, and the lower side gets exactly as many elements as those parts
    should hold. All groups of one level are processed together, with reductions
    over arrays indexed by group. No rank ever holds more than its own rows.

    Parameters
    ----------
    coords : array_like, shape (n_local, gdim)
        This rank's rows of the set's coordinates (float64; a 1-D array is taken
        as ``gdim = 1``). Ranks without rows may pass any empty array.
    comm : mpi4py.MPI.Comm
        Communicator over which the set is distributed (collective call).
    nparts : int, optional
        Number of parts, ``>= 1``; default ``comm.size``. The same on every rank.
    global_ids : array_like of int, shape (n_local,), optional
        Unique non-negative global ids of the local rows, used to break ties
        between equal projections (duplicates are detected -- and rejected --
        only where they make a split ambiguous; uniqueness is not checked
        globally). Default: the row's position in the rank-ordered
        concatenation (``offsets[rank] + i`` in a block distribution).
    weights : array_like of float, shape (n_local,), optional
        Non-negative finite load of each local row (weighted RIB, for load balance). A
        group of ``P`` parts gives its lower ``P // 2`` parts the elements, in projection
        order, whose summed weight stays within their share of the group's weight. Weights
        are quantised to integers (``floor(w / max(w) * 2**24) + 1``, the maximum taken
        over every rank), so the sums are exact and the result, as without weights, does
        not depend on the number of ranks; a zero weight counts as the smallest unit.

    Returns
    -------
    numpy.ndarray
        int32 part in ``[0, nparts)`` of each local row. Without weights part ``p``
        receives exactly ``block_offsets(N, nparts)[p + 1] - block_offsets(N, nparts)[p]``
        elements, so part sizes differ by at most one; with weights the parts' summed
        (quantised) weights differ by at most about one element's weight per level.

    Raises
    ------
    DeclarationError
        On every rank, if ``coords`` is not a finite 1-D/2-D float array, the ranks
        disagree on ``nparts`` or on the dimension, ``nparts`` is not a positive int,
        ``global_ids`` has the wrong shape/dtype, is negative or not unique, or the
        coordinates overflow float64 in the inertia computation.

    Notes
    -----
    The result is a deterministic function of the global coordinates, global ids
    and ``nparts``; it is bitwise the same for any number of ranks and any
    distribution of the rows (see the module notes: exact reductions, elementwise
    per-element arithmetic, a Jacobi eigen-solver, an exact radix selection).

    Cost per level (``ceil(log2 nparts)`` levels): ``O(n_local * gdim**2)`` local
    work for the inertia and ``O(n_local)`` per selection pass (at most
    ``8 + ceil(log2(max id + 1) / 8)`` passes, usually 2--4, over a shrinking set);
    communication is ``O(ngroups * gdim**2 * L)`` int64 for the exact sums, ``L``
    being the number of 32-bit limbs spanning the exponent range present (a few for
    ordinary meshes, at most ~70), plus ``256 * ngroups`` int64 per selection pass.
    The exact sums dominate the run time (about 9 values per element per level in
    3-D, a few tens of ns each). Every rank also holds ``O(nparts)`` small
    bookkeeping arrays. Coordinates must be finite and their centred products must
    not overflow (``|x|`` below about ``1e150``); otherwise a
    :class:`DeclarationError` asks to rescale them.

    Examples
    --------
    >>> from mpi4py import MPI
    >>> import numpy as np
    >>> xy = np.column_stack([np.arange(8.0), np.zeros(8)])
    >>> rib(xy, MPI.COMM_SELF, nparts=4)
    array([0, 0, 1, 1, 2, 2, 3, 3], dtype=int32)
    >>> rib(xy, MPI.COMM_SELF, nparts=3)      # sizes 3, 3, 2
    array([0, 0, 0, 1, 1, 1, 2, 2], dtype=int32)
    >>> rib(xy, MPI.COMM_SELF, nparts=2, weights=[3, 1, 1, 1, 1, 1, 1, 1])   # 3 + 1 + 1 = 5 of 10
    array([0, 0, 0, 1, 1, 1, 1, 1], dtype=int32)
    """
    size = comm.size
    message = None
    x = w = None
    gdim = -1
    n_local = 0
    gids = None
    want = size if nparts is None else nparts
    try:
        want = as_integer(want, "rib: nparts")
        if not 1 <= want < 1 << 31:
            raise DeclarationError(f"rib: nparts={want} must be at least 1 (and below 2**31); pass a positive number of parts.")
        raw = np.asarray(coords)
        if raw.dtype.kind not in "fiub" or raw.ndim not in (1, 2):
            raise DeclarationError(
                f"rib: coords must be a real array of shape (n_local, gdim), got dtype {raw.dtype} "
                f"and shape {raw.shape}; pass this rank's rows of the coordinate array."
            )
        x = raw.astype(np.float64) if raw.ndim == 2 else raw.astype(np.float64)[:, None]
        n_local = int(x.shape[0])
        gdim = int(x.shape[1]) if n_local else -1
        if n_local and gdim < 1:
            raise DeclarationError("rib: coords has zero columns; pass coordinates of shape (n_local, gdim >= 1).")
        if not np.isfinite(x).all():
            raise DeclarationError(
                "rib: coords contains NaN or infinite values; pass finite coordinates."
            )
        if global_ids is not None:
            gids = np.asarray(global_ids)
            if gids.dtype.kind not in "iu" or gids.shape != (n_local,):
                raise DeclarationError(
                    f"rib: global_ids must be an integer array of shape ({n_local},) matching coords, got "
                    f"dtype {gids.dtype} and shape {gids.shape}; pass one global id per local row or None."
                )
            if n_local and (gids.min() < 0 or int(gids.max()) >= 1 << 63):
                raise DeclarationError("rib: global_ids must be non-negative int64 values; pass ids >= 0.")
            gids = gids.astype(np.int64)
        w = None if weights is None else _checked_weights(weights, n_local)
    except (ValueError, TypeError) as err:
        message = str(err) if isinstance(err, DeclarationError) else f"rib: coords could not be read as an array ({err}); pass a (n_local, gdim) float array."

    _agree(comm, message)
    same = same_everywhere(comm, [want, gdim if n_local else None, int(global_ids is not None),
                                   int(weights is not None)])
    if not same[0]:
        _agree(comm, f"rib: the ranks pass different nparts (this rank: {want}); pass the same nparts on every rank.")
    if not same[1]:
        _agree(comm, f"rib: the ranks' coords have different numbers of columns (this rank: {gdim}); pass the same gdim everywhere.")
    if not same[2]:
        _agree(comm, "rib: global_ids is given on some ranks only; pass it on every rank or on none.")
    if not same[3]:
        _agree(comm, "rib: weights are given on some ranks only; pass them on every rank or on none.")
    nparts = want
    n_total = sum_everywhere(comm, n_local)
    n_before = count_before(comm, n_local)
    if n_total == 0 or nparts == 1:
        return np.zeros(n_local, dtype=np.int32)
    gdim = max_everywhere(comm, gdim if n_local else -1)
    x = x.reshape(n_local, gdim)
    if gids is None:
        gids = np.arange(n_local, dtype=np.int64) + int(n_before)
        max_id = n_total - 1
    else:
        top = max_everywhere(comm, np.array([gids.max() if n_local else 0], dtype=np.int64))
        max_id = int(top[0])
    id_bits = max(1, max_id.bit_length())
    units = None if w is None else _weight_units(w, comm)

    target = block_offsets(n_total, nparts)  # elements each range of parts must hold
    part_lo = np.zeros(n_local, dtype=np.int64)  # first part of each element's group
    groups = [(0, nparts)]
    while any(b - a > 1 for a, b in groups):
        splitting = [(a, b) for a, b in groups if b - a > 1]
        ng = len(splitting)
        lo = np.array([a for a, _ in splitting], dtype=np.int64)
        hi = np.array([b for _, b in splitting], dtype=np.int64)
        mid = lo + (hi - lo) // 2
        sizes = target[hi] - target[lo]
        below = target[mid] - target[lo]
        counts = sizes
        lookup = np.full(nparts, -1, dtype=np.int64)
        lookup[lo] = np.arange(ng)
        gi_all = lookup[part_lo]
        sel = np.flatnonzero(gi_all >= 0)
        g = gi_all[sel]
        xs = x[sel]
        if units is not None:  # split by weight: the groups' element counts and weights are summed
            counts = _group_sums(np.ones(len(sel), dtype=np.int64), g, ng, comm)
            sizes = _group_sums(units[sel], g, ng, comm)
            below = (sizes // (hi - lo)) * (mid - lo) + (sizes % (hi - lo)) * (mid - lo) // (hi - lo)

        centre = _exact_means(xs, g, ng, counts, comm, "centroid")
        d = xs - centre[g]
        iu, ju = np.triu_indices(gdim)
        prods = np.empty((len(sel), len(iu)), dtype=np.float64)
        for c, (i, j) in enumerate(zip(iu, ju)):
            with np.errstate(over="ignore"):
                np.multiply(d[:, i], d[:, j], out=prods[:, c])
        moments = _exact_means(prods, g, ng, counts, comm, "inertia tensor")
        cov = np.zeros((ng, gdim, gdim), dtype=np.float64)
        cov[:, iu, ju] = moments
        cov[:, ju, iu] = moments
        axis = _principal_axes(cov)
        proj = d[:, 0] * axis[g, 0]
        for j in range(1, gdim):
            proj = proj + d[:, j] * axis[g, j]

        lower = _select_lower(_order_keys(proj), gids[sel], g, ng, sizes, below, id_bits, comm,
                              weights=None if units is None else units[sel])
        upper = sel[~lower]
        part_lo[upper] = mid[g[~lower]]
        groups = _children(groups)
    return part_lo.astype(np.int32)


def _children(groups: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Next level of the bisection tree: ``[a, b)`` -> ``[a, m), [m, b)`` with ``m - a = (b - a) // 2``."""
    out = []
    for a, b in groups:
        if b - a > 1:
            m = a + (b - a) // 2
            out += [(a, m), (m, b)]
        else:
            out.append((a, b))
    return out


def _group_sums(values: np.ndarray, g: np.ndarray, ng: int, comm) -> np.ndarray:
    """Exact int64 sums of ``values`` per group over every rank."""
    return sum_everywhere(comm, np.rint(np.bincount(g, values.astype(np.float64), ng)).astype(np.int64))


def _select_lower(keys, ids, g, ng, sizes, below, id_bits, comm, *, weights=None) -> np.ndarray:
    """Mark the ``below[g]`` smallest elements of each group by ``(keys, ids)``; with
    ``weights`` (int64 per element), the smallest elements whose summed weight is at most
    ``below[g]`` (``sizes`` are then the groups' weights).

    Parallel MSB-first radix selection with 8-bit digits: each pass histograms
    the still-undecided elements per (group, digit), sums the histograms over ranks
    and fixes one more digit of each group's threshold element. Elements strictly
    below the threshold in the total order ``(key, id)`` are lower; the threshold
    and everything above is upper, so each lower side holds exactly ``below[g]``.
    """
    lower = np.zeros(len(keys), dtype=bool)
    lower[(below == sizes)[g]] = True
    remaining = below.astype(np.int64).copy()
    need = (below > 0) & (below < sizes)
    act = np.flatnonzero(need[g])
    passes = [(0, s) for s in range(64 - _DIGIT, -1, -_DIGIT)]
    top = -(-id_bits // _DIGIT) * _DIGIT
    passes += [(1, s) for s in range(top - _DIGIT, -1, -_DIGIT)]
    rows = np.arange(ng)
    for source, shift in passes:
        if not need.any():
            break
        if source == 0:
            digit = ((keys[act] >> np.uint64(shift)) & np.uint64(_RADIX - 1)).astype(np.int64)
        else:
            digit = (ids[act] >> shift) & (_RADIX - 1)
        ga = g[act]
        slot = ga * _RADIX + digit
        hist = np.bincount(slot, minlength=ng * _RADIX).astype(np.int64)
        if weights is not None:  # exact: the sums stay far below 2**53
            hist = np.concatenate((hist, np.rint(np.bincount(slot, weights[act], ng * _RADIX)).astype(np.int64)))
        sum_everywhere(comm, hist)
        hist, load = hist[: ng * _RADIX].reshape(ng, _RADIX), hist[ng * _RADIX:].reshape(-1, _RADIX)
        cum = np.cumsum(hist if weights is None else load, axis=1)
        chosen = (cum <= remaining[:, None]).sum(axis=1)
        chosen = np.minimum(chosen, _RADIX - 1)  # only for groups that are not selecting
        before = np.where(chosen > 0, cum[rows, chosen - 1], 0)
        remaining = np.where(need, remaining - before, remaining)
        still = hist[rows, chosen]
        pick = chosen[ga]
        lower[act[need[ga] & (digit < pick)]] = True
        need = need & (still > 1)
        keep = (digit == pick) & need[ga]
        act = act[keep]
    if need.any():
        # ``need`` is computed from reduced counts, so every rank raises together.
        raise DeclarationError(
            "rib: global_ids are not unique (elements with equal projections share an id), so the split "
            "cannot be made exact; pass unique global ids or leave global_ids=None."
        )
    return lower
