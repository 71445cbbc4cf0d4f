"""Lazy evaluation: the trace of recorded loops (chains and dependence analysis build on it)."""

from .trace import Trace

__all__ = ["Trace"]
