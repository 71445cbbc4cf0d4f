"""Block matrices over mixed spaces: ``mc.Mat(row_space, col_space, maps)`` with a
:class:`~meshchain.types.mixed.MixedSet` on either side.

A :class:`MixedMat` is a grid of :class:`~meshchain.types.mat.Mat` blocks, block ``(i, j)``
from row component ``i`` to column component ``j`` (``A.blocks[i][j]``, dims ``dim[i] x
col_dim[j]``), its sparsity from the components ``(row_map.split[i], col_map.split[j])`` of
every mixed map pair. A loop assembles all of them at once through
``A(mc.INC, (row_mixed_map, col_mixed_map))``: the kernel receives one dense block whose
rows are row component 0's (``arity_0 * dim_0`` of them), then component 1's, and so on,
and likewise the columns, as PyOP2 lays out a mixed element matrix. ``mult`` takes and gives
:class:`~meshchain.types.mixed.MixedDat`; ``to_scipy`` gives SciPy's ``bmat`` of the blocks.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> cells, nodes = mc.Set(1, "cells"), mc.Set(2, "nodes")
>>> c2n = mc.Map(cells, nodes, 2, [[0, 1]], "c2n")
>>> c2c = mc.Map(cells, cells, 1, [[0]], "c2c")
>>> space = mc.MixedSet([nodes, cells], "space")
>>> both = mc.MixedMap([c2n, c2c], "both")
>>> A = mc.Mat(space, space, [(both, both)], "A")
>>> @mc.kernel
... def element(a):
...     for i in range(3):
...         for j in range(3):
...             a[i, j] += 10 * i + j
>>> mc.par_loop(element, cells, A(mc.INC, (both, both)))
>>> A.to_scipy().toarray().tolist()
[[0.0, 1.0, 2.0], [10.0, 11.0, 12.0], [20.0, 21.0, 22.0]]
"""

from __future__ import annotations

import numpy as np

from ..core import context
from ..core.errors import DataShapeError, MapError, SetMismatchError
from ._checks import assembly_path, check_count, check_name
from .data import Dat
from .maps import Map
from .mixed import MixedDat, MixedMap, MixedSet
from .sets import Set

__all__ = ["MixedMat", "MixedMatArg"]


def _space(s, name: str, what: str) -> MixedSet:
    if isinstance(s, MixedSet):
        return s
    if isinstance(s, Set):
        return MixedSet([s], f"{name}.{what}")
    raise DataShapeError(f"Mat {name!r}: {what} must be a meshchain.Set or MixedSet, got {type(s).__name__}.")


def _dims(dim, n: int, name: str, what: str) -> tuple[int, ...]:
    dims = (dim,) * n if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) else tuple(dim)
    if len(dims) != n:
        raise DataShapeError(f"Mat {name!r}: {len(dims)} {what} for {n} components.")
    return tuple(check_count(d, f"Mat {name!r} {what}", minimum=1, error=DataShapeError) for d in dims)


def _split_map(m, n: int, name: str) -> tuple:
    parts = m.split if isinstance(m, MixedMap) else (m,) if isinstance(m, Map) else ()
    if len(parts) != n:
        raise MapError(f"Mat {name!r}: {getattr(m, 'name', m)!r} has {len(parts)} component maps where the space has "
                       f"{n} components; pass a MixedMap with one map per component.")
    return parts


