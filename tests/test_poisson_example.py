"""``examples/poisson.py``: P1 errors fall at second order under refinement, serial and
unchanged on several ranks, for triangles and GeoFEM's cube of tetrahedra."""

from __future__ import annotations

import pytest

import meshchain as mc
from helpers import example_module

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


def example():
    return example_module("poisson")


def rates(capsys, argv) -> list[float]:
    assert example().main(argv) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    return [float(line[5]) for line in lines if len(line) == 6]


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
@pytest.mark.parametrize("argv", [["--sizes", "8", "16", "32", "--method", "pipecg"],
                                  ["--cell", "tetra", "--sizes", "4", "8", "--method", "groppcg", "--pc", "sgs"]])
def test_error_converges_at_second_order_on_any_number_of_ranks(comm, capsys, argv):
    found = rates(capsys, argv)
    if comm.rank == 0:
        assert found and all(1.8 < r < 2.3 for r in found), found
    mc.reset_runtime()
