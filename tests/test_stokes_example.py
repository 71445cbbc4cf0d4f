"""``examples/stokes.py``: the stabilised P1-P1 Stokes errors fall under refinement (velocity at
second order), serial and unchanged on 3 ranks."""

from __future__ import annotations

import pytest

import meshchain as mc
from helpers import example_module


def example():
    return example_module("stokes")


@pytest.mark.mpi(nprocs=(1, 3), timeout=300)
def test_stokes_errors_fall_with_the_mesh_size_on_any_number_of_ranks(comm, capsys):
    assert example().main(["--sizes", "8", "16", "32"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    if comm.rank == 0:
        assert [int(line[0]) for line in lines] == [8, 16, 32]
        velocity = [float(line[4]) for line in lines[1:]]
        pressure = [float(line[6]) for line in lines[1:]]
        assert all(1.9 < r < 2.1 for r in velocity), velocity
        assert all(1.4 < r < 1.8 for r in pressure), pressure
    mc.reset_runtime()
