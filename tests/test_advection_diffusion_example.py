"""``examples/advection_diffusion.py``: every nonsymmetric method reaches the direct solution
at two Péclet numbers, serial and on several ranks, with the same iterations."""

from __future__ import annotations

import pytest

import meshchain as mc
from helpers import example_module

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


def example():
    return example_module("advection_diffusion")


@pytest.mark.mpi(nprocs=(1, 2), timeout=300)
def test_every_method_reaches_the_direct_solution_at_two_peclet_numbers(comm, capsys):
    assert example().main(["--n", "24", "--pc", "jacobi", "--peclet", "1", "100",
                           "--methods", "gmres", "pipegmres", "bicgstab"]) == 0
    assert example().main(["--n", "24", "--peclet", "1", "100"]) == 0  # bjacobi-ilu: pipebicgstab too
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line and line[0].isdigit()]
    if comm.rank == 0:
        assert len(lines) == 2 * 3 + 2 * 4, lines
        for peclet, method, iterations, true_residual, error in lines:
            assert int(iterations) > 0 and float(error) < 1e-6, (peclet, method, error)
    mc.reset_runtime()
