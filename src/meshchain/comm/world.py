"""The communicator a session runs on when none is given.

Examples
--------
>>> from meshchain.comm.world import world_communicator
>>> world_communicator() is None   # not started by an MPI launcher
True
"""

from __future__ import annotations

import os

__all__ = ["world_communicator"]

_LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_RANK", "HYDI_CONTROL_FD")


def world_communicator():
    """``MPI.COMM_WORLD`` when this process was started by an MPI launcher, else None.

    mpi4py is imported only then, so serial runs never initialise MPI.
    """
    if not any(v in os.environ for v in _LAUNCHER_VARIABLES):
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD
