"""Gather a distributed dat to rank 0 in the original global numbering."""

from __future__ import annotations

import numpy as np

__all__ = ["gather_rows"]


def gather_rows(comm, global_ids: np.ndarray, rows: np.ndarray, n_global: int):
    """Rows of all ranks placed at their global ids, on rank 0 (``None`` elsewhere)."""
    gathered_ids = comm.gather(np.ascontiguousarray(global_ids, dtype=np.int64), root=0)
    gathered_rows = comm.gather(np.ascontiguousarray(rows), root=0)
    if comm.rank != 0:
        return None
    result = np.empty((n_global,) + rows.shape[1:], dtype=rows.dtype)
    for ids, values in zip(gathered_ids, gathered_rows):
        result[ids] = values
    return result
