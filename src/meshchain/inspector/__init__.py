"""Inspectors: pure functions from loops (and later chains) and the mesh to schedules."""

from .colouring import Plan, colour_blocks, touched_keys
from .tiling import TileLoop, TilePlan, chain_footprints, check_colouring, tile_chain

__all__ = ["Plan", "colour_blocks", "touched_keys", "TileLoop", "TilePlan", "tile_chain", "chain_footprints",
           "check_colouring"]
