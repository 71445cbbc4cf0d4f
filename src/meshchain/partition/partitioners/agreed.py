"""What the partitioners share: errors agreed over ranks, checked weights and their integer
units (their collectives are :mod:`meshchain.comm`'s).

>>> from mpi4py import MPI
>>> _agree(MPI.COMM_SELF, None)   # no rank found a problem
"""

from __future__ import annotations

import numpy as np

from ...comm.agree import raise_together
from ...comm.reductions import max_everywhere
from ...core.errors import DeclarationError

__all__ = ["_agree", "_checked_weights", "_weight_units"]


def _agree(comm, message: str | None) -> None:
    """Collective: raise ``message`` (from the lowest rank that has one) as a
    :class:`DeclarationError` on every rank."""
    raise_together(comm, None if message is None else DeclarationError(message))


def _checked_weights(weights, n_local: int) -> np.ndarray:
    """``weights`` as float64 of shape ``(n_local,)``, or a DeclarationError saying what is wrong."""
    w = np.asarray(weights)
    if w.dtype.kind not in "fiub" or w.shape != (n_local,):
        raise DeclarationError(
            f"rib: weights must be a real array with one value per local row, shape ({n_local},), got dtype "
            f"{w.dtype} and shape {w.shape}; pass one weight per element.")
    w = w.astype(np.float64)
    if not np.isfinite(w).all() or (w < 0).any():
        raise DeclarationError("rib: weights must be finite and non-negative; "
                               f"found {w[~np.isfinite(w) | (w < 0)][0]!r}.")
    return w


def _weight_units(w: np.ndarray, comm, *, bits: int = 24) -> np.ndarray:
    """Weights quantised to int64 units of ``max(w) / 2**bits`` (max over every rank), at least 1."""
    top = max_everywhere(comm, np.array([w.max() if len(w) else 0.0]))
    if top[0] <= 0:
        return np.ones(len(w), dtype=np.int64)
    return np.floor(w / top[0] * float(1 << bits)).astype(np.int64) + 1
