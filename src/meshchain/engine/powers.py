"""The matrix powers kernel: ``A x, A² x, ..., Aˢ x`` from one halo exchange.

A product ``y = A x`` needs ``x`` on the columns of this rank's owned rows, which reach
``d`` halo layers (the pattern's depth; 1 for a matrix assembled over a mesh). ``s``
products in a row also need, on this rank, the rows of ``A`` in halo layers
``1..(s-1) d``: product ``k`` is computed on the rows of layers ``0..(s-k) d`` (on the halo
rows redundantly: their owners compute them too), so its result is valid that deep, and
product ``k + 1`` finds its columns there. One exchange of ``x``, ``s d`` layers deep and
one message per neighbour, replaces ``s`` exchanges: Hoemmen's matrix powers kernel, or
the OP2 paper's communication-avoiding chain applied to a sparse matrix.

The halo rows are copies of their owners' rows, fetched once (one exchange of rows of
fixed width: global column ids and values, as wide as the longest row on any rank) and
kept until the layout changes; their columns are renumbered to this rank's elements. When
only the matrix's values change (:attr:`~.matrices.Pattern.version`: assembled again, as
in a time loop), only the halo rows' values are fetched again, into the same rows (one
exchange of the values, kept for it): the rows, their plans and compiled calls stay. The owned rows are the
matrix's own, summed in its order: with ``s = 1`` the product has the bits of
``A.mult``; with any ``s`` the products have the bits of ``s`` calls of ``A.mult`` on
integer data (floating-point sums of a halo row's copy may be ordered otherwise).

Examples
--------
>>> import numpy as np, meshchain as mc
>>> cells, nodes = mc.Set(2, "cells"), mc.Set(3, "nodes")
>>> c2n = mc.Map(cells, nodes, 2, [[0, 1], [1, 2]], "c2n")
>>> A = mc.Mat(nodes, nodes, [(c2n, c2n)], "A")
>>> ones = mc.Kernel.from_source("def ones(a):\\n    for i in range(2):\\n        for j in range(2):\\n"
...                              "            a[i, j] += 1.0\\n")
>>> mc.par_loop(ones, cells, A(mc.INC, (c2n, c2n)))
>>> x = mc.Dat(nodes, 1, np.array([1.0, 0.0, 0.0]), "x")
>>> ys = [mc.Dat(nodes, 1, None, f"y{k}") for k in range(3)]
>>> A.powers(x, ys)
>>> [y.data[:, 0].tolist() for y in ys]
[[1.0, 1.0, 0.0], [2.0, 3.0, 1.0], [5.0, 9.0, 4.0]]
"""

from __future__ import annotations

import numpy as np

from ..backends.sparse import add_scaled, csr_rows, csr_sequence, same_values, scaled_values, sequence_on_ranks
from ..comm.agree import raise_together
from ..comm.exchange import HaloExchange, HaloItem
from ..core.arrays import unique_integers
from ..core.errors import DataShapeError, DeclarationError
from .boundary import layer_rows

__all__ = ["PowersRows", "SequencePlan", "sequence_plan", "powers"]


class PowersRows:
    """The rows an ``s``-step product runs on this rank: owned rows first (the matrix's; on
    several ranks those that need no received value in more of the products first,
    :func:`_early_first`), then those of halo layers ``1..(s-1) d`` by layer; ``targets`` the
    scalar row of a dat each one writes, ``ends[l]`` how many of them lie in layers ``0..l``."""

    __slots__ = ("steps", "indptr", "split", "indices", "values", "targets", "ends", "version", "layout", "exchanges",
                 "unsigned", "scaled", "scaled_by", "plans", "refill")

    def __init__(self, steps, indptr, split, indices, values, targets, ends, version, layout, refill):
        self.steps, self.indptr, self.split, self.indices, self.values = steps, indptr, split, indices, values
        self.targets, self.ends, self.version, self.layout = targets, ends, version, layout
        self.refill = refill  # how the values are fetched again when only they changed (a _Refill)
        self.exchanges = {}  # ids of storages -> (storages, their exchange, s d layers deep)
        self.plans = {}  # (ids of x's and the scale's storages) -> the SequencePlan on these rows
        wide = np.uint32 if max(len(targets), len(values), int(indices.max(initial=0)) + 1,
                                int(targets.max(initial=0)) + 1) < 2**32 else np.uint64
        # (indptr, split, indices, targets) as the narrowest unsigned integers that hold them (faster)
        self.unsigned = tuple(a.astype(wide) for a in (indptr, split, indices, targets))
        self.scaled = None  # the values of S A S ...
        self.scaled_by = None  # ... for this copy of S's diagonal (worked out again when it changes)

    def count(self, layers: int) -> int:
        """Rows in layers ``0..layers``."""
        return int(self.ends[min(layers, len(self.ends) - 1)])

    def close(self) -> None:
        for _, exchange in self.exchanges.values():
            exchange.close()
        self.exchanges.clear()
        for plan in self.plans.values():
            plan.close()
        self.plans.clear()
        if self.refill is not None:
            self.refill.close()


