"""Grid loops on several ranks run their block's middle by index arithmetic and the rest
(lines along the partition boundary, ghosts) through maps; every combination (chains
communication-avoiding or not, boundary tasks or bulk, numba or reference, 2-D and 3-D,
stencils reaching 1 or 2 lines) equals NumPy and one process bit for bit on integer data."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.engine.grids import middle_box
from meshchain.partition.grids import box_offsets
from meshchain.partition.layout import SetLayout
from test_grids_mpi import STAR, oracle, sweeps

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

CASES = [  # shape, offsets, steps, blocks
    ((64, 50), STAR, 3, None),
    ((60, 44), [(0, 0), (-2, 0), (2, 1), (0, -2), (1, 2)], 2, None),  # reach 2, asymmetric
    ((80, 30), box_offsets(1, 2), 4, "rows"),                            # corners; blocks along one axis
    ((26, 22, 20), [(0, 0, 0), (-1, 0, 0), (0, 1, 0), (0, 0, -1), (1, 1, 1)], 2, None),
]


def arithmetic_shares(comm) -> list[float]:
    """``[share]``: of the sweep loop's owned iterations over all ranks, the share that found
    its grid points by index arithmetic (``mc.stats``; the copy loop over the whole grid is
    direct)."""
    record = mc.stats(all_ranks=True).loops["apply"]
    return [record.arithmetic_iterations / (record.iterations - record.halo_iterations)]


@pytest.mark.mpi(nprocs=(2,), timeout=600)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_middle_runs_by_arithmetic_and_every_rank_count_equals_numpy(comm, case):
    check_middle(comm, case)


@pytest.mark.mpi(nprocs=(4,), timeout=600)
@pytest.mark.parametrize("case", [0, 3])
def test_the_middle_runs_by_arithmetic_on_four_ranks_in_2d_and_3d(comm, case):
    check_middle(comm, case)


def check_middle(comm, case):
    shape, offsets, steps, blocks = CASES[case]
    if blocks == "rows":
        blocks = (comm.size,) + (1,) * (len(shape) - 1)
    want = oracle(shape, offsets, steps, chains=2, seed=case) if comm.rank == 0 else None
    for ca, boundary in [(False, "bulk"), (True, "tasks")]:  # CA in bulk: the tests below
        got = sweeps(comm, shape, offsets, steps, ca=ca, blocks=blocks, chains=2, seed=case, boundary=boundary)
        shares = arithmetic_shares(comm)
        assert shares and min(shares) >= 0.25, shares  # most of the grid runs without index arrays
        if comm.rank == 0:
            np.testing.assert_array_equal(got, want, err_msg=f"ca={ca}, boundary={boundary}")


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_the_reference_backend_runs_the_arithmetic_part_too(comm):
    shape, offsets = (40, 36), [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (1, 1)]
    got = sweeps(comm, shape, offsets, 2, ca=True, chains=1, seed=7, backend="reference")
    assert min(arithmetic_shares(comm)) > 0.25
    if comm.rank == 0:
        np.testing.assert_array_equal(got, oracle(shape, offsets, 2, chains=1, seed=7))


@pytest.mark.mpi(nprocs=(3,), timeout=300)
def test_the_arithmetic_part_under_every_transport_progress_and_interior_mode(comm):
    """Dynamic interiors chunk the arithmetic part on threads; progress modes and transports
    move the ghosts the rest reads; each equals NumPy."""
    shape, offsets, steps = (48, 40), STAR, 3
    want = oracle(shape, offsets, steps, chains=2, seed=3) if comm.rank == 0 else None
    for options in ({"interior": "dynamic"}, {"progress": "poll", "transport": "p2p"},
                    {"progress": "none"}, {"transport": "neighbour"}, {"transport": "rma"}):
        got = sweeps(comm, shape, offsets, steps, ca=True, chains=2, seed=3, **options)
        assert min(arithmetic_shares(comm)) > 0.25
        if comm.rank == 0:
            np.testing.assert_array_equal(got, want, err_msg=str(options))


@st.composite
def grid_cases(draw):
    """A 2-D grid of 12-48 points per axis, a stencil of 1-6 points reaching at most 2 lines,
    1-4 sweeps per chain."""
    reach = draw(st.integers(1, 2))
    shape = (draw(st.integers(2 * reach + 10, 48)), draw(st.integers(2 * reach + 10, 48)))
    point = st.tuples(st.integers(-reach, reach), st.integers(-reach, reach))
    offsets = draw(st.lists(point, min_size=1, max_size=6, unique=True))
    return shape, offsets, draw(st.integers(1, 4))


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=grid_cases(), ca=st.booleans(), boundary=st.sampled_from(["bulk", "tasks"]), dim=st.integers(1, 2))
def test_random_stencils_on_ranks_equal_numpy(comm, case, ca, boundary, dim):
    shape, offsets, steps = case
    got = sweeps(comm, shape, offsets, steps, ca=ca, dim=dim, chains=2, seed=len(offsets), boundary=boundary)
    if comm.rank == 0:
        np.testing.assert_array_equal(got, oracle(shape, offsets, steps, dim=dim, chains=2, seed=len(offsets)))


def layout_of(ids, levels) -> SetLayout:
    ids = np.asarray(ids, dtype=np.int64)
    zeros = np.zeros(len(ids), dtype=np.int64)
    return SetLayout(ids, len(ids), np.array([len(ids)]), zeros, zeros, np.asarray(levels, dtype=np.int32),
                     zeros.astype(np.int32))


def test_the_middle_box_is_the_top_level_when_it_fills_a_box_row_major():
    shape = (4, 5)  # ids 6, 7, 11, 12 are the box [1, 3) x [1, 3)
    assert [a.tolist() if hasattr(a, "tolist") else a for a in middle_box(layout_of([6, 7, 11, 12, 0], [3, 3, 3, 3, 1]),
                                                                           shape)] == [[1, 1], [3, 3], 4]
    assert middle_box(layout_of([6, 7, 11, 0], [3, 3, 3, 1]), shape) is None       # a box with a hole
    assert middle_box(layout_of([6, 11, 7, 12], [3, 3, 3, 3]), shape) is None      # not row-major
    assert middle_box(layout_of([], []), shape) is None                             # nothing owned
    lo, hi, count = middle_box(layout_of([0, 1], [2, 2]), (2, 2), shift=1)         # an interior's, in grid lines
    assert (lo.tolist(), hi.tolist(), count) == ([1, 1], [2, 3], 2)
