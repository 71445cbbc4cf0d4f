"""METIS k-way partitioning of a distributed graph, gathered to rank 0 (see :func:`kway`)."""

from __future__ import annotations

import numpy as np

from ...comm.agree import same_everywhere
from ...comm.blocks import as_integer
from ...comm.reductions import gather_to_root, scatter_from_root, sum_everywhere
from ...core.errors import DeclarationError, InternalError
from .agreed import _agree, _checked_weights, _weight_units

__all__ = ["kway"]


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
    if not same_everywhere(comm, [want, seed, int(weights is not None)]).all():
        _agree(comm, f"kway: the ranks pass different nparts or seed (this rank: {want}, {seed}); pass the same on every rank.")
    nparts = want
    n_total = sum_everywhere(comm, n_local)
    bad = adj[(adj < 0) | (adj >= n_total)]
    _agree(
        comm,
        None if bad.size == 0 else
        f"kway: adjncy holds vertex id {int(bad[0])} outside [0, {n_total}); pass global ids of the {n_total} vertices.",
    )
    if nparts == 1 or n_total == 0:
        return np.zeros(n_local, dtype=np.int32)

    root = rank == 0
    all_degree, counts = gather_to_root(comm, np.diff(ptr).astype(np.int64, copy=False))
    all_adj, _ = gather_to_root(comm, np.asarray(adj, dtype=np.int64))
    all_units = None
    if w is not None:
        all_units, _ = gather_to_root(comm, _weight_units(w, comm, bits=16), counts)

    parts = np.zeros(n_total if root else 0, dtype=np.int32)
    failure = None
    if root:
        try:
            parts = _metis_kway(all_degree, all_adj, n_total, nparts, seed, all_units)
        except Exception as err:  # reported on every rank below
            failure = f"kway: METIS failed on rank 0 ({type(err).__name__}: {err}); check the graph and that pymetis is installed."
    _agree(comm, failure)
    return scatter_from_root(comm, parts, counts, np.empty(n_local, dtype=np.int32))


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
