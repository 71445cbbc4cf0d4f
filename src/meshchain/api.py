"""The public API: the one module that holds the global session.

Everything here works on the current :class:`~meshchain.engine.session.Session`, created
on first use from the ``MESHCHAIN_*`` environment variables (:func:`reset_runtime` starts
a new one). User objects (sets, maps, dats, globals) reach it through
:mod:`meshchain.core.context`, which this module installs.
"""

from __future__ import annotations

import atexit

from .core import context
from .core.config import Config
from .core.errors import CaptureError
from .engine.capture import CapturedStep
from .engine.chains import ChainOptions
from .engine.profiles import SessionProfile, profile_block
from .engine.session import Session
from .types.extruded import in_region

__all__ = ["get_runtime", "reset_runtime", "par_loop", "flush", "configure", "stats", "loop_chain", "capture", "partition",
           "repartition", "rebalance", "profile"]

_session: Session | None = None
_closing_at_exit = False
_session_profile = SessionProfile()  # config.profile: the whole run's trace
_profile_at_exit = False


def get_runtime() -> Session:
    """The process's session (created on first use from ``MESHCHAIN_*`` variables)."""
    global _session
    if _session is None:
        _session = _watched(Session())
    return _session


def engine_surface():
    """What ``meshchain.linalg`` and ``meshchain.io`` use of the current session
    (:class:`~meshchain.engine.surface.Surface`)."""
    return get_runtime().surface


def _watched(session: Session) -> Session:
    """``session``, closed at exit before MPI is finalized (its plans hold persistent requests)."""
    global _closing_at_exit
    if session.comm is not None and not _closing_at_exit:
        # registered after mpi4py imported MPI, so it runs before mpi4py finalizes MPI
        atexit.register(lambda: _session is not None and _session.close())
        _closing_at_exit = True
    _follow_profile(session)
    return session


def _follow_profile(session: Session) -> None:
    """Start, switch or end the run's profile as ``config.profile`` says; written at exit."""
    global _profile_at_exit
    _session_profile.follow(session)
    if _session_profile.profiler is not None and not _profile_at_exit:
        atexit.register(_session_profile.finish)  # after MPI was imported: runs before MPI is finalized
        _profile_at_exit = True


context.install(get_runtime)


def reset_runtime(*, comm=None, **options) -> Session:
    """Drop all pending loops, caches and statistics; start again from the environment and
    ``options``.

    ``comm`` (keyword-only) selects the MPI communicator (default: ``COMM_WORLD`` when
    started by an MPI launcher, else none). On one process the sets, maps, dats and globals
    declared before stay usable; a session on several ranks starts with none (declare and
    partition the mesh again).
    """
    global _session
    config = Config.from_env().replace(**options)
    old = _session
    if old is not None:
        old.close()
    _session = _watched(Session(config, comm=comm, inherit=old))
    return _session


def par_loop(kernel, iterset, *args, name=None, region=None) -> None:
    """Apply ``kernel`` to every element of ``iterset``.

    Parameters
    ----------
    kernel : Kernel
        Takes one view per argument.
    iterset : Set
        The set to iterate over.
    *args : Arg
        ``dat(mode)``, ``dat(mode, map[i])``, ``dat(mode, map)`` or ``glob(mode)``.
    name : str, keyword-only
        Loop name for statistics and chain configuration (default: the kernel's name).
    region : str, keyword-only
        For a loop over an :class:`~meshchain.ExtrudedSet`: ``mc.ALL`` (every layer, the
        default), ``mc.ON_BOTTOM``, ``mc.ON_TOP`` or ``mc.ON_INTERIOR_FACETS`` (PyOP2's
        ``iteration_region``; see :mod:`meshchain.types.extruded`).

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> nodes, edges = mc.Set(3, "nodes"), mc.Set(2, "edges")
    >>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2]], "e2n")
    >>> deg = mc.Dat(nodes, 1, None, "deg", dtype=np.int32)
    >>> @mc.kernel
    ... def count(a, b):
    ...     a[0] += 1
    ...     b[0] += 1
    >>> mc.par_loop(count, edges, deg(mc.INC, e2n[0]), deg(mc.INC, e2n[1]))
    >>> deg.data[:, 0].tolist()
    [1, 2, 1]
    """
    if region is not None:
        iterset, args = in_region(iterset, args, region)
    (_session or get_runtime()).record(kernel, iterset, args, name)


