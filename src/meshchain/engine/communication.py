"""The communication settings in use: the halo-exchange transport and the progress mode.

``config.transport`` and ``config.progress`` may be ``"auto"``: ``"persistent"`` and
``"none"``, limited to what the backend's exchanges can use. A calibration never changes
them unless applied (``mc.model.calibrate(apply=True)``, ``mc.model.apply``: they then
become explicit options). On several ranks every rank must use the same, so rank 0's
choice is agreed in one explicit collective (:meth:`CommunicationSettings.agree`, a
broadcast of both) at the points every rank passes together: ``mc.partition``,
``mc.configure`` after partitioning.
Reading :attr:`~CommunicationSettings.transport` or :attr:`~CommunicationSettings.progress`
never communicates; on one process they are resolved locally when first read.

Examples
--------
>>> import meshchain as mc
>>> settings = mc.get_runtime().communication
>>> settings.transport in ("p2p", "persistent", "neighbour", "rma"), settings.progress
(True, 'none')
"""

from __future__ import annotations

from ..comm.progress import check_progress
from ..core.errors import MeshchainError

__all__ = ["CommunicationSettings"]


class CommunicationSettings:
    """The transport and progress mode of one session (see the module docstring)."""

    def __init__(self, session):
        self._session = session
        self._transport = self._progress = None

    def forget(self) -> None:
        """The configuration changed: choose again (at the next :meth:`agree`, or when read on
        one process)."""
        self._transport = self._progress = None

    def agree(self) -> None:
        """Choose both and make every rank use rank 0's choice (collective on several ranks:
        one broadcast); nothing before the mesh is partitioned (no plan runs before)."""
        session = self._session
        if not session.distributed:
            self.forget()
            return
        if not session.partitioned:
            return
        progress = session.config.progress
        if progress != "auto":
            check_progress(progress, session.comm)
        self._transport, self._progress = session.comm.bcast((self._chosen_transport(), self._chosen_progress()),
                                                             root=0)

    @property
    def transport(self) -> str:
        """The halo-exchange transport in use."""
        if self._transport is None:
            self._transport = self._local(self._chosen_transport)
        return self._transport

    @property
    def progress(self) -> str:
        """The progress mode in use."""
        if self._progress is None:
            self._progress = self._local(self._chosen_progress)
        return self._progress

    def planned(self) -> tuple[str, str]:
        """``(transport, progress)``: those in use, else those the options choose (no MPI call)."""
        return self._transport or self._chosen_transport(), self._progress or self._chosen_progress()

    def reported(self, what: str) -> str:
        """What ``mc.stats()`` reports for ``what`` (``"transport"`` or ``"progress"``): the
        choice in use, or what will be chosen (no MPI call)."""
        chosen = self._transport if what == "transport" else self._progress
        if chosen is not None:
            return chosen
        configured = getattr(self._session.config, what)
        return configured if configured != "auto" else "auto (chosen when the mesh is partitioned)"

    def _local(self, choose) -> str:
        if self._session.distributed:
            raise MeshchainError("the communication settings are agreed when the mesh is partitioned; no exchange "
                                 "can be planned before mc.partition (an internal error; please report it)")
        return choose()

    def _chosen_transport(self) -> str:
        session = self._session
        chosen, allowed = session.config.transport, session.backend.transports
        if chosen == "auto":
            chosen = "persistent" if "persistent" in allowed else allowed[0]
        return chosen

    def _chosen_progress(self) -> str:
        session = self._session
        chosen = session.config.progress
        if chosen == "auto":
            chosen = "none"
        return chosen
