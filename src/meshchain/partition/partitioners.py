"""Partitioners over block-distributed arrays.

Before partitioning, every set of global size ``N`` is held in a block
distribution: rank ``r`` holds global ids ``[offsets[r], offsets[r + 1])`` with
``offsets = block_offsets(N, comm.size)``. The partitioners here are pure
functions of those distributed arrays: each rank passes its own rows and gets back
the part of each of them. Every function is collective over ``comm``; invalid
input found on any rank raises the same :class:`~meshchain.core.errors.DeclarationError`
on every rank (the ranks agree on errors before raising, so none is left waiting in
a collective).

* :func:`block_offsets` -- the block distribution itself.
* :func:`rib` -- recursive inertial bisection (Hydra's default), computed in
  parallel, exactly balanced, and bitwise independent of the number of ranks.
* :func:`kway` -- METIS k-way (through pymetis) on the graph gathered to rank 0.

Determinism of :func:`rib`
--------------------------
The result of :func:`rib` is a function of the *global* coordinate array, the
global ids and ``nparts`` only: computing it on 1, 2, 3 or 4 ranks holding blocks of
the same array gives the same parts, bit for bit. Floating-point sums over ranks
would break this (addition is not associative), so:

* every reduction over elements (centroid, inertia tensor) is an **exact** sum: each
  float64 is split, from its IEEE bits, into integer chunks of a fixed-point
  super-accumulator (32-bit limbs spanning the exponent range actually present,
  agreed by an ``Allreduce(MAX)``), the chunks are summed in int64 (order
  independent; carries are normalised every few thousand rows so nothing
  overflows), summed over ranks with an integer ``Allreduce``, and brought to a
  canonical limb form. Converting that to float64 is a fixed sequence of IEEE
  operations on identical integers. The centroid and the inertia tensor therefore
  do not depend on how the elements are spread over the ranks, nor on their order;
* every per-element quantity (centred coordinates, products, projections) is
  computed with elementwise IEEE operations (``+``, ``-``, ``*``) whose results do
  not depend on the array they sit in (no BLAS, no fused multiply-add);
* the principal axis comes from a vectorised cyclic Jacobi eigen-solver built from
  elementwise ``+ - * / sqrt`` only (no LAPACK, whose kernels may differ between
  CPUs), run on the same matrices on every rank; its sign is fixed by making the
  largest-magnitude component positive;
* the split is a parallel radix selection on the exact total order
  ``(projection, global id)``: histogram counts are integers, so the lower half gets
  exactly the prescribed number of elements.

Examples
--------
>>> from mpi4py import MPI
>>> import numpy as np
>>> block_offsets(10, 4)
array([ 0,  3,  6,  8, 10])
>>> xy = np.array([[0.0, 0.0], [3.0, 0.1], [1.0, 0.0], [2.0, 0.1]])
>>> rib(xy, MPI.COMM_SELF, nparts=2)
array([0, 1, 0, 1], dtype=int32)
"""

from __future__ import annotations

from ..core.errors import InternalError

import operator

import numpy as np

from meshchain.comm.blocks import as_integer, block_offsets
from meshchain.core.errors import DeclarationError

__all__ = ["block_offsets", "rib", "kway"]

# Limb width of the exact accumulator, rows summed between carry normalisations,
# digit width of the radix selection and the cap on Jacobi sweeps.
_LIMB = 32
_LIMB_MASK = (1 << _LIMB) - 1
_CHUNK_ROWS = 1 << 14
_DIGIT = 8
_RADIX = 1 << _DIGIT
_JACOBI_SWEEPS = 60


# --------------------------------------------------------------------------- utils


def _agree(comm, message: str | None) -> None:
    """Collective: if ``message`` is set on some rank, raise the lowest such rank's
    message as :class:`DeclarationError` on every rank (O(log P): an allreduce and,
    only on error, a broadcast)."""
    if comm.size == 1:
        if message is not None:
            raise DeclarationError(message)
        return
    MPI = _mpi()
    first = comm.allreduce(comm.rank if message is not None else comm.size, op=MPI.MIN)
    if first < comm.size:
        text = comm.bcast(message, root=first)
        raise DeclarationError(f"{text} (found on rank {first} of {comm.size})")


