"""Where generated CUDA runs: a GPU through CuPy, or the host emulation.

Both offer the same small interface to :class:`~meshchain.backends.cuda.backend.CudaBackend`:
allocate, copy in and out, gather and scatter rows, compile a generated module and
launch its ``mc_loop``; and, for halo exchanges (:mod:`.halo`), two streams. Kernels run
in order on the *compute* stream; the staging copies of halo bytes between the device
and pinned host buffers run on a separate *copy* stream, so they overlap the kernels of
the core iterations:

- ``mark()`` is an event after the compute work enqueued so far;
- ``copy_out(after, source, target)`` copies device bytes to a host buffer once ``after``
  has happened, and returns an event that ``wait(event)`` (the host) waits for;
- ``copy_in(source, target)`` copies host bytes to the device; compute work enqueued
  afterwards waits for it.

Launches do not wait for the GPU: a reduction's partials (or any copy to the host)
waits for the kernels before it, and :meth:`CupyDevice.settle` adds the launches' CUDA
event times to their loops' ``time_compute`` (``mc.stats()`` settles first). The
emulated device keeps its "device" arrays as separate NumPy arrays and runs kernels at
once, but holds copies on the copy stream back until the host waits for them, so a
missing wait shows up as wrong halos in the tests that run without a GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import time
from pathlib import Path

import numpy as np

from ...core.errors import BackendUnavailableError, CompilationError
from ..generated import save_source

__all__ = ["CupyDevice", "EmulatedDevice"]


class EmulatedDevice:
    """NumPy arrays and C++-compiled generated source (see :mod:`.emulation`)."""

    name = "cuda-emulation"
    aware_mpi = False  # as most MPI libraries: gpu_halos="auto" stages halos through host buffers
    host_memory = True  # but its "device" memory is host memory, so gpu_halos="direct" works too

    def __init__(self, cache_dir: Path):
        from .emulation import compiler

        compiler()  # fail now, in configure(), when there is no C++ compiler
        self.directory = Path(cache_dir) / "cuda-emulation"
        self._copies: list = []  # the copy stream: (event, work) not yet done

    def compile(self, source: str, what: str, *, contract: bool = False):
        from .emulation import compile_emulated

        return compile_emulated(source, self.directory, what=what, contract=contract)

    def launch(self, function, grid: int, threads: int, arguments, timer=None) -> None:
        converted = [ctypes.c_uint(grid)]
        for value in arguments:
            if isinstance(value, np.ndarray):
                converted.append(ctypes.c_void_p(value.ctypes.data))
            elif isinstance(value, np.int32):
                converted.append(ctypes.c_int(int(value)))
            else:
                converted.append(ctypes.c_longlong(int(value)))
        began = time.perf_counter()
        function(*converted)
        if timer is not None:
            timer(time.perf_counter() - began)

    # --- streams (see the module docstring) ---

    def mark(self):
        return _Done()  # kernels ran when they were launched

    def copy_out(self, after, source: np.ndarray, target: np.ndarray):
        done = _Done(False)
        self._copies.append((done, lambda: np.copyto(target, source)))
        return done

    def copy_in(self, source: np.ndarray, target: np.ndarray):
        done = _Done(False)
        self._copies.append((done, lambda: np.copyto(target, source)))
        self.wait(done)  # compute work enqueued after this sees the bytes
        return done

    def wait(self, event) -> None:
        while not event.done:
            finished, work = self._copies.pop(0)
            work()
            finished.done = True

    def pinned(self, nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.uint8)

    def address(self, array: np.ndarray) -> int:
        return array.ctypes.data

    def settle(self) -> None:
        pass

    def upload(self, host: np.ndarray) -> np.ndarray:
        return np.array(host, copy=True, order="C")

    def refresh(self, array, host: np.ndarray) -> None:
        np.copyto(array, host)

    def download(self, array, out: np.ndarray) -> None:
        np.copyto(out, array)

    def to_host(self, array) -> np.ndarray:
        return np.array(array, copy=True)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype=dtype)

    def gather(self, array, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` of a device array, on the host (one staged copy)."""
        return array[rows]

    def scatter(self, array, rows: np.ndarray, values: np.ndarray) -> None:
        array[rows] = values

class _Done:
    """An event of the emulated device."""

    __slots__ = ("done",)

    def __init__(self, done: bool = True):
        self.done = done