def flush() -> None:
    """Execute every pending loop now."""
    get_runtime().flush()


def configure(**options) -> None:
    """Change options (see :class:`~meshchain.core.config.Config`); pending loops run first.

    Examples
    --------
    >>> import meshchain as mc
    >>> mc.configure(block_size=256)
    >>> mc.get_runtime().config.block_size
    256
    >>> mc.configure(block_size=2048)
    """
    session = get_runtime()
    session.reconfigure(**options)
    _follow_profile(session)


def stats(*, reset: bool = False, all_ranks: bool = False, summary: bool = False):
    """A snapshot of per-loop statistics (:class:`~meshchain.core.stats.Stats`).

    ``reset`` clears them; ``all_ranks`` (collective) sums the counters and times over the
    ranks (``neighbours`` is the maximum). ``summary`` (collective) returns instead a
    :class:`~meshchain.core.summary.Summary` in the manner of PETSc's ``-log_view``: per
    loop and chain the time (slowest and fastest rank, % of the total), messages, bytes
    and each loop's achieved bandwidth beside the machine's copy bandwidth; print it.

    Examples
    --------
    >>> import meshchain as mc
    >>> cells = mc.Set(1000, "cells")
    >>> q = mc.Dat(cells, 1, None, "q")
    >>> bump = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
    >>> mc.par_loop(bump, cells, q(mc.RW))
    >>> row = mc.stats(summary=True).loops["bump"]
    >>> row.calls >= 1, row.bytes_moved >= 16000
    (True, True)
    """
    return get_runtime().statistics(reset=reset, all_ranks=all_ranks, summary=summary)


def profile(path=None):
    """Record a timeline of everything run inside a ``with`` block (collective on several ranks).

    Writes a Chrome trace-event file (open it in https://ui.perfetto.dev or
    ``chrome://tracing``): a track per rank, with every plan run of a loop or chain, its
    phases (core, boundary, halo: the redundant work of communication-avoiding chains,
    tail), its halo exchanges (post, wait: bytes, messages, neighbours), reductions over
    ranks, plan builds, compilations and captured replays (:mod:`meshchain.core.profiling`).
    Pending loops run when the block begins and ends. ``MESHCHAIN_PROFILE=trace.json``
    (``mc.configure(profile=...)``) records a whole run instead.

    Parameters
    ----------
    path : str or Path, optional
        The trace file; on several ranks rank 0 writes every rank's events, unless the name
        contains ``{rank}`` (then each rank writes its own). None: nothing is written (the
        events stay in the returned object).

    Returns
    -------
    meshchain.engine.profiles.Profile
        A context manager yielding the record: ``events`` (this rank's), ``path`` and
        ``seconds``, filled in when the block ends.

    Examples
    --------
    >>> import meshchain as mc
    >>> cells = mc.Set(3, "cells")
    >>> q = mc.Dat(cells, 1, None, "q")
    >>> bump = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
    >>> with mc.profile() as timeline:
    ...     for _ in range(2):
    ...         mc.par_loop(bump, cells, q(mc.RW))
    >>> [e["name"] for e in timeline.events if e.get("cat") == "unit"]
    ['loop bump', 'loop bump']
    """
    return profile_block(get_runtime(), path)