class MixedMatArg:
    """``A(mode, (row_map, col_map))`` of a :class:`MixedMat`: the kernel's view is one dense
    block of :attr:`view_shape`; :meth:`parts` are the blocks' own arguments, row by row."""

    __slots__ = ("mat", "access", "row_map", "col_map")

    def __init__(self, mat: "MixedMat", access, row_map, col_map):
        self.mat, self.access, self.row_map, self.col_map = mat, access, row_map, col_map

    def parts(self) -> tuple:
        rows = _split_map(self.row_map, len(self.mat.row_space), self.mat.name)
        cols = _split_map(self.col_map, len(self.mat.col_space), self.mat.name)
        return tuple(self.mat.blocks[i][j](self.access, (r, c)) for i, r in enumerate(rows) for j, c in enumerate(cols))

    def block_corners(self) -> tuple:
        """``(first row, first column)`` of each part's block in the kernel's view."""
        rows = _split_map(self.row_map, len(self.mat.row_space), self.mat.name)
        cols = _split_map(self.col_map, len(self.mat.col_space), self.mat.name)
        row_starts = np.cumsum([0, *(m.arity * d for m, d in zip(rows, self.mat.dims))])
        col_starts = np.cumsum([0, *(m.arity * d for m, d in zip(cols, self.mat.col_dims))])
        return tuple((int(row_starts[i]), int(col_starts[j])) for i in range(len(rows)) for j in range(len(cols)))

    @property
    def view_shape(self) -> tuple[int, int]:
        rows = _split_map(self.row_map, len(self.mat.row_space), self.mat.name)
        cols = _split_map(self.col_map, len(self.mat.col_space), self.mat.name)
        return (sum(m.arity * d for m, d in zip(rows, self.mat.dims)),
                sum(m.arity * d for m, d in zip(cols, self.mat.col_dims)))

    def __repr__(self) -> str:
        return f"{self.mat.name}({self.access!r}, ({self.row_map.name}, {self.col_map.name}))"


