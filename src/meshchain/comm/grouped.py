"""One grouped halo message per neighbour (Alg. 2, lines 5-7; the paper's Fig. 8).

Every dat a segment of a chain needs deeper than it is valid contributes the rows of
its layers ``lo+1..hi`` that a neighbour imports; the rows of all such dats are packed
into one byte buffer per neighbour, sent with one ``Isend``, and received with one
``Irecv`` whose size each side knows from its import lists (every rank takes the same
decisions, so sender and receiver agree on which dats and layers are in the message).
"""

from __future__ import annotations

import numpy as np

from .p2p import _layers

__all__ = ["GroupedExchange", "GROUPED_TAG"]

GROUPED_TAG = 0  # dats use their declaration number (>= 1) as tag; messages between two ranks arrive in order


class GroupedExchange:
    """A posted grouped exchange of ``[(dat, lo, hi), ...]``."""

    def __init__(self, comm, items):
        self.items = [(dat, lo, hi) for dat, lo, hi in items if hi > lo]
        self.requests, self.receives, self._keep = [], [], []
        self.messages = self.bytes_sent = 0
        self.largest = 0  # the largest message sent to one neighbour (m^r)
        for neighbour in _neighbours(self.items):
            sent = self._pack(neighbour)
            if sent.size:
                self.requests.append(comm.Isend(sent, dest=neighbour, tag=GROUPED_TAG))
                self._keep.append(sent)
                self.messages += 1
                self.bytes_sent += sent.nbytes
                self.largest = max(self.largest, sent.nbytes)
            size = self._incoming_bytes(neighbour)
            if size:
                buffer = np.empty(size, dtype=np.uint8)
                self.requests.append(comm.Irecv(buffer, source=neighbour, tag=GROUPED_TAG))
                self.receives.append((neighbour, buffer))

    def _pack(self, neighbour) -> np.ndarray:
        parts = []
        for dat, lo, hi in self.items:
            rows = _layers(dat.dataset._layout.exports.get(neighbour), lo, hi)
            if rows.size:
                parts.append(np.ascontiguousarray(dat._read_rows(rows)).view(np.uint8).ravel())
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)

    def _incoming_bytes(self, neighbour) -> int:
        return sum(_row_bytes(dat) * _layers(dat.dataset._layout.imports.get(neighbour), lo, hi).size
                   for dat, lo, hi in self.items)

    def finish(self) -> None:
        """Wait for every message, unpack into the halos, mark the dats valid."""
        if self.requests:
            from mpi4py import MPI

            MPI.Request.Waitall(self.requests)
        for neighbour, buffer in self.receives:
            offset = 0
            for dat, lo, hi in self.items:
                rows = _layers(dat.dataset._layout.imports.get(neighbour), lo, hi)
                size = rows.size * _row_bytes(dat)
                if size:
                    chunk = buffer[offset : offset + size].view(dat._host.dtype)
                    dat._write_rows(rows, chunk.reshape((rows.size,) + dat._host.shape[1:]))
                offset += size
        for dat, _, hi in self.items:
            dat._valid_depth = max(dat._valid_depth, hi)
        self._keep.clear()


def _row_bytes(dat) -> int:
    return int(np.prod(dat._host.shape[1:], dtype=np.int64)) * dat._host.dtype.itemsize


def _neighbours(items) -> list[int]:
    found = set()
    for dat, _, _ in items:
        found.update(dat.dataset._layout.neighbours)
    return sorted(found)