def powers(matrices, mat, x, ys) -> None:
    """``ys[k] = A^(k+1) x`` for ``k = 0..s-1`` (collective; see the module docstring)."""
    sequences(matrices, mat, [(x, list(ys), None)])


def sequences(matrices, mat, wanted, *, scale=None) -> None:
    """Several sequences of products with one halo exchange (collective): for each
    ``(x, ys, shifts)`` of ``wanted``, ``ys[0] = (S A S - shifts[0] I) x`` and ``ys[k] =
    (S A S - shifts[k] I) ys[k-1]`` (``shifts`` None: zeros; ``scale``: the dat of ``S``'s
    diagonal, None: the identity). A sequence may carry ``pulls`` as a fourth item: ``ys[k] +=
    pulls[k] ys[k-2]`` (``ys[-1]`` is ``x``; ``pulls[0]`` must be 0), the three-term recurrence
    of a Newton basis with complex conjugate shifts. ``s``, the longest sequence's length,
    sets the depth: every ``x`` of a sequence with products (and ``scale``, where stale)
    travels in the one exchange, ``s`` layers deep; a shorter sequence's products are valid deeper than
    needed. With no shifts and no scale the products have the bits of :func:`powers`' (a
    shift of 0 and a scale of 1 change no bit). The s-step Krylov methods build their bases
    with it (Newton shifts, Jacobi scaling)."""
    session = matrices.session
    wanted = [(x, ys, shifts, pulls[0] if pulls else None) for x, ys, shifts, *pulls in wanted]
    steps = _checked_all(matrices, mat, wanted, scale)
    pattern, rows = prepare(matrices, mat, steps)
    depth = pattern.depth
    for x, ys, _, _ in wanted:
        session.force_read(x)
        for y in ys:
            session.force_write(y)
    if scale is not None:
        session.force_read(scale)
    wanted = [(session.storage(x), ys, shifts, pulls) for x, ys, shifts, pulls in wanted if ys]
    scaled = session.storage(scale) if scale is not None else None
    if session.distributed:
        sources = [xs for xs, _, _, _ in wanted] + ([scaled] if scaled is not None else [])
        stale = tuple(storage for storage in sources if storage.valid_depth < steps * depth)
        if stale:
            exchange = _exchange(session, pattern, rows, stale, steps * depth)
            exchange.begin()
            exchange.end()
            for storage in stale:
                storage.valid_depth = steps * depth
    values = rows.values
    indptr, _, indices, targets = rows.unsigned
    if scaled is not None:
        values = _scaled(rows, scaled.host.reshape(-1))
    for xs, ys, shifts, pulls in wanted:
        before, previous = None, xs.host.reshape(-1)
        for k, y in enumerate(ys, start=1):
            storage = session.storage(y)
            out = storage.host.reshape(-1)
            shift = 0.0 if shifts is None else float(shifts[k - 1])
            count = rows.count((steps - k) * depth)
            csr_rows(indptr, indices, values, targets, count, previous, out, shift)
            if pulls is not None and pulls[k - 1] != 0.0:
                add_scaled(targets, count, before, float(pulls[k - 1]), out)
            storage.valid_depth = (steps - k) * depth if session.distributed else 0
            before, previous = previous, out


def _scaled(rows: PowersRows, scale: np.ndarray) -> np.ndarray:
    """The values of ``S A S`` on ``rows`` for ``S = diag(scale)``, worked out when ``scale``
    differs from the last one's copy."""
    if rows.scaled is None or rows.scaled_by is None or not same_values(rows.scaled_by, scale):
        if rows.scaled is None:
            rows.scaled = np.empty_like(rows.values)
        indptr, _, indices, targets = rows.unsigned
        scaled_values(indptr, indices, rows.values, targets, scale, rows.scaled)
        rows.scaled_by = scale.copy()
    return rows.scaled


