"""Declarations: sets, maps, dats, globals, loop arguments and rank-local input blocks.

Declarations hold no values: the session that runs the loops keeps them (see
:mod:`meshchain.core.storage`); ``dat.data``, ``glob.value`` and ``map.values`` ask it.
"""

from .args import Arg
from .block import Block
from .data import Dat, Global
from .extruded import ALL, ON_BOTTOM, ON_INTERIOR_FACETS, ON_TOP, ExtrudedSet
from .grid import Grid, GridInterior, Stencil
from .maps import ExtrudedMap, Map, MapIndex
from .mat import Mat, MatArg
from .mixed import MixedArg, MixedDat, MixedMap, MixedSet
from .sets import Set
from .subsets import Subset

__all__ = ["Arg", "Block", "Dat", "Global", "ExtrudedSet", "ExtrudedMap", "ALL", "ON_BOTTOM", "ON_TOP", "ON_INTERIOR_FACETS", "Grid", "GridInterior", "Stencil", "Map", "MapIndex", "Mat", "MatArg", "MixedArg", "MixedDat",
           "MixedMap", "MixedSet", "Set", "Subset"]
