"""Execution backends behind one interface (:class:`~meshchain.backends.base.Backend`)."""

from __future__ import annotations

from ..core.errors import BackendUnavailableError

__all__ = ["make_backend"]


def make_backend(name: str, runtime):
    """Instantiate the backend called ``name`` for ``runtime``."""
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend(runtime)
    if name == "numba":
        from .numba_backend import NumbaBackend

        return NumbaBackend(runtime)
    if name in ("cupy", "cuda-emulation"):
        from .cuda.backend import CudaBackend
        from .cuda.device import CupyDevice, EmulatedDevice

        device = CupyDevice if name == "cupy" else EmulatedDevice
        return CudaBackend(runtime, device(runtime.config.cache_dir))
    raise BackendUnavailableError(
        f"backend {name!r} is not available in this version of meshchain; use 'numba', 'reference', 'cupy' or "
        f"'cuda-emulation'."
    )
