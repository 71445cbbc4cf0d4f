"""OP2's Airfoil mesh: the :class:`AirfoilMesh` container and the ASCII
``new_grid.dat`` reader and writer.

The file format is the one OP2-Common's ``apps/c/airfoil/airfoil_plain``
reads with ``fscanf``: whitespace-separated numbers, 0-based ids::

    nnode ncell nedge nbedge
    x y                     (nnode records)
    n0 n1 n2 n3             (ncell records: the 4 nodes of each quad)
    n0 n1 c0 c1             (nedge records: 2 nodes, then the 2 cells)
    n0 n1 c bound           (nbedge records: 2 nodes, the cell, the boundary code)

Like OP2's ``fscanf`` reader, :func:`read_op2_ascii` treats all whitespace
alike (a record may span lines); the line numbers in error messages are those
of the offending token.

Examples
--------
>>> import os, tempfile
>>> from meshchain.meshes.naca import naca0012
>>> from meshchain.meshes.op2 import read_op2_ascii, write_op2_ascii
>>> mesh = naca0012(4, 6)
>>> path = os.path.join(tempfile.mkdtemp(), "new_grid.dat")
>>> write_op2_ascii(mesh, path)
>>> back = read_op2_ascii(path)
>>> back == mesh
True
>>> back.nnode, back.ncell, back.nedge, back.nbedge
(91, 72, 130, 28)
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, fields
from typing import Union

import numpy as np

from ..core.errors import DataShapeError, MapError, MeshFileError, MeshFileNotFoundError

__all__ = ["AirfoilMesh", "DeclaredAirfoil", "read_op2_ascii", "write_op2_ascii"]

PathLike = Union[str, "os.PathLike[str]"]

# the integer arrays of an AirfoilMesh
_INT_FIELDS = ("cell", "edge", "ecell", "bedge", "becell", "bound")


@dataclass(frozen=True, eq=False)
class AirfoilArrays:
    """The arrays of an Airfoil mesh (see :class:`AirfoilMesh`): whole, or one rank's rows."""

    x: np.ndarray
    cell: np.ndarray
    edge: np.ndarray
    ecell: np.ndarray
    bedge: np.ndarray
    becell: np.ndarray
    bound: np.ndarray


