"""Ping-pong timing between rank pairs: what the model's latency and bandwidth come from.

It lives in the communication layer because it sends point-to-point messages, and every
message meshchain sends goes through :mod:`meshchain.comm`.

Examples
--------
>>> from mpi4py import MPI
>>> half_round_trip(MPI.COMM_SELF, 1024, repeats=3) > 0    # to itself on one process
True
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["half_round_trip"]

_TAG = 77


def half_round_trip(comm, nbytes: int, repeats: int) -> float:
    """Median of half a round trip of ``nbytes`` with this rank's partner (``rank ^ 1``), after
    two warm-up trips; a rank without a partner sends to itself (collective: barriers)."""
    partner = comm.rank ^ 1
    if partner >= comm.size:
        partner = comm.rank
    out, back = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    samples = []
    comm.Barrier()
    for _ in range(repeats + 2):
        start = time.perf_counter()
        if partner == comm.rank:
            _to_self(comm, out, back)
            _to_self(comm, back, out)
        elif comm.rank < partner:
            comm.Send(out, dest=partner, tag=_TAG)
            comm.Recv(back, source=partner, tag=_TAG)
        else:
            comm.Recv(back, source=partner, tag=_TAG)
            comm.Send(out, dest=partner, tag=_TAG)
        samples.append((time.perf_counter() - start) / 2)
    comm.Barrier()
    return float(np.median(samples[2:]))


def _to_self(comm, sent: np.ndarray, received: np.ndarray) -> None:
    request = comm.Irecv(received, source=comm.rank, tag=_TAG)
    comm.Send(sent, dest=comm.rank, tag=_TAG)
    request.Wait()
