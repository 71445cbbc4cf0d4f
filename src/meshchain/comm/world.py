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
           "ASYNC_PROGRESS_VARIABLES", "NETWORK_VARIABLES", "network_label"]

_LAUNCHER_VARIABLES = ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_RANK", "HYDI_CONTROL_FD")

PROGRESS_VARIABLE = "MESHCHAIN_PROGRESS"
"""The environment variable that picks the progress mode; ``thread`` changes how MPI starts."""

ASYNC_PROGRESS_VARIABLES = ("MPICH_ASYNC_PROGRESS", "MPIR_PARAM_ASYNC_PROGRESS", "MPIR_CVAR_ASYNC_PROGRESS")
"""MPICH's spellings of its asynchronous-progress switch, in the order MPICH reads them (a
later one that is set overrides an earlier one)."""

NETWORK_VARIABLES = ("MPIR_CVAR_NOLOCAL", "MPIR_CVAR_CH4_NETMOD", "MPIR_CVAR_CH4_SHM", "MPIR_CVAR_DEVICE_COLLECTIVES",
                     "FI_PROVIDER", "UCX_TLS", "UCX_NET_DEVICES", "OMPI_MCA_pml", "OMPI_MCA_btl", "OMPI_MCA_mtl",
                     "I_MPI_FABRICS", "I_MPI_OFI_PROVIDER")
"""Environment variables with which MPICH, libfabric, UCX, Open MPI and Intel MPI choose how
ranks talk (shared memory, TCP, InfiniBand...): what :func:`network_label` reads."""

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


def network_label(environ=None) -> str:
    """How this job's ranks talk, as far as the environment says (default ``os.environ``):
    ``"default"`` when none of :data:`NETWORK_VARIABLES` is set, else each one that is, as
    ``name.value`` (MPICH's ``MPIR_CVAR_`` and Open MPI's ``OMPI_MCA_`` prefixes dropped,
    lower case, characters other than letters, digits, ``.`` and ``_`` replaced by ``_``),
    joined by ``-``. Measurements of the network (a calibration) are kept per label.

    >>> network_label({}), network_label({"MPIR_CVAR_NOLOCAL": "1", "MPIR_CVAR_CH4_NETMOD": "ofi",
    ...                                     "FI_PROVIDER": "tcp"})
    ('default', 'nolocal.1-ch4_netmod.ofi-fi_provider.tcp')
    """
    environ = os.environ if environ is None else environ
    parts = []
    for name in NETWORK_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            short = name.removeprefix("MPIR_CVAR_").removeprefix("OMPI_MCA_").lower()
            parts.append(f"{short}.{_safe(value.lower())}")
    return "-".join(parts) or "default"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text)


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
