"""Sparse matrices on the mesh: rows on one set, columns on another, sparsity from maps.

A :class:`Mat` is a declaration, like a :class:`~meshchain.types.Dat`: the session that runs
the loops builds and keeps its compressed sparse rows (see :mod:`meshchain.engine.matrices`).
Loops assemble into it through ``A(mc.INC, (row_map, col_map))``: the kernel receives a dense
block of shape ``(row_arity * dim, col_arity * dim)`` to add into; ``A(mc.WRITE, ...)`` sets
the block's entries instead (PyOP2's insertion: every entry of the block is set, an entry
reached from several iterations must be given one value). A square matrix (rows and columns
on one set) keeps a diagonal entry in every row, reached by its maps or not, as PyOP2 does
(so ``zero_rows(rows, diagonal)`` works on any row).

>>> import meshchain as mc
>>> nodes, edges = mc.Set(4, "nodes"), mc.Set(2, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2]], "e2n")   # node 3: no edge
>>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
>>> put = mc.Kernel.from_source("def put(a):\\n    for i in range(2):\\n        for j in range(2):\\n"
...                             "            a[i, j] = 2.0 if i == j else -1.0\\n")
>>> mc.par_loop(put, edges, A(mc.WRITE, (e2n, e2n)))
>>> A.zero_rows([3], 1.0)
>>> A.to_scipy().toarray().tolist()
[[2.0, -1.0, 0.0, 0.0], [-1.0, 2.0, -1.0, 0.0], [0.0, -1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
"""

from __future__ import annotations

import numpy as np

from ..core import context
from ..core.errors import DataShapeError, MapError
from ._checks import assembly_path, check_count, check_name, next_uid
from .maps import Map
from .mixed import MixedSet
from .mixed_mat import MixedMat
from .sets import Set
from .subsets import Subset, ids_in

__all__ = ["Mat", "MatArg"]


class MatArg:
    """A matrix argument of a parallel loop, built by ``A(mc.INC, (row_map, col_map))``.

    The kernel receives a view of shape ``(row_map.arity * dim, col_map.arity * dim)``,
    zero before each iteration; what it adds goes into the rows ``row_map[e, :]`` and the
    columns ``col_map[e, :]`` (row ``i * dim + a`` of the block is component ``a`` of the
    ``i``-th row element).
    """

    __slots__ = ("mat", "access", "row_map", "col_map")

    def __init__(self, mat: "Mat", access, row_map: Map, col_map: Map):
        self.mat, self.access, self.row_map, self.col_map = mat, access, row_map, col_map

    @property
    def view_shape(self) -> tuple[int, int]:
        return (self.row_map.arity * self.mat.dim, self.col_map.arity * self.mat.col_dim)

    def __repr__(self) -> str:
        return f"{self.mat.name}({self.access!r}, ({self.row_map.name}, {self.col_map.name}))"


