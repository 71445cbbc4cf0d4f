"""The single exception hierarchy of meshchain.

Every error meshchain raises on bad input is a :class:`MeshchainError`. Each
message names the offending object and says how to fix it.

Examples
--------
>>> import meshchain as mc
>>> try:
...     mc.Set(-1, "cells")
... except mc.MeshchainError as err:
...     print(type(err).__name__)
DeclarationError
"""

from __future__ import annotations

__all__ = [
    "MeshchainError",
    "InternalError",
    "DeclarationError",
    "MapError",
    "DataShapeError",
    "LoopError",
    "CaptureError",
    "SetMismatchError",
    "ArgumentCountError",
    "AccessModeError",
    "KernelError",
    "CompilationError",
    "KernelRuntimeError",
    "ConfigurationError",
    "SolverError",
    "BackendUnavailableError",
    "MeshFileError",
    "MeshFileNotFoundError",
    "CheckpointError",
    "OutputError",
    "MeshchainWarning",
]


class MeshchainError(Exception):
    """Base class of every error meshchain raises on bad input or bad use."""


class DeclarationError(MeshchainError, ValueError):
    """A `Set`, `Map`, `Dat` or `Global` was declared with invalid arguments."""


class MapError(DeclarationError):
    """A map's values are out of range, negative, or of the wrong shape or arity."""


class DataShapeError(DeclarationError):
    """Data given to a `Dat` or `Global` has the wrong shape or dtype."""


class LoopError(MeshchainError):
    """A `par_loop` call is inconsistent (sets, arguments, access modes)."""


class CaptureError(LoopError):
    """A step given to ``mc.capture`` does what a replay could not repeat (reads or sets
    values between its loops, opens a loop chain, assembles a matrix) or records no loop."""


class SetMismatchError(LoopError):
    """An argument's set or map does not match the loop's iteration set."""


class ArgumentCountError(LoopError, TypeError):
    """The kernel's parameter count differs from the number of loop arguments."""


class AccessModeError(LoopError):
    """An access mode is not allowed for this kind of argument."""


class KernelError(MeshchainError):
    """A kernel uses a construct or a global that meshchain cannot translate."""


class CompilationError(KernelError):
    """A backend failed to compile a kernel; names the kernel, the generated source
    file and the compiler's message."""


class KernelRuntimeError(KernelError):
    """A kernel failed while running (for example an index outside an argument view)."""


class ConfigurationError(MeshchainError):
    """An invalid option was passed to `configure` or a ``MESHCHAIN_*`` variable."""


class BackendUnavailableError(ConfigurationError):
    """The requested backend cannot run here (missing package or device)."""


class SolverError(MeshchainError):
    """A linear solver cannot go on: bad arguments (unknown method or preconditioner,
    vectors on the wrong set) or a breakdown it cannot report as non-convergence."""


class MeshFileError(MeshchainError):
    """A mesh file could not be read or parsed (wraps the reader's own exception)."""


class MeshFileNotFoundError(MeshFileError, FileNotFoundError):
    """A mesh file does not exist (also a :class:`FileNotFoundError`)."""


class CheckpointError(MeshchainError):
    """A checkpoint could not be written or restored (a missing or unreadable file, one of
    another mesh, an object missing from it); nothing was changed."""


class OutputError(MeshchainError):
    """Output for ParaView could not be written (bad fields, an unwritable directory); the
    files already complete are unchanged."""


class InternalError(MeshchainError, RuntimeError):
    """Meshchain found itself in a state it should never reach (a bug: please report it)."""


class MeshchainWarning(UserWarning):
    """A diagnostic: something works, but not as well as it could. The message starts with
    an id in brackets, to silence it by, e.g. ``warnings.filterwarnings("ignore", message=r"\\[some-id\\]")``."""
