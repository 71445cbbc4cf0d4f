"""Lazy host/device synchronisation of a dat's values.

A dat that a CUDA loop used has a :class:`DeviceCopy`. Its ``state`` says which side is
current: ``"both"``, ``"device"`` (a loop wrote it on the GPU; the host array is stale)
or ``"host"`` (the host array was handed out for writing; the device array is stale).
Copies happen only when the other side needs the values: a loop uploads a dat whose
host side is newer; reading ``dat.data`` (or anything else that needs the host array)
downloads a dat whose device side is newer. So ``dat.data`` on the host is always right,
and a time loop on the GPU moves no data between host and device.

Halo exchanges of the CUDA backend pack and unpack rows on the device (:mod:`.halo`).
A dat with a device copy that a host backend exchanges (after ``mc.configure`` switched
backends) moves only its exchanged rows (:meth:`DeviceCopy.read_rows`,
:meth:`DeviceCopy.write_rows`), gathered and scattered where they are current.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DeviceCopy", "device_array", "HOST", "DEVICE", "BOTH"]

HOST, DEVICE, BOTH = "host", "device", "both"


class DeviceCopy:
    """The device side of one dat."""

    __slots__ = ("device", "array", "state")

    def __init__(self, device, array, state: str):
        self.device, self.array, self.state = device, array, state

    def to_host(self, host: np.ndarray, *, write: bool) -> None:
        """Make ``host`` current; with ``write`` the caller may change it, so the device copy
        becomes stale."""
        if self.state == DEVICE:
            self.device.download(self.array, host)
            self.state = BOTH
        if write:
            self.state = HOST

    def read_rows(self, host: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` from the current side."""
        if self.state == DEVICE:
            return self.device.gather(self.array, rows)
        return host[rows]

    def write_rows(self, host: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """Store rows on every side that is current, so neither goes stale."""
        if self.state != HOST:
            self.device.scatter(self.array, rows, values)
        if self.state != DEVICE:
            host[rows] = values


def device_array(device, storage, *, write: bool):
    """The dat's array on ``device`` (``storage`` is its
    :class:`~meshchain.core.storage.DatStorage`), current; after a writing loop the host
    copy is stale."""
    copy = storage.device
    if copy is None or copy.device is not device or copy.array.shape != storage.host.shape:
        if copy is not None:
            copy.to_host(storage.host, write=False)
        copy = storage.device = DeviceCopy(device, device.upload(storage.host), BOTH)
    elif copy.state == HOST:
        device.refresh(copy.array, storage.host)
        copy.state = BOTH
    if write:
        copy.state = DEVICE
    return copy.array