def _same_everywhere(comm, values) -> np.ndarray:
    """Collective: per entry, whether every rank passed the same int (one allreduce).

    An entry of ``None`` on a rank does not take part in the comparison for it.
    """
    MPI = _mpi()
    lo = -(1 << 62)
    v = np.array([lo if x is None else x for x in values] + [lo if x is None else -x for x in values], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, v, op=MPI.MAX)
    k = len(values)
    return (v[:k] == -v[k:]) | (v[:k] == lo)


def _mpi():
    from mpi4py import MPI

    return MPI


# --------------------------------------------------------------- exact reductions


def _exact_group_sums(values: np.ndarray, group: np.ndarray, ngroups: int, comm):
    """Exact sums of the columns of ``values`` per group, over all ranks.

    Returns ``(limbs, exponent)``, or ``None`` on every rank if some value on
    some rank is not finite. ``limbs`` is an int64 array of shape
    ``(ngroups * k, nlimbs)`` (rows ordered by ``(group, column)``), in canonical
    form -- every limb but the last in ``[0, 2**32)`` -- and the exact sum of column
    ``j`` of group ``g`` is ``sum(limbs[g * k + j, i] * 2**(exponent + 32 * i))``.
    The limbs do not depend on the order of the rows nor on how they are
    distributed over the ranks.
    """
    MPI = _mpi()
    n, k = values.shape
    # IEEE decomposition without frexp: value = (-1)**negative * mant * 2**q exactly.
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    field = (bits >> 52) & 0x7FF
    mant = (bits & ((1 << 52) - 1)) | ((field > 0).astype(np.int64) << 52)
    q = np.maximum(field, 1) - 1075
    big = 1 << 40
    bounds = np.array([-big, -big, 0], dtype=np.int64)
    if n:
        present = mant != 0
        bounds[0] = -np.where(present, q, big).min()
        bounds[1] = np.where(present, q, -big).max()
        bounds[2] = (field == 0x7FF).any()
    comm.Allreduce(MPI.IN_PLACE, bounds, op=MPI.MAX)
    if bounds[2]:
        return None
    if bounds[1] == -big:  # every value on every rank is zero
        return np.zeros((ngroups * k, 1), dtype=np.int64), 0
    qmin, qmax = int(-bounds[0]), int(bounds[1])
    # Limbs 0 .. nlimbs-1 weigh 2**(qmin + 32 j); the top ones are headroom.
    nlimbs = (qmax - qmin) // _LIMB + 4
    acc = np.zeros((ngroups * k, nlimbs), dtype=np.int64)
    flat = acc.reshape(-1)
    cols = np.arange(k, dtype=np.int64)
    for start in range(0, n, _CHUNK_ROWS):
        stop = min(n, start + _CHUNK_ROWS)
        mc = mant[start:stop]
        shift = np.maximum(q[start:stop] - qmin, 0)  # zeros (q = -1074) clamp to 0
        off = shift & (_LIMB - 1)
        t0 = (mc & _LIMB_MASK) << off  # < 2**63
        t1 = (mc >> _LIMB) << off  # < 2**52
        c0 = t0 & _LIMB_MASK
        c1 = (t0 >> _LIMB) + (t1 & _LIMB_MASK)
        c2 = t1 >> _LIMB
        sign = (bits[start:stop] >> 63) | 1  # -1 or +1
        c0 *= sign
        c1 *= sign
        c2 *= sign
        row = ((group[start:stop, None].astype(np.int64) * k + cols) * nlimbs + (shift >> 5)).ravel()
        np.add.at(flat, row, c0.ravel())
        np.add.at(flat, row + 1, c1.ravel())
        np.add.at(flat, row + 2, c2.ravel())
        _normalise_limbs(acc)
    comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    _normalise_limbs(acc)
    return acc, qmin


def _limbs_to_int(limbs: np.ndarray) -> list[int]:
    """Python ints ``sum(limbs[r, i] * 2**(32 i))`` of canonical limb rows (for checks)."""
    low = np.ascontiguousarray(limbs[:, :-1]).astype("<u4")
    top = _LIMB * (limbs.shape[1] - 1)
    return [int.from_bytes(low[r].tobytes(), "little") + (int(limbs[r, -1]) << top) for r in range(len(limbs))]


