"""The session's side of :class:`~meshchain.types.mat.Mat`: sparsity, assembly, SpMV.

**Storage.** Each rank keeps its owned rows as compressed sparse rows (CSR) over its local
columns (owned column elements first, then halo ones, as dats are laid out); a matrix of
``dim > 1`` is stored by scalar rows ``element * dim + component``. Every row's columns are
sorted, so its owned-column entries come first and ``split[r]`` marks where the halo
columns start.

**Assembly.** A loop with a matrix argument is lowered to an ordinary loop: the kernel is
wrapped to write its element block into a scratch dat on the iteration set (``WRITE``, zeroed
first), and a dummy ``INC`` through the row map makes the loop run on the exec halo too, so
every contribution to an owned row is computed on its owner (no reverse exchange). When the
matrix is next used the blocks are added into the CSR values at positions computed once
per map pair (owned rows only).

**SpMV.** ``y = A x`` begins ``x``'s halo exchange (as deep as the columns reach), multiplies
the owned-column entries while it travels (with the session's progress mode), ends it and
adds the halo-column entries.
"""

from __future__ import annotations

import ast
import textwrap

import numpy as np

from ..backends.sparse import csr_halo, csr_owned, largest_row_sum, scatter_add, scatter_set
from ..comm.agree import raise_together
from ..comm.exchange import HaloExchange, HaloItem
from ..core.access import Access
from ..core.arrays import unique_integers
from ..core.errors import (AccessModeError, BackendUnavailableError, DataShapeError, DeclarationError, InternalError,
                           LoopError, SetMismatchError)
from ..ir.kernel import Kernel
from ..ir.loop import as_kernel
from ..types import Dat, Subset
from ..types.mat import MatArg
from . import block_matrices
from .boundary import layer_rows
from .powers import powers, prepare, sequence_plan, sequences

__all__ = ["Matrices", "Pattern"]


class Pattern:
    """One matrix's CSR on this rank (see the module docstring)."""

    __slots__ = ("indptr", "split", "indices", "values", "n_rows", "n_cols", "n_owned_cols",
                 "depth", "scatters", "layout", "keys", "assembled", "col_layout", "exchanges", "unsigned",
                 "row_gids", "version", "norms", "widest", "diagonal")
    # ``unsigned``: (indptr, split, indices) as the narrowest unsigned integers that hold them; the
    # SpMV kernels run measurably faster on them (no wraparound tests, 32-bit loop counters)

    def __init__(self, keys: np.ndarray, n_rows: int, n_cols: int, n_owned_cols: int,
                 depth: int, layout, col_layout, row_gids: np.ndarray):
        self.keys = keys  # sorted row * n_cols + col of every stored entry
        rows, self.indices = np.divmod(keys, n_cols)
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_rows))]).astype(np.int64)
        owned = np.bincount(rows[self.indices < n_owned_cols], minlength=n_rows)
        self.split = (self.indptr[:-1] + owned).astype(np.int64)
        self.values = np.zeros(len(keys))
        wide = np.uint32 if max(n_cols, len(keys)) < 2**32 else np.uint64
        self.unsigned = (self.indptr.astype(wide), self.split.astype(wide), self.indices.astype(wide))
        self.n_rows, self.n_cols, self.n_owned_cols = n_rows, n_cols, n_owned_cols  # rows: the owned ones
        self.depth, self.layout, self.scatters, self.assembled = depth, layout, {}, False
        self.col_layout, self.exchanges = col_layout, {}  # the halo exchanges of the vectors multiplied (and compiled)
        self.row_gids = row_gids  # global ids of the owned row elements, in local order
        self.version = 0  # counts changes of the values (what copies of them are checked against)
        self.norms = (-1, 0.0)  # (version, ||A||_inf over the ranks) of the last norm_inf
        self.widest = -1  # the most entries a row stores on any rank (-1: not summed yet)
        self.diagonal = None  # (rows with a stored diagonal entry, where it is stored), found at first use

    @property
    def rows(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_rows), np.diff(self.indptr))


class _Record:
    """What the session keeps of one matrix: its pattern, the assemblies not yet added,
    the dummy dat that makes assembly loops run on the exec halo and the scratch dats."""

    __slots__ = ("mat", "pattern", "pending", "touch", "scratch", "maps", "powers")

    def __init__(self, mat):
        self.mat, self.pattern, self.pending, self.touch = mat, None, [], None
        self.scratch, self.maps, self.powers = {}, {}, {}  # maps: key -> (row map, col map) of an assembly


