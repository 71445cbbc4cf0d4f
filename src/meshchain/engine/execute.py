"""Loops and chains over a partitioned mesh: the paper's Alg. 1 and Alg. 2, owner-compute.

Both run *segments* planned by :func:`meshchain.inspector.chain.plan_chain`: a single
loop is a segment of one (Alg. 1, one message per dat per neighbour); a
communication-avoiding chain is split into as few segments as its dependences allow
(Alg. 2, one grouped message per neighbour per segment). A segment:

1. starts the exchanges that bring every dat it reads to the depth it needs (on the host
   the messages are posted at once; on a GPU the rows are packed on the device and a copy to
   the host is started, and the messages are posted in step 3, after the core kernels were
   enqueued, so that the copies and the messages overlap them);
2. runs every loop's core range (owned elements far enough from the partition
   boundary: they touch nothing that is arriving or still to be computed), in order;
3. waits for the exchanges;
4. runs every loop's remaining owned elements and its exec halo to its depth, in order
   (redundant work instead of messages);
5. starts the reduction of globals over ranks (``Iallreduce``), finished when the
   global is next read or used, and records how deep each written dat is now valid.

Exec-halo iterations reduce into scratch arrays: only owned iterations count.
"""

from __future__ import annotations

import time

import numpy as np

from ..core.access import Access
from ..inspector.chain import ArgSig, LoopSig, SetFacts, plan_chain, validity_after
from ..core.stats import add_by_layer
from ..partition.layout import MAX_LEVEL

__all__ = ["run_loop", "run_chain_segments", "chain_plan", "abort_on_failure"]


def abort_on_failure(runtime, what: str, action) -> None:
    """Run ``action()``; if it fails on this rank, print the error and abort every rank.

    Errors in declarations and in ``par_loop``'s checks are raised on every rank alike.
    An error while loops run (a kernel failing on some elements) may happen on some
    ranks only; the others would wait for them forever, so the job is aborted.
    """
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - reported, then the job ends
        import sys
        import traceback

        sys.stderr.write(
            f"meshchain: rank {runtime.comm.rank}: {what} failed; aborting all ranks.\n"
            + "".join(traceback.format_exception(exc))
        )
        sys.stderr.flush()
        runtime.comm.Abort(1)


# --- plans -----------------------------------------------------------------------------------


class _Signature:
    """A chain's loops as :class:`LoopSig` tuples over small integer keys, and the objects."""

    def __init__(self, loops):
        self.objects, self.sets = {}, {}
        sigs = []
        for loop in loops:
            args = tuple(self._arg(a) for a in loop.args)
            sigs.append(LoopSig(loop.name, self._set(loop.iterset), args))
        self.loops = tuple(sigs)

    def by_key(self) -> dict:
        return {key: obj for key, obj in self.objects.values()}

    def _set(self, s) -> int:
        return self.sets.setdefault(id(s), (len(self.sets), s))[0]

    def _arg(self, arg) -> ArgSig:
        key = self.objects.setdefault(id(arg.data), (len(self.objects), arg.data))[0]
        dataset = -1 if arg.data.is_global else self._set(arg.data.dataset)
        return ArgSig(key, arg.data.is_global, arg.map is not None, arg.access, dataset)

    def names(self) -> dict:
        return {key: obj.name for key, obj in self.objects.values()}

    def set_objects(self) -> dict:
        return {key: s for key, s in self.sets.values()}


def _facts(runtime, set_objects: dict) -> dict:
    sources = runtime.map_sources()
    return {key: SetFacts(tuple(int(c) for c in s._layout.covered_depths), id(s) in sources)
            for key, s in set_objects.items()}


def chain_plan(runtime, loops, limit: int):
    """Plan ``loops`` as one chain, building deeper halos first if the plan needs them.

    Returns ``(plan, signature)``. Cached by the chain's signature and the mesh's layers.
    """
    from ..partition.distribute import ensure_depth

    signature = _Signature(loops)
    while True:
        set_objects = signature.set_objects()
        facts = _facts(runtime, set_objects)
        key = (signature.loops, tuple(sorted(facts.items())), runtime.depth, limit)
        plan = runtime.chain_plans.get(key)
        if plan is None:
            plan = runtime.chain_plans[key] = plan_chain(signature.loops, facts, built=runtime.depth, limit=limit,
                                                         names=signature.names())
        wanted = plan.more_layers
        if wanted is None or wanted <= runtime.depth:
            return plan, signature
        ensure_depth(min(wanted, limit), flush=False)


# --- execution -------------------------------------------------------------------------------


def run_loop(runtime, loop, record) -> None:
    """One loop with per-dat exchanges overlapped with its core (Alg. 1)."""
    plan, signature = chain_plan(runtime, [loop], limit=max(runtime.depth, 1))
    for segment in plan.segments:
        _run_segment(runtime, [loop], segment, signature, [record], grouped=False, chain_record=None)