class SequencePlan:
    """``s`` shifted (and scaled) products of one dat, ``Y[k] = (S A S - θ_k I) Y[k-1]`` with
    ``Y[0] = x``, into the rows of an array: checked and prepared once (collective), then run
    again and again by a solver while nothing changes the layout (:meth:`run`: one exchange
    of ``x`` when its halo is stale, the products in one call; with the matrix's current
    values: where they changed since the last run, assembled again, its rows' values are
    fetched again first, collective).
    On several ranks a run is one compiled call that also exchanges ``x`` (every product's
    rows that need no received value computed while its messages travel) where compiled code can call
    the MPI library (:func:`meshchain.comm.compiled.available`); elsewhere, and when the
    scale's halo is stale, the exchange runs from Python first. Each product has the bits of
    :func:`sequences`' (every row's running sum in order). The block s-step CG (:mod:`meshchain.linalg.blockcg`)
    runs its bases with it; :func:`sequence_plan` keeps one per dat with the matrix's rows.

    >>> import numpy as np, meshchain as mc
    >>> cells, nodes = mc.Set(2, "cells"), mc.Set(3, "nodes")
    >>> c2n = mc.Map(cells, nodes, 2, [[0, 1], [1, 2]], "c2n")
    >>> A = mc.Mat(nodes, nodes, [(c2n, c2n)], "A")
    >>> ones = mc.Kernel.from_source("def ones(a):\\n    for i in range(2):\\n        for j in range(2):\\n"
    ...                              "            a[i, j] += 1.0\\n")
    >>> mc.par_loop(ones, cells, A(mc.INC, (c2n, c2n)))
    >>> x = mc.Dat(nodes, 1, np.array([1.0, 0.0, 0.0]), "x")
    >>> plan = mc.get_runtime().surface.matrices.sequence_plan(A, x, 2)
    >>> Y = np.empty((3, plan.width)); plan.run(np.zeros(2), Y); Y[:, :3].tolist()
    [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [2.0, 3.0, 1.0]]
    """

    def __init__(self, matrices, mat, x, steps: int, *, scale=None, prepared=None):
        _checked(matrices, mat, [x], steps)
        if scale is not None:
            matrices.check_vector(mat, scale, mat.row_set, "powers scale")
        self.session, self.steps, self.matrices, self.mat = matrices.session, steps, matrices, mat
        self.pattern, self.rows = prepared or prepare(matrices, mat, steps)
        for d in (x, scale):
            if d is not None:
                self.session.force_read(d)
        self.x = self.session.storage(x)
        self.scale = self.session.storage(scale) if scale is not None else None
        self.host = self.x.host
        self.width = self.host.size
        depth = self.pattern.depth
        self.counts = np.array([self.rows.count((steps - k) * depth) for k in range(1, steps + 1)], dtype=np.int64)
        self.values = None  # the matrix's values as multiplied
        self.dim, self.inside = mat.dim, None  # the exchange and rows of runs inside one compiled call

    def run(self, shifts: np.ndarray, Y: np.ndarray) -> None:
        """``Y[0] = x`` (its local rows), ``Y[1..s]`` its products with ``shifts`` (collective
        when ``x``'s halo is stale or the matrix's values changed since the last run: every
        rank makes the same runs); row ``k`` of ``Y`` is valid on the rows of halo layers
        ``0..(s - k) d``. ``S A S`` is worked out again when the scale's or the matrix's values
        changed."""
        depth = self._ready(shifts, Y)
        if self.session.distributed and self.x.valid_depth < depth:
            if _compiled_mpi():
                self._run_inside(shifts, Y, depth)
                return
            self._exchanged(depth)
        indptr, _, indices, targets = self.rows.unsigned
        np.copyto(Y[0, :self.width], self.host.reshape(-1))
        csr_sequence(indptr, indices, self.values, targets, self.counts, np.asarray(shifts, dtype=np.float64), Y)

    def compiled_arguments(self, shifts: np.ndarray, Y: np.ndarray) -> tuple | None:
        """The arguments of :func:`~meshchain.backends.sparse.sequence_on_ranks` for the next
        :meth:`run`, for a caller's compiled code to make that call itself, with :meth:`run`'s
        checks made and ``S A S`` current; afterwards the caller says :meth:`exchanged`. None
        where :meth:`run` would not be that call: on one process, where compiled code cannot
        call MPI, or ``x``'s halo is valid."""
        depth = self._ready(shifts, Y)
        if not (self.session.distributed and self.x.valid_depth < depth and _compiled_mpi()):
            return None
        return self._inside_call(shifts, Y, depth)

    def exchanged(self, error: int) -> None:
        """After a caller made :meth:`compiled_arguments`'s call: ``x``'s halo is valid (an MPI
        ``error`` aborts every rank)."""
        if error:
            self._failed(error)
        self.x.valid_depth = self.steps * self.pattern.depth

    def _failed(self, error: int) -> None:
        from ..comm.compiled import abort_on_error

        abort_on_error(self.session.comm, "the matrix powers exchange inside a compiled call", error)

    def _ready(self, shifts: np.ndarray, Y: np.ndarray) -> int:
        """:meth:`run`'s checks, the scale's halo and ``S A S`` current; the depth of ``x``'s exchange."""
        if self.x.host is not self.host:
            raise DeclarationError("SequencePlan.run: the dat's storage moved (halo layers were added) after the "
                                   "plan was made; make a new plan.")
        if len(shifts) < self.steps or Y.ndim != 2 or Y.shape[0] < self.steps + 1 or Y.shape[1] < self.width \
                or Y.dtype != np.float64 or not Y.flags.c_contiguous:
            raise DataShapeError(f"SequencePlan.run: {self.steps} products need at least {self.steps} shifts (got "
                                 f"{len(shifts)}) and a C-contiguous float64 array of at least "
                                 f"{(self.steps + 1, self.width)} (got {Y.dtype} {Y.shape}).")
        rows, depth = self.rows, self.steps * self.pattern.depth
        self.matrices.settle(self.mat)  # assemblies recorded since are added
        if rows.version != self.pattern.version:  # new values since the last run: fetched again (collective)
            _refresh(self.matrices, self.mat, self.pattern, rows)
        distributed = self.session.distributed
        if self.scale is not None:
            if distributed and self.scale.valid_depth < depth:  # it travels with x (this run in Python)
                self._exchanged(depth)
            self.values = _scaled(rows, self.scale.host.reshape(-1))  # S A S, worked out again where the scale changed
        elif self.values is None:
            self.values = rows.values
        return depth

    def _run_inside(self, shifts: np.ndarray, Y: np.ndarray, depth: int) -> None:
        """:meth:`run` in one compiled call that calls MPI (:mod:`meshchain.comm.compiled`): the
        exchange of ``x`` started, every product's rows that need no received value (see
        :func:`rows_before_arrival`) computed while its messages travel (the library let to
        move them after each product's), then the rest."""
        self.exchanged(sequence_on_ranks(*self._inside_call(shifts, Y, depth)))

    def _inside_call(self, shifts: np.ndarray, Y: np.ndarray, depth: int) -> tuple:
        if self.inside is None:
            self.inside = self._inside(depth)
        exchange, spans, at = self.inside
        indptr, _, indices, targets = self.rows.unsigned
        return (addresses(), self.host.reshape(-1), exchange.send_at, exchange.send, exchange.receive_at,
                exchange.receive, exchange.requests, exchange.flag, exchange.statuses, indptr, indices, self.values,
                targets, spans, at, np.asarray(shifts, dtype=np.float64), Y)

    def _inside(self, depth: int):
        """``(exchange, spans, at)``: a compiled exchange of ``x`` ``depth`` layers deep, and
        each product's rows before and after the messages arrive (:func:`rows_before_arrival`)."""
        from ..comm.compiled import CompiledExchange

        layout = self.pattern.col_layout
        exports, imports = layer_rows(layout.exports, 0, depth), layer_rows(layout.imports, 0, depth)
        exchange = CompiledExchange(self.session.comm, exports, imports, self.dim, tag=self.x.tag)
        indptr, _, indices, targets = self.rows.unsigned
        spans, at = rows_before_arrival(indptr, indices, targets, self.counts, self.rows.count(0), self.width)
        return exchange, spans, at

    def close(self) -> None:
        """Free the compiled exchange's persistent requests."""
        if self.inside is not None:
            self.inside[0].close()
            self.inside = None

    def _exchanged(self, depth: int) -> None:
        """One exchange of ``x`` (and of the scale the first time), ``depth`` layers deep."""
        stale = tuple(storage for storage in (self.x, self.scale) if storage is not None and storage.valid_depth < depth)
        if not stale:
            return
        exchange = _exchange(self.session, self.pattern, self.rows, stale, depth)  # kept with the rows
        exchange.begin()
        exchange.end()
        for storage in stale:
            storage.valid_depth = depth


