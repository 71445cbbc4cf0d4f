"""``python -m meshchain info``: what this installation is and what a session here would use.

The versions of meshchain, Python, NumPy, Numba, mpi4py and the MPI library (and of CuPy and
petsc4py where they are installed: CuPy's line says whether it sees a GPU), then the settings a
session started now takes from the environment: the backend, the threads, the cache
directory, and whether a saved calibration of the cost model applies here. What a bug report
should hold; it sends no MPI message and compiles nothing.

Examples
--------
>>> rows = dict(info_rows())
>>> sorted(key for key in rows if key in ("meshchain", "numpy", "backend"))
['backend', 'meshchain', 'numpy']
>>> rows["meshchain"] == __import__("meshchain").__version__
True
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys

import mpi4py
import numba
import numpy as np
from mpi4py import MPI

import meshchain as mc

from ..model.calibrate import calibration_path, load_calibration

__all__ = ["info_rows", "main"]


def info_rows() -> list[tuple[str, str]]:
    """``(what, value)`` pairs, in the order ``python -m meshchain info`` prints them."""
    rows = [("meshchain", mc.__version__), ("python", f"{platform.python_version()} ({sys.executable})"),
            ("numpy", np.__version__), ("numba", numba.__version__), ("mpi4py", mpi4py.__version__),
            ("mpi library", " ".join(MPI.Get_library_version().strip().splitlines()[0].split())),
            ("mpi standard", "{}.{}".format(*MPI.Get_version()))]
    rows += _optional_rows()
    session = mc.get_runtime()
    config = session.config
    threads = getattr(session.backend, "threads_in_use", None)
    rows += [("backend", session.backend.name),
             ("threads", str(threads()) if threads is not None else "1 (the backend runs no thread pool)"),
             ("cache directory", str(config.cache_dir)),
             ("calibration", _calibration(session))]
    return rows


def _optional_rows() -> list[tuple[str, str]]:
    rows = []
    for name in ("cupy", "petsc4py"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            rows.append((name, "not installed"))
            continue
        rows.append((name, getattr(module, "__version__", "?") + (_gpus(module) if name == "cupy" else "")))
    return rows


def _gpus(cupy) -> str:
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CuPy imports without a GPU; every device call then fails
        return f" (no usable GPU: {type(exc).__name__})"
    return f" ({count} GPU{'s' if count != 1 else ''})"


def _calibration(session) -> str:
    key = session.calibration_key()
    path = calibration_path(session.config.cache_dir, key)
    return f"saved, {path}" if load_calibration(key, cache_dir=session.config.cache_dir) else f"none ({path})"


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m meshchain info", description=__doc__.splitlines()[0]).parse_args(argv)
    rows = info_rows()
    width = max(len(what) for what, _ in rows)
    for what, value in rows:
        print(f"{what:<{width}}  {value}")
    return 0
