"""Output for ParaView: a time series of node and cell dats as XDMF + HDF5, from every rank.

``mc.Output(directory, coords=p_x, cells=pcell, name="flow")`` writes the mesh once:
``<name>_mesh.h5`` with the node coordinates (``geometry``) and the cells' nodes
(``topology``), in global numbering. Each ``out.write(time, {"q": p_q, ...})`` writes one
step, ``<name>_<step>.h5`` with one dataset per dat, and rewrites the index
``<name>.xdmf`` (XDMF 3: a temporal collection of grids, each pointing at the mesh file and
at its step's file), which ParaView opens as a time series (the XDMF3 reader), as does
``meshio.xdmf.TimeSeriesReader``.

How it is written: the data go through h5py in the scheme of :mod:`meshchain.io.ranked`
(each rank's block of rows in global numbering, appended in rank order to a temporary file
that rank 0 renames into place when complete); no rank ever gathers a whole dat, and
parallel HDF5 is not needed. The small XML index is written by rank 0, to a temporary
file renamed into place, after the step's data are complete: a crash leaves the index
pointing at complete steps only. Limits: the mesh (coordinates and cells) is written once,
so a moving mesh is not followed; one cell type per series; ranks append one after
another, so writing takes the time of one writer (see ``benchmarks/checkpoint.py`` for
the rates).

Examples
--------
>>> import os, tempfile, numpy as np, meshchain as mc
>>> nodes, cells = mc.Set(4, "nodes"), mc.Set(2, "cells")
>>> c2n = mc.Map(cells, nodes, 3, [[0, 1, 2], [0, 2, 3]], "c2n")
>>> x = mc.Dat(nodes, 2, [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], "x")
>>> u = mc.Dat(cells, 1, [[1.0], [2.0]], "u")
>>> directory = tempfile.mkdtemp()
>>> out = mc.Output(directory, coords=x, cells=c2n, name="demo")
>>> out.write(0.5, {"u": u})
>>> sorted(os.listdir(directory))
['demo.xdmf', 'demo_000000.h5', 'demo_mesh.h5']
>>> import meshio
>>> with meshio.xdmf.TimeSeriesReader(os.path.join(directory, "demo.xdmf")) as reader:
...     points, blocks = reader.read_points_cells()
...     t, point_data, cell_data = reader.read_data(0)
>>> t, blocks[0].type, cell_data["u"][0].ravel().tolist()
(0.5, 'triangle', [1.0, 2.0])
"""

from __future__ import annotations

import os
import re
import tempfile
import xml.etree.ElementTree as ET

import numpy as np

from ..comm.agree import raise_together
from ..core.errors import OutputError
from ..types import Dat, Map
from .ranked import agreed, block_range, context, create_on_root, dat_block, map_block, replace_on_root, write_in_turn

__all__ = ["Output"]

# (coordinate dim, nodes per cell) -> XDMF topology
TOPOLOGIES = {(2, 3): "Triangle", (2, 4): "Quadrilateral", (3, 4): "Tetrahedron", (3, 8): "Hexahedron",
              (3, 3): "Triangle", (3, 6): "Wedge"}
ATTRIBUTE_TYPES = {1: "Scalar", 2: "Vector", 3: "Vector", 6: "Tensor6", 9: "Tensor"}
NAME = re.compile(r"[A-Za-z0-9_.+-]+\Z")


