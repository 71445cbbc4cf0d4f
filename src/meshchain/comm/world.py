"""The communicator a session runs on when none is given, and how MPI is started.

When :func:`world_communicator` is the first to import mpi4py (so it initialises MPI) and
the environment has ``MESHCHAIN_PROGRESS=thread``, it first switches on MPICH's
asynchronous progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1``, unless one of MPICH's
spellings of that variable is already set) and asks for ``MPI_THREAD_MULTIPLE``: MPICH
reads the variable only when MPI initialises. It records what the environment said then
(:func:`async_progress_at_init`), for :func:`meshchain.comm.progress.check_progress`.

Examples
--------
>>> from meshchain.comm.world import world_communicator, async_progress_requested
>>> world_communicator() is None   # not started by an MPI launcher
True
>>> async_progress_requested({"MPIR_CVAR_ASYNC_PROGRESS": "1"}), async_progress_requested({})
(True, False)
"""

from __future__ import annotations

import os
import sys

__all__ = ["world_communicator", "async_progress_requested", "async_progress_at_init", "PROGRESS_VARIABLE",
           "ASYNC_PROGRESS_VARIABLES"]

_LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_RANK", "HYDI_CONTROL_FD")

PROGRESS_VARIABLE = "MESHCHAIN_PROGRESS"
"""The environment variable that picks the progress mode; ``thread`` changes how MPI starts."""

ASYNC_PROGRESS_VARIABLES = ("MPICH_ASYNC_PROGRESS", "MPIR_PARAM_ASYNC_PROGRESS", "MPIR_CVAR_ASYNC_PROGRESS")
"""MPICH's spellings of its asynchronous-progress switch, in the order MPICH reads them (a
later one that is set overrides an earlier one)."""

_TRUE, _FALSE = ("1", "yes", "true", "on"), ("0", "no", "false", "off")

_async_at_init: bool | None = None  # what the environment said when meshchain initialised MPI


def async_progress_requested(environ=None) -> bool:
    """Whether ``environ`` (default ``os.environ``) switches on MPICH's asynchronous progress,
    read the way MPICH reads it at ``MPI_Init`` (a value it cannot read counts as unset)."""
    environ = os.environ if environ is None else environ
    requested = False
    for name in ASYNC_PROGRESS_VARIABLES:
        value = environ.get(name, "").strip().lower()
        if value in _TRUE or value in _FALSE:
            requested = value in _TRUE
    return requested


def async_progress_at_init() -> bool | None:
    """Whether the environment switched on MPICH's asynchronous progress when
    :func:`world_communicator` initialised MPI; None when meshchain did not initialise it."""
    return _async_at_init


def _prepare_mpi() -> None:
    """Before mpi4py's first import initialises MPI: honour ``MESHCHAIN_PROGRESS=thread``
    and record what the environment says about asynchronous progress."""
    global _async_at_init
    import mpi4py

    if os.environ.get(PROGRESS_VARIABLE, "").strip().lower() == "thread":
        if not any(name in os.environ for name in ASYNC_PROGRESS_VARIABLES):
            os.environ["MPIR_CVAR_ASYNC_PROGRESS"] = "1"
        mpi4py.rc.thread_level = "multiple"
    _async_at_init = async_progress_requested()


def world_communicator():
    """``MPI.COMM_WORLD`` when this process was started by an MPI launcher, else None.

    mpi4py is imported only then, so serial runs never initialise MPI. The first call that
    imports it prepares MPI's start (see the module docstring).
    """
    if not any(v in os.environ for v in _LAUNCHER_VARIABLES):
        return None
    if "mpi4py.MPI" not in sys.modules:
        _prepare_mpi()
    from mpi4py import MPI

    return MPI.COMM_WORLD