def sequence_plan(matrices, mat, x, steps: int, *, scale=None) -> SequencePlan:
    """The :class:`SequencePlan` of ``steps`` products of ``x`` (scaled by ``scale``), kept
    with the matrix's rows until the layout changes or ``x``'s storage moves (new values of
    the matrix are fetched into the same rows: the plan stays; collective: halo layers and
    rows are prepared)."""
    pattern, rows = prepare(matrices, mat, steps)
    session = matrices.session
    key = (id(session.storage(x)), None if scale is None else id(session.storage(scale)))
    found = rows.plans.get(key)
    if found is not None and found.host is session.storage(x).host and found.rows is rows:
        return found
    if found is not None:
        found.close()
    plan = rows.plans[key] = SequencePlan(matrices, mat, x, steps, scale=scale, prepared=(pattern, rows))
    return plan


def _compiled_mpi() -> bool:
    """Whether compiled code can call the MPI library here (by address)."""
    return addresses() is not None


def addresses():
    """:func:`meshchain.comm.compiled.addresses` (imported when first asked: it imports mpi4py)."""
    from ..comm.compiled import addresses

    return addresses()


def rows_before_arrival(indptr, indices, targets, counts, owned: int, width: int) -> tuple:
    """``(spans, at)``: for product ``k`` (``0..s-1``), the rows it computes before the
    exchange's messages arrive, ``spans[at[2k]:at[2k + 1]]``, and after,
    ``spans[at[2k + 1]:at[2k + 2]]``, as runs of rows (``(first, end)`` pairs, flat: see
    :func:`~meshchain.backends.sparse.csr_spans`). Before: the rows all of whose columns,
    and whose own entry (the shift's term), hold values already (for the first product the
    owned entries, ``< owned``; for a later one the entries the product before wrote
    before); after, the others. Every row once, so each product has the bits of the
    sequence run after the exchange.

    >>> indptr = np.array([0, 2, 4, 6]); indices = np.array([0, 1, 1, 2, 2, 0])
    >>> spans, at = rows_before_arrival(indptr, indices, np.arange(3), np.array([3, 2]), owned=2, width=3)
    >>> [spans[at[i]:at[i + 1]].tolist() for i in range(4)]
    [[0, 1], [1, 3], [], [0, 2]]
    """
    pieces = []
    for early in _early_rows(indptr, indices, targets, counts, owned, width):
        pieces += [_runs(early), _runs(~early)]
    at = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return np.concatenate(pieces).astype(np.asarray(indptr).dtype), at