class Output:
    """A time series of dats for ParaView (XDMF + HDF5), written from every rank.

    Parameters
    ----------
    directory : str or os.PathLike
        Where the files go (created if missing).
    coords : Dat
        Node coordinates (dim 2 or 3).
    cells : Map
        Cells to their nodes (into ``coords``' set): 3 or 4 nodes in 2-D (triangles, quads),
        4, 6 or 8 in 3-D (tetrahedra, prisms, hexahedra: the extruded cells of an
        :class:`~meshchain.ExtrudedSet`, VTK's node order: a prism's bottom triangle, clockwise
        seen from above, then the top one).
    name : str, optional
        File name stem (default ``"output"``).
    keep_until : float, optional
        Continue the series already in ``directory`` (a restarted run): its steps with time
        ``<= keep_until`` stay in the index, later ones are dropped. Default: a new series.

    Raises
    ------
    OutputError
        Bad arguments, or the files cannot be written (on every rank, naming the file).
    """

    def __init__(self, directory, *, coords: Dat, cells: Map, name: str = "output", keep_until=None):
        self.engine, self.comm = context()
        self.directory, self.name = os.fspath(directory), name
        self.topology = agreed(self.comm, lambda: _topology(coords, cells, name), OutputError)
        self.coords, self.cells = coords, cells
        self.steps: list = []  # (time, file, [(field name, dat, centre)])
        self._prepare_directory()
        if keep_until is not None:
            self.steps = self._earlier_steps(keep_until)
        self._write_mesh()

    @property
    def index(self) -> str:
        """The path of the XDMF index (what ParaView opens)."""
        return os.path.join(self.directory, f"{self.name}.xdmf")

    def write(self, time, fields: dict) -> None:
        """Write one step: ``fields`` maps output names to dats on the cells' set (cell data)
        or on the coordinates' set (node data). Collective."""
        fields = dict(fields)
        entries = agreed(self.comm, lambda: [(label, dat, self._centre(label, dat)) for label, dat in fields.items()],
                         OutputError)
        step = f"{self.name}_{len(self.steps):06d}.h5"
        path = os.path.join(self.directory, step)
        blocks = [dat_block(self.engine, self.comm, dat, OutputError) for _, dat, _ in entries]

        def fill(f):
            for label, dat, _ in entries:
                f.create_dataset(label, shape=(dat.dataset.size, dat.dim), dtype=dat.dtype)

        temporary = create_on_root(self.comm, path, fill, _failure)
        ranges = [block_range(dat.dataset.size, self.comm)[0] for _, dat, _ in entries]
        write_in_turn(self.comm, temporary, path, [(label, lo, block) for (label, _, _), lo, block
                                                   in zip(entries, ranges, blocks)], _failure)
        replace_on_root(self.comm, temporary, path, _failure)
        self.steps.append((float(time), step, [(label, dat.dim, dat.dtype, dat.dataset.size, centre)
                                                for label, dat, centre in entries]))
        self._write_index()

    # --- checks ---------------------------------------------------------------------------------

    def _centre(self, label: str, dat) -> str:
        if not isinstance(dat, Dat):
            raise OutputError(f"Output {self.name!r}: field {label!r} is a {type(dat).__name__}; pass Dats.")
        if not NAME.match(str(label)):
            raise OutputError(f"Output {self.name!r}: field name {label!r} must be letters, digits and _.+- only.")
        if dat.dataset is self.cells.source:
            return "Cell"
        if dat.dataset is self.coords.dataset:
            return "Node"
        raise OutputError(f"Output {self.name!r}: Dat {dat.name!r} lives on set {dat.dataset.name!r}; ParaView "
                          f"output takes dats on the cells ({self.cells.source.name!r}) or the nodes "
                          f"({self.coords.dataset.name!r}).")

    def _prepare_directory(self) -> None:
        error = None
        if not NAME.match(self.name):
            error = OutputError(f"Output name {self.name!r} must be letters, digits and _.+- only.")
        elif self.comm.rank == 0:
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as exc:
                error = OutputError(f"Output directory {self.directory!r} cannot be created ({exc}).")
        raise_together(self.comm, error)

    # --- files ----------------------------------------------------------------------------------

    def _write_mesh(self) -> None:
        path = os.path.join(self.directory, f"{self.name}_mesh.h5")
        coords, cells = self.coords, self.cells
        points = dat_block(self.engine, self.comm, coords, OutputError)
        nodes = map_block(self.engine, cells)

        def fill(f):
            f.create_dataset("geometry", shape=(coords.dataset.size, coords.dim), dtype=coords.dtype)
            f.create_dataset("topology", shape=(cells.source.size, cells.arity), dtype=np.int64)

        temporary = create_on_root(self.comm, path, fill, _failure)
        blocks = [("geometry", block_range(coords.dataset.size, self.comm)[0], points),
                  ("topology", block_range(cells.source.size, self.comm)[0], nodes)]
        write_in_turn(self.comm, temporary, path, blocks, _failure)
        replace_on_root(self.comm, temporary, path, _failure)
        self._write_index()

    def _write_index(self) -> None:
        error = None
        if self.comm.rank == 0:
            try:
                _replace_text(self.index, _xdmf(self))
            except OSError as exc:
                error = OutputError(f"Output index {self.index!r} cannot be written ({exc}); the data files are "
                                    f"complete.")
        raise_together(self.comm, error)

    def _earlier_steps(self, keep_until) -> list:
        steps, error = None, None
        if self.comm.rank == 0:
            try:
                steps = _read_steps(self.index, float(keep_until))
            except (OSError, ET.ParseError, KeyError, ValueError) as exc:
                error = OutputError(f"Output index {self.index!r} cannot be continued ({type(exc).__name__}: "
                                    f"{exc}); start a new series (no keep_until) or fix the file.")
        raise_together(self.comm, error)
        return self.comm.bcast(steps, root=0)