class Matrices:
    """Every matrix of a session (``session.matrices``)."""

    def __init__(self, session):
        self.session = session
        self.records: dict = {}
        self._wrappers: dict = {}
        self._sums: dict = {}  # length -> a CompiledPairwiseSum of its own buffer (kept until close)

    # --- declaration and pattern ---------------------------------------------------------------------

    def declare(self, mat) -> None:
        self.records[mat.uid] = _Record(mat)

    def record(self, mat) -> _Record:
        found = self.records.get(mat.uid)
        if found is None or found.mat is not mat:
            raise DeclarationError(f"Mat {mat.name!r} belongs to another meshchain session (mc.reset_runtime() "
                                   f"discards every declaration); declare it again.")
        return found

    def pattern(self, mat, *, discard: bool = False) -> Pattern:
        """The matrix's CSR, built at first use (after ``mc.partition`` on several ranks) and
        again after ``mc.repartition``: then the values assembled before are lost, so this
        refuses unless ``discard`` (``A.zero()``). Deeper halo layers (a communication-avoiding
        chain, a matrix powers product) keep every rank's rows: the values move with them."""
        record = self.record(mat)
        session = self.session
        if session.distributed and not session.partitioned:
            raise LoopError(f"Mat {mat.name!r}: the mesh is not partitioned yet; call mc.partition(...) before "
                            f"assembling or using a matrix on several ranks.")
        pattern = record.pattern
        if pattern is not None and pattern.layout is not session.layout:
            moved = self._relaid(mat, pattern)
            if moved is not None:
                record.pattern = moved
                return moved
            if (pattern.assembled or record.pending) and not discard:
                raise DeclarationError(f"Mat {mat.name!r} was assembled before the mesh was repartitioned; its rows "
                                       f"moved: call {mat.name}.zero() and assemble it again.")
            for _, exchange in pattern.exchanges.values():
                exchange.close()
            record.pending.clear()
            pattern = None
        if pattern is None:
            pattern = record.pattern = self._build(mat)
        return pattern

    def _build(self, mat) -> Pattern:
        session, dim, col_dim = self.session, mat.dim, mat.col_dim
        rows_layout, cols_layout = session.layout_of(mat.row_set), session.layout_of(mat.col_set)
        n_owned_rows, n_owned_cols = rows_layout.n_owned * dim, cols_layout.n_owned * col_dim
        n_cols = len(cols_layout.global_ids) * col_dim
        keys, depth = [], 0
        for row_map, col_map in mat.maps:
            rows, cols, _ = self._entries(mat, row_map, col_map)
            keys.append(rows * n_cols + cols)
            if cols.size:
                depth = max(depth, int(cols_layout.data_layers[cols // col_dim].max()))
        if square(mat):  # every owned row keeps its diagonal entry (as PyOP2 does)
            diagonal = np.arange(n_owned_rows, dtype=np.int64)  # owned columns come first, in the rows' order
            keys.append(diagonal * n_cols + diagonal)
        depth = self._max(depth)
        return Pattern(unique_integers(np.concatenate(keys)), n_owned_rows, n_cols, n_owned_cols, depth,
                       session.layout, cols_layout, rows_layout.global_ids[:rows_layout.n_owned].copy())

    def _relaid(self, mat, pattern: Pattern) -> Pattern | None:
        """``pattern`` moved to the session's layout when it is the same partition with more
        halo layers (the same owners, so every rank keeps its rows): rows and columns
        renumbered by global id, values kept; None after a repartition. The scatters of
        assemblies are worked out again when used.

        The owned rows may come in another order: the layout orders them by their distance
        from the halo through the maps alive when it is built, and a map collected in between
        changes it (a second session on the same mesh: the InternalError "owned rows moved"
        before)."""
        session = self.session
        if session.layout.owner_blocks is None or session.layout.owner_blocks is not pattern.layout.owner_blocks:
            return None
        rows_layout, cols_layout = session.layout_of(mat.row_set), session.layout_of(mat.col_set)
        owned = rows_layout.global_ids[:rows_layout.n_owned]
        rows, cols = np.divmod(pattern.keys, pattern.n_cols)
        if not np.array_equal(owned, pattern.row_gids):
            place = _places_of(owned, pattern.row_gids)  # each old owned row element's place now
            if place is None:
                raise InternalError(f"Mat {mat.name!r}: owned rows changed when halo layers were added "
                                    f"(please report it)")
            rows = place[rows // mat.dim] * mat.dim + rows % mat.dim
        col_dim = mat.col_dim
        old_gids = pattern.col_layout.global_ids
        order = np.argsort(cols_layout.global_ids, kind="stable")
        elements = old_gids[cols // col_dim]
        found = np.minimum(np.searchsorted(cols_layout.global_ids, elements, sorter=order), len(order) - 1)
        where = order[found] if len(order) else found
        if elements.size and not np.array_equal(cols_layout.global_ids[where], elements):
            raise InternalError(f"Mat {mat.name!r}: a column element left this rank's halo when layers were added "
                                f"(please report it)")
        new_cols = where * col_dim + cols % col_dim
        n_cols = len(cols_layout.global_ids) * col_dim
        keys = rows * n_cols + new_cols
        sort = np.argsort(keys, kind="stable")
        for _, exchange in pattern.exchanges.values():
            exchange.close()
        moved = Pattern(keys[sort], pattern.n_rows, n_cols, pattern.n_owned_cols, pattern.depth, session.layout,
                        cols_layout, owned.copy())
        moved.values[:] = pattern.values[sort]
        moved.assembled, moved.version = pattern.assembled, pattern.version + 1
        return moved

    def _entries(self, mat, row_map, col_map):
        """Scalar rows and local columns of every entry the pair contributes to an owned row,
        and their positions in the element blocks of the iterations that run (owned + exec halo)."""
        session, dim, col_dim = self.session, mat.dim, mat.col_dim
        iterations = session.layout_of(row_map.source).exec_end(1)
        rv = session.layout.values(row_map)[:iterations]
        cv = session.layout.values(col_map)[:iterations]
        rows = (rv[:, :, None, None, None] * dim + np.arange(dim)[None, None, :, None, None])
        cols = (cv[:, None, None, :, None] * col_dim + np.arange(col_dim)[None, None, None, None, :])
        shape = (iterations, row_map.arity, dim, col_map.arity, col_dim)
        rows, cols = np.broadcast_to(rows, shape).ravel(), np.broadcast_to(cols, shape).ravel()
        picks = np.flatnonzero(rows < session.layout_of(mat.row_set).n_owned * dim)
        return rows[picks].astype(np.int64), cols[picks].astype(np.int64), picks

    # --- assembly ----------------------------------------------------------------------------------

    def record_assembly(self, kernel, iterset, args, name) -> None:
        """Record ``par_loop(kernel, iterset, *args)`` where some arguments are matrices
        (lowered, see the module docstring; a block matrix gives one argument per block)."""
        kernel = as_kernel(kernel)
        name = name or kernel.name
        positions = [i for i, a in enumerate(args) if isinstance(a, MatArg)]
        if len({id(args[i].mat) for i in positions}) != len(positions):
            raise LoopError(f"par_loop {name!r}: a loop assembles into a matrix through one argument, got "
                            f"{', '.join(repr(args[i]) for i in positions)}.")
        lowered = list(args)
        if isinstance(iterset, Subset):
            for i in positions:
                lowered[i] = self.session.mesh.subset_lowering.lowered_mat_arg(iterset, args[i])
        for i in positions:
            self._check_assembly(lowered[i], iterset, name)
        if len(args) != len(kernel.params):
            return self.session.record(kernel, iterset, args, name)  # make_loop names the count mismatch
        for i in positions:
            if lowered[i].access is Access.INC:
                self._check_kernel(kernel, lowered, i, name)
        touches, pending = [], []
        for i in positions:
            lowered[i], touch, done = self._lowered(lowered[i], iterset)
            touches.append(touch)
            pending.append(done)
        wrapper = self._wrapper(kernel, tuple((i, args[i].view_shape) for i in positions))
        self.session.record(wrapper, iterset, (*lowered, *touches), name)
        for mat, entry in pending:
            self.record(mat).pending.append(entry)

    def _check_assembly(self, arg, iterset, name: str) -> None:
        mat = arg.mat
        if self.session.config.backend in ("cupy", "cuda-emulation"):
            raise BackendUnavailableError(f"par_loop {name!r}: the cupy backend cannot assemble matrices yet "
                                          f"(Mat {mat.name!r}); assemble with the numba or reference backend.")
        if arg.row_map.source is not iterset:
            raise SetMismatchError(f"par_loop {name!r} over {iterset.name!r}: Mat {mat.name!r} is reached through "
                                   f"{arg.row_map.name!r}, which starts from {arg.row_map.source.name!r}.")

    def _lowered(self, arg, iterset) -> tuple:
        """``(the scratch dat's argument, the dummy increment, (mat, pending entry))`` of one
        matrix argument; builds the pattern and the scatter of its map pair at first use."""
        mat = arg.mat
        record = self.record(mat)
        pattern = self.pattern(mat)
        self.settle(mat)
        key = (arg.row_map.uid, arg.col_map.uid)
        record.maps[key] = (arg.row_map, arg.col_map)
        self._scatter(mat, pattern, key)
        scratch = record.scratch.get(key)
        if scratch is None:
            size = arg.view_shape[0] * arg.view_shape[1]
            scratch = record.scratch[key] = Dat(iterset, size, None, f"{mat.name}:{arg.row_map.name}-blocks")
        if record.touch is None:
            record.touch = Dat(mat.row_set, 1, None, f"{mat.name}:assembled")
        pattern.assembled = True
        return scratch(Access.WRITE), record.touch(Access.INC, arg.row_map[0]), (mat, (key, scratch, arg.access))

    def _scatter(self, mat, pattern: Pattern, key) -> tuple:
        """``(positions in the values, picks in the element blocks)`` of map pair ``key``
        (worked out at first use on this pattern and layout)."""
        found = pattern.scatters.get(key)
        if found is None:
            rows, cols, picks = self._entries(mat, *self.record(mat).maps[key])
            positions = np.searchsorted(pattern.keys, rows * pattern.n_cols + cols).astype(np.int64)
            found = pattern.scatters[key] = (positions, picks.astype(np.int64))
        return found

    @staticmethod
    def _check_kernel(kernel, args, position: int, name: str) -> None:
        param = kernel.params[position]
        kernel.index_safety(a.view_shape for a in args)
        bad = kernel.non_increment_uses(param)
        if bad:
            raise AccessModeError(
                f"kernel {kernel.name!r} in loop {name!r} at {kernel.where(bad[0])}: {param!r} is the matrix block "
                f"{args[position]!r}, which may only be incremented ('{param}[i, j] += ...' or '-= ...').")

    def _wrapper(self, kernel, blocks) -> Kernel:
        """``kernel`` with each matrix parameter (``blocks``: (position, shape) pairs) taken as
        a flat block, reshaped and zeroed first, plus one dummy increment parameter per matrix
        (cached per kernel and blocks)."""
        key = (id(kernel), blocks)
        found = self._wrappers.get(key)
        if found is not None and found[0] is kernel and kernel.unchanged():
            return found[1]
        kernel.constants()  # snapshot the user kernel's globals now, so that unchanged() can tell next time
        params, lines = list(kernel.params), []
        for n, (position, shape) in enumerate(blocks):
            flat, params[position] = f"_mc_block_flat{n}", f"_mc_block_flat{n}"
            lines += [f"    for _mc_k in range({shape[0] * shape[1]}):",
                      f"        {flat}[_mc_k] = 0.0",
                      f"    {kernel.params[position]} = {flat}.reshape(({shape[0]}, {shape[1]}))"]
        touches = [f"_mc_assembled{n}" for n in range(len(blocks))]
        body = textwrap.indent("\n".join(ast.unparse(statement) for statement in kernel.tree.body), "    ")
        source = f"def {kernel.name}_assembly({', '.join(params + touches)}):\n" + "\n".join(lines) + f"\n{body}\n"
        wrapper = Kernel.from_source(source, name=kernel.name, namespace=kernel.func.__globals__)
        self._wrappers[key] = (kernel, wrapper)
        return wrapper

    def settle(self, mat) -> None:
        """Add the element blocks of the assembly loops recorded since the last use."""
        record = self.record(mat)
        if not record.pending:
            return
        pattern = self.pattern(mat)
        pending, record.pending = record.pending, []
        pattern.version += 1
        for key, scratch, access in pending:
            blocks = self.session.dat_values(scratch, write=False, halos=True)
            positions, picks = self._scatter(mat, pattern, key)
            if access is Access.INC:
                scatter_add(pattern.values, positions, blocks.reshape(-1), picks)
            else:
                scatter_set(pattern.values, positions, blocks.reshape(-1), picks)

    # --- values ------------------------------------------------------------------------------------------

    def zero(self, mat) -> None:
        self.record(mat).pending.clear()  # their loops still run; their blocks are not added
        pattern = self.pattern(mat, discard=True)
        pattern.values.fill(0.0)
        pattern.version += 1

    def zero_rows(self, mat, rows, diagonal: float) -> None:
        pattern = self.pattern(mat)
        self.settle(mat)
        session = self.session
        error, local = None, np.zeros(0, dtype=np.int64)
        try:
            local = self._owned_rows(mat, rows)
            if diagonal != 0.0 and not square(mat):
                raise DataShapeError(f"Mat {mat.name!r}.zero_rows: rows and columns are on different sets (or have "
                                     f"different dims), so there is no diagonal to set to {diagonal}; pass "
                                     f"diagonal=0.0.")
        except DataShapeError as exc:
            error = exc
        raise_together(session.comm if session.distributed else None, error)
        scalar = (local[:, None] * mat.dim + np.arange(mat.dim)[None, :]).ravel()
        pattern.version += 1
        starts, ends = pattern.indptr[scalar], pattern.indptr[scalar + 1]
        for begin, end in zip(starts, ends):
            pattern.values[begin:end] = 0.0
        if diagonal != 0.0 and scalar.size:
            where = np.searchsorted(pattern.keys, scalar * pattern.n_cols + scalar)
            missing = (where >= len(pattern.keys)) | (pattern.keys[np.minimum(where, len(pattern.keys) - 1)]
                                                       != scalar * pattern.n_cols + scalar)
            if missing.any():
                raise DeclarationError(f"Mat {mat.name!r}.zero_rows: row {int(scalar[missing][0])} has no diagonal "
                                       f"entry in the sparsity; declare the matrix with a map pair that gives one.")
            pattern.values[where] = diagonal

    def _owned_rows(self, mat, rows) -> np.ndarray:
        ids = np.asarray(rows)
        if ids.dtype.kind not in "iu" and ids.size:
            raise DataShapeError(f"Mat {mat.name!r}.zero_rows: rows must be integer global ids, got {ids.dtype}.")
        ids = ids.astype(np.int64).ravel()
        bad = ids[(ids < 0) | (ids >= mat.row_set.size)]
        if bad.size:
            raise DataShapeError(f"Mat {mat.name!r}.zero_rows: row id {int(bad[0])} is outside "
                                 f"{mat.row_set.name!r} (size {mat.row_set.size}).")
        layout = self.session.layout_of(mat.row_set)
        owned = layout.global_ids[: layout.n_owned]
        order = np.argsort(owned, kind="stable")
        where = np.searchsorted(owned, ids, sorter=order)
        where = np.minimum(where, len(owned) - 1) if len(owned) else where
        hit = (owned[order[where]] == ids) if len(owned) else np.zeros(len(ids), dtype=bool)
        return unique_integers(order[where[hit]])

    def diagonal(self, mat, d) -> None:
        self.check_vector(mat, d, mat.row_set, "diagonal")
        self.session.dat_values(d, write=True)[...] = self.diagonal_values(mat).reshape(-1, mat.dim)

    def diagonal_values(self, mat) -> np.ndarray:
        """The owned rows' diagonal entries (zero where the sparsity has none), flat."""
        pattern = self.pattern(mat)
        self.settle(mat)
        out = np.zeros(pattern.n_rows)
        if not square(mat) or not len(pattern.keys):
            return out
        if pattern.diagonal is None:  # where the entries are: the structure's, found once
            rows = np.arange(pattern.n_rows)
            keys = rows * pattern.n_cols + rows
            where = np.minimum(np.searchsorted(pattern.keys, keys), len(pattern.keys) - 1)
            present = pattern.keys[where] == keys
            pattern.diagonal = (np.flatnonzero(present), where[present])
        rows, where = pattern.diagonal
        out[rows] = pattern.values[where]
        return out

    def norm_inf(self, mat) -> float:
        """``||A||_inf``, the largest absolute row sum (collective; kept until the values change,
        which every rank sees at the same call)."""
        pattern = self.pattern(mat)
        self.settle(mat)
        if pattern.norms[0] != pattern.version:
            pattern.norms = (pattern.version, self._max(largest_row_sum(pattern.indptr, pattern.values)))
        return pattern.norms[1]

    def max_nonzeros(self, mat) -> int:
        """The most entries any row stores (collective the first time for a pattern, which
        every rank makes at the same call)."""
        pattern = self.pattern(mat)
        if pattern.widest < 0:
            pattern.widest = int(self._max(int(np.diff(pattern.indptr).max()) if pattern.n_rows else 0))
        return pattern.widest

    def max_over_ranks(self, values) -> list:
        """Each of ``values`` (integers) maximised over the ranks (collective)."""
        array = np.asarray(values, dtype=np.int64)
        if self.session.distributed:
            out = np.empty_like(array)
            self.session.comm.Allreduce(array, out, op=_max())
            array = out
        return array.tolist()

    def _max(self, value):
        return self.session.comm.allreduce(value, op=_max()) if self.session.distributed else value

    def local_block(self, mat):
        import scipy.sparse as sp

        pattern = self.pattern(mat)
        self.settle(mat)
        return sp.csr_matrix((pattern.values.copy(), pattern.indices.copy(), pattern.indptr.copy()),
                             shape=(pattern.n_rows, pattern.n_cols))

    def global_entries(self, mat):
        """This rank's owned entries as (global row, global column, value), scalar numbering."""
        pattern = self.pattern(mat)
        self.settle(mat)
        dim, col_dim, session = mat.dim, mat.col_dim, self.session
        rows_ids = session.layout_of(mat.row_set).global_ids
        cols_ids = session.layout_of(mat.col_set).global_ids
        rows, cols = pattern.rows, pattern.indices
        return (rows_ids[rows // dim] * dim + rows % dim, cols_ids[cols // col_dim] * col_dim + cols % col_dim,
                pattern.values.copy())

    def to_scipy(self, mat):
        import scipy.sparse as sp

        rows, cols, values = self.global_entries(mat)
        shape = (mat.row_set.size * mat.dim, mat.col_set.size * mat.col_dim)
        session = self.session
        if session.distributed:
            parts = session.comm.gather((rows, cols, values), root=0)
            if session.rank != 0:
                return None
            rows, cols, values = (np.concatenate(p) for p in zip(*parts))
        return sp.csr_matrix((values, (rows, cols)), shape=shape)

    def nonzeros_per_row(self, mat) -> float:
        pattern = self.pattern(mat)
        counts = np.array([len(pattern.keys), pattern.n_rows], dtype=np.float64)
        if self.session.distributed:
            counts = self.session.comm.allreduce(counts)
        return float(counts[0] / max(counts[1], 1.0))

    # --- SpMV ---------------------------------------------------------------------------------------------

    def check_vector(self, mat, dat, expected_set, what: str, dim: int | None = None) -> None:
        dim = mat.dim if dim is None else dim
        if not isinstance(dat, Dat):
            raise DataShapeError(f"Mat {mat.name!r}.{what}: expected a meshchain.Dat, got {type(dat).__name__}.")
        if dat.dataset is not expected_set:
            raise SetMismatchError(f"Mat {mat.name!r}.{what}: Dat {dat.name!r} lives on {dat.dataset.name!r}, not on "
                                   f"{expected_set.name!r}.")
        if dat.dim != dim or dat.dtype != np.float64:
            raise DataShapeError(f"Mat {mat.name!r}.{what}: Dat {dat.name!r} has dim {dat.dim} and dtype {dat.dtype}; "
                                 f"the matrix needs float64 dats of dim {dim}.")

    def powers(self, mat, x, ys) -> None:
        """``ys[k] = A^(k+1) x`` from one halo exchange (:mod:`.powers`; collective)."""
        powers(self, mat, x, ys)

    def products(self, mat, wanted, *, scale=None) -> None:
        """Sequences of (shifted, scaled) products with one halo exchange (:func:`.powers.sequences`)."""
        sequences(self, mat, wanted, scale=scale)

    def values_stamp(self, mat) -> tuple:
        """What changes whenever ``mat``'s values or layout change (pending assemblies run
        first): equal stamps, equal matrices. The same on every rank."""
        self.settle(mat)
        pattern = self.pattern(mat)
        return pattern, pattern.version

    def sequence_plan(self, mat, x, steps: int, *, scale=None):
        """The :class:`~meshchain.engine.powers.SequencePlan` of ``steps`` products of ``x``
        (collective: halo layers and rows are prepared; kept with the matrix's rows)."""
        return sequence_plan(self, mat, x, steps, scale=scale)

    def prepare_products(self, mat, steps: int):
        """Build what ``steps`` products need (halo layers, halo rows; collective):
        ``(pattern, rows)``, the :class:`~meshchain.engine.powers.PowersRows` they run on."""
        return prepare(self, mat, steps)

    def mult(self, mat, x, y) -> None:
        self.check_vector(mat, x, mat.col_set, "mult", mat.col_dim)
        self.check_vector(mat, y, mat.row_set, "mult")
        if x is y:
            raise DataShapeError(f"Mat {mat.name!r}.mult: x and y are the same Dat {x.name!r}; y = A x needs two.")
        session = self.session
        session.force_read(x)
        session.force_write(y)
        self.mult_storage(mat, session.storage(x), session.storage(y))

    def mult_storage(self, mat, xs, ys) -> None:
        """``y = A x`` on the storages of two dats whose pending loops already ran."""
        pattern = self.pattern(mat)
        self.settle(mat)
        self.multiply(pattern, xs, ys)

    def multiply(self, pattern: Pattern, xs, ys, overlap=None) -> None:
        """``y = A x`` with ``A``'s current, settled pattern (the solvers' fast path; they pass
        the session's :meth:`~meshchain.engine.session.Session.overlap` once for all products)."""
        x = xs.host.reshape(-1)
        y = ys.host.reshape(-1)[: pattern.n_rows]
        ys.valid_depth = 0
        exchange = self._exchange(pattern, xs) if xs.valid_depth < pattern.depth else None
        if exchange is None:
            csr_owned(*pattern.unsigned, pattern.values, x, y)
        else:
            exchange.begin()
            failure, _ = (overlap or self.session.overlap()).run(
                lambda: csr_owned(*pattern.unsigned, pattern.values, x, y), (exchange,))
            exchange.end()
            xs.valid_depth = pattern.depth
            if failure is not None:
                raise failure
        if pattern.n_cols > pattern.n_owned_cols:
            csr_halo(*pattern.unsigned, pattern.values, x, y)

    @staticmethod
    def halo_rows(pattern: Pattern) -> tuple[dict, dict]:
        """Per neighbour, the rows of a vector on ``pattern``'s columns that its product's halo
        exchange sends and receives (in wire order)."""
        layout, depth = pattern.col_layout, pattern.depth
        return layer_rows(layout.exports, 0, depth), layer_rows(layout.imports, 0, depth)

    def _exchange(self, pattern: Pattern, storage):
        """``storage``'s halo exchange, as deep as ``pattern``'s columns reach (kept per dat)."""
        found = pattern.exchanges.get(id(storage))
        if found is not None and found[0] is storage:
            return found[1]
        items = [(storage, *self.halo_rows(pattern))]
        exchange = self.session.backend.halo_exchange(self.session.comm, items, tag=storage.tag, transport="p2p")
        pattern.exchanges[id(storage)] = (storage, exchange)
        return exchange

    def compiled_exchange(self, pattern: Pattern, dim: int, tag: int):
        """The halo exchange of a vector (``dim`` values per row, message ``tag``) on
        ``pattern``'s columns that compiled iterations start and finish
        (:class:`~meshchain.comm.compiled.CompiledExchange`): made at the first solve that asks
        for it and kept with the pattern, so a later solve only starts its persistent requests;
        freed with the pattern's other exchanges when the layout or the matrix changes."""
        key = ("compiled", dim, tag)
        found = pattern.exchanges.get(key)
        if found is None:
            from ..comm.compiled import CompiledExchange  # mpi4py: only on several ranks

            exports, imports = self.halo_rows(pattern)
            found = pattern.exchanges[key] = (key, CompiledExchange(self.session.comm, exports, imports, dim, tag=tag))
        return found[1]

    # --- PETSc -------------------------------------------------------------------------------------------

    def petsc_numbering(self, mat, which):
        """``(offset, total, numbers)``: PETSc's global numbers of ``which`` set's local
        elements (owned rank by rank in local order; halo ones as their owners number them)."""
        s = mat.row_set if which == "rows" else mat.col_set
        layout, session = self.session.layout_of(s), self.session
        n_owned = layout.n_owned
        offset = session.comm.exscan(n_owned) if session.distributed else 0
        offset = offset or 0
        numbers = np.full(len(layout.global_ids), -1, dtype=np.int64)
        numbers[:n_owned] = offset + np.arange(n_owned)
        if session.distributed:
            depth = self.pattern(mat).depth if which == "cols" else 0
            if depth:
                table = numbers[:, None]
                exchange = HaloExchange(session.comm, [HaloItem(table, layer_rows(layout.exports, 0, depth),
                                                                layer_rows(layout.imports, 0, depth))], tag=7, transport="p2p")
                exchange.begin()
                exchange.end()
                exchange.close()
        return offset, s.size, numbers

    def to_petsc(self, mat):
        PETSc = _petsc()
        pattern = self.pattern(mat)
        self.settle(mat)
        dim, col_dim = mat.dim, mat.col_dim
        _, n_rows, _ = self.petsc_numbering(mat, "rows")
        _, n_cols, numbers = self.petsc_numbering(mat, "cols")
        columns = (numbers[pattern.indices // col_dim] * col_dim + pattern.indices % col_dim).astype(PETSc.IntType)
        comm = self._petsc_comm(PETSc)
        A = PETSc.Mat().createAIJ(size=((pattern.n_rows, n_rows * dim), (pattern.n_owned_cols, n_cols * col_dim)),
                                  comm=comm)
        A.setPreallocationCSR((pattern.indptr.astype(PETSc.IntType), columns))
        A.setValuesCSR(pattern.indptr.astype(PETSc.IntType), columns, pattern.values)
        A.assemble()
        return A

    def petsc_vec(self, mat, dat):
        PETSc = _petsc()
        s = self._vector_set(mat, dat, "petsc_vec")
        values = self.session.dat_values(dat, write=False).reshape(-1)
        vec = PETSc.Vec().createMPI((len(values), s.size * dat.dim), comm=self._petsc_comm(PETSc))
        vec.getArray()[...] = values
        return vec

    def from_petsc_vec(self, mat, vec, dat) -> None:
        self._vector_set(mat, dat, "from_petsc_vec")
        target = self.session.dat_values(dat, write=True)
        source = vec.getArray(readonly=True)
        if source.size != target.size:
            raise DataShapeError(f"Mat {mat.name!r}.from_petsc_vec: the Vec holds {source.size} values on this rank, "
                                 f"Dat {dat.name!r} owns {target.size}.")
        target.reshape(-1)[...] = source

    def _vector_set(self, mat, dat, what: str):
        if dat.dataset is not mat.row_set and dat.dataset is not mat.col_set:
            raise SetMismatchError(f"Mat {mat.name!r}.{what}: Dat {dat.name!r} lives on {dat.dataset.name!r}, neither "
                                   f"the row set {mat.row_set.name!r} nor the column set {mat.col_set.name!r}.")
        rows = dat.dataset is mat.row_set and (dat.dim == mat.dim or dat.dataset is not mat.col_set)
        self.check_vector(mat, dat, dat.dataset, what, mat.dim if rows else mat.col_dim)
        return dat.dataset

    # --- block matrices in PETSc (:mod:`.block_matrices`) --------------------------------------------------

    def block_to_petsc(self, mixed):
        PETSc = _petsc()
        return block_matrices.to_petsc(self, mixed, PETSc, self._petsc_comm(PETSc))

    def block_nest(self, mixed):
        PETSc = _petsc()
        blocks = [[self.to_petsc(b) for b in row] for row in mixed.blocks]
        nest = PETSc.Mat().createNest(blocks, comm=self._petsc_comm(PETSc))
        for block in (b for row in blocks for b in row):
            block.destroy()  # the nest holds its own references
        return nest

    def block_fields(self, mixed) -> list:
        PETSc = _petsc()
        return block_matrices.fields(self, mixed, PETSc, self._petsc_comm(PETSc))

    def block_petsc_vec(self, mixed, x, *, columns: bool = True):
        PETSc = _petsc()
        return block_matrices.petsc_vec(self, mixed, x, PETSc, self._petsc_comm(PETSc), columns=columns)

    def block_from_petsc_vec(self, mixed, vec, x, *, columns: bool = True) -> None:
        block_matrices.from_petsc_vec(self, mixed, vec, x, columns=columns)

    def _petsc_comm(self, PETSc):  # noqa: N803 - the module's own name
        session = self.session
        if not session.distributed:
            return PETSc.COMM_SELF
        return PETSc.Comm(session.comm if hasattr(session.comm, "Get_size") else session.comm.comm)

    def pairwise_sum(self, length: int):
        """A :class:`~meshchain.comm.compiled.CompiledPairwiseSum` of its own buffer of
        ``length`` float64 (``.values``) over the session's ranks, for the Krylov solvers' sums
        from compiled code: its persistent requests are made once per length and kept until the
        session closes (a solve that made its own paid about 10-20 µs to make and free them).
        One solve uses it at a time (solves do not nest)."""
        found = self._sums.get(length)
        if found is None:
            from ..comm.compiled import CompiledPairwiseSum

            found = self._sums[length] = CompiledPairwiseSum(self.session.comm, np.zeros(length))
        return found

    def close(self) -> None:
        for pairs in self._sums.values():
            pairs.close()
        self._sums.clear()
        for record in self.records.values():
            if record.pattern is not None:
                for _, exchange in record.pattern.exchanges.values():
                    exchange.close()
                record.pattern.exchanges.clear()
            for rows in record.powers.values():
                rows.close()


def square(mat) -> bool:
    """Rows and columns on one set with one dim: a diagonal exists (and is kept)."""
    return mat.row_set is mat.col_set and mat.dim == mat.col_dim


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _petsc():
    try:
        import petsc4py

        petsc4py.init()
        from petsc4py import PETSc
    except ImportError as exc:
        raise BackendUnavailableError("petsc4py is not installed: pip install meshchain[petsc] (PETSc builds from "
                                      "source, about 10 minutes)") from exc
    return PETSc


def _places_of(new_ids: np.ndarray, old_ids: np.ndarray) -> np.ndarray | None:
    """Where each of ``old_ids`` is in ``new_ids`` (the same ids in another order), or None if
    they are not the same ids."""
    if len(new_ids) != len(old_ids):
        return None
    order = np.argsort(new_ids, kind="stable")
    found = order[np.minimum(np.searchsorted(new_ids, old_ids, sorter=order), len(order) - 1)] if len(order) else order
    return found if np.array_equal(new_ids[found], old_ids) else None