def _early_rows(indptr, indices, targets, counts, owned: int, width: int):
    """For each product ``k`` in turn, which of its rows (the first ``counts[k]``) need no
    received value (see :func:`rows_before_arrival`). A row early in product ``k + 1`` is
    early in product ``k``: its own entry was written early."""
    indptr, indices = np.asarray(indptr, dtype=np.int64), np.asarray(indices, dtype=np.int64)
    targets = np.asarray(targets, dtype=np.int64)
    ready = np.arange(width) < owned
    for count in np.asarray(counts, dtype=np.int64):
        lengths = np.diff(indptr[:count + 1])
        row_of_entry = np.repeat(np.arange(count), lengths)
        missing = np.bincount(row_of_entry, weights=~ready[indices[:indptr[count]]], minlength=count)
        early = (missing == 0) & ready[targets[:count]]  # the shift reads the row's own entry
        yield early
        ready = np.zeros(width, dtype=bool)
        ready[targets[:count][early]] = True


def _early_first(indptr, indices, targets, counts, owned: int) -> np.ndarray | None:
    """An order of the owned rows (the first ``owned``) in which those early in more of the
    products of ``counts`` come first, each kind in the matrix's order (None: that order
    already). Each product's early rows are then one run from the first row and its late
    ones one run, not a run per stretch of rows between two near the halo: the four products
    of ``s = 4`` over 2179 owned rows and 779 halo rows were 648 runs and took 60.7-61.3 µs,
    59.1-59.2 µs as eight runs (AMD EPYC)."""
    width = max(int(np.max(indices, initial=-1)) + 1, int(np.max(targets, initial=-1)) + 1)
    levels = np.zeros(owned, dtype=np.int64)
    for early in _early_rows(indptr, indices, targets, counts, owned, width):
        levels += early[:owned]
    order = np.argsort(-levels, kind="stable")
    return None if np.array_equal(order, np.arange(owned)) else order


def _rows_in_order(indptr, split, indices, values, targets, order: np.ndarray) -> tuple:
    """The arrays of CSR rows with the first ``len(order)`` rows taken in ``order`` (the rest
    as they are), and the places of the new first rows' entries among the old ones."""
    lengths = np.diff(indptr[:len(order) + 1])[order]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    entries = np.repeat(indptr[order] - starts[:-1], lengths) + np.arange(starts[-1])
    first, head = len(order), int(starts[-1])
    return (np.concatenate([starts, indptr[first + 1:]]),
            np.concatenate([starts[:-1] + split[order] - indptr[order], split[first:]]),
            np.concatenate([indices[entries], indices[head:]]), np.concatenate([values[entries], values[head:]]),
            np.concatenate([targets[order], targets[first:]]), entries)


def _runs(chosen: np.ndarray) -> np.ndarray:
    """The runs of True in ``chosen`` as flat ``(first, end)`` pairs."""
    edges = np.diff(np.concatenate([[0], chosen.astype(np.int8), [0]]))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1).reshape(-1)