class MixedMat:
    """A block matrix over mixed row and column spaces (made by :class:`~meshchain.Mat`).

    Parameters
    ----------
    row_space, col_space : MixedSet or Set
        A plain set is a space of one component.
    maps : sequence of (MixedMap or Map, MixedMap or Map)
        The pairs loops assemble through, one component map per component of each space.
    name : str, optional
        Block ``(i, j)`` is named ``f"{name}[{i},{j}]"``.
    dim, col_dim : int or sequence of int, keyword-only
        Components per element of each row (column) component; ``col_dim`` defaults to
        ``dim`` when both spaces have as many components.
    block : type, keyword-only
        The class of the blocks (:class:`~meshchain.Mat`, which makes this one).
    """

    def __init__(self, row_space, col_space, maps, name=None, *, dim=1, col_dim=None, block):
        self.name = check_name(name, "mat")
        self.row_space, self.col_space = _space(row_space, self.name, "row_set"), _space(col_space, self.name, "col_set")
        self.dims = _dims(dim, len(self.row_space), self.name, "dims")
        if col_dim is None and len(self.col_space) != len(self.row_space) and not isinstance(dim, (int, np.integer)):
            raise DataShapeError(f"Mat {self.name!r}: the spaces have different component counts; pass col_dim.")
        self.col_dims = _dims(dim if col_dim is None else col_dim, len(self.col_space), self.name, "col_dims")
        try:
            pairs = tuple(tuple(p) for p in maps)
        except TypeError:
            pairs = ()
        if not pairs or any(len(p) != 2 for p in pairs):
            raise MapError(f"Mat {self.name!r}: maps must be a non-empty sequence of (row_map, col_map) pairs, got "
                           f"{maps!r}.")
        self.maps = pairs
        split = [(_split_map(r, len(self.row_space), self.name), _split_map(c, len(self.col_space), self.name))
                 for r, c in pairs]
        self.blocks = tuple(
            tuple(block(rs, cs, [(rows[i], cols[j]) for rows, cols in split], f"{self.name}[{i},{j}]",
                      dim=self.dims[i], col_dim=self.col_dims[j])
                  for j, cs in enumerate(self.col_space))
            for i, rs in enumerate(self.row_space))
        self._work: tuple = (None, ())

    def __call__(self, access, maps) -> MixedMatArg:
        return MixedMatArg(self, access, *assembly_path(f"Mat {self.name!r}", access, maps, self.maps))

    def _all(self):
        return [b for row in self.blocks for b in row]

    # --- operations (collective on several ranks) --------------------------------------------------

    def zero(self) -> None:
        for block in self._all():
            block.zero()

    def zero_rows(self, rows, diagonal: float = 1.0, *, component: int) -> None:
        """Zero the rows ``rows`` (global ids, or a Subset) of row component ``component`` in
        every block of that block row, and put ``diagonal`` on the diagonal of the block
        ``(component, component)`` (which must then be square)."""
        if not isinstance(component, (int, np.integer)) or not 0 <= component < len(self.row_space):
            raise DataShapeError(f"Mat {self.name!r}.zero_rows: component must be an int in "
                                 f"[0, {len(self.row_space)}), got {component!r}.")
        for j, block in enumerate(self.blocks[component]):
            block.zero_rows(rows, diagonal if j == component else 0.0)

    def mult(self, x: MixedDat, y: MixedDat) -> None:
        """``y = A x`` block by block: ``y_i = sum_j A_ij x_j``."""
        for what, v, space, dims in (("x", x, self.col_space, self.col_dims), ("y", y, self.row_space, self.dims)):
            if not isinstance(v, MixedDat) or tuple(d.dataset for d in v.split) != tuple(space) or v.dims != dims:
                raise SetMismatchError(f"Mat {self.name!r}.mult: {what} must be a MixedDat on "
                                       f"{[s.name for s in space]} with dims {dims}, got {v!r}.")
        work = self._workspace()
        for i, row in enumerate(self.blocks):
            row[0].mult(x.split[0], y.split[i])
            for j in range(1, len(row)):
                row[j].mult(x.split[j], work[i])
                y.split[i].axpy(1.0, work[i])

    def _workspace(self) -> tuple:
        session = context.current()
        if self._work[0] is not session:
            self._work = (session, tuple(Dat(s, d, None, f"{self.name}:mult[{i}]")
                                         for i, (s, d) in enumerate(zip(self.row_space, self.dims))))
        return self._work[1]

    def to_scipy(self):
        """The whole matrix as SciPy's ``bmat`` of the blocks (CSR, global numbering: row
        component 0's scalar rows first) on rank 0, None on the others."""
        import scipy.sparse as sp

        blocks = [[b.to_scipy() for b in row] for row in self.blocks]
        if blocks[0][0] is None:
            return None
        return sp.bmat(blocks, format="csr")

    def to_petsc(self, *, nest: bool = False):
        """One ``petsc4py.PETSc.Mat`` (AIJ) with every block's values, rows numbered rank by
        rank, on each rank its owned rows of component 0, then of component 1, ...; with
        ``nest`` a ``MATNEST`` of the blocks' own :meth:`Mat.to_petsc <meshchain.Mat.to_petsc>`
        (the same numbering). Needs petsc4py (``pip install meshchain[petsc]``)."""
        if nest:
            return context.current().matrices.block_nest(self)
        return context.current().matrices.block_to_petsc(self)

    def petsc_fields(self) -> list:
        """``[("0", IS), ("1", IS), ...]``: each row component's rows in :meth:`to_petsc`'s
        numbering, as ``PCFieldSplitSetIS`` takes them."""
        return context.current().matrices.block_fields(self)

    def petsc_vec(self, x: MixedDat):
        """A ``petsc4py.PETSc.Vec`` holding a copy of ``x``'s owned values in :meth:`to_petsc`'s
        column numbering."""
        return context.current().matrices.block_petsc_vec(self, x)

    def from_petsc_vec(self, vec, x: MixedDat) -> None:
        """Copy a ``petsc4py.PETSc.Vec`` in :meth:`to_petsc`'s column numbering into ``x``."""
        context.current().matrices.block_from_petsc_vec(self, vec, x)

    def __repr__(self) -> str:
        return f"Mat({self.row_space.name}, {self.col_space.name}, {self.name!r}, blocks {len(self.row_space)}x" \
               f"{len(self.col_space)})"