def partition(method: str = "rib", *, coords=None, seed_set=None, depth: int = 1, seed: int = 0,
              blocks=None) -> None:
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
        Halo layers to build (1 suffices for loop-by-loop execution; at most 48).
    seed : int, keyword-only
        Random seed for METIS.
    blocks : tuple of int, keyword-only
        Structured grids (:class:`~meshchain.Grid`) are always cut into a block decomposition,
        whatever ``method`` the rest of the mesh gets: ``blocks=(px, py)`` (or ``(px, py, pz)``,
        product = the rank count) fixes it; by default the factors that cut the fewest points'
        links are chosen. A program of grids only needs no ``coords``. Call ``g.interior(w)``
        for every interior the loops use before partitioning.

    Examples
    --------
    >>> import meshchain as mc
    >>> mc.partition("block")   # one process: nothing to distribute
    """
    get_runtime().partition(method, coords=coords, seed_set=seed_set, depth=depth, seed=seed, blocks=blocks)


def repartition(method: str = "rib", *, coords=None, weights=None, seed: int = 0) -> None:
    """Move the distributed mesh to a new partition during a run (load balancing).

    Pending loops run first. Every set's owned elements move to their new owners with
    every dat's values (dats are moved, not recomputed: ``dat.gather()`` is unchanged, bit
    for bit); maps are laid out again from their declared connectivity, halos are rebuilt
    as deep as before and every plan, chain schedule and colouring is dropped (the next
    execution builds them again). Globals are the same on every rank and stay as they are.
    Collective: every rank calls it with the same method. A no-op on one process (the
    arguments are still checked).

    Parameters
    ----------
    method : {"rib", "kway", "block"}
        As in :func:`partition`; the seed set is the one ``mc.partition`` partitioned first.
        ``"rib"`` bisects ``coords`` where they are now, in parallel; ``"kway"`` runs METIS
        on the seed set's graph (gathered to rank 0, as in ``mc.partition``).
    coords : Dat, keyword-only
        Coordinates of the seed set, for ``"rib"``.
    weights : Dat or array_like, keyword-only
        Non-negative load per element of the seed set, for weighted ``"rib"`` and
        ``"kway"``: a Dat of dim 1 on the seed set, or this rank's owned elements' weights in
        local order (shape ``(n_owned,)``, as ``dat.data``). Elements then spread so that
        every rank gets about the same summed weight. ``"block"`` ignores weights.
    seed : int, keyword-only
        Random seed for METIS.

    Raises
    ------
    MeshchainError
        On every rank, for an unknown method, missing coordinates for ``"rib"``, weights of
        the wrong shape, negative or not finite, or a mesh that was never partitioned.

    Examples
    --------
    >>> import meshchain as mc
    >>> mc.repartition("block")   # one process: nothing moves
    """
    get_runtime().repartition(method, coords=coords, weights=weights, seed=seed)


def rebalance(method: str = "rib", *, coords=None, seed: int = 0):
    """Repartition with weights from measured costs, to remove load imbalance.

    Every loop's cost per iteration is measured (its compute seconds over its iterations,
    summed over the ranks, since the statistics were last reset); each element of the seed
    set weighs what its owned iterations cost (a loop over another set charges the seed
    element its first map into the seed set names, e.g. a boundary edge its cell), and
    :func:`repartition` moves the mesh so that every rank gets about the same summed weight.
    Every value is kept, bit for bit. Collective. A no-op on one process.

    Parameters
    ----------
    method : {"rib", "kway"}
        As in :func:`repartition` (``"rib"`` needs ``coords``).
    coords : Dat, keyword-only
        Coordinates of the seed set, for ``"rib"``.
    seed : int, keyword-only
        Random seed for METIS.

    Returns
    -------
    meshchain.engine.rebalance.Rebalance or None
        The costs per iteration by loop, this rank's weights before the move, and the
        imbalance of the summed weights before it (max/mean); None on one process.

    Examples
    --------
    >>> import meshchain as mc
    >>> mc.rebalance() is None   # one process: nothing moves
    True
    """
    return get_runtime().rebalance(method, coords=coords, seed=seed)


def capture(fn=None, *, name: str | None = None, ca=False, tile_size: int | None = None,
            max_halo: int | None = None):
    """Capture a step once and replay it as a whole: ``step = mc.capture(fn)`` or ``@mc.capture``.

    The first call of ``step(*args)`` runs ``fn(*args)`` and records its parallel loops as one
    chain, executed at once; later calls with the same arguments replay that chain without
    running ``fn`` (no Python between the loops) and return what ``fn`` returned. Other
    arguments, or ``mc.configure``/``mc.partition``/``mc.repartition`` since, capture it
    again. Reading or setting values inside ``fn`` raises
    :class:`~meshchain.core.errors.CaptureError`. See :mod:`meshchain.engine.capture`.

    Parameters
    ----------
    fn : callable
        The step. Used bare (``@mc.capture``) or with options (``@mc.capture(ca=True)``).
    name : str, keyword-only
        The step's chain name in statistics and diagnostics (default: ``fn``'s name).
    ca : True, False or "auto", keyword-only
        How the step runs on several ranks, as for :class:`loop_chain`; the default,
        False, runs it loop by loop, as it runs uncaptured.
    tile_size, max_halo : int or None, keyword-only
        As for :class:`loop_chain`.

    Returns
    -------
    CapturedStep
        Callable like ``fn``; ``.captures`` and ``.replays`` count what its calls did;
        ``.repeat(n, *args)`` calls it ``n`` times, on one process in one compiled call once
        replayed (:meth:`~meshchain.engine.capture.CapturedStep.repeat`).

    Examples
    --------
    >>> import meshchain as mc
    >>> cells = mc.Set(3, "cells")
    >>> q = mc.Dat(cells, 1, None, "q")
    >>> bump = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
    >>> step = mc.capture(lambda: mc.par_loop(bump, cells, q(mc.RW)), name="bump step")
    >>> for _ in range(4):
    ...     step()
    >>> q.data[:, 0].tolist(), step.captures, step.replays
    ([4.0, 4.0, 4.0], 1, 3)
    >>> step.repeat(6)
    >>> q.data[:, 0].tolist(), step.replays
    ([10.0, 10.0, 10.0], 9)
    """
    def captured(function):
        if not callable(function):
            raise CaptureError(f"mc.capture needs a callable (the step), got {type(function).__name__}.")
        options = ChainOptions.of(name if name is not None else getattr(function, "__name__", "step"), ca,
                                  tile_size, max_halo)
        return CapturedStep(function, options, get_runtime)

    return captured if fn is None else captured(fn)


class loop_chain:  # noqa: N801 - used like a function: ``with mc.loop_chain(...)``
    """Execute the loops recorded inside the block as one chain when the block ends.

    Parameters
    ----------
    name : str
    ca : True, False or "auto", keyword-only
        Communication-avoiding execution (one grouped exchange per segment), loop by loop,
        or decided per chain by the model.
    tile_size : int or None, keyword-only
        Sparse tiling: run the chain tile by tile, ``tile_size`` iterations of its seed loop
        per tile (see :mod:`meshchain.engine.tiling`); a chain of loops over one structured
        grid runs as a wavefront of whole slabs of its first loop instead
        (:mod:`meshchain.inspector.wavefront`); None runs it loop by loop.
    max_halo : int or None, keyword-only
        Most halo layers the chain may use (default: as many as can be built, 48).

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> nodes, edges = mc.Set(3, "nodes"), mc.Set(2, "edges")
    >>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2]], "e2n")
    >>> deg = mc.Dat(nodes, 1, None, "deg", dtype=np.int64)
    >>> twice = mc.Dat(nodes, 1, None, "twice", dtype=np.int64)
    >>> @mc.kernel
    ... def count(a, b):
    ...     a[0] += 1
    ...     b[0] += 1
    >>> @mc.kernel
    ... def double(d, t):
    ...     t[0] = 2 * d[0]
    >>> with mc.loop_chain("degrees", ca=True):
    ...     mc.par_loop(count, edges, deg(mc.INC, e2n[0]), deg(mc.INC, e2n[1]))
    ...     mc.par_loop(double, nodes, deg(mc.READ), twice(mc.WRITE))
    >>> twice.data[:, 0].tolist()
    [2, 4, 2]
    >>> mc.stats().chains["degrees"].executions
    1
    >>> with mc.loop_chain("tiled", tile_size=1):  # tiles of one node (the larger loop seeds)
    ...     mc.par_loop(count, edges, deg(mc.INC, e2n[0]), deg(mc.INC, e2n[1]))
    ...     mc.par_loop(double, nodes, deg(mc.READ), twice(mc.WRITE))
    >>> twice.data[:, 0].tolist(), mc.stats().chains["tiled"].tiles
    ([4, 8, 4], 3)
    """

    __slots__ = ("options", "run", "_session")

    def __init__(self, name: str, *, ca=True, tile_size: int | None = None, max_halo: int | None = None):
        self.options = ChainOptions.of(name, ca, tile_size, max_halo)
        self.run = None

    def __enter__(self) -> "loop_chain":
        self._session = get_runtime()
        self.run = self._session.open_chain(self.options)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._session.close_chain(self.run, force=exc_type is None)
