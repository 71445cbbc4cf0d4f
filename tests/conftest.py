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


@pytest.fixture
def discard_saved_calibration(meshchain_cache_dir):
    """For a test that runs the demo or the notebook in the session's cache (to reuse what is
    compiled there): remove the calibration they save afterwards, so that ``"auto"`` choices
    in later tests do not depend on which tests ran before them."""
    yield
    shutil.rmtree(os.path.join(meshchain_cache_dir, "model"), ignore_errors=True)


@pytest.fixture(autouse=True)
def reset_meshchain(meshchain_cache_dir):
    """Start every test from a fresh runtime; configuration never leaks between tests."""
    mc.reset_runtime(cache_dir=meshchain_cache_dir)
    yield
    mc.reset_runtime(cache_dir=meshchain_cache_dir)


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Run the test once per backend; the backend is already configured."""
    mc.configure(backend=request.param)
    return request.param
