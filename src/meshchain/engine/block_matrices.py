"""Block matrices (:class:`~meshchain.types.mixed_mat.MixedMat`) as one PETSc matrix.

PETSc numbers a block system rank by rank: rank ``r``'s rows are its owned scalar rows of
row component 0, then of component 1, and so on (each in local order), after every row of
the ranks before it; the columns likewise over the column space. :func:`to_petsc` copies
every block's owned rows into one AIJ matrix in that numbering (halo columns numbered as
their owners number them, through one exchange per column component), :func:`fields` gives
each component's rows as a PETSc index set (for ``pc_type fieldsplit``), and
:func:`petsc_vec` / :func:`from_petsc_vec` copy a :class:`~meshchain.MixedDat`'s owned values
into and out of a PETSc vector in the same numbering.
"""

from __future__ import annotations

import numpy as np

from ..comm.exchange import HaloExchange, HaloItem
from ..core.errors import DataShapeError, SetMismatchError
from .boundary import layer_rows

__all__ = ["to_petsc", "fields", "petsc_vec", "from_petsc_vec"]


class _Numbering:
    """PETSc's numbers of one space on this rank: ``first`` (this rank's first scalar),
    ``offsets[i]`` (component ``i``'s first scalar after ``first``), ``n_local`` (owned
    scalars), ``total`` and ``starts[i]`` (per local element of component ``i``: its first
    scalar's number; halo elements as deep as ``depths[i]``, from their owners)."""

    def __init__(self, session, space, dims, depths):
        layouts = [session.layout_of(s) for s in space]
        owned = [layout.n_owned * d for layout, d in zip(layouts, dims)]
        self.n_local, self.total = sum(owned), sum(s.size * d for s, d in zip(space, dims))
        self.first = (session.comm.exscan(self.n_local) or 0) if session.distributed else 0
        self.offsets = np.cumsum([0, *owned])[:-1]
        self.owned = owned
        self.starts = []
        for layout, d, offset, depth in zip(layouts, dims, self.offsets, depths):
            starts = np.full((len(layout.global_ids), 1), -1, dtype=np.int64)
            starts[: layout.n_owned, 0] = self.first + offset + np.arange(layout.n_owned) * d
            if session.distributed and depth:
                exchange = HaloExchange(session.comm, [HaloItem(starts, layer_rows(layout.exports, 0, depth),
                                                                layer_rows(layout.imports, 0, depth))],
                                        tag=7, transport="p2p")
                exchange.begin()
                exchange.end()
                exchange.close()
            self.starts.append(starts[:, 0])


def _numberings(matrices, mixed) -> tuple[_Numbering, _Numbering]:
    session = matrices.session
    patterns = [[matrices.pattern(b) for b in row] for row in mixed.blocks]
    depths = [max(patterns[i][j].depth for i in range(len(mixed.blocks))) for j in range(len(mixed.col_space))]
    rows = _Numbering(session, mixed.row_space, mixed.dims, [0] * len(mixed.row_space))
    cols = _Numbering(session, mixed.col_space, mixed.col_dims, matrices.max_over_ranks(depths))
    return rows, cols


def to_petsc(matrices, mixed, PETSc, comm):  # noqa: N803 - the module's own name
    """One AIJ matrix with every block's values (collective)."""
    import scipy.sparse as sp

    rows, cols = _numberings(matrices, mixed)
    parts_r, parts_c, parts_v = [], [], []
    for i, row in enumerate(mixed.blocks):
        for j, block in enumerate(row):
            pattern = matrices.pattern(block)
            matrices.settle(block)
            d = mixed.col_dims[j]
            parts_r.append(rows.offsets[i] + pattern.rows)
            parts_c.append(cols.starts[j][pattern.indices // d] + pattern.indices % d)
            parts_v.append(pattern.values)
    local = sp.coo_matrix((np.concatenate(parts_v), (np.concatenate(parts_r), np.concatenate(parts_c))),
                          shape=(rows.n_local, cols.total)).tocsr()
    local.sort_indices()
    indptr, indices = local.indptr.astype(PETSc.IntType), local.indices.astype(PETSc.IntType)
    A = PETSc.Mat().createAIJ(size=((rows.n_local, rows.total), (cols.n_local, cols.total)), comm=comm)
    A.setPreallocationCSR((indptr, indices))
    A.setValuesCSR(indptr, indices, local.data)
    A.assemble()
    return A


def fields(matrices, mixed, PETSc, comm) -> list:
    """``[(str(i), IS of row component i's rows)]`` in :func:`to_petsc`'s numbering."""
    rows = _Numbering(matrices.session, mixed.row_space, mixed.dims, [0] * len(mixed.row_space))
    return [(str(i), PETSc.IS().createStride(n, first=rows.first + offset, step=1, comm=comm))
            for i, (n, offset) in enumerate(zip(rows.owned, rows.offsets))]


def _check(mixed, x, what: str, *, columns: bool) -> None:
    space, dims = (mixed.col_space, mixed.col_dims) if columns else (mixed.row_space, mixed.dims)
    parts = getattr(x, "split", None)
    if parts is None or tuple(d.dataset for d in parts) != tuple(space):
        raise SetMismatchError(f"Mat {mixed.name!r}.{what}: expected a MixedDat on {[s.name for s in space]}, got "
                               f"{x!r}.")
    if tuple(d.dim for d in parts) != tuple(dims) or any(d.dtype != np.float64 for d in parts):
        raise DataShapeError(f"Mat {mixed.name!r}.{what}: {x!r} has dims {tuple(d.dim for d in parts)}; the matrix "
                             f"needs float64 components of dims {tuple(dims)}.")


def petsc_vec(matrices, mixed, x, PETSc, comm, *, columns: bool = True):  # noqa: N803
    """A PETSc vector holding a copy of ``x``'s owned values (of the column space, or of the
    row space with ``columns=False``)."""
    _check(mixed, x, "petsc_vec", columns=columns)
    session = matrices.session
    values = np.concatenate([session.dat_values(d, write=False).reshape(-1) for d in x.split])
    space, dims = (mixed.col_space, mixed.col_dims) if columns else (mixed.row_space, mixed.dims)
    total = sum(s.size * d for s, d in zip(space, dims))
    vec = PETSc.Vec().createMPI((len(values), total), comm=comm)
    vec.getArray()[...] = values
    return vec


def from_petsc_vec(matrices, mixed, vec, x, *, columns: bool = True) -> None:
    """Copy a PETSc vector in :func:`to_petsc`'s numbering into ``x``'s owned values."""
    _check(mixed, x, "from_petsc_vec", columns=columns)
    session = matrices.session
    source = vec.getArray(readonly=True)
    targets = [session.dat_values(d, write=True) for d in x.split]
    if source.size != sum(t.size for t in targets):
        raise DataShapeError(f"Mat {mixed.name!r}.from_petsc_vec: the Vec holds {source.size} values on this rank, "
                             f"{x!r} owns {sum(t.size for t in targets)}.")
    at = 0
    for target in targets:
        target.reshape(-1)[...] = source[at: at + target.size]
        at += target.size
