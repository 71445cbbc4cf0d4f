"""Halo exchanges: bring a dat's halo up to a depth with non-blocking messages.

One :class:`Exchange` sends, to each neighbour, the rows of the owned elements that
the neighbour imports in layers ``lo+1..hi``, and receives the rows of this rank's
imports in those layers. ``begin`` posts everything (so computation can overlap);
``finish`` waits, unpacks and records the dat's new valid depth.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Exchange"]


class Exchange:
    """A posted halo exchange of one dat from valid depth ``lo`` to ``hi``."""

    def __init__(self, comm, dat, lo: int, hi: int):
        self.dat, self.hi = dat, hi
        self.requests, self.unpack = [], []
        self.messages = self.bytes_sent = 0
        layout = dat.dataset._layout
        data = dat._host  # shapes only: rows are read where they are current
        tag = dat._tag
        for neighbour in layout.neighbours:
            exported = _layers(layout.exports.get(neighbour), lo, hi)
            imported = _layers(layout.imports.get(neighbour), lo, hi)
            if exported.size:
                buffer = np.ascontiguousarray(dat._read_rows(exported))
                self.requests.append(comm.Isend(buffer, dest=neighbour, tag=tag))
                self.unpack.append((None, buffer))  # keep the send buffer alive until the wait
                self.messages += 1
                self.bytes_sent += buffer.nbytes
            if imported.size:
                buffer = np.empty((imported.size,) + data.shape[1:], dtype=data.dtype)
                self.requests.append(comm.Irecv(buffer, source=neighbour, tag=tag))
                self.unpack.append((imported, buffer))

    def finish(self) -> None:
        """Wait for every message, copy received rows into the halo, mark the dat valid."""
        if self.requests:
            from mpi4py import MPI

            MPI.Request.Waitall(self.requests)
        for indices, buffer in self.unpack:
            if indices is not None:
                self.dat._write_rows(indices, buffer)
        self.dat._valid_depth = max(self.dat._valid_depth, self.hi)


def _layers(per_layer, lo: int, hi: int) -> np.ndarray:
    if not per_layer:
        return np.zeros(0, dtype=np.int64)
    chosen = per_layer[lo:hi]
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