def run_chain_segments(runtime, loops, plan, signature, records, chain_record, tiling=None) -> None:
    """A planned chain: every segment with one grouped exchange (Alg. 2); with ``tiling``
    the core phase and the rest of each segment run sparse-tiled (core tiles while the
    exchange is in flight, the others after it)."""
    for segment in plan.segments:
        _run_segment(runtime, loops[segment.start : segment.end], segment, signature,
                     records[segment.start : segment.end], grouped=True, chain_record=chain_record, tiling=tiling)


def _run_segment(runtime, loops, segment, signature, records, *, grouped: bool, chain_record, tiling=None) -> None:
    comm = runtime.comm
    objects = signature.by_key()
    for loop in loops:
        for obj in loop.data:
            if obj.is_global:
                obj.settle()
    items = [(objects[key], objects[key]._valid_depth, depth) for key, depth in segment.required
             if objects[key]._valid_depth < depth]
    exchanges = runtime.backend.halo_exchanges(comm, items, grouped=grouped) if items else []
    overlap = bool(exchanges) and runtime.config.overlap
    waited = 0.0
    if exchanges and not overlap:
        waited += _finish(exchanges)
    layouts = [loop.iterset._layout for loop in loops]
    reductions = [_Reductions(loop) for loop in loops]
    # with nothing in flight the loops simply run one after the other
    cores = [_core(layout, t) if overlap else 0 for layout, t in zip(layouts, segment.thresholds)]
    phase1 = [(loop, 0, core, rec, red.owned) for loop, core, rec, red in zip(loops, cores, records, reductions)]
    t0 = time.perf_counter()
    runtime.run_ranges(phase1, tiling=tiling)
    t1 = time.perf_counter()
    if overlap:
        waited += _finish(exchanges)
    t2 = time.perf_counter()
    phase2 = []
    for loop, layout, core, depth, rec, red in zip(loops, layouts, cores, segment.depths, records, reductions):
        phase2.append((loop, core, layout.n_owned, rec, red.owned))
        phase2.append((loop, layout.n_owned, layout.exec_end(depth), rec, red.scratch))
    runtime.run_ranges(phase2, tiling=tiling)
    t3 = time.perf_counter()
    for red in reductions:
        red.start(comm)
    _mark_valid(loops, segment, signature, objects)
    for loop, layout, core, depth, rec in zip(loops, layouts, cores, segment.depths, records):
        _count_loop(rec, layout, core, depth)
    if grouped:
        _count_grouped(chain_record, exchanges, layouts, cores, segment, t1 - t0, t3 - t2, waited)
    else:
        _count_per_dat(records[0], exchanges, layouts[0], waited)


def _core(layout, threshold: int) -> int:
    return layout.core(threshold) if threshold < MAX_LEVEL else 0


def _finish(exchanges) -> float:
    start = time.perf_counter()
    for exchange in exchanges:
        exchange.finish()
    return time.perf_counter() - start


def _mark_valid(loops, segment, signature, objects) -> None:
    valid = {key: obj._valid_depth for key, obj in objects.items() if not obj.is_global}
    covered = {key: s._layout.covered for key, s in signature.set_objects().items()}
    for loop_sig, depth in zip(signature.loops[segment.start : segment.end], segment.depths):
        valid = validity_after(loop_sig, depth, valid, covered[loop_sig.iterset])
    for key, depth in valid.items():
        objects[key]._valid_depth = depth


# --- statistics ------------------------------------------------------------------------------


def _count_loop(record, layout, core, depth) -> None:
    end = layout.exec_end(depth)
    record.calls += 1
    record.iterations += end
    record.core_iterations += core
    record.halo_iterations += end - layout.n_owned
    record.halo_iterations_by_layer = add_by_layer(
        record.halo_iterations_by_layer, np.diff(layout.exec_ends[: depth + 1]).tolist()
    )
    record.neighbours = max(record.neighbours, len(layout.neighbours))


def _count_per_dat(record, exchanges, layout, waited) -> None:
    record.exchanges += len(exchanges)
    record.messages += sum(x.messages for x in exchanges)
    record.bytes_sent += sum(x.bytes_sent for x in exchanges)
    record.time_wait += waited


def _count_grouped(chain, exchanges, layouts, cores, segment, core_time, halo_time, waited) -> None:
    chain.segments += 1
    chain.depth = max(chain.depth, max(segment.depths, default=0),
                      max((d for _, d in segment.required), default=0))
    for exchange in exchanges:
        chain.exchanges += 1
        chain.messages += exchange.messages
        chain.bytes_sent += exchange.bytes_sent
        chain.max_message = max(chain.max_message, exchange.largest)
    chain.core_iterations += sum(cores)
    chain.iterations += sum(layout.exec_end(d) for layout, d in zip(layouts, segment.depths))
    chain.neighbours = max([chain.neighbours, *(len(layout.neighbours) for layout in layouts)])
    chain.time_core += core_time
    chain.time_halo += halo_time
    chain.time_wait += waited


# --- reductions ------------------------------------------------------------------------------


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