def prepare(matrices, mat, steps: int):
    """``(pattern, rows)`` for ``steps`` products: the halo layers built (collective: every
    dat's storage moves), the assemblies added, the halo rows fetched. A solver calls it
    before it takes views of its vectors, so that its iterations only exchange vectors."""
    session = matrices.session
    pattern = matrices.pattern(mat)
    if session.distributed and steps * pattern.depth > session.layout.depth:
        session.ensure_depth(steps * pattern.depth)  # collective: every rank asks for the same depth
        pattern = matrices.pattern(mat)
    matrices.settle(mat)
    return pattern, _rows(matrices, mat, pattern, steps)


def _checked_all(matrices, mat, wanted, scale) -> int:
    """The longest sequence's length (at least 1) after checking every dat and shift list."""
    steps = max((len(ys) for _, ys, _, _ in wanted), default=0)
    _checked(matrices, mat, [d for x, ys, _, _ in wanted for d in (x, *ys)], steps)
    for _, ys, shifts, pulls in wanted:
        for what, given in (("shifts", shifts), ("pulls", pulls)):
            if given is not None and len(given) < len(ys):
                raise DataShapeError(f"Mat {mat.name!r}: {len(given)} {what} for {len(ys)} products.")
        if pulls is not None and len(ys) and pulls[0] != 0.0:
            raise DataShapeError(f"Mat {mat.name!r}: the first product of a sequence has no vector two before it "
                                 f"to pull (pulls[0] = {pulls[0]}, not 0).")
    if scale is not None:
        matrices.check_vector(mat, scale, mat.row_set, "powers scale")
    return steps


def _checked(matrices, mat, dats, steps: int) -> None:
    """Checks the matrix and the dats (inputs and outputs) of ``steps`` products."""
    if mat.row_set is not mat.col_set or mat.dim != mat.col_dim:
        raise DataShapeError(f"Mat {mat.name!r}.powers: A^k x needs a square matrix (rows and columns on one set, one "
                             f"dim); {mat.name!r} is {mat.row_set.name!r} x {mat.col_set.name!r}, dims {mat.dim} x "
                             f"{mat.col_dim}.")
    if steps < 1:
        raise DataShapeError(f"Mat {mat.name!r}.powers: give at least one output dat (s = len(ys) >= 1).")
    for d in dats:
        matrices.check_vector(mat, d, mat.row_set, "powers")
    ids = [id(d) for d in dats]
    if len(set(ids)) != len(ids):
        raise DataShapeError(f"Mat {mat.name!r}.powers: x and the output dats must be distinct dats (each product "
                             f"reads the one before).")


def _rows(matrices, mat, pattern, steps: int) -> PowersRows:
    """The rows of an ``steps``-step product, fetched at first use and again when the layout
    changed (collective then); when only the matrix's values changed (it was assembled
    again), their values alone are fetched again into the same rows (collective): the rows'
    plans, exchanges and compiled calls stay."""
    record = matrices.record(mat)
    found = record.powers.get(steps)
    if found is not None and found.layout is pattern.layout and found.refill.source is pattern.indptr:
        if found.version != pattern.version:
            _refresh(matrices, mat, pattern, found)
        return found
    if found is not None:
        found.close()
    built = record.powers[steps] = _build(matrices, mat, pattern, steps)
    return built