class Mat:
    """A sparse matrix whose rows live on ``row_set`` and columns on ``col_set``.

    Its nonzeros are every ``(row_map[e, i], col_map[e, j])`` of the map pairs given (each
    map from one iteration set, the row map into ``row_set``, the column map into
    ``col_set``). On several ranks each rank stores the rows it owns (compressed sparse rows,
    columns in local numbering: owned first, then halo); loops assemble on the exec halo, so
    no contribution travels between ranks.

    Parameters
    ----------
    row_set, col_set : Set or MixedSet
        With a :class:`~meshchain.MixedSet` on either side the matrix is a block matrix
        (:class:`~meshchain.types.mixed_mat.MixedMat`, one Mat per pair of components).
    maps : sequence of (Map, Map)
        The ``(row_map, col_map)`` pairs that loops will assemble through.
    name : str, optional
    dim : int, keyword-only
        Components per element (a block of ``dim x dim`` per pair of elements; vectors are
        dats of this dim).
    col_dim : int, keyword-only
        Components per column element when they differ from the rows' (a block of
        ``dim x col_dim``: ``mult`` then takes dats of dim ``col_dim`` and gives dats of dim
        ``dim``); default ``dim``.

    Examples
    --------
    >>> import numpy as np, meshchain as mc
    >>> nodes, edges = mc.Set(3, "nodes"), mc.Set(2, "edges")
    >>> e2n = mc.Map(edges, nodes, 2, [[0, 1], [1, 2]], "e2n")
    >>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
    >>> @mc.kernel
    ... def spring(a):
    ...     a[0, 0] += 1.0
    ...     a[0, 1] -= 1.0
    ...     a[1, 0] -= 1.0
    ...     a[1, 1] += 1.0
    >>> mc.par_loop(spring, edges, A(mc.INC, (e2n, e2n)))
    >>> A.to_scipy().toarray().tolist()
    [[1.0, -1.0, 0.0], [-1.0, 2.0, -1.0], [0.0, -1.0, 1.0]]
    >>> x = mc.Dat(nodes, 1, [1.0, 2.0, 4.0], "x")
    >>> y = mc.Dat(nodes, 1, None, "y")
    >>> A.mult(x, y)
    >>> y.data[:, 0].tolist()
    [-1.0, -1.0, 2.0]
    """

    def __new__(cls, row_set=None, col_set=None, *args, **kwargs):
        if isinstance(row_set, MixedSet) or isinstance(col_set, MixedSet):
            return MixedMat(row_set, col_set, *args, block=Mat, **kwargs)
        return super().__new__(cls)

    def __init__(self, row_set, col_set, maps, name=None, *, dim: int = 1, col_dim: int | None = None):
        self.name = check_name(name, "mat")
        for what, s in (("row_set", row_set), ("col_set", col_set)):
            if not isinstance(s, Set):
                raise DataShapeError(f"Mat {self.name!r}: {what} must be a meshchain.Set, got {type(s).__name__}.")
        self.row_set, self.col_set = row_set, col_set
        self.dim = check_count(dim, f"Mat {self.name!r} dim", minimum=1, error=DataShapeError)
        self.col_dim = self.dim if col_dim is None else check_count(col_dim, f"Mat {self.name!r} col_dim", minimum=1,
                                                                     error=DataShapeError)
        self.maps = self._checked_pairs(maps)
        self.dtype = np.dtype(np.float64)
        self.uid = next_uid()
        context.current().matrices.declare(self)

    def _checked_pairs(self, maps) -> tuple:
        try:
            pairs = tuple(tuple(pair) for pair in maps)
        except TypeError:
            pairs = ()
        if not pairs or any(len(p) != 2 or not all(isinstance(m, Map) for m in p) for p in pairs):
            raise MapError(f"Mat {self.name!r}: maps must be a non-empty sequence of (row_map, col_map) pairs of "
                           f"meshchain.Map, got {maps!r}.")
        for row_map, col_map in pairs:
            if row_map.source is not col_map.source:
                raise MapError(f"Mat {self.name!r}: the pair ({row_map.name}, {col_map.name}) starts from two sets "
                               f"({row_map.source.name!r}, {col_map.source.name!r}); both maps must start from the "
                               f"set the assembly loop runs over.")
            for m, s, what in ((row_map, self.row_set, "row"), (col_map, self.col_set, "column")):
                if m.target is not s:
                    raise MapError(f"Mat {self.name!r}: {what} map {m.name!r} points to {m.target.name!r}, not to "
                                   f"the {what} set {s.name!r}.")
        return pairs

    def __call__(self, access, maps) -> MatArg:
        return MatArg(self, access, *assembly_path(f"Mat {self.name!r}", access, maps, self.maps))

    # --- operations (collective on several ranks) --------------------------------------------------

    def zero(self) -> None:
        """Set every stored value to zero (the sparsity stays). After ``mc.repartition`` the
        matrix must be zeroed (its rows moved: it is laid out again) and assembled again."""
        context.current().matrices.zero(self)

    def zero_rows(self, rows, diagonal: float = 1.0) -> None:
        """Zero the rows with these global ids (of ``row_set``; every component of each) and put
        ``diagonal`` on their diagonal: Dirichlet conditions. Each rank changes the rows it
        owns; ids may be given on every rank (the same list) or only where they are owned.
        ``rows`` may also be a :class:`~meshchain.Subset` of ``row_set`` (or of a subset of it)."""
        if isinstance(rows, Subset):
            rows = ids_in(rows, self.row_set)
        context.current().matrices.zero_rows(self, rows, float(diagonal))

    def mult(self, x, y) -> None:
        """``y = A x`` for dats ``x`` on ``col_set`` and ``y`` on ``row_set``: the owned columns
        are multiplied while ``x``'s halo travels, the halo columns after it arrived."""
        context.current().matrices.mult(self, x, y)

    def powers(self, x, ys) -> None:
        """``ys[k] = A^(k+1) x`` for ``k = 0..s-1`` (``s = len(ys)``; square matrices): the
        matrix powers kernel, one halo exchange of ``x`` ``s`` layers deep for all ``s``
        products instead of one per product (see :mod:`meshchain.engine.powers`). The same
        bits as ``s`` calls of :meth:`mult` on integer data; ``ys[s-1]`` is valid on the
        owned rows, ``ys[k]`` also on ``s-1-k`` halo layers. Collective."""
        context.current().matrices.powers(self, x, list(ys))

    def diagonal(self, d) -> None:
        """Write the diagonal into the dat ``d`` on ``row_set`` (dim ``self.dim``)."""
        context.current().matrices.diagonal(self, d)

    def to_scipy(self):
        """The whole matrix as a ``scipy.sparse.csr_matrix`` in global numbering (rows and
        columns ``element * dim + component``) on rank 0, None on the others."""
        return context.current().matrices.to_scipy(self)

    def local_block(self):
        """This rank's owned rows as a ``scipy.sparse.csr_matrix`` over its local columns
        (owned elements first, then halo)."""
        return context.current().matrices.local_block(self)

    def nonzeros_per_row(self) -> float:
        """Stored entries per row, averaged over the whole matrix."""
        return context.current().matrices.nonzeros_per_row(self)

    def to_petsc(self):
        """A ``petsc4py.PETSc.Mat`` (AIJ) with the same values, rows numbered rank by rank
        (each rank's owned rows in local order); needs petsc4py (``pip install meshchain[petsc]``)."""
        return context.current().matrices.to_petsc(self)

    def petsc_vec(self, dat):
        """A ``petsc4py.PETSc.Vec`` holding ``dat``'s owned values in :meth:`to_petsc`'s numbering."""
        return context.current().matrices.petsc_vec(self, dat)

    def from_petsc_vec(self, vec, dat) -> None:
        """Copy a ``petsc4py.PETSc.Vec`` in :meth:`to_petsc`'s numbering into ``dat``."""
        context.current().matrices.from_petsc_vec(self, vec, dat)

    def __repr__(self) -> str:
        return f"Mat({self.row_set.name}, {self.col_set.name}, {self.name!r}, dim={self.dim})"