class CupyDevice:
    """A CUDA GPU through CuPy: ``cupy.RawModule`` builds the source with NVRTC (CuPy keeps
    the compiled binaries in its on-disk kernel cache). With several GPUs on a node, the
    ranks of that node take them round-robin by their node-local rank (as ``mpiexec``,
    Open MPI's ``mpirun`` and Slurm's ``srun`` report it); set ``CUDA_VISIBLE_DEVICES``
    per rank to choose otherwise."""

    name = "cupy"
    aware_mpi = None  # asked of the MPI library when a halo exchange first needs it
    host_memory = False

    def __init__(self, cache_dir: Path):
        try:
            import cupy
        except ImportError as exc:
            raise BackendUnavailableError(
                f"backend 'cupy' needs CuPy ({exc}); install the wheel for your CUDA version, e.g. "
                f"pip install cupy-cuda12x, or use backend='numba'."
            ) from exc
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - CuPy raises driver-specific errors
            raise BackendUnavailableError(f"backend 'cupy': no usable CUDA GPU ({exc}); use backend='numba'.") from exc
        if count < 1:
            raise BackendUnavailableError("backend 'cupy': CuPy sees no CUDA GPU; use backend='numba'.")
        self.cp = cupy
        self.number = local_rank() % count
        cupy.cuda.Device(self.number).use()
        self.directory = Path(cache_dir) / "cuda"
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        self._timings: list = []  # (timer, start, stop) of launches not yet accounted

    def compile(self, source: str, what: str, *, contract: bool = False):
        """``source`` compiled by NVRTC; ``contract``: multiplies and adds may be fused
        (``--fmad=true``); without it the kernel rounds each operation as the host does."""
        path = save_source(self.directory, hashlib.sha256(source.encode()).hexdigest()[:24], ".cu", source)
        try:
            fmad = f"--fmad={'true' if contract else 'false'}"
            module = self.cp.RawModule(code=source, options=("--std=c++17", fmad))
            return module.get_function("mc_loop")
        except Exception as exc:  # noqa: BLE001 - NVRTC errors come in several types
            raise CompilationError(f"NVRTC could not compile {what}; source: {path}\n{str(exc)[:2000]}") from exc

    def launch(self, function, grid: int, threads: int, arguments, timer=None) -> None:
        converted = tuple(v if not isinstance(v, int) else np.int64(v) for v in arguments)
        if timer is None:
            function((grid,), (threads,), converted)
            return
        start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record()
        function((grid,), (threads,), converted)
        stop.record()
        self._timings.append((timer, start, stop))
        if len(self._timings) > 1024:
            self._account(lambda stop: stop.done)

    def settle(self) -> None:
        """Wait for the GPU and hand the launches' times to their timers."""
        self.cp.cuda.get_current_stream().synchronize()
        self._account(lambda stop: True)

    def _account(self, finished) -> None:
        while self._timings and finished(self._timings[0][2]):
            timer, start, stop = self._timings.pop(0)
            stop.synchronize()
            timer(self.cp.cuda.get_elapsed_time(start, stop) / 1000.0)

    # --- streams (see the module docstring) ---

    def mark(self):
        event = self.cp.cuda.Event(disable_timing=True)
        event.record()
        return event

    def copy_out(self, after, source, target: np.ndarray):
        stream = self.copy_stream
        stream.wait_event(after)
        self.cp.cuda.runtime.memcpyAsync(target.ctypes.data, source.data.ptr, source.nbytes,
                                         _DEVICE_TO_HOST, stream.ptr)
        return self._recorded(stream)

    def copy_in(self, source: np.ndarray, target):
        stream = self.copy_stream
        self.cp.cuda.runtime.memcpyAsync(target.data.ptr, source.ctypes.data, source.nbytes,
                                         _HOST_TO_DEVICE, stream.ptr)
        done = self._recorded(stream)
        self.cp.cuda.get_current_stream().wait_event(done)
        return done

    def _recorded(self, stream):
        event = self.cp.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def wait(self, event) -> None:
        event.synchronize()

    def pinned(self, nbytes: int) -> np.ndarray:
        import cupyx

        return cupyx.empty_pinned(max(nbytes, 1), dtype=np.uint8)[:nbytes]

    def address(self, array) -> int:
        return array.data.ptr

    def upload(self, host: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(host))

    def refresh(self, array, host: np.ndarray) -> None:
        array.set(np.ascontiguousarray(host))

    def download(self, array, out: np.ndarray) -> None:
        array.get(out=out)

    def to_host(self, array) -> np.ndarray:
        return array.get()

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype=dtype)

    def gather(self, array, rows: np.ndarray) -> np.ndarray:
        """Gather the rows on the GPU, then one copy to the host (for host exchanges of a dat
        that lives on the GPU; the CUDA backend's own exchanges are in :mod:`.halo`)."""
        return self.cp.asnumpy(array[self.cp.asarray(rows)])

    def scatter(self, array, rows: np.ndarray, values: np.ndarray) -> None:
        array[self.cp.asarray(rows)] = self.cp.asarray(values)


_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind
LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "PMI_LOCAL_RANK")


def local_rank(environ=None) -> int:
    """This process's rank among the MPI ranks of its node, as the launcher reports it (0 when
    none does).

    Examples
    --------
    >>> local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}), local_rank({})
    (3, 0)
    """
    environ = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARIABLES:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def check_sizes(loop) -> None:
    """Refuse maps whose values do not fit the int32 indices of the generated code."""
    for m in loop.maps:
        if m.target.size >= 2**31:
            raise CompilationError(f"map {m.name!r} points into {m.target.size} elements, too many for the CUDA "
                                   f"backend's int32 map values.")