class _Refill:
    """Where a :class:`PowersRows`' values come from, to fetch them again (:func:`_refresh`):
    ``source`` the pattern's ``indptr`` they were built on (its structure; its values change
    in place), ``owned`` the flat places of the pattern's entries in the table of rows that
    :func:`_fetch` exchanges (None where a refresh exchanges nothing, and once the entries sent
    are found), ``halo`` the halo elements whose rows follow the owned ones and
    ``gather`` the flat places of their entries in those rows of the table (in the rows'
    order), the table's ``shape``, the halo layers exchanged (``reach``) and ``entries``, the
    places of the owned rows' entries among the pattern's (None: the pattern's order; see
    :func:`_early_first`). A table of the
    rows sent and received only and its exchange are made at the first refresh and kept
    (:meth:`close` frees the exchange); a refresh fills only the entries a neighbour receives."""

    __slots__ = ("source", "owned", "halo", "gather", "shape", "reach", "entries", "sent", "table", "exchange")

    def __init__(self, source, owned, halo, gather, shape, reach: int, entries):
        self.source, self.owned, self.halo, self.gather = source, owned, halo, gather
        self.shape, self.reach, self.entries = shape, reach, entries
        self.sent = self.table = self.exchange = None

    def halo_values(self, session, layout, values: np.ndarray) -> np.ndarray:
        """The halo rows' values, in the rows' order, for the pattern's ``values`` (collective
        on several ranks when rows of halo layers are kept)."""
        if not (session.distributed and self.reach):
            return np.zeros(0)
        if self.table is None:
            self._make(session, layout)
        where, entries, halo = self.sent
        self.table.reshape(-1)[where] = values[entries]
        self.exchange.begin()
        self.exchange.end()
        return self.table[halo].reshape(-1)[self.gather]

    def _make(self, session, layout) -> None:
        """The table of the rows sent and received only (the exported elements' and the halo
        elements', renumbered in that order; not every local element's) and its exchange."""
        exports, imports = layer_rows(layout.exports, 0, self.reach), layer_rows(layout.imports, 0, self.reach)
        exported = unique_integers(np.concatenate([np.zeros(0, dtype=np.int64), *exports.values()]))
        kept = np.concatenate([exported, self.halo]).astype(np.int64)
        place = np.full(self.shape[0], -1, dtype=np.int64)
        place[kept] = np.arange(len(kept))
        width = self.shape[1]
        self.table = np.zeros((len(kept), width))
        sends = {neighbour: place[rows] for neighbour, rows in exports.items()}
        receives = {neighbour: place[rows] for neighbour, rows in imports.items()}
        self.exchange = HaloExchange(session.comm, [HaloItem(self.table, sends, receives)], tag=7, transport="p2p")
        element, column = np.divmod(self.owned, width)
        entries = np.flatnonzero(np.isin(element, exported))  # the entries neighbours receive
        self.sent = (place[element[entries]] * width + column[entries], entries, place[self.halo])
        self.owned = None  # (what was kept only to find those)

    def close(self) -> None:
        if self.exchange is not None:
            self.exchange.close()
        self.table = self.exchange = None


def _refresh(matrices, mat, pattern, rows: PowersRows) -> None:
    """The values of ``rows`` fetched again after the matrix's values changed (the same
    structure and layout; collective on several ranks): the bits :func:`_build` would give,
    without sorting the halo rows again."""
    session = matrices.session
    owned, entries = len(pattern.values), rows.refill.entries
    rows.values[:owned] = pattern.values if entries is None else pattern.values[entries]
    rows.values[owned:] = rows.refill.halo_values(session, session.layout_of(mat.row_set), pattern.values)
    rows.version, rows.scaled_by = pattern.version, None  # S A S worked out again at the next product


def _build(matrices, mat, pattern, steps: int) -> PowersRows:
    session, dim = matrices.session, mat.dim
    layout = session.layout_of(mat.row_set)
    reach = (steps - 1) * pattern.depth if session.distributed else 0
    layers = layout.data_layers
    halo = np.flatnonzero((layers >= 1) & (layers <= reach))
    halo = halo[np.argsort(layers[halo], kind="stable")]
    error, fetched = None, _fetch(matrices, mat, pattern, layout, reach)
    try:
        extra = _halo_rows(mat, pattern, fetched, halo)
    except DeclarationError as exc:
        error, extra = exc, None
    raise_together(session.comm if session.distributed else None, error)
    indptr_h, split_h, indices_h, values_h, gather = extra
    n_owned_entries = pattern.indptr[-1]
    indptr = np.concatenate([pattern.indptr, n_owned_entries + indptr_h[1:]]).astype(np.int64)
    split = np.concatenate([pattern.split, n_owned_entries + split_h]).astype(np.int64)
    indices = np.concatenate([pattern.indices, indices_h]).astype(np.int64)
    values = np.concatenate([pattern.values, values_h])
    targets = np.concatenate([np.arange(pattern.n_rows, dtype=np.int64),
                              (halo[:, None] * dim + np.arange(dim)[None, :]).ravel()]).astype(np.int64)
    per_layer = np.bincount(layers[halo], minlength=reach + 1)[: reach + 1] * dim
    per_layer[0] = pattern.n_rows
    ends = np.cumsum(per_layer)
    order = entries = None
    if session.distributed:  # rows early in more products first (fewer runs before and after the messages)
        counts = [ends[min((steps - k) * pattern.depth, len(ends) - 1)] for k in range(1, steps + 1)]
        order = _early_first(indptr, indices, targets, counts, pattern.n_rows)
    if order is not None:
        indptr, split, indices, values, targets, entries = _rows_in_order(indptr, split, indices, values, targets,
                                                                         order)
    owned = fetched[3] if session.distributed and reach else None  # kept only where a refresh exchanges
    refill = _Refill(pattern.indptr, owned, halo, gather, fetched[1].shape, reach, entries)
    return PowersRows(steps, indptr, split, indices, values, targets, ends, pattern.version, pattern.layout, refill)


