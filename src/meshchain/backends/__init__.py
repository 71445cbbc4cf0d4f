"""Execution backends behind one interface (:class:`~meshchain.backends.base.Backend`)."""

from __future__ import annotations

from ..errors import BackendUnavailableError

__all__ = ["make_backend"]


def make_backend(name: str, runtime):
    """Instantiate the backend called ``name`` for ``runtime``."""
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend(runtime)
    if name == "numba":
        from .numba_backend import NumbaBackend

        return NumbaBackend(runtime)
    raise BackendUnavailableError(
        f"backend {name!r} is not available in this version of meshchain; use 'numba' or 'reference'."
    )