@dataclass(frozen=True, eq=False)
class AirfoilMesh(AirfoilArrays):
    """The unstructured quadrilateral mesh of OP2's Airfoil application.

    Parameters
    ----------
    x : numpy.ndarray, shape (nnode, 2), float64
        Node coordinates.
    cell : numpy.ndarray, shape (ncell, 4), int32
        The 4 nodes of each quadrilateral cell (counter-clockwise in meshes
        from :func:`meshchain.meshes.naca.naca0012`).
    edge : numpy.ndarray, shape (nedge, 2), int32
        The 2 nodes of each interior edge.
    ecell : numpy.ndarray, shape (nedge, 2), int32
        The 2 cells on either side of each interior edge.
    bedge : numpy.ndarray, shape (nbedge, 2), int32
        The 2 nodes of each boundary edge.
    becell : numpy.ndarray, shape (nbedge,), int32
        The cell next to each boundary edge.
    bound : numpy.ndarray, shape (nbedge,), int32
        Boundary code of each boundary edge: OP2's ``bres_calc`` treats
        ``1`` as the solid wall and anything else (``2`` in OP2's meshes) as
        far field.

    Notes
    -----
    The constructor converts the arrays to C-contiguous float64 / int32 but
    does not check them; call :meth:`validate` for that (the readers and
    generators of :mod:`meshchain.meshes` do). Two meshes compare equal when
    all their arrays are equal element for element (coordinates bit for bit,
    ``-0.0 == 0.0`` aside).

    Examples
    --------
    >>> import numpy as np
    >>> from meshchain.meshes.op2 import AirfoilMesh
    >>> m = AirfoilMesh(
    ...     x=np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]),
    ...     cell=np.array([[0, 1, 2, 3]]),
    ...     edge=np.zeros((0, 2)), ecell=np.zeros((0, 2)),
    ...     bedge=np.array([[1, 0], [2, 1], [3, 2], [0, 3]]),
    ...     becell=np.zeros(4), bound=np.array([1, 2, 2, 2]))
    >>> m.validate()
    >>> m.nnode, m.ncell, m.nedge, m.nbedge
    (4, 1, 0, 4)
    """

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", np.ascontiguousarray(self.x, dtype=np.float64))
        for name in _INT_FIELDS:
            value = np.asarray(getattr(self, name))
            if value.dtype.kind == "f":
                rounded = np.rint(value)
                if not np.array_equal(rounded, value):
                    raise DataShapeError(
                        f"AirfoilMesh.{name} holds non-integer values; pass integer "
                        "node/cell ids (int32)."
                    )
                value = rounded
            elif value.dtype.kind not in "iub":
                raise DataShapeError(
                    f"AirfoilMesh.{name} has dtype {value.dtype}; pass an integer "
                    "array (int32) of ids."
                )
            if value.size and (value.max() > np.iinfo(np.int32).max
                               or value.min() < np.iinfo(np.int32).min):
                raise MapError(
                    f"AirfoilMesh.{name} holds values outside the int32 range; "
                    "ids must be 0-based indices that fit in int32."
                )
            object.__setattr__(
                self, name, np.ascontiguousarray(value, dtype=np.int32)
            )

    # ------------------------------------------------------------------ sizes
    @property
    def nnode(self) -> int:
        """Number of nodes (rows of :attr:`x`)."""
        return int(self.x.shape[0])

    @property
    def ncell(self) -> int:
        """Number of quadrilateral cells (rows of :attr:`cell`)."""
        return int(self.cell.shape[0])

    @property
    def nedge(self) -> int:
        """Number of interior edges (rows of :attr:`edge`)."""
        return int(self.edge.shape[0])

    @property
    def nbedge(self) -> int:
        """Number of boundary edges (rows of :attr:`bedge`)."""
        return int(self.bedge.shape[0])

    # ------------------------------------------------------------- comparison
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AirfoilMesh):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name))
            for f in fields(self)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"AirfoilMesh(nnode={self.nnode}, ncell={self.ncell}, "
            f"nedge={self.nedge}, nbedge={self.nbedge})"
        )

    # ---------------------------------------------------------- declaration
    def declare(self, prefix: str = "") -> "DeclaredAirfoil":
        """Declare the mesh as meshchain sets, maps and dats, named as in
        OP2's ``airfoil.cpp``.

        Parameters
        ----------
        prefix : str
            Prepended to every name, to tell several meshes apart.

        Returns
        -------
        DeclaredAirfoil
            Sets ``nodes, edges, bedges, cells``; maps ``pedge`` (edges ->
            nodes, arity 2), ``pecell`` (edges -> cells, 2), ``pbedge``
            (bedges -> nodes, 2), ``pbecell`` (bedges -> cells, 1), ``pcell``
            (cells -> nodes, 4); dats ``p_x`` (nodes, dim 2, float64) and
            ``p_bound`` (bedges, dim 1, int32).

        Examples
        --------
        >>> from meshchain.meshes.naca import naca0012
        >>> d = naca0012(4, 6).declare()
        >>> d.cells.size, d.pecell.arity, d.p_x.dim
        (72, 2, 2)
        """
        sizes = (self.nnode, self.nedge, self.nbedge, self.ncell)
        return declare_airfoil(sizes, self, prefix, lambda rows: rows)

    def per_cell(self, row) -> np.ndarray:
        """``row`` repeated for every cell: initial values of a cell dat, whole.

        >>> from meshchain.meshes.naca import naca0012
        >>> naca0012(4, 6).per_cell([1.0, 0.0]).shape
        (72, 2)
        """
        return np.tile(np.asarray(row, dtype=np.float64), (self.ncell, 1))

    @classmethod
    def from_records(cls, x, cell, edge_records, bedge_records) -> "AirfoilMesh":
        """Build and validate a mesh from OP2's records: edges ``(n1, n2, c1, c2)`` and
        boundary edges ``(n1, n2, cell, bound)``.

        Examples
        --------
        >>> import numpy as np
        >>> from meshchain.meshes.op2 import AirfoilMesh
        >>> x = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
        >>> b = np.array([[1, 0, 0, 1], [2, 1, 0, 2], [3, 2, 0, 2], [0, 3, 0, 2]])
        >>> AirfoilMesh.from_records(x, [[0, 1, 2, 3]], np.zeros((0, 4), int), b).nbedge
        4
        """
        edge_records = np.asarray(edge_records).reshape(-1, 4)
        bedge_records = np.asarray(bedge_records).reshape(-1, 4)
        mesh = cls(
            x=x,
            cell=cell,
            edge=edge_records[:, :2],
            ecell=edge_records[:, 2:],
            bedge=bedge_records[:, :2],
            becell=bedge_records[:, 2],
            bound=bedge_records[:, 3],
        )
        mesh.validate()
        return mesh

    # ------------------------------------------------------------- validation
    def validate(self) -> None:
        """Check the shapes of all arrays and that every id is in range.

        Raises
        ------
        DataShapeError
            An array has the wrong number of dimensions or columns, the
            counts of ``edge``/``ecell`` or ``bedge``/``becell``/``bound``
            disagree, or a coordinate is not finite.
        MapError
            A node or cell id is negative or not smaller than the number of
            nodes or cells.
        """
        shapes = {
            "x": (2, "nnode"),
            "cell": (4, "ncell"),
            "edge": (2, "nedge"),
            "ecell": (2, "nedge"),
            "bedge": (2, "nbedge"),
            "becell": (None, "nbedge"),
            "bound": (None, "nbedge"),
        }
        for name, (ncol, rows) in shapes.items():
            arr = getattr(self, name)
            if ncol is None:
                if arr.ndim != 1:
                    raise DataShapeError(
                        f"AirfoilMesh.{name} has shape {arr.shape}; it must be 1-D "
                        f"with one entry per boundary edge, shape ({rows},)."
                    )
            elif arr.ndim != 2 or arr.shape[1] != ncol:
                raise DataShapeError(
                    f"AirfoilMesh.{name} has shape {arr.shape}; it must have shape "
                    f"({rows}, {ncol})."
                )
        if self.ecell.shape[0] != self.nedge:
            raise DataShapeError(
                f"AirfoilMesh.ecell has {self.ecell.shape[0]} rows but edge has "
                f"{self.nedge}; give one (cell, cell) pair per interior edge."
            )
        for name in ("becell", "bound"):
            n = getattr(self, name).shape[0]
            if n != self.nbedge:
                raise DataShapeError(
                    f"AirfoilMesh.{name} has {n} entries but bedge has "
                    f"{self.nbedge} rows; give one entry per boundary edge."
                )
        if not np.all(np.isfinite(self.x)):
            bad = int(np.flatnonzero(~np.isfinite(self.x).all(axis=1))[0])
            raise DataShapeError(
                f"AirfoilMesh.x[{bad}] = {self.x[bad].tolist()} is not finite; "
                "all node coordinates must be finite numbers."
            )
        for name, target, count in (
            ("cell", "node", self.nnode),
            ("edge", "node", self.nnode),
            ("ecell", "cell", self.ncell),
            ("bedge", "node", self.nnode),
            ("becell", "cell", self.ncell),
        ):
            check_range(getattr(self, name), f"AirfoilMesh.{name}", target, count)


