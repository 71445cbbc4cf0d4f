"""What the partitioners share: errors agreed over ranks and the MPI module, imported when needed.

>>> from mpi4py import MPI
>>> _agree(MPI.COMM_SELF, None)   # no rank found a problem
"""

from __future__ import annotations

from ...comm.agree import raise_together
from ...core.errors import DeclarationError

__all__ = ["_agree", "_mpi"]


def _agree(comm, message: str | None) -> None:
    """Collective: raise ``message`` (from the lowest rank that has one) as a
    :class:`DeclarationError` on every rank."""
    raise_together(comm, None if message is None else DeclarationError(message))


def _mpi():
    from mpi4py import MPI

    return MPI
