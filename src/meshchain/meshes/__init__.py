"""Mesh readers and generators.

Readers and generators return plain NumPy containers (:class:`AirfoilMesh`,
:class:`UnstructuredMesh`); their ``declare()`` methods turn them into meshchain
sets, maps and dats.
"""

from .op2 import AirfoilMesh, read_op2_ascii, write_op2_ascii
from .op2_hdf5 import AirfoilBlocks, declare_op2_hdf5, read_op2_hdf5, write_op2_hdf5
from .naca import naca0012
from .generators import UnstructuredMesh, structured_quads, structured_tris, jittered_delaunay
from .cube import structured_tets
from .meshio_reader import read_meshio
from .mgcfd import MGCFDLevel, MGCFDMesh, channel_bump, read_input_dat

__all__ = [
    "AirfoilMesh",
    "read_op2_ascii",
    "write_op2_ascii",
    "AirfoilBlocks",
    "read_op2_hdf5",
    "write_op2_hdf5",
    "declare_op2_hdf5",
    "naca0012",
    "UnstructuredMesh",
    "structured_quads",
    "structured_tris",
    "jittered_delaunay",
    "structured_tets",
    "read_meshio",
    "MGCFDLevel",
    "MGCFDMesh",
    "channel_bump",
    "read_input_dat",
]
