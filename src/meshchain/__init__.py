"""meshchain: unstructured-mesh parallel loops in Python, fast on CPUs, GPUs and clusters.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> cells = mc.Set(4, "cells")
>>> q = mc.Dat(cells, 1, np.arange(4.0), "q")
>>> biggest = mc.Global(1, -np.inf, "biggest")
>>> @mc.kernel
... def peak(a, m):
...     m[0] = max(m[0], a[0])
>>> mc.par_loop(peak, cells, q(mc.READ), biggest(mc.MAX))
>>> float(biggest.value[0])
3.0
"""

from .core.numba_cache import install as _install_numba_cache

_install_numba_cache()  # before any module decorates a cached function: their stamps cover what they call

from .core.access import INC, MAX, MIN, READ, RW, WRITE, Access
from .core.errors import (
    AccessModeError,
    ArgumentCountError,
    BackendUnavailableError,
    CompilationError,
    ConfigurationError,
    DataShapeError,
    DeclarationError,
    InternalError,
    KernelError,
    KernelRuntimeError,
    LoopError,
    CaptureError,
    MapError,
    MeshchainError,
    MeshchainWarning,
    MeshFileError,
    MeshFileNotFoundError,
    CheckpointError,
    OutputError,
    SetMismatchError,
    SolverError,
)
from .ir.kernel import Kernel, kernel
from . import model
from .core import errors
from .api import capture, configure, flush, get_runtime, loop_chain, par_loop, partition, profile, rebalance, repartition, reset_runtime, stats
from .types import ALL, ON_BOTTOM, ON_INTERIOR_FACETS, ON_TOP, ExtrudedSet, Arg, Block, Dat, Global, Grid, Map, MapIndex, Mat, MixedDat, MixedMap, MixedSet, Set, Stencil, Subset
from .linalg import LinearOperator, Preconditioner, SolveInfo, matrix_powers, solve
from .io.checkpoint import checkpoint, restore
from .io.output import Output

__version__ = "0.1.0"

__all__ = [
    "Access", "READ", "WRITE", "RW", "INC", "MIN", "MAX",
    "Set", "Subset", "ExtrudedSet", "ALL", "ON_BOTTOM", "ON_TOP", "ON_INTERIOR_FACETS", "MixedSet", "MixedDat", "MixedMap", "Map", "MapIndex", "Dat", "Global", "Arg", "Mat", "Grid", "Stencil", "LinearOperator", "Preconditioner", "SolveInfo", "solve", "matrix_powers",
    "Kernel", "kernel", "par_loop", "flush", "configure", "stats", "get_runtime", "reset_runtime", "loop_chain", "capture", "profile",
    "partition", "repartition", "rebalance", "Block", "model", "checkpoint", "restore", "CheckpointError",
    "Output", "OutputError",
    "MeshchainError", "InternalError", "DeclarationError", "MapError", "DataShapeError", "LoopError", "CaptureError", "SetMismatchError",
    "ArgumentCountError", "AccessModeError", "KernelError", "CompilationError", "KernelRuntimeError",
    "ConfigurationError", "BackendUnavailableError", "SolverError", "MeshFileError", "MeshFileNotFoundError",
    "MeshchainWarning",
]