@dataclass(frozen=True)
class DeclaredAirfoil:
    """The meshchain objects of an :class:`AirfoilMesh` (see
    :meth:`AirfoilMesh.declare`), named as in OP2's ``airfoil.cpp``."""

    nodes: object
    edges: object
    bedges: object
    cells: object
    pedge: object
    pecell: object
    pbedge: object
    pbecell: object
    pcell: object
    p_x: object
    p_bound: object


def declare_airfoil(sizes, arrays, prefix: str, wrap) -> DeclaredAirfoil:
    """Declare Airfoil's sets (``sizes``: nodes, edges, bedges, cells), maps and dats from the
    arrays ``x, cell, edge, ecell, bedge, becell, bound`` of ``arrays``, each passed through
    ``wrap`` (whole arrays, or this rank's rows as ``mc.Block``)."""
    import meshchain as mc

    nodes, edges, bedges, cells = (mc.Set(n, f"{prefix}{name}")
                                   for n, name in zip(sizes, ("nodes", "edges", "bedges", "cells")))
    return DeclaredAirfoil(
        nodes=nodes,
        edges=edges,
        bedges=bedges,
        cells=cells,
        pedge=mc.Map(edges, nodes, 2, wrap(arrays.edge), f"{prefix}pedge"),
        pecell=mc.Map(edges, cells, 2, wrap(arrays.ecell), f"{prefix}pecell"),
        pbedge=mc.Map(bedges, nodes, 2, wrap(arrays.bedge), f"{prefix}pbedge"),
        pbecell=mc.Map(bedges, cells, 1, wrap(arrays.becell.reshape(-1, 1)), f"{prefix}pbecell"),
        pcell=mc.Map(cells, nodes, 4, wrap(arrays.cell), f"{prefix}pcell"),
        p_x=mc.Dat(nodes, 2, wrap(arrays.x), f"{prefix}p_x"),
        p_bound=mc.Dat(bedges, 1, wrap(arrays.bound.reshape(-1, 1)), f"{prefix}p_bound", dtype=np.int32),
    )