def _normalise_limbs(acc: np.ndarray) -> None:
    """Carry so every limb but the top one lies in ``[0, 2**32)`` (value unchanged)."""
    for j in range(acc.shape[1] - 1):
        carry = acc[:, j] >> _LIMB  # floor division, also for negative limbs
        acc[:, j] -= carry << _LIMB
        acc[:, j + 1] += carry


def _exact_means(values, group, ngroups, counts, comm, what: str) -> np.ndarray:
    """Per-group column means of ``values``, independent of the distribution.

    The sums are exact (:func:`_exact_group_sums`); each is converted to float64 by
    adding its limbs from the most significant down (a fixed sequence of IEEE
    operations on identical integers, accurate to a few ulps) and divided by the
    group's element count.
    """
    k = values.shape[1]
    reduced = _exact_group_sums(values, group, ngroups, comm)
    out = np.full((ngroups, k), np.inf)
    if reduced is not None:
        limbs, exponent = reduced
        total = np.zeros(len(limbs), dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(limbs.shape[1] - 1, -1, -1):
                total = total + np.ldexp(limbs[:, i].astype(np.float64), exponent + _LIMB * i)
        n = np.asarray(counts, dtype=np.float64)
        out = np.where(n[:, None] > 0, total.reshape(ngroups, k) / np.maximum(n, 1.0)[:, None], 0.0)
    if not np.isfinite(out).all():
        # Identical on every rank (computed from reduced data): raising is collective.
        raise DeclarationError(
            f"rib: the {what} overflows float64; the coordinates are too large in magnitude. "
            "Rescale the coordinates (for example to the unit box) before partitioning."
        )
    return out


# ------------------------------------------------------------------ eigen solver


def _principal_axes(cov: np.ndarray) -> np.ndarray:
    """Unit eigenvector of the largest eigenvalue of each symmetric ``cov[g]``.

    Vectorised cyclic Jacobi using only elementwise IEEE operations, so the result
    is bitwise reproducible on any CPU and independent of the batch. The sign is
    chosen so that the component of largest magnitude (first one on ties) is
    positive.
    """
    a = np.array(cov, dtype=np.float64, copy=True)
    ng, d, _ = a.shape
    v = np.zeros_like(a)
    v[:, np.arange(d), np.arange(d)] = 1.0
    pairs = [(p, r) for p in range(d) for r in range(p + 1, d)]
    tiny = 2.0**-70
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for _ in range(_JACOBI_SWEEPS):
            rotated = False
            for p, r in pairs:
                apq = a[:, p, r]
                app = a[:, p, p]
                aqq = a[:, r, r]
                active = np.abs(apq) > tiny * (np.abs(app) + np.abs(aqq))
                if not active.any():
                    continue
                rotated = True
                safe = np.where(active, apq, 1.0)
                tau = (aqq - app) / (2.0 * safe)
                root = np.sqrt(1.0 + tau * tau)
                t = np.where(tau >= 0.0, 1.0 / (tau + root), -1.0 / (root - tau))
                t = np.where(np.isfinite(t), t, 0.0)  # |tau| so large that tau*tau overflows
                c = 1.0 / np.sqrt(1.0 + t * t)
                s = t * c
                c = np.where(active, c, 1.0)[:, None]
                s = np.where(active, s, 0.0)[:, None]
                # A <- A J, then A <- J^T A, V <- V J with J = [[c, s], [-s, c]] at (p, r).
                colp, colr = a[:, :, p].copy(), a[:, :, r].copy()
                a[:, :, p] = c * colp - s * colr
                a[:, :, r] = s * colp + c * colr
                rowp, rowr = a[:, p, :].copy(), a[:, r, :].copy()
                a[:, p, :] = c * rowp - s * rowr
                a[:, r, :] = s * rowp + c * rowr
                a[:, p, r] = np.where(active, 0.0, a[:, p, r])
                a[:, r, p] = np.where(active, 0.0, a[:, r, p])
                vp, vr = v[:, :, p].copy(), v[:, :, r].copy()
                v[:, :, p] = c * vp - s * vr
                v[:, :, r] = s * vp + c * vr
            if not rotated:
                break
    best = np.argmax(a[:, np.arange(d), np.arange(d)], axis=1)
    axes = v[np.arange(ng), :, best]
    lead = np.argmax(np.abs(axes), axis=1)
    flip = axes[np.arange(ng), lead] < 0.0
    axes[flip] = -axes[flip]
    return axes + 0.0


def _order_keys(x: np.ndarray) -> np.ndarray:
    """uint64 keys with the same order as the float64 ``x`` (-0.0 taken as +0.0)."""
    bits = np.ascontiguousarray(x + 0.0).view(np.uint64)
    negative = (bits >> np.uint64(63)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint64(1 << 63))


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
    MPI = _mpi()
    size = comm.size
    rank = comm.rank
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
    same = _same_everywhere(comm, [want, gdim if n_local else None, int(global_ids is not None),
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
    n_total = comm.allreduce(n_local, op=MPI.SUM)
    n_before = comm.exscan(n_local, op=MPI.SUM)  # collective; None on rank 0
    n_before = int(n_before) if rank else 0
    if n_total == 0 or nparts == 1:
        return np.zeros(n_local, dtype=np.int32)
    gdim = comm.allreduce(gdim if n_local else -1, op=MPI.MAX)
    x = x.reshape(n_local, gdim)
    if gids is None:
        gids = np.arange(n_local, dtype=np.int64) + int(n_before)
        max_id = n_total - 1
    else:
        top = np.array([gids.max() if n_local else 0], dtype=np.int64)
        comm.Allreduce(MPI.IN_PLACE, top, op=MPI.MAX)
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


def _checked_weights(weights, n_local: int) -> np.ndarray:
    """``weights`` as float64 of shape ``(n_local,)``, or a DeclarationError saying what is wrong."""
    w = np.asarray(weights)
    if w.dtype.kind not in "fiub" or w.shape != (n_local,):
        raise DeclarationError(
            f"rib: weights must be a real array with one value per local row, shape ({n_local},), got dtype "
            f"{w.dtype} and shape {w.shape}; pass one weight per element.")
    w = w.astype(np.float64)
    if not np.isfinite(w).all() or (w < 0).any():
        raise DeclarationError("rib: weights must be finite and non-negative; "
                               f"found {w[~np.isfinite(w) | (w < 0)][0]!r}.")
    return w


def _weight_units(w: np.ndarray, comm, *, bits: int = 24) -> np.ndarray:
    """Weights quantised to int64 units of ``max(w) / 2**bits`` (max over every rank), at least 1."""
    MPI = _mpi()
    top = np.array([w.max() if len(w) else 0.0])
    comm.Allreduce(MPI.IN_PLACE, top, op=MPI.MAX)
    if top[0] <= 0:
        return np.ones(len(w), dtype=np.int64)
    return np.floor(w / top[0] * float(1 << bits)).astype(np.int64) + 1


def _group_sums(values: np.ndarray, g: np.ndarray, ng: int, comm) -> np.ndarray:
    """Exact int64 sums of ``values`` per group over every rank."""
    MPI = _mpi()
    sums = np.rint(np.bincount(g, values.astype(np.float64), ng)).astype(np.int64)
    comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    return sums


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
    MPI = _mpi()
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
        comm.Allreduce(MPI.IN_PLACE, hist, op=MPI.SUM)
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


# ------------------------------------------------------------------------ k-way


def kway(xadj, adjncy, comm, *, nparts: int | None = None, seed: int = 0, weights=None) -> np.ndarray:
    """METIS k-way partition of a distributed graph, computed on rank 0.

    The graph is gathered to rank 0 (``Gatherv``), cleaned there (self-loops and
    duplicate edges removed, made symmetric by adding missing reverse edges),
    partitioned with ``pymetis.part_graph(..., recursive=False)`` (METIS
    ``PartGraphKway``) with ``options.seed = seed``, and the parts are scattered
    back (``Scatterv``).

    Parameters
    ----------
    xadj : array_like of int, shape (n_local + 1,)
        This rank's CSR row pointers into ``adjncy`` (non-decreasing; a non-zero
        start is subtracted).
    adjncy : array_like of int
        Global vertex ids of the neighbours of the local rows, in ``[0, N)``.
        Global ids follow the rank order: rank ``r``'s rows are
        ``[sum(n_local of ranks < r), ...)`` -- the block distribution.
    comm : mpi4py.MPI.Comm
        Communicator (collective call).
    nparts : int, optional
        Number of parts, ``>= 1``; default ``comm.size``. The same on every rank.
    seed : int, optional
        METIS random seed; the same seed gives the same partition.
    weights : array_like of float, shape (n_local,), optional
        Non-negative finite load of each local vertex (METIS vertex weights, for load
        balance), quantised to integers ``floor(w / max(w) * 2**16) + 1``.

    Returns
    -------
    numpy.ndarray
        int32 part in ``[0, nparts)`` of each local row. ``nparts == 1`` returns
        zeros without calling METIS.

    Raises
    ------
    DeclarationError
        On every rank, for malformed CSR arrays, neighbour ids out of range,
        ranks disagreeing on ``nparts``/``seed``, pymetis missing on rank 0 or
        METIS failing.

    Notes
    -----
    Limits: the whole graph must fit in rank 0's memory -- the gathered arrays and
    the symmetrised copy take roughly ``(N + 4 * nnz) * 8`` bytes plus METIS's own
    workspace (several times the graph); pymetis is built here with 64-bit
    ``idx_t`` (``pymetis.zero_copy_dtype()``), but a 32-bit METIS build caps
    ``N`` and ``2 * edges`` at ``2**31 - 1``. MPI counts of one message are C ints
    unless the MPI library provides MPI-4 large counts. Balance is METIS's
    default ``ufactor`` of 30: each part holds at most about 1.03 times the average
    (not guaranteed; METIS may also leave a part empty on a disconnected or tiny
    graph, or when ``nparts`` exceeds the vertex count).

    Examples
    --------
    >>> from mpi4py import MPI
    >>> import numpy as np
    >>> xadj = np.array([0, 1, 3, 5, 7, 9, 10])           # a path 0-1-2-3-4-5
    >>> adjncy = np.array([1, 0, 2, 1, 3, 2, 4, 3, 5, 4])
    >>> parts = kway(xadj, adjncy, MPI.COMM_SELF, nparts=2)
    >>> sorted(np.bincount(parts).tolist())
    [3, 3]
    """
    MPI = _mpi()
    size = comm.size
    rank = comm.rank
    message = None
    want = size if nparts is None else nparts
    n_local = 0
    ptr = np.zeros(1, dtype=np.int64)
    adj = np.zeros(0, dtype=np.int64)
    w = None
    try:
        want = as_integer(want, "kway: nparts")
        if not 1 <= want < 1 << 31:
            raise DeclarationError(f"kway: nparts={want} must be at least 1 (and below 2**31); pass a positive number of parts.")
        seed = as_integer(seed, "kway: seed")
        if not -(1 << 31) <= seed < 1 << 31:
            raise DeclarationError(f"kway: seed={seed} does not fit METIS's 32-bit seed; pass a smaller int.")
        ptr = np.asarray(xadj)
        adj = np.asarray(adjncy)
        if ptr.ndim != 1 or len(ptr) < 1 or ptr.dtype.kind not in "iu":
            raise DeclarationError(
                f"kway: xadj must be a 1-D integer array of length n_local + 1, got dtype {ptr.dtype} and shape "
                f"{ptr.shape}; pass the CSR row pointers of this rank's rows."
            )
        if adj.ndim != 1 or (adj.dtype.kind not in "iu" and adj.size):
            raise DeclarationError(
                f"kway: adjncy must be a 1-D integer array, got dtype {adj.dtype} and shape {adj.shape}; "
                "pass the global neighbour ids of this rank's rows."
            )
        ptr = ptr.astype(np.int64) - int(ptr[0])
        adj = adj.astype(np.int64)
        if (np.diff(ptr) < 0).any():
            raise DeclarationError("kway: xadj decreases; CSR row pointers must be non-decreasing.")
        if int(ptr[-1]) != len(adj):
            raise DeclarationError(
                f"kway: xadj spans {int(ptr[-1])} entries but adjncy has {len(adj)}; pass matching CSR arrays."
            )
        n_local = len(ptr) - 1
        w = None if weights is None else _checked_weights(weights, n_local)
    except (ValueError, TypeError) as err:
        message = str(err).replace("rib:", "kway:") if isinstance(err, DeclarationError) else f"kway: the graph arrays could not be read ({err}); pass integer CSR arrays."

    _agree(comm, message)
    if not _same_everywhere(comm, [want, seed, int(weights is not None)]).all():
        _agree(comm, f"kway: the ranks pass different nparts or seed (this rank: {want}, {seed}); pass the same on every rank.")
    nparts = want
    sizes = comm.gather((n_local, len(adj)), root=0)
    n_total = comm.allreduce(n_local, op=MPI.SUM)
    bad = adj[(adj < 0) | (adj >= n_total)]
    _agree(
        comm,
        None if bad.size == 0 else
        f"kway: adjncy holds vertex id {int(bad[0])} outside [0, {n_total}); pass global ids of the {n_total} vertices.",
    )
    if nparts == 1 or n_total == 0:
        return np.zeros(n_local, dtype=np.int32)

    degree = np.diff(ptr)
    root = rank == 0
    counts = np.array([c for c, _ in sizes], dtype=np.int64) if root else None
    nnzs = np.array([z for _, z in sizes], dtype=np.int64) if root else None
    all_degree = np.empty(n_total if root else 0, dtype=np.int64)
    all_adj = np.empty(int(nnzs.sum()) if root else 0, dtype=np.int64)
    comm.Gatherv(degree, [all_degree, counts, MPI.INT64_T] if root else None, root=0)
    comm.Gatherv(adj, [all_adj, nnzs, MPI.INT64_T] if root else None, root=0)
    all_units = None
    if w is not None:
        units = _weight_units(w, comm, bits=16)
        all_units = np.empty(n_total if root else 0, dtype=np.int64)
        comm.Gatherv(units, [all_units, counts, MPI.INT64_T] if root else None, root=0)

    parts = np.zeros(n_total if root else 0, dtype=np.int32)
    failure = None
    if root:
        try:
            parts = _metis_kway(all_degree, all_adj, n_total, nparts, seed, all_units)
        except Exception as err:  # reported on every rank below
            failure = f"kway: METIS failed on rank 0 ({type(err).__name__}: {err}); check the graph and that pymetis is installed."
    _agree(comm, failure)
    out = np.empty(n_local, dtype=np.int32)
    comm.Scatterv([parts, counts, MPI.INT32_T] if root else None, out, root=0)
    return out


def _metis_kway(degree: np.ndarray, adjncy: np.ndarray, n: int, nparts: int, seed: int, vweights=None) -> np.ndarray:
    """Clean the gathered graph (no self-loops or duplicates, symmetric) and run METIS."""
    import pymetis

    rows = np.repeat(np.arange(n, dtype=np.int64), degree)
    keep = rows != adjncy
    rows, cols = rows[keep], adjncy[keep]
    u = np.concatenate([rows, cols])
    v = np.concatenate([cols, rows])
    order = np.lexsort((v, u))
    u, v = u[order], v[order]
    first = np.ones(len(u), dtype=bool)
    first[1:] = (u[1:] != u[:-1]) | (v[1:] != v[:-1])
    u, v = u[first], v[first]
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(u, minlength=n), out=xadj[1:])
    dtype = pymetis.zero_copy_dtype()
    options = pymetis.Options(seed=seed)
    graph = pymetis.CSRAdjacency(xadj.astype(dtype), v.astype(dtype))
    extra = {} if vweights is None else {"vweights": vweights.astype(dtype)}
    _, membership = pymetis.part_graph(nparts, graph, options=options, recursive=False, **extra)
    parts = np.asarray(membership, dtype=np.int64)
    if parts.shape != (n,) or (n and (parts.min() < 0 or parts.max() >= nparts)):
        raise InternalError(f"METIS returned an invalid partition of shape {parts.shape}")
    return parts.astype(np.int32)
