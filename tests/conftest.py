"""Shared fixtures: a clean runtime for every test, and the backends to run on.

meshchain's pytest plugin (``meshchain.testing``: the ``mpi``/``parallel`` markers and the
``comm`` / ``mpi_nprocs`` fixtures) is loaded by its entry point, or here when entry points
are not loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

import meshchain as mc
from meshchain.testing import harness

BACKENDS = ("reference", "numba")


CACHE_VARIABLE = "MESHCHAIN_TEST_CACHE_DIR"


def pytest_configure(config):
    """Load meshchain's pytest plugin (unless its entry point already did), and choose the
    session's cache directory: inherited by the MPI children this session launches, so
    every rank reuses what the session compiled instead of compiling again.

    It is also the default cache (``MESHCHAIN_CACHE_DIR``) of every runtime a test starts
    without ``cache_dir=``: a calibration saved in the user's ``~/.cache/meshchain`` (by
    ``make demo``) must not choose the transport or progress mode of a test."""
    harness.register(config)
    if not os.environ.get(CACHE_VARIABLE):
        os.environ[CACHE_VARIABLE] = tempfile.mkdtemp(prefix="meshchain-test-cache-")
        config._meshchain_cache_owner = True
    os.environ["MESHCHAIN_CACHE_DIR"] = os.environ[CACHE_VARIABLE]


def pytest_unconfigure(config):
    if getattr(config, "_meshchain_cache_owner", False):
        shutil.rmtree(os.environ.pop(CACHE_VARIABLE), ignore_errors=True)


@pytest.fixture(scope="session")
def meshchain_cache_dir():
    """One cache directory for the whole session (and its MPI children), so compiled loops
    are reused between tests."""
    return os.environ[CACHE_VARIABLE]


@pytest.fixture(autouse=True)
def reset_meshchain(meshchain_cache_dir):
    """Start every test from a fresh runtime and no saved calibration; configuration never
    leaks between tests."""
    forget_saved_calibrations(meshchain_cache_dir)
    mc.reset_runtime(cache_dir=meshchain_cache_dir)
    yield
    mc.reset_runtime(cache_dir=meshchain_cache_dir)


def forget_saved_calibrations(cache_dir):
    """Remove the calibrations saved in the session's cache: ``ca="auto"`` measures the
    network and saves what it measured when there is none, and a calibration left by an
    earlier test would choose the transport and progress mode of every later test with its
    rank count, as that test's timings happened to fall (in an MPI child, rank 0 removes
    them while the others wait)."""
    if not harness.is_child():
        shutil.rmtree(os.path.join(cache_dir, "model"), ignore_errors=True)
        return
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        shutil.rmtree(os.path.join(cache_dir, "model"), ignore_errors=True)
    MPI.COMM_WORLD.Barrier()


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Run the test once per backend; the backend is already configured."""
    mc.configure(backend=request.param)
    return request.param
