"""Execution backends behind one interface (:class:`~meshchain.backends.base.Backend`).

A backend prepares calls for the phases of a plan (``phase``, ``tiled``) and, for data
it keeps off the host, its own halo exchanges; it gets its configuration and a cache
registry from the engine and never reaches for the session.
"""

from __future__ import annotations

from ..core.errors import BackendUnavailableError

__all__ = ["make_backend", "BACKEND_NAMES"]

BACKEND_NAMES = ("numba", "reference", "cupy", "cuda-emulation")


def make_backend(name: str, config, caches, *, distributed: bool = False):
    """Instantiate the backend called ``name`` with ``config`` and the cache registry ``caches``."""
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend(config, caches, distributed=distributed)
    if name == "numba":
        from .numba_backend import NumbaBackend

        return NumbaBackend(config, caches, distributed=distributed)
    if name in ("cupy", "cuda-emulation"):
        from .cuda.backend import CudaBackend
        from .cuda.device import CupyDevice, EmulatedDevice

        device = CupyDevice if name == "cupy" else EmulatedDevice
        return CudaBackend(config, caches, distributed=distributed, device=device(config.cache_dir))
    raise BackendUnavailableError(
        f"backend {name!r} is not available in this version of meshchain; use 'numba', 'reference', 'cupy' or "
        f"'cuda-emulation'."
    )
