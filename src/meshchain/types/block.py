"""``mc.Block``: this rank's own rows of a global array, as a declaration input.

Examples
--------
>>> import numpy as np
>>> from meshchain.types.block import Block
>>> Block(np.zeros((3, 2))).rows.shape
(3, 2)
"""

from __future__ import annotations

import numpy as np

__all__ = ["Block"]


class Block:
    """This rank's consecutive rows of a global array (rank order = row order).

    Parameters
    ----------
    rows : array_like
        Shape ``(n_local, ...)``; the row counts of all ranks must add up to the set size.
    """

    def __init__(self, rows):
        self.rows = np.asarray(rows)
