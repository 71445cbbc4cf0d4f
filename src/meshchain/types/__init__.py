"""Declarations: sets, maps, dats, globals and loop arguments."""

from .args import Arg
from .data import Dat, Global
from .maps import Map, MapIndex
from .sets import Set

__all__ = ["Arg", "Dat", "Global", "Map", "MapIndex", "Set"]