def check_range(arr: np.ndarray, what: str, target: str, count: int,
                where: str = "", first: int = 0) -> None:
    """Raise MapError if some entry of ``arr`` is not in ``[0, count)`` (``first``: the
    number of the first row, for the message)."""
    if arr.size == 0:
        return
    bad = (arr < 0) | (arr >= count)
    if bad.any():
        flat = int(np.flatnonzero(bad.reshape(-1))[0])
        row = first + flat // (arr.shape[1] if arr.ndim == 2 else 1)
        value = int(arr.reshape(-1)[flat])
        raise MapError(
            f"{what}[{row}] refers to {target} {value}, outside 0..{count - 1}"
            f"{where}; {target} ids are 0-based and must be smaller than the "
            f"number of {target}s ({count})."
        )


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------

def _parse_numbers(text: str) -> np.ndarray:
    """All whitespace-separated numbers of ``text`` as float64; stops at the
    first token that is not a number (the caller detects the short count)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return np.fromstring(text, dtype=np.float64, sep=" ")
        except (ValueError, AttributeError):  # pragma: no cover - future numpy
            pass
    out = []
    for tok in text.split():
        try:
            out.append(float(tok))
        except ValueError:
            break
    return np.array(out, dtype=np.float64)


def _locate_token(text: str, index: int) -> tuple[int, str | None]:
    """Line number (1-based) and text of token number ``index`` (0-based);
    ``(last line, None)`` when the file has fewer tokens."""
    seen = 0
    lineno = 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        toks = line.split()
        if seen + len(toks) > index:
            return lineno, toks[index - seen]
        seen += len(toks)
    return lineno, None


def _sections(nnode: int, ncell: int, nedge: int, nbedge: int):
    """(name, records, columns, record description) in file order."""
    return (
        ("node coordinates", nnode, 2, "x y"),
        ("cells", ncell, 4, "4 node ids"),
        ("edges", nedge, 4, "n1 n2 c1 c2"),
        ("boundary edges", nbedge, 4, "n1 n2 cell bound"),
    )


def _where(counts, token: int) -> str:
    """Describe which section/record token number ``token`` (after the
    4-number header) belongs to."""
    start = 4
    for name, nrec, ncol, desc in _sections(*counts):
        size = nrec * ncol
        if token < start + size:
            rec = (token - start) // ncol
            return f"{name} section, record {rec} of {nrec} ({desc})"
        start += size
    return "after the last section"


def read_op2_ascii(path: PathLike) -> AirfoilMesh:
    """Read an OP2 Airfoil mesh in the ASCII ``new_grid.dat`` format.

    Parameters
    ----------
    path : str or os.PathLike
        The file: a header ``nnode ncell nedge nbedge``, then ``nnode``
        records ``x y``, ``ncell`` records of 4 node ids, ``nedge`` records
        ``n1 n2 c1 c2`` and ``nbedge`` records ``n1 n2 cell bound``, 0-based.

    Returns
    -------
    AirfoilMesh
        The validated mesh (``x`` float64, ids int32).

    Raises
    ------
    DataShapeError
        The header is missing or invalid, the file is truncated, holds a
        token that is not a number, a non-integer id, or extra numbers after
        the last section. The message names the file, the line and the
        section/record.
    MapError
        A node or cell id is out of range; the message names the file, the
        section and the record.
    MeshFileNotFoundError
        The file does not exist (also a :class:`FileNotFoundError`).

    Examples
    --------
    >>> import os, tempfile
    >>> from meshchain.meshes.op2 import read_op2_ascii
    >>> path = os.path.join(tempfile.mkdtemp(), "one_cell.dat")
    >>> with open(path, "w") as f:
    ...     _ = f.write('''4 1 0 4
    ... 0 0
    ... 1 0
    ... 1 1
    ... 0 1
    ... 0 1 2 3
    ... 1 0 0 1
    ... 2 1 0 2
    ... 3 2 0 2
    ... 0 3 0 2
    ... ''')
    >>> read_op2_ascii(path)
    AirfoilMesh(nnode=4, ncell=1, nedge=0, nbedge=4)
    """
    fname = os.fspath(path)
    try:
        with open(fname, "r", encoding="ascii", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        raise MeshFileNotFoundError(f"mesh file {fname!r} does not exist; check the path.") from None
    except OSError as exc:
        raise MeshFileError(f"cannot read mesh file {fname!r}: {exc}") from exc
    data = _parse_numbers(text)

    # ---- header
    if data.size < 4:
        lineno, tok = _locate_token(text, data.size)
        if tok is not None:
            raise DataShapeError(
                f"{fname}: bad header on line {lineno}: {tok!r} is not a number; "
                "the first line must be 'nnode ncell nedge nbedge' (4 integers)."
            )
        raise DataShapeError(
            f"{fname}: truncated header: found {data.size} of 4 numbers; the first "
            "line must be 'nnode ncell nedge nbedge'."
        )
    header = data[:4]
    if np.any(header != np.floor(header)) or np.any(header < 0) or np.any(header > 2**31 - 1):
        raise DataShapeError(
            f"{fname}: bad header on line 1: {header.tolist()}; it must be 4 "
            "non-negative integers 'nnode ncell nedge nbedge'."
        )
    counts = tuple(int(v) for v in header)
    nnode, ncell, nedge, nbedge = counts
    expected = 4 + 2 * nnode + 4 * (ncell + nedge + nbedge)

    # ---- token count: non-numeric token, truncation, trailing data
    if data.size < expected:
        lineno, tok = _locate_token(text, data.size)
        where = _where(counts, data.size)
        if tok is not None:
            raise DataShapeError(
                f"{fname}: line {lineno}: {tok!r} is not a number ({where})."
            )
        raise DataShapeError(
            f"{fname}: file is truncated: it ends at line {lineno} in the {where}; "
            f"the header 'nnode ncell nedge nbedge' = {list(counts)} needs "
            f"{expected} numbers but the file has {data.size}. Regenerate or "
            "re-download the file, or fix the header counts."
        )
    if data.size > expected:
        lineno, _ = _locate_token(text, expected)
        raise DataShapeError(
            f"{fname}: extra data from line {lineno} on: the header "
            f"'nnode ncell nedge nbedge' = {list(counts)} accounts for {expected} "
            f"numbers but the file has {data.size}; fix the header counts."
        )

    # ---- split sections
    pos = 4
    x = data[pos:pos + 2 * nnode].reshape(nnode, 2)
    pos += 2 * nnode
    ints = data[pos:]
    nonint = ints != np.floor(ints)
    if nonint.any():
        k = int(np.flatnonzero(nonint)[0]) + pos
        lineno, tok = _locate_token(text, k)
        raise DataShapeError(
            f"{fname}: line {lineno}: {tok!r} is not an integer id "
            f"({_where(counts, k)})."
        )
    if ints.size and (ints.max() > 2**31 - 1 or ints.min() < -(2**31)):
        k = int(np.flatnonzero((ints > 2**31 - 1) | (ints < -(2**31)))[0]) + pos
        lineno, tok = _locate_token(text, k)
        raise MapError(
            f"{fname}: line {lineno}: id {tok} does not fit in int32 "
            f"({_where(counts, k)})."
        )
    ints = ints.astype(np.int32)
    cell = ints[: 4 * ncell].reshape(ncell, 4)
    off = 4 * ncell
    erec = ints[off: off + 4 * nedge].reshape(nedge, 4)
    off += 4 * nedge
    brec = ints[off: off + 4 * nbedge].reshape(nbedge, 4)

    if not np.all(np.isfinite(x)):
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise DataShapeError(
            f"{fname}: node {bad} has non-finite coordinates {x[bad].tolist()} "
            "(node coordinates section); coordinates must be finite numbers."
        )
    where = f" in {fname}"
    check_range(cell, "cells section: cell", "node", nnode, where)
    check_range(erec[:, :2], "edges section: edge", "node", nnode, where)
    check_range(erec[:, 2:], "edges section: edge", "cell", ncell, where)
    check_range(brec[:, :2], "boundary edges section: boundary edge", "node", nnode, where)
    check_range(brec[:, 2:3], "boundary edges section: boundary edge", "cell", ncell, where)

    return AirfoilMesh.from_records(x, cell, erec, brec)


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------

def _format_rows(arr: np.ndarray, fmt: str) -> str:
    """Format a 2-D array one row per line, fast (one % per row block)."""
    if arr.shape[0] == 0:
        return ""
    line = " ".join([fmt] * arr.shape[1]) + "\n"
    block = 65536
    parts = []
    for start in range(0, arr.shape[0], block):
        chunk = arr[start:start + block]
        parts.append((line * chunk.shape[0]) % tuple(chunk.reshape(-1).tolist()))
    return "".join(parts)


def write_op2_ascii(mesh: AirfoilMesh, path: PathLike) -> None:
    """Write ``mesh`` in OP2's ASCII ``new_grid.dat`` format.

    Coordinates are written with ``%.17g``, so ``read_op2_ascii(path)``
    returns arrays bit-identical to ``mesh``'s; OP2's C reader (``fscanf``
    with ``%lf``) reads the same values.

    Parameters
    ----------
    mesh : AirfoilMesh
        The mesh; it is validated first.
    path : str or os.PathLike
        Output file (overwritten).

    Raises
    ------
    DataShapeError, MapError
        ``mesh`` fails :meth:`AirfoilMesh.validate`.

    Examples
    --------
    >>> import os, tempfile
    >>> from meshchain.meshes.naca import naca0012
    >>> from meshchain.meshes.op2 import write_op2_ascii
    >>> path = os.path.join(tempfile.mkdtemp(), "new_grid.dat")
    >>> write_op2_ascii(naca0012(4, 6), path)
    >>> open(path).readline()
    '91 72 130 28\\n'
    """
    mesh.validate()
    ecols = np.concatenate([mesh.edge, mesh.ecell], axis=1)
    bcols = np.concatenate(
        [mesh.bedge, mesh.becell[:, None], mesh.bound[:, None]], axis=1
    )
    text = "".join(
        (
            f"{mesh.nnode} {mesh.ncell} {mesh.nedge} {mesh.nbedge}\n",
            _format_rows(mesh.x, "%.17g"),
            _format_rows(mesh.cell, "%d"),
            _format_rows(ecols, "%d"),
            _format_rows(bcols, "%d"),
        )
    )
    with open(os.fspath(path), "w", encoding="ascii") as f:
        f.write(text)
