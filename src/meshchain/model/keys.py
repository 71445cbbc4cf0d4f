"""What a calibration holds for: the settings that change what it measures.

The latency and bandwidth depend on how the ranks talk (shared memory, TCP, InfiniBand:
:func:`meshchain.comm.world.network_label`) and on how many there are; the runtime's
overheads ``o_r`` and ``o_l`` on the halo-exchange transport; the overlap ``φ`` on the
progress mode; the loop costs ``g_l`` on the threads per rank. A calibration is saved,
and a saved one used, per :class:`CalibrationKey` of all of them: a calibration taken on
shared memory is never used over TCP, nor one taken with 2 threads with 1.

Examples
--------
>>> key = CalibrationKey("node1", 2, "default", "persistent", "none", 1)
>>> key.filename()
'node1-2ranks-default-persistent-none-1threads.json'
>>> key.describe()
'2 rank(s) on node1, network default, transport persistent, progress none, 1 thread(s) per rank'
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CalibrationKey"]


class CalibrationKey(NamedTuple):
    """``host``, ``ranks``, ``network`` (:func:`~meshchain.comm.world.network_label`),
    ``transport`` and ``progress`` (``"-"`` on one process: nothing is exchanged) and
    ``threads`` per rank."""

    host: str
    ranks: int
    network: str
    transport: str
    progress: str
    threads: int

    def filename(self) -> str:
        """The calibration file's name for this key."""
        return (f"{self.host or 'unknown'}-{self.ranks}ranks-{self.network or 'default'}-{self.transport or '-'}-"
                f"{self.progress or '-'}-{self.threads}threads.json")

    def describe(self) -> str:
        """The key in words."""
        return (f"{self.ranks} rank(s) on {self.host or '?'}, network {self.network or '?'}, transport "
                f"{self.transport or '?'}, progress {self.progress or '?'}, {self.threads} thread(s) per rank")
