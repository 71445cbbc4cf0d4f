"""Fixtures of the meshchain pytest plugin: small meshes and N ranks against one.

Each mesh fixture takes its size from an indirect parameter (a default otherwise)::

    @pytest.mark.parametrize("tri_mesh", [4, (6, 3)], indirect=True)
    def test_flux(tri_mesh):
        ...

``quad_mesh`` / ``tri_mesh`` (``n`` or ``(nx, ny)`` cells, default 8 x 8: structured
quadrilaterals / triangles of the unit square), ``delaunay_mesh`` (``n`` points a side, default
8: a jittered Delaunay triangulation), ``naca_mesh`` (``(I, J)``, default (4, 6): a tiny
NACA0012 C-mesh with OP2's numbering). ``one_and_all_ranks`` is
:func:`~meshchain.testing.same_on_one_and_all_ranks` on the test's communicator.
"""

from __future__ import annotations

import pytest

from .compare import same_on_one_and_all_ranks

# meshchain (and with it numba) is imported inside the fixtures: pytest loads this plugin in
# every session of an environment with meshchain installed, and the parent of an MPI test
# must not import mpi4py (see .harness)

__all__ = ["quad_mesh", "tri_mesh", "delaunay_mesh", "naca_mesh", "one_and_all_ranks"]


def _pair(size) -> tuple:
    return (size, size) if isinstance(size, int) else tuple(size)


@pytest.fixture
def quad_mesh(request):
    """Structured quadrilaterals of the unit square (``UnstructuredMesh``)."""
    from meshchain.meshes import structured_quads

    return structured_quads(*_pair(getattr(request, "param", 8)))


@pytest.fixture
def tri_mesh(request):
    """Structured triangles of the unit square (``UnstructuredMesh``)."""
    from meshchain.meshes import structured_tris

    return structured_tris(*_pair(getattr(request, "param", 8)))


@pytest.fixture
def delaunay_mesh(request):
    """A jittered Delaunay triangulation (``UnstructuredMesh``), seed 0."""
    from meshchain.meshes import jittered_delaunay

    return jittered_delaunay(getattr(request, "param", 8), seed=0)


@pytest.fixture
def naca_mesh(request):
    """A tiny NACA0012 C-mesh (``AirfoilMesh``, OP2's Airfoil data)."""
    from meshchain.meshes import naca0012

    return naca0012(*_pair(getattr(request, "param", (4, 6))))


@pytest.fixture
def one_and_all_ranks(comm):
    """``check(program, *, rtol=0, atol=0, **options)``: run ``program`` on one rank and on
    the test's ranks and assert that they agree (see
    :func:`~meshchain.testing.same_on_one_and_all_ranks`)."""

    def check(program, **kwargs):
        return same_on_one_and_all_ranks(program, comm=comm, **kwargs)

    return check
