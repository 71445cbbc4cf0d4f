"""Where generated CUDA runs: a GPU through CuPy, or the host emulation.

Both offer the same small interface to :class:`~meshchain.backends.cuda.backend.CudaBackend`:
allocate, copy in and out, gather and scatter rows (halo packing), compile a generated
module and launch its ``mc_loop``. The emulated device keeps its "device" arrays as
separate NumPy arrays, so the host/device synchronisation logic is exercised by the
tests that run without a GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import numpy as np

from ...errors import BackendUnavailableError, CompilationError
from ..generated import save_source

__all__ = ["CupyDevice", "EmulatedDevice"]


class EmulatedDevice:
    """NumPy arrays and C++-compiled generated source (see :mod:`.emulation`)."""

    name = "cuda-emulation"

    def __init__(self, cache_dir: Path):
        from .emulation import compiler

        compiler()  # fail now, in configure(), when there is no C++ compiler
        self.directory = Path(cache_dir) / "cuda-emulation"

    def compile(self, source: str, what: str):
        from .emulation import compile_emulated

        return compile_emulated(source, self.directory, what=what)

    def launch(self, function, grid: int, threads: int, arguments) -> None:
        converted = [ctypes.c_uint(grid)]
        for value in arguments:
            if isinstance(value, np.ndarray):
                converted.append(ctypes.c_void_p(value.ctypes.data))
            elif isinstance(value, np.int32):
                converted.append(ctypes.c_int(int(value)))
            else:
                converted.append(ctypes.c_longlong(int(value)))
        function(*converted)

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

    def synchronize(self) -> None:
        pass


class CupyDevice:
    """A CUDA GPU through CuPy: ``cupy.RawModule`` builds the source with NVRTC (CuPy keeps
    the compiled binaries in its on-disk kernel cache); halo rows are gathered on the GPU
    and staged through pinned host buffers."""

    name = "cupy"

    def __init__(self, cache_dir: Path):
        try:
            import cupy
        except ImportError as exc:
            raise BackendUnavailableError(
                f"backend 'cupy' needs CuPy ({exc}); install the wheel for your CUDA version, e.g. "
                f"pip install cupy-cuda12x, or use backend='numba'."
            ) from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # noqa: BLE001 - CuPy raises driver-specific errors
            raise BackendUnavailableError(f"backend 'cupy': no usable CUDA GPU ({exc}); use backend='numba'.") from None
        if count < 1:
            raise BackendUnavailableError("backend 'cupy': CuPy sees no CUDA GPU; use backend='numba'.")
        self.cp = cupy
        self.directory = Path(cache_dir) / "cuda"
        self._pinned: dict = {}

    def compile(self, source: str, what: str):
        path = save_source(self.directory, hashlib.sha256(source.encode()).hexdigest()[:24], ".cu", source)
        try:
            module = self.cp.RawModule(code=source, options=("--std=c++17",))
            return module.get_function("mc_loop")
        except Exception as exc:  # noqa: BLE001 - NVRTC errors come in several types
            raise CompilationError(f"NVRTC could not compile {what}; source: {path}\n{str(exc)[:2000]}") from None

    def launch(self, function, grid: int, threads: int, arguments) -> None:
        converted = [v if not isinstance(v, int) else np.int64(v) for v in arguments]
        function((grid,), (threads,), tuple(converted))

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
        """Gather the rows on the GPU, then one copy into a pinned host buffer."""
        picked = array[self.cp.asarray(rows)]
        out = self._pinned_buffer(picked.nbytes).view(picked.dtype)[: picked.size].reshape(picked.shape)
        picked.get(out=out)
        return out.copy()

    def scatter(self, array, rows: np.ndarray, values: np.ndarray) -> None:
        array[self.cp.asarray(rows)] = self.cp.asarray(values)

    def _pinned_buffer(self, nbytes: int) -> np.ndarray:
        buffer = self._pinned.get("out")
        if buffer is None or buffer.nbytes < nbytes:
            import cupyx

            buffer = self._pinned["out"] = cupyx.empty_pinned(max(nbytes, 1 << 16), dtype=np.uint8)
        return buffer

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()


def check_sizes(loop) -> None:
    """Refuse maps whose values do not fit the int32 indices of the generated code."""
    for m in loop.maps:
        if m.target.size >= 2**31:
            raise CompilationError(f"map {m.name!r} points into {m.target.size} elements, too many for the CUDA "
                                   f"backend's int32 map values.")
