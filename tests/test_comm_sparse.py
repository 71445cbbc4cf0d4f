"""The dynamic sparse exchange (meshchain.comm.sparse): items packed into buffers, sent to
ranks the receiver does not know, with NBX, neighbourhood and allreduce termination. Every
item arrives exactly once, by source rank then posting order, round after round on one
communicator; exchange_rows equals MPI's Alltoallv (the collective it replaces in set-up); buffers are recycled."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshchain.comm.collectives import mpi_datatype
from meshchain.comm.sparse import (DEFAULT_MAX_IN_FLIGHT, HEADER_BYTES, TERMINATIONS, SparseExchange, channel_of,
                                   exchange_rows)
from meshchain.core.errors import ConfigurationError, MeshchainError


def alltoallv(comm, send, destinations):
    """The oracle: what set-up used before the sparse exchange, MPI's all-to-all of counts
    then ``Alltoallv`` (received rows grouped by source rank, each source's in order)."""
    send = np.ascontiguousarray(send)
    order = np.argsort(destinations, kind="stable")
    ordered = np.ascontiguousarray(send[order])
    counts = np.bincount(destinations, minlength=comm.size).astype(np.int64)
    recv_counts = np.array(comm.alltoall(counts.tolist()), dtype=np.int64)
    row = int(np.prod(send.shape[1:], dtype=np.int64))
    received = np.empty((int(recv_counts.sum()),) + send.shape[1:], dtype=send.dtype)
    if row:
        mpi_type = mpi_datatype(send.dtype)
        send_displ = np.concatenate(([0], np.cumsum(counts)[:-1])) * row
        recv_displ = np.concatenate(([0], np.cumsum(recv_counts)[:-1])) * row
        comm.Alltoallv([ordered, (counts * row).tolist(), send_displ.tolist(), mpi_type],
                       [received, (recv_counts * row).tolist(), recv_displ.tolist(), mpi_type])
    return received, np.repeat(np.arange(comm.size), recv_counts)


SEEDS = st.integers(0, 2**32 - 1)
DTYPES = (np.float64, np.float32, np.int32, np.int64, np.uint8, np.int16, np.complex128)


def random_round(rng, size: int, limit: int) -> list:
    """What each rank posts in one round: ``posts[s]`` lists ``(dest, bytes)`` in posting order.

    Some rounds are empty; a sender posts nothing, a few items or many tiny ones; items
    go to any rank (self included) and are empty, tiny, mid-sized or larger than ``limit``.
    """
    posts = [[] for _ in range(size)]
    if rng.random() < 0.15:
        return posts
    for sender in range(size):
        count = int(rng.choice([0, rng.integers(1, 6), rng.integers(30, 120)]))
        targets = rng.choice(size, size=min(size, int(rng.integers(1, 4))), replace=False)
        for _ in range(count):
            kind = rng.random()
            length = (int(rng.integers(0, 9)) if kind < 0.7 else int(rng.integers(9, limit)) if kind < 0.93
                      else int(rng.integers(limit, 3 * limit)))
            posts[sender].append((int(rng.choice(targets)), rng.integers(0, 256, length, dtype=np.uint8)))
    return posts


def symmetric_neighbourhoods(rng, size: int, posts=None, extra: float = 0.3) -> list:
    """Per rank, a symmetric neighbourhood: every pair that sends in ``posts`` (if given)
    plus random extra pairs."""
    linked = np.triu(rng.random((size, size)) < extra, 1)
    for sender, items in enumerate(posts or []):
        for dest, _ in items:
            linked[sender, dest] = True
    linked = linked | linked.T
    return [[n for n in range(size) if linked[rank, n] and n != rank] for rank in range(size)]


def run_round(comm, posts, **options) -> list:
    """Post this rank's items, finish, and check what arrived against ``posts``; the stats."""
    exchange = SparseExchange(comm, **options)
    for dest, data in posts[comm.rank]:
        exchange.post(dest, data)
    received = exchange.finish()
    expected = [(source, data) for source in range(comm.size) for dest, data in posts[source] if dest == comm.rank]
    assert [source for source, _ in received] == [source for source, _ in expected]
    for (_, got), (_, want) in zip(received, expected):
        assert got.dtype == np.uint8 and got.tobytes() == want.tobytes()
    stats = exchange.stats
    assert stats["items_sent"] == len(posts[comm.rank]) and stats["items_received"] == len(expected)
    return stats


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(seed=SEEDS)
def test_random_rounds_deliver_every_item_once_in_order(comm, seed):
    """Four rounds in a row on one communicator, in a random order of the termination modes,
    each with its own random pattern, buffer limit, ordering and neighbourhood."""
    rng = np.random.default_rng(seed)
    rank, size = comm.rank, comm.size
    modes = list(rng.permutation(TERMINATIONS)) + [str(rng.choice(TERMINATIONS))]
    for mode in modes:
        limit = int(rng.integers(48, 600))
        posts = random_round(rng, size, limit)
        senders = {s for s in range(size) if s != rank and any(d == rank for d, _ in posts[s])}
        options = dict(termination=mode, buffer_limit=limit, ordered=bool(rng.random() < 0.5))
        if mode == "neighbourhood":
            options["neighbours"] = symmetric_neighbourhoods(rng, size, posts)[rank]
        elif mode == "allreduce" and rng.random() < 0.5:  # neighbours given, not all senders among them
            options["neighbours"] = symmetric_neighbourhoods(rng, size)[rank]
        elif mode == "nbx" and rng.random() < 0.5:  # any initial neighbourhood, even asymmetric
            options["neighbours"] = [int(n) for n in np.flatnonzero(rng.random(size) < 0.4)]
        stats = run_round(comm, posts, **options)
        given_neighbours = set(options.get("neighbours", ())) - {rank}
        assert stats["neighbours_discovered"] == sorted(senders - given_neighbours)
        destinations = {d for d, _ in posts[rank] if d != rank}
        assert stats["neighbours"] == sorted(given_neighbours | senders | destinations)
        lone = sum(HEADER_BYTES + -(-len(data) // 8) * 8 + 8 > limit for d, data in posts[rank] if d != rank)
        last = given_neighbours if mode != "nbx" else set()  # a last message to every neighbour
        assert stats["messages_sent"] >= max(lone, len(destinations | last))


@pytest.mark.mpi(nprocs=(2, 4), timeout=120)
def test_fast_ranks_never_feed_a_slow_rank_the_next_round(comm):
    """Rounds back to back, every rank sending to every rank, while one rank dawdles: a
    rank that has left round k (NBX's barrier, or its neighbours' last messages) sends for
    round k+1 while the slow rank still receives round k. Under a ring neighbourhood, far
    ranks get several rounds ahead. Also on a communicator freed afterwards."""
    rank, size = comm.rank, comm.size
    split = comm.Split(0, size - 1 - rank)  # same ranks, reversed: a second cached channel
    for which, current in enumerate((comm, split)):
        me, slow = current.rank, current.size - 1
        for round_ in range(12):
            mode = TERMINATIONS[round_ % 3]
            neighbours = [(me - 1) % size, (me + 1) % size] if mode == "neighbourhood" else None
            exchange = SparseExchange(current, termination=mode, neighbours=neighbours, buffer_limit=64)
            targets = range(size) if neighbours is None else sorted({*neighbours, me})
            for dest in targets:
                exchange.post(dest, np.array([which, round_, me, dest], dtype=np.int64))
            if me == slow:
                time.sleep(0.01)
            received = exchange.finish()
            assert [s for s, _ in received] == list(targets)
            assert [item.view(np.int64).tolist() for _, item in received] == [[which, round_, s, me] for s in targets]
    assert channel_of(comm) is channel_of(comm) and channel_of(split) is not channel_of(comm)
    split.Free()


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(seed=SEEDS)
def test_exchange_rows_equals_alltoallv(comm, seed):
    """Random rows (several dtypes, 1-D and 2-D rows, zero-width rows, empty inputs) to
    random ranks: the same rows, in the same order, with the same sources as alltoallv."""
    rng = np.random.default_rng(seed)
    rank, size = comm.rank, comm.size
    dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    trailing = [(), (3,), (2, 2), (0,)][int(rng.integers(4))]
    counts = rng.integers(0, 40, size) * (rng.random(size) < 0.8) * (rng.random() < 0.9)
    all_destinations = [rng.integers(0, size, counts[r]) for r in range(size)]
    own = np.random.default_rng([seed, rank])
    rows = (own.random((counts[rank],) + trailing) * 1000).astype(dtype)
    termination = str(rng.choice(TERMINATIONS))
    buffer_limit = [None, int(rng.integers(1, 200)), 65536][int(rng.integers(3))]
    neighbours = None
    if termination == "neighbourhood":
        posts = [[(int(d), None) for d in all_destinations[r]] for r in range(size)]
        neighbours = symmetric_neighbourhoods(rng, size, posts, extra=0.0)[rank]
    got, got_sources = exchange_rows(comm, rows, all_destinations[rank], termination=termination,
                                     neighbours=neighbours, buffer_limit=buffer_limit)
    want, want_sources = alltoallv(comm, rows, all_destinations[rank])
    assert got.dtype == rows.dtype and got.shape == want.shape == (len(want_sources),) + trailing
    np.testing.assert_array_equal(got, want)
    assert got_sources.dtype == np.int64
    np.testing.assert_array_equal(got_sources, want_sources)


@pytest.mark.mpi(nprocs=(2, 3), timeout=120)
def test_buffers_are_recycled_and_a_full_flight_never_deadlocks(comm):
    """Hundreds of small items to one neighbour under a small limit: many messages, few
    buffers (at most the messages in flight plus the one being filled). Then everybody
    posts items too large for MPI's eager protocol to everybody at once, with two messages
    allowed in flight: a post waiting for room keeps receiving, so every post ends."""
    rank, size = comm.rank, comm.size
    neighbours = sorted({(rank - 1) % size, (rank + 1) % size})
    for termination in TERMINATIONS:
        exchange = SparseExchange(comm, termination=termination, neighbours=neighbours, buffer_limit=256)
        for k in range(600):
            exchange.post((rank + 1) % size, np.full(6, k, dtype=np.int64))
        received = exchange.finish()
        assert [int(item.view(np.int64)[0]) for _, item in received] == list(range(600))
        assert {source for source, _ in received} == {(rank - 1) % size}
        stats = exchange.stats
        assert stats["messages_sent"] >= 600 // 4 and stats["bytes_sent"] >= 600 * 48
        assert stats["buffers_allocated"] <= DEFAULT_MAX_IN_FLIGHT + 2

        exchange = SparseExchange(comm, termination=termination, neighbours=range(size), max_in_flight=2)
        for k in range(6):
            for dest in range(size):
                exchange.post(dest, np.full(20_000, 1000 * rank + 10 * dest + k, dtype=np.int64))
        received = exchange.finish()
        assert [(s, int(item.view(np.int64)[0])) for s, item in received] == [
            (s, 1000 * s + 10 * rank + k) for s in range(size) for k in range(6)]
        assert all(item.size == 160_000 and (item.view(np.int64) == item.view(np.int64)[0]).all()
                   for _, item in received)
        last = 0 if termination == "nbx" else 1  # then an empty last message to each neighbour
        assert exchange.stats["messages_sent"] == (6 + last) * (size - 1)


@pytest.mark.mpi(nprocs=3, timeout=120)
def test_bad_options_are_refused_on_every_rank(comm):
    rank, size = comm.rank, comm.size
    with pytest.raises(ConfigurationError, match="unknown termination 'barrier'.*nbx"):
        SparseExchange(comm, termination="barrier")
    with pytest.raises(ConfigurationError, match="needs neighbours"):
        SparseExchange(comm, termination="neighbourhood")
    with pytest.raises(ConfigurationError, match=r"neighbours \[0, 7\].*0\.\.%d" % (size - 1)):
        SparseExchange(comm, neighbours=[0, 7])
    for limit in (0, -5, 1.5, True, None):
        with pytest.raises(ConfigurationError, match=f"buffer_limit must be a positive int, got {limit!r}"):
            SparseExchange(comm, buffer_limit=limit)
    with pytest.raises(ConfigurationError, match="timeout"):
        SparseExchange(comm, timeout=-1)
    exchange = SparseExchange(comm, termination="neighbourhood", neighbours=[])
    for dest in (-1, size, "0"):
        with pytest.raises(ConfigurationError, match=f"destination {dest!r} is not a rank"):
            exchange.post(dest, np.zeros(2))
    if size > 1:
        with pytest.raises(ConfigurationError, match=f"destination {(rank + 1) % size} is not among"):
            exchange.post((rank + 1) % size, np.zeros(2))
    with pytest.raises(ConfigurationError, match="dtype object"):
        exchange.post(rank, np.array([None]))
    exchange.post(rank, np.arange(2, dtype=np.int32))  # a refused post left the exchange usable
    assert [(s, item.view(np.int32).tolist()) for s, item in exchange.finish()] == [(rank, [0, 1])]
    for action in (exchange.finish, lambda: exchange.post(rank, np.zeros(1))):
        with pytest.raises(ConfigurationError, match="already finished"):
            action()
    with pytest.raises(ConfigurationError, match=f"destination {size} .* not a rank"):
        exchange_rows(comm, np.zeros((2, 2)), np.array([0, size]))
    with pytest.raises(ConfigurationError, match="one per row"):
        exchange_rows(comm, np.zeros((2, 2)), np.array([0]))
    with pytest.raises(ConfigurationError, match="buffer_limit"):
        exchange_rows(comm, np.zeros((2, 2)), np.array([0, 0]), buffer_limit=0)
    rows, sources = exchange_rows(comm, np.zeros((0, 3), dtype=np.float32), np.zeros(0, dtype=np.int64))
    assert rows.shape == (0, 3) and rows.dtype == np.float32 and sources.shape == (0,)


@pytest.mark.mpi(nprocs=2, timeout=60)
def test_an_asymmetric_neighbourhood_times_out_with_a_diagnosis(comm):
    """Rank 0 lists rank 1 as a neighbour, rank 1 lists nobody: rank 0 waits for a last
    message that never comes and, with a timeout, says so instead of hanging."""
    exchange = SparseExchange(comm, termination="neighbourhood", neighbours=[1] if comm.rank == 0 else [],
                              timeout=0.3)
    if comm.rank == 0:
        with pytest.raises(MeshchainError, match=r"neighbours not finished: \[1\].*symmetric"):
            exchange.finish()
    else:
        assert exchange.finish() == []
    comm.Barrier()


def test_self_sends_and_large_items_on_one_process(comm):
    """Without MPI messages: items to self come back in order, copied at post time."""
    exchange = SparseExchange(comm, buffer_limit=40)
    item = np.arange(100, dtype=np.float64)
    exchange.post(comm.rank, item)
    item[:] = -1
    exchange.post(comm.rank, np.zeros(0, dtype=np.uint8))
    received = exchange.finish()
    assert [len(data) for _, data in received] == [800, 0]
    np.testing.assert_array_equal(received[0][1].view(np.float64), np.arange(100.0))


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=120)
def test_a_neighbourhood_grows_by_discovery_and_then_needs_no_collective(comm):
    from meshchain.comm.neighbourhood import Neighbourhood

    rank, size = comm.rank, comm.size
    hood = Neighbourhood(comm)
    first = hood.round(termination="nbx")
    targets = sorted({(rank + 1) % size, (rank + 3) % size})
    for dest in targets:
        first.post(dest, np.array([rank, dest], dtype=np.int64))
    got = hood.finish(first)
    senders = sorted({r for r in range(size) if rank in {(r + 1) % size, (r + 3) % size}})
    assert [int(item.view(np.int64)[0]) for _, item in got] == senders
    expected = tuple(sorted((set(targets) | set(senders)) - {rank}))
    assert hood.neighbours == expected and hood.discovered == [expected]
    everybody = comm.allgather(hood.neighbours)  # symmetric: b lists a iff a lists b
    assert all((a in everybody[b]) == (b in everybody[a]) for a in range(size) for b in range(size) if a != b)
    second = hood.round()  # neighbourhood counting: every neighbour hears from this rank
    assert second.termination == "neighbourhood"
    for dest in hood.neighbours:
        second.post(dest, np.array([rank * 100 + dest], dtype=np.int64))
    got = hood.finish(second)
    assert [int(item.view(np.int64)[0]) for _, item in got] == [n * 100 + rank for n in hood.neighbours]
    assert hood.discovered[-1] == ()
    outsider = next((r for r in range(size) if r != rank and r not in hood.neighbours), size)
    with pytest.raises(ConfigurationError):  # not a neighbour (4 ranks), or no rank at all
        hood.round().post(outsider, np.zeros(1))