def _fetch(matrices, mat, pattern, layout, reach: int):
    """``(global columns, values, width, owned)``: per local element of the row set, ``dim``
    rows of ``width`` entries each (``-1``: none): the owned rows filled here (the flat places
    ``owned`` of the pattern's entries), those of halo layers ``1..reach`` received from their
    owners (collective on several ranks)."""
    session, dim, col_dim = matrices.session, mat.dim, mat.col_dim
    lengths = np.diff(pattern.indptr)
    width = max(1, int(matrices.max_over_ranks([int(lengths.max()) if lengths.size else 0])[0]))
    n_local = len(layout.global_ids)
    columns = np.full((n_local, dim * width), -1.0)
    values = np.zeros((n_local, dim * width))
    rows = np.repeat(np.arange(pattern.n_rows), lengths)
    position = np.arange(len(rows)) - pattern.indptr[rows]
    global_columns = pattern.col_layout.global_ids[pattern.indices // col_dim] * col_dim + pattern.indices % col_dim
    owned = (rows // dim) * (dim * width) + (rows % dim) * width + position
    columns.reshape(-1)[owned] = global_columns
    values.reshape(-1)[owned] = pattern.values
    _exchange_table(session, layout, reach, [columns, values])
    return columns, values, width, owned


def _exchange_table(session, layout, reach: int, tables) -> None:
    """The rows of halo layers ``1..reach`` of each of ``tables`` (one row per local element)
    received from their owners (on several ranks; collective)."""
    if not (session.distributed and reach):
        return
    exports, imports = layer_rows(layout.exports, 0, reach), layer_rows(layout.imports, 0, reach)
    exchange = HaloExchange(session.comm, [HaloItem(table, exports, imports) for table in tables], tag=7,
                            transport="p2p")
    try:
        exchange.begin()
        exchange.end()
    finally:
        exchange.close()


def _halo_rows(mat, pattern, fetched, halo: np.ndarray) -> tuple:
    """The halo elements' rows as split CSR over this rank's columns (see :func:`_fetch`), and
    the flat places of their entries in ``values[halo]``, in order (:func:`_refresh`)."""
    columns, values, width, _ = fetched
    dim, col_dim = mat.dim, mat.col_dim
    table = columns[halo].reshape(len(halo) * dim, width)
    numbers = values[halo].reshape(len(halo) * dim, width)
    present = table >= 0
    row_of, _ = np.nonzero(present)
    wanted = table[present].astype(np.int64)
    gids = pattern.col_layout.global_ids
    order = np.argsort(gids, kind="stable")
    found = np.searchsorted(gids, wanted // col_dim, sorter=order)
    found = np.minimum(found, max(len(order) - 1, 0))
    local = order[found] if len(order) else found
    missing = ~np.equal(gids[local], wanted // col_dim) if len(order) else np.ones(len(wanted), dtype=bool)
    if wanted.size and missing.any():
        raise DeclarationError(f"Mat {mat.name!r}.powers: a halo row couples to global column "
                               f"{int(wanted[missing][0])}, which this rank's halo layers do not hold: the matrix "
                               f"reaches further than the mesh its maps describe (lower s).")
    local_columns = local * col_dim + wanted % col_dim
    keys = row_of * pattern.n_cols + local_columns
    sort = np.argsort(keys, kind="stable")
    row_of, local_columns, entries = row_of[sort], local_columns[sort], numbers[present][sort]
    n_rows = len(halo) * dim
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row_of, minlength=n_rows))]).astype(np.int64)
    owned = np.bincount(row_of[local_columns < pattern.n_owned_cols], minlength=n_rows)
    gather = np.flatnonzero(present.reshape(-1))[sort]
    return indptr, (indptr[:-1] + owned).astype(np.int64), local_columns.astype(np.int64), entries, gather


def _exchange(session, pattern, rows: PowersRows, storages: tuple, depth: int):
    """One halo exchange of ``storages``, ``depth`` layers deep, one message per neighbour (kept)."""
    key = tuple(id(storage) for storage in storages)
    found = rows.exchanges.get(key)
    if found is not None and all(a is b for a, b in zip(found[0], storages)):
        return found[1]
    layout = pattern.col_layout
    exports, imports = layer_rows(layout.exports, 0, depth), layer_rows(layout.imports, 0, depth)
    exchange = session.backend.halo_exchange(session.comm, [(storage, exports, imports) for storage in storages],
                                             tag=storages[0].tag, transport="p2p")
    rows.exchanges[key] = (storages, exchange)
    return exchange
