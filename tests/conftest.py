"""Shared fixtures: a clean runtime for every test, and the backends to run on."""

from __future__ import annotations

import pytest

import meshchain as mc

BACKENDS = ("reference", "numba")


@pytest.fixture(scope="session")
def meshchain_cache_dir(tmp_path_factory):
    """One cache directory for the whole session, so compiled loops are reused between tests."""
    return tmp_path_factory.mktemp("meshchain-cache")


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
