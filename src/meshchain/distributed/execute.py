"""One loop over a partitioned mesh: the paper's Alg. 1, owner-compute.

1. post the halo exchanges of the dats the loop reads whose halo is not valid to the
   depth it needs;
2. run the core iterations (a prefix: they touch no halo data);
3. wait for the exchanges;
4. run the owned iterations near the partition boundary, then the exec halo (layer 1,
   only for loops that write through a map): redundant work instead of a reverse
   exchange for ``INC``;
5. start the reduction of globals over ranks (``Iallreduce``); it is finished when the
   global is next read or used.

Exec-halo iterations reduce into scratch arrays: only owned iterations count.
"""

from __future__ import annotations

import time

import numpy as np

from ..access import Access
from ..stats import add_by_layer
from .exchange import Exchange

__all__ = ["run_distributed", "run_distributed_or_abort", "execution_depth", "required_depths"]


def execution_depth(loop) -> int:
    """Halo layers of the iteration set the loop runs on: 1 if it writes through a map."""
    return 1 if loop.indirect_writes else 0


def required_depths(loop, depth: int) -> dict:
    """``{dat: halo depth it must be valid to}`` for the dats the loop reads (READ, RW, and
    direct INC, which adds to the old values of the rows it runs)."""
    needed = {}
    for arg in loop.args:
        if arg.data.is_global or arg.access in (Access.WRITE,):
            continue
        if arg.access is Access.INC and arg.map is not None:
            continue  # owner-compute: owned targets receive every contribution, no read needed
        # a direct INC adds to the old value, also on the exec-halo rows it runs
        need = depth if arg.map is None else max(1, depth)
        if need:
            needed[arg.data] = max(needed.get(arg.data, 0), need)
    return needed


def run_distributed_or_abort(runtime, loop, record) -> None:
    """:func:`run_distributed`, aborting every rank if it fails on one.

    Errors in declarations and in ``par_loop``'s checks are raised on every rank alike.
    An error while a loop runs (a kernel failing on some elements) may happen on some
    ranks only; the others would wait for them forever, so the error is printed with its
    rank and the whole job is aborted (``MPI_Abort``).
    """
    try:
        run_distributed(runtime, loop, record)
    except Exception as exc:  # noqa: BLE001 - reported, then the job ends
        import sys
        import traceback

        sys.stderr.write(
            f"meshchain: rank {runtime.comm.rank}: loop {loop.name!r} failed; aborting all ranks.\n"
            + "".join(traceback.format_exception(exc))
        )
        sys.stderr.flush()
        runtime.comm.Abort(1)


def run_distributed(runtime, loop, record) -> None:
    """Execute ``loop`` with halo exchanges overlapped with its core iterations."""
    comm, layout = runtime.comm, loop.iterset._layout
    depth = execution_depth(loop)
    for obj in loop.data:
        if obj.is_global:
            obj.settle()
    exchanges = [
        Exchange(comm, dat, dat._valid_depth, need)
        for dat, need in required_depths(loop, depth).items()
        if dat._valid_depth < need
    ]
    reductions = _Reductions(loop)
    n_owned = layout.n_owned
    overlap = bool(exchanges) and runtime.config.overlap
    if exchanges and not overlap:
        _finish(exchanges, record)  # exchange-then-compute, for comparison
    core = layout.core(1) if overlap else n_owned
    runtime.run_range(loop, 0, core, record, reductions.owned)
    if overlap:
        _finish(exchanges, record)
    runtime.run_range(loop, core, n_owned, record, reductions.owned)
    halo_end = layout.exec_end(depth)
    if halo_end > n_owned:
        runtime.run_range(loop, n_owned, halo_end, record, reductions.scratch)
    reductions.start(comm)
    _mark_written(loop, depth)
    _count(record, layout, exchanges, core, n_owned, depth)


def _finish(exchanges, record) -> None:
    start = time.perf_counter()
    for exchange in exchanges:
        exchange.finish()
    record.time_wait += time.perf_counter() - start


def _mark_written(loop, depth: int) -> None:
    """Written through a map at depth e: every target of data layer < e got all contributions.
    Written directly: valid as deep as the run covers every element of the data layers."""
    for arg in loop.args:
        if arg.data.is_global or arg.access is Access.READ:
            continue
        if arg.map is None:
            arg.data._valid_depth = loop.iterset._layout.covered(depth)
        else:
            arg.data._valid_depth = min(arg.data._valid_depth, max(depth - 1, 0))


def _count(record, layout, exchanges, core, n_owned, depth) -> None:
    record.calls += 1
    record.iterations += layout.exec_end(depth)
    record.core_iterations += core
    record.halo_iterations += layout.exec_end(depth) - n_owned
    record.halo_iterations_by_layer = add_by_layer(
        record.halo_iterations_by_layer, np.diff(layout.exec_ends[: depth + 1]).tolist()
    )
    record.exchanges += len(exchanges)
    record.messages += sum(x.messages for x in exchanges)
    record.bytes_sent += sum(x.bytes_sent for x in exchanges)
    record.neighbours = max(record.neighbours, len(layout.neighbours))


class _Reductions:
    """Per-rank reduction targets of a loop's reduced globals, then their ``Iallreduce``."""

    def __init__(self, loop):
        self.owned, self.scratch, self.globals = {}, {}, {}
        for position, arg in enumerate(loop.args):
            g = arg.data
            if not g.is_global or arg.access is Access.READ:
                continue
            if id(g) not in self.globals:
                start = np.zeros_like(g._data) if arg.access is Access.INC else g._data.copy()
                self.globals[id(g)] = (g, arg.access, start)
            self.owned[position] = self.globals[id(g)][2]
            self.scratch[position] = self.owned[position].copy()

    def start(self, comm) -> None:
        from mpi4py import MPI

        operations = {Access.INC: MPI.SUM, Access.MIN: MPI.MIN, Access.MAX: MPI.MAX}
        for g, access, local in self.globals.values():
            result = np.empty_like(local)
            request = comm.Iallreduce(local, result, operations[access])
            g._pending = _PendingReduction(request, result, access, local)


class _PendingReduction:
    def __init__(self, request, result, access, local):
        self.request, self.result, self.access, self.local = request, result, access, local

    def finish(self, value: np.ndarray) -> None:
        self.request.Wait()
        if self.access is Access.INC:
            value += self.result
        else:
            value[...] = self.result