def _failure(message: str) -> OutputError:
    return OutputError(f"output file {message}")


def _topology(coords, cells, name: str) -> str:
    if not isinstance(coords, Dat) or not isinstance(cells, Map):
        raise OutputError(f"Output {name!r}: pass coords= a Dat of node coordinates and cells= a Map from cells to "
                          f"nodes.")
    if cells.target is not coords.dataset:
        raise OutputError(f"Output {name!r}: Map {cells.name!r} goes to {cells.target.name!r} but the coordinates "
                          f"{coords.name!r} live on {coords.dataset.name!r}; the cells' map must point at the nodes.")
    topology = TOPOLOGIES.get((coords.dim, cells.arity))
    if topology is None or coords.dtype.kind != "f":
        raise OutputError(f"Output {name!r}: coordinates of dim {coords.dim} ({coords.dtype}) with {cells.arity} "
                          f"nodes per cell are not supported; pass real coordinates of dim 2 or 3 and cells of "
                          f"3 or 4 nodes (2-D) or 4, 6 or 8 nodes (3-D).")
    return topology


# --- the XDMF index ---------------------------------------------------------------------------------


def _data_item(parent, dims, dtype, where: str):
    kind = {"f": "Float", "u": "UInt"}.get(np.dtype(dtype).kind, "Int")
    item = ET.SubElement(parent, "DataItem", DataType=kind, Precision=str(np.dtype(dtype).itemsize),
                         Dimensions=" ".join(str(d) for d in dims), Format="HDF")
    item.text = where


def _xdmf(output: Output) -> str:
    root = ET.Element("Xdmf", Version="3.0")
    series = ET.SubElement(ET.SubElement(root, "Domain"), "Grid", Name=output.name, GridType="Collection",
                           CollectionType="Temporal")
    mesh = f"{output.name}_mesh.h5"
    coords, cells = output.coords, output.cells
    for time, step, fields in output.steps:
        grid = ET.SubElement(series, "Grid", Name=step[: -len(".h5")], GridType="Uniform")
        ET.SubElement(grid, "Time", Value=repr(time))
        topology = ET.SubElement(grid, "Topology", TopologyType=output.topology,
                                 NumberOfElements=str(cells.source.size))
        _data_item(topology, (cells.source.size, cells.arity), np.int64, f"{mesh}:/topology")
        geometry = ET.SubElement(grid, "Geometry", GeometryType="XY" if coords.dim == 2 else "XYZ")
        _data_item(geometry, (coords.dataset.size, coords.dim), coords.dtype, f"{mesh}:/geometry")
        for label, dim, dtype, size, centre in fields:
            attribute = ET.SubElement(grid, "Attribute", Name=label, AttributeType=ATTRIBUTE_TYPES.get(dim, "Matrix"),
                                      Center=centre)
            _data_item(attribute, (size, dim), dtype, f"{step}:/{label}")
    ET.indent(root)
    return '<?xml version="1.0"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _read_steps(index: str, keep_until: float) -> list:
    """The steps of an existing index with time ``<= keep_until``."""
    steps = []
    for grid in ET.parse(index).getroot().iter("Grid"):
        if grid.get("GridType") != "Uniform":
            continue
        time = float(grid.find("Time").get("Value"))
        fields = []
        for attribute in grid.findall("Attribute"):
            item = attribute.find("DataItem")
            size, dim = (int(d) for d in item.get("Dimensions").split())
            kind = {"Float": "f", "UInt": "u"}.get(item.get("DataType"), "i")
            fields.append((attribute.get("Name"), dim, np.dtype(f"{kind}{item.get('Precision')}"), size,
                           attribute.get("Center")))
        if time <= keep_until:
            steps.append((time, grid.get("Name") + ".h5", fields))
    return steps


def _replace_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                         dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(handle, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
