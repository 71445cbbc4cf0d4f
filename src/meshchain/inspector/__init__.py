"""Inspectors: pure functions from loops (and later chains) and the mesh to schedules."""

from .colouring import Plan, colour_blocks, touched_keys

__all__ = ["Plan", "colour_blocks", "touched_keys"]
