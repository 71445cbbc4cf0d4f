"""Inspectors: pure functions from loops and the mesh layout to what the engine runs.

* :mod:`.colouring`: block colourings of one loop (shared-memory threads, no races);
* :mod:`.chain`: the chain inspector (the paper's Alg. 3, generalised): segments, depths,
  core thresholds, validity;
* :mod:`.schedule`: a unit's :class:`~.schedule.Schedule` (serial, loop by loop, CA);
* :mod:`.tiling`: sparse tiles of a chain phase.
"""

from .colouring import BlockColouring, colour_blocks, touched_keys
from .schedule import ExchangeSpec, MoreLayers, Run, Schedule, Segment
from .tiling import TileLoop, TilePlan, chain_footprints, check_colouring, tile_chain

__all__ = ["BlockColouring", "colour_blocks", "touched_keys", "TileLoop", "TilePlan", "tile_chain", "chain_footprints",
           "check_colouring", "Run", "ExchangeSpec", "Segment", "Schedule", "MoreLayers"]
