"""The device backends the CUDA tests run on: the host emulation everywhere, and the cupy
backend too where CuPy sees a GPU, so that the same tests and assertions run on real
hardware (``benchmarks/gpu_check.sh`` runs them on a GPU machine)."""

from __future__ import annotations

import shutil

import pytest

from meshchain.backends.cuda.device import CupyDevice, EmulatedDevice

EMULATION = "cuda-emulation"

#: For tests that run the host emulation (it compiles the generated source with g++).
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CUDA emulation needs g++")


def gpu_present() -> bool:
    """Whether CuPy is installed and sees at least one CUDA GPU."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - CuPy raises driver-specific errors without a GPU
        return False


GPU = gpu_present()

#: For modules of device tests: run where either device backend can (a GPU machine without
#: g++ still runs the cupy tests).
needs_a_device = pytest.mark.skipif(shutil.which("g++") is None and not GPU,
                                    reason="the CUDA emulation needs g++, and no GPU is present")

#: ``cuda-emulation`` (where g++ is), and ``cupy`` where a GPU is present.
DEVICE_BACKENDS = (pytest.param(EMULATION, marks=needs_gxx, id=EMULATION),) + (("cupy",) if GPU else ())


def device_class(backend: str) -> type:
    """The device class behind a device backend (for counting its copies in a test)."""
    return {EMULATION: EmulatedDevice, "cupy": CupyDevice}[backend]
