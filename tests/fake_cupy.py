"""A NumPy stand-in for the parts of CuPy that ``backend="cupy"`` uses, so that the code of
:class:`~meshchain.backends.cuda.device.CupyDevice` (streams, events, asynchronous copies,
pinned buffers, kernel launches, event timing) runs in the tests without a GPU.

"Device" arrays are NumPy arrays behind a small wrapper that offers ``.data.ptr``,
``.get``/``.set`` and indexing; ``RawModule`` compiles the source with the host emulation
and launches ``mc_launch``. Everything runs at once, in order, so this checks our calls
and their logic against CuPy's documented interface, not CuPy's own behaviour on a GPU.
(The calls were checked against CuPy's source: see the notes of issue 7.)
"""

from __future__ import annotations

import ctypes
import sys
import time
import types
from pathlib import Path

import numpy as np


class FakeArray:
    """A "device" array: a NumPy array reached through CuPy's interface."""

    def __init__(self, array: np.ndarray):
        self.host = array
        self.data = types.SimpleNamespace(ptr=array.ctypes.data)

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    nbytes = property(lambda self: self.host.nbytes)
    size = property(lambda self: self.host.size)

    def __len__(self):
        return len(self.host)

    def get(self, out=None):
        if out is None:
            return self.host.copy()
        np.copyto(out, self.host)
        return out

    def set(self, array):
        np.copyto(self.host, array)

    def __getitem__(self, index):
        index = index.host if isinstance(index, FakeArray) else index
        return FakeArray(self.host[index])

    def __setitem__(self, index, value):
        index = index.host if isinstance(index, FakeArray) else index
        self.host[index] = value.host if isinstance(value, FakeArray) else value


class Stream:
    def __init__(self, non_blocking=False, null=False):
        self.ptr = 0 if null else id(self)
        self.waited = []

    def wait_event(self, event):
        assert isinstance(event, Event) and event.recorded, "waiting for an event that was never recorded"
        self.waited.append(event)

    def synchronize(self):
        pass


NULL = Stream(null=True)


class Event:
    def __init__(self, disable_timing=False):
        self.timing, self.recorded, self.time = not disable_timing, False, None

    def record(self, stream=None):
        self.recorded, self.time = True, time.perf_counter()

    def synchronize(self):
        assert self.recorded, "synchronising on an event that was never recorded"

    @property
    def done(self):
        return self.recorded


def get_elapsed_time(start, stop):
    assert start.timing and stop.timing, "timing needs events created without disable_timing"
    return (stop.time - start.time) * 1e3


class Kernel:
    def __init__(self, launch):
        self.launch = launch

    def __call__(self, grid, block, arguments):
        assert isinstance(grid, tuple) and isinstance(block, tuple) and isinstance(arguments, tuple)
        converted = [ctypes.c_uint(grid[0])]
        for value in arguments:
            if isinstance(value, FakeArray):
                converted.append(ctypes.c_void_p(value.data.ptr))
            elif isinstance(value, np.int32):
                converted.append(ctypes.c_int(int(value)))
            elif isinstance(value, np.int64):
                converted.append(ctypes.c_longlong(int(value)))
            else:
                raise TypeError(f"CuPy kernels take arrays and NumPy scalars, got {type(value).__name__}")
        self.launch(*converted)


class RawModule:
    directory: Path = Path(".")

    def __init__(self, code, options=()):
        self.code = code

    def get_function(self, name):
        from meshchain.backends.cuda.emulation import compile_emulated

        assert name == "mc_loop"
        return Kernel(compile_emulated(self.code, self.directory, what="a fake-CuPy module"))


def memcpy_async(dst, src, size, kind, stream):
    assert kind in (1, 2) and isinstance(stream, int)
    ctypes.memmove(dst, src, size)


def install(monkeypatch, directory: Path) -> None:
    """Make ``import cupy`` and ``import cupyx`` give this stand-in."""
    RawModule.directory = Path(directory)
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, memcpyAsync=memcpy_async)
    cuda = types.SimpleNamespace(runtime=runtime, Stream=Stream, Event=Event, get_elapsed_time=get_elapsed_time,
                                 get_current_stream=lambda: NULL,
                                 Device=lambda number: types.SimpleNamespace(use=lambda: None))
    cupy = types.ModuleType("cupy")
    cupy.cuda, cupy.RawModule = cuda, RawModule
    cupy.asarray = lambda a: a if isinstance(a, FakeArray) else FakeArray(np.array(a, copy=True, order="C"))
    cupy.empty = lambda shape, dtype: FakeArray(np.empty(shape, dtype=dtype))
    cupy.asnumpy = lambda a: a.get()
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda n, dtype: np.empty(n, dtype=dtype)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
