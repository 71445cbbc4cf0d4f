"""Short sums over ranks by recursive doubling (meshchain.comm.pairwise): every rank gets the
same bits, MPI_Allreduce's sum to rounding (its bits on two ranks, and exactly on whole
numbers), on 1-4 ranks (3: a rank beyond the power of two), from Python and from compiled code
with the same bits; its messages never take another
message's place (the s-step methods reduce with it: tests/test_sstep.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshchain.comm.pairwise import TAG, pairwise_sum, short_sum


def mpi_sum(comm, values):
    from mpi4py import MPI

    out = np.empty_like(values)
    comm.Allreduce(values, out, op=MPI.SUM)
    return out


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
@settings(max_examples=20, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(0, 80), whole=st.booleans())
def test_pairwise_sum_gives_every_rank_the_same_bits_and_mpis_sum(comm, seed, count, whole):
    rng = np.random.default_rng([seed, comm.rank])
    values = rng.integers(-1000, 1000, count).astype(np.float64) if whole else \
        rng.standard_normal(count) * 10.0 ** rng.integers(-8, 8, count)
    reference = mpi_sum(comm, values)
    assert np.array_equal(compiled_sum(comm, values), pairwise_sum(comm, values.copy()))
    assert np.array_equal(compiled_short_sum(comm, values), short_sum(comm, values.copy()))
    for total in (pairwise_sum(comm, values.copy()), short_sum(comm, values.copy()), compiled_sum(comm, values),
                  compiled_short_sum(comm, values)):
        every = comm.allgather(total)
        assert all(np.array_equal(total, other) for other in every)  # the same bits on every rank
        if whole or comm.size <= 2:  # whole numbers: exact; two ranks: one addition, as MPI's
            assert np.array_equal(total, reference)
        else:
            scale = sum(np.abs(v) for v in comm.allgather(values))
            assert np.all(np.abs(total - reference) <= 4 * np.finfo(float).eps * scale)


def compiled_sum(comm, values):
    """The same sum from compiled code (:class:`~meshchain.comm.compiled.CompiledPairwiseSum`,
    persistent requests started by address), where compiled code can call MPI; else pairwise_sum's."""
    from meshchain.comm.by_address import sum_in_pairs
    from meshchain.comm.compiled import CompiledPairwiseSum, addresses

    values = values.copy()
    if addresses() is None:
        return pairwise_sum(comm, values)
    pairs = CompiledPairwiseSum(comm, values)
    try:
        assert sum_in_pairs(addresses(), values, pairs.other, pairs.requests, pairs.phases, pairs.statuses) == 0
    finally:
        pairs.close()
    return values


def compiled_short_sum(comm, values):
    """The sum the compiled Krylov iterations make (:func:`~meshchain.comm.by_address.sum_all`
    with :func:`~meshchain.comm.compiled.handles`: recursive doubling by ``MPI_Sendrecv`` where
    ``MPI_Allreduce`` would take two rounds), where compiled code can call MPI; else short_sum's."""
    from meshchain.comm.by_address import sum_all
    from meshchain.comm.compiled import addresses, handles

    if addresses() is None:
        return short_sum(comm, values.copy())
    out = np.full_like(values, np.nan)
    assert sum_all(addresses(), values, out, handles(comm)) == 0
    return out


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8])
@pytest.mark.mpi(nprocs=(2, 3, 4), timeout=120)
def test_compiled_sums_round_as_short_sum_chooses(comm, count, monkeypatch):
    """The compiled sums go by ``MPI_Sendrecv`` exactly where short_sum goes by pairwise_sum
    (at least as many values as the largest power of two of ranks), else by ``MPI_Allreduce``:
    short_sum's way seen by the function it calls, the compiled sum's by its bits, with values
    whose grouping shows in them (on 3 ranks MPI's grouping and the rounds' differ: summing by
    ``MPI_Allreduce`` throughout fails this test and the one above)."""
    import meshchain.comm.pairwise as pairwise

    chosen = []
    monkeypatch.setattr(pairwise, "pairwise_sum", lambda c, v: chosen.append(len(v)) or v)
    short_sum(comm, np.zeros(count))
    top = 1 << (comm.size.bit_length() - 1)
    assert bool(chosen) == (count >= top)
    values = np.full(count, [1.0, 1e-16, -1.0, 1e-16][comm.rank % 4])  # the grouping decides the bits
    monkeypatch.undo()
    assert np.array_equal(compiled_short_sum(comm, values), short_sum(comm, values.copy()))


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_pairwise_sums_never_take_another_messages_place(comm):
    """Messages of another tag from every rank, waiting to be received while sums run, are
    still there, whole, afterwards; sums back to back stay in order."""
    rank, size = comm.rank, comm.size
    others = [r for r in range(size) if r != rank]
    pending = np.full(3, float(rank))
    sent = [comm.Isend(pending, dest=other, tag=TAG - 1) for other in others]  # from every partner
    totals = [pairwise_sum(comm, np.array([float(k + rank), 1.0])) for k in range(5)]
    for other in others:
        arrived = np.empty(3)
        comm.Recv(arrived, source=other, tag=TAG - 1)
        assert arrived.tolist() == [float(other)] * 3
    for request in sent:
        request.Wait()
    ranks = sum(range(size))
    assert [t.tolist() for t in totals] == [[float(k * size + ranks), float(size)] for k in range(5)]
