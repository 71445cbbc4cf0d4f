"""The meshchain pytest plugin (entry point ``meshchain.testing.plugin``, loaded by pytest
wherever meshchain is installed): the ``parallel`` / ``mpi`` markers that run a test under
``mpiexec`` from plain ``pytest`` (:mod:`.harness`), the ``comm`` and ``mpi_nprocs``
fixtures, and the mesh and comparison fixtures of :mod:`.fixtures`."""

from __future__ import annotations

from .fixtures import delaunay_mesh, naca_mesh, one_and_all_ranks, quad_mesh, tri_mesh
from .harness import (_meshchain_mpi_nprocs, comm, mpi_nprocs, pytest_addoption, pytest_configure,
                      pytest_generate_tests)

__all__ = ["pytest_addoption", "pytest_configure", "pytest_generate_tests", "comm", "mpi_nprocs", "quad_mesh",
           "tri_mesh", "delaunay_mesh", "naca_mesh", "one_and_all_ranks", "_meshchain_mpi_nprocs"]
