"""Generated source files in the cache directory, shared by every backend.

Examples
--------
>>> import tempfile, pathlib
>>> from meshchain.backends.generated import save_source
>>> path = save_source(pathlib.Path(tempfile.mkdtemp()), "loop_abc", ".cu", "// text\\n")
>>> path.name, path.read_text()
('loop_abc.cu', '// text\\n')
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import ConfigurationError

__all__ = ["save_source"]


def save_source(directory: Path, stem: str, suffix: str, text: str) -> Path:
    """Write ``text`` to ``directory/<stem><suffix>`` unless it is there; return the path.

    Names carry a hash of their text, so an existing file already holds ``text``. The file
    is written atomically: processes (MPI ranks) sharing a cache directory never read half
    a file.
    """
    path = directory / f"{stem}{suffix}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            temporary = directory / f".{stem}.{os.getpid()}.tmp"
            temporary.write_text(text)
            os.replace(temporary, path)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write generated code to {directory} ({exc}); set MESHCHAIN_CACHE_DIR or "
            f"mc.configure(cache_dir=...) to a writable directory."
        ) from None
    return path
