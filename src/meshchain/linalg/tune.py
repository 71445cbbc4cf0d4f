"""``s="auto"``: the s-step methods' ``s`` chosen by the Krylov model
(:mod:`meshchain.model.krylov`) from costs measured on the problem itself.

:func:`measure_costs` times, on every rank, the pieces a Krylov iteration is made of on
this matrix (a product's entries, a vector pass, the matrix powers exchanges for each
candidate ``s``, a reduction of one and of many numbers) and keeps the slowest rank's
(collective; once per matrix layout and set of candidates; it builds the halo layers of the
deepest candidate, as an s-step solve with that ``s`` would: 5 products deep for
``sstep-cg``, 8 for ``ca-cg`` and ``ca-gmres``. A matrix's first ``sstep-cg`` solve with
``s="auto"`` took 146-151 ms against 116-118 with ``s=4``, 4096 unknowns on 2 ranks; with 8
products deep for every method, as before, and the halo layers built as before, 423-477. Timing
the block's parts as well (``block_parts``, below) made a first ``s="auto"`` solve 338-340 ms
where it had taken 298-301, on a slower VM over TCP).
:func:`choose_steps` predicts the time per iteration of every method and ``s`` among the
method's candidates from them and picks the ``s`` with the least; for the block s-step CG,
once a solve with the matrix and tolerances told the iterations CG needs
(:func:`record_iterations`), the ``s`` with the least time for them rounded up to a multiple
of ``s`` (where CG needs 46, ``s = 5`` makes 50 and ``s = 4`` 48).

Examples
--------
>>> import numpy as np, meshchain as mc
>>> nodes, edges = mc.Set(40, "nodes"), mc.Set(39, "edges")
>>> e2n = mc.Map(edges, nodes, 2, [[i, i + 1] for i in range(39)], "e2n")
>>> A = mc.Mat(nodes, nodes, [(e2n, e2n)], "A")
>>> spring = mc.Kernel.from_source("def spring(a):\\n    a[0, 0] += 2.1\\n    a[0, 1] -= 1.0\\n"
...                                "    a[1, 0] -= 1.0\\n    a[1, 1] += 2.1\\n")
>>> mc.par_loop(spring, edges, A(mc.INC, (e2n, e2n)))
>>> x, b = mc.Dat(nodes, 1, None, "x"), mc.Dat(nodes, 1, np.ones(40), "b")
>>> info = mc.solve(A, x, b, method="sstep-cg", s="auto", rtol=1e-10)
>>> info.converged, info.steps in (1, 2, 3, 4, 5), sorted(info.predicted)[:2]
(True, True, ['ca-cg s=1', 'ca-cg s=2'])
"""

from __future__ import annotations

import math
import statistics
import time

import numba
import numpy as np

from ..backends.sparse import csr_rows, sequence_on_ranks
from ..comm.pairwise import short_sum
from ..model.krylov import STEP_CANDIDATES, KrylovCosts, best_steps, candidates_of, predict
from .blockcg import block_sums, block_update
from .fused import dot
from .operators import found_kept, kept_for
from .scaled import work_dats

__all__ = ["measure_costs", "choose_steps", "iterations_needed", "record_iterations", "REPEATS"]

REPEATS = 7  # timings per piece; the median counts
WORKING_SETS = (6, 12, 24, 48)  # vectors a pass works among: CG's, pipelined CG's, s-step bases, GMRES's basis
# the session's solver caches (:meth:`~meshchain.engine.surface.Surface.solver_cache`), per matrix:
MEASURED = "Krylov costs"  # (candidates, block parts) -> (the pattern's indptr, KrylovCosts)
CHOSEN = "Krylov choices"  # (id(costs), method, jacobi, restart) -> (costs, predicted, {iterations: s})
NEEDED = "Krylov iterations needed"  # (method, jacobi, rtol, atol) -> iterations


def choose_steps(engine, A, method: str, *, jacobi: bool, restart: int, iterations: int | None = None
                 ) -> tuple[int, dict]:
    """``(s, predicted)``: the ``s`` the model predicts fastest for ``method`` on ``A`` (for
    ``iterations``, CG's iterations for the solve where a solve before told them,
    :func:`iterations_needed`: the block form makes them rounded up to a multiple of ``s``),
    and its predicted seconds per iteration of every method (collective). Worked out once per
    costs measured (the model's predictions of every method took 0.2-0.35 ms, a tenth of a
    solve at 2000 unknowns per rank), then looked up; ``predicted`` is a copy."""
    candidates = candidates_of(method)
    costs = measure_costs(engine, A, candidates=candidates, block_parts=method == "sstep-cg")
    key = (id(costs), method, jacobi, restart)
    chosen = kept_for(engine, CHOSEN, A)
    if key not in chosen:  # (each entry holds its costs: their id is not reused while it lives)
        current = {id(found) for _, found in kept_for(engine, MEASURED, A).values()}
        for stale in [k for k, entry in chosen.items() if id(entry[0]) not in current]:
            del chosen[stale]  # costs measured again (a new layout): the choices made from the old ones
        chosen[key] = (costs, predict(costs, jacobi=jacobi, restart=restart, candidates=candidates), {})
    else:
        found_kept(engine, CHOSEN)
    _, predicted, steps = chosen[key]
    if iterations not in steps:
        steps[iterations] = best_steps(costs, method, jacobi=jacobi, restart=restart, iterations=iterations)
    return steps[iterations], dict(predicted)


def iterations_needed(engine, A, method: str, *, jacobi: bool, rtol: float, atol: float) -> int | None:
    """CG's iterations the last converged ``s="auto"`` solve of ``method`` with ``A`` and these
    tolerances needed in this session (:func:`record_iterations`), or None."""
    needed = kept_for(engine, NEEDED, A).get((method, jacobi, rtol, atol))
    if needed is not None:
        found_kept(engine, NEEDED)
    return needed


def record_iterations(engine, A, method: str, info, *, jacobi: bool, rtol: float, atol: float) -> None:
    """Keep what a converged block s-step CG solve (``info``) says of the iterations CG needs:
    it tests the residual every ``s`` iterations, so they lie between its last two tests; the
    last two norms, on the line of their rate, place the tolerance between them (the same on
    every rank: the norms are sums over them). The next ``s="auto"`` solve chooses its ``s``
    for them (:func:`choose_steps`)."""
    history, k, s = info.residual_history, info.iterations, info.steps
    if method != "sstep-cg" or not info.converged or not history or not s:
        return
    target = max(rtol * history[0], atol)
    needed = k - (s - 1) / 2  # without a rate to go by: half a block before the end, on average
    if len(history) >= 2 and history[-2] > target >= history[-1] > 0:
        fraction = math.log(history[-2] / target) / math.log(history[-2] / history[-1])
        needed = k - s + s * min(max(fraction, 0.0), 1.0)
    kept_for(engine, NEEDED, A)[(method, jacobi, rtol, atol)] = max(1, math.ceil(needed - 1e-9))


def measure_costs(engine, A, *, candidates=STEP_CANDIDATES, block_parts: bool = False) -> KrylovCosts:
    """The costs of a Krylov iteration's pieces on ``A`` (collective; kept per matrix until the
    layout changes: its values, assembled again at every step of a time loop, change none of
    them): the slowest rank's times and the largest part's rows and entries, the same on every
    rank (so is the ``s`` chosen from them). With ``block_parts``, also the block s-step CG's
    parts for each candidate as it runs them: its basis as its compiled outer iterations make
    it (:func:`_basis_seconds`; on several ranks where compiled code can call MPI), into
    ``basis``, and its sums and update (:func:`_block_seconds`), into ``block``. Worked out from
    the other pieces, a basis of 4 products with its exchange came out at 342 µs where the
    compiled call takes 159-203, and the sums and update at 22 µs where they take about 40
    (their sums are compensated; 2 ranks over TCP, 4096 unknowns, an Intel Xeon VM), so
    ``s = "auto"`` was chosen from costs that were not the solve's."""
    deepest = max(candidates)
    key = (tuple(candidates), block_parts)
    found = kept_for(engine, MEASURED, A).get(key)
    if found is not None and found[0] is engine.matrices.pattern(A).indptr:  # the same pattern (a new layout
        found_kept(engine, MEASURED)  # makes a new one): nothing prepared, so no rows of these products fetched again
        return found[1]
    pattern, rows = engine.matrices.prepare_products(A, deepest)
    for steps in candidates:
        engine.matrices.prepare_products(A, steps)
    dats = work_dats(engine, A, "tune", deepest, ["x", *[f"y{k}" for k in range(deepest)]])
    comm = engine.comm
    n = engine.n_owned(A.row_set) * A.dim
    x, ys = dats["x"], [dats[f"y{k}"] for k in range(deepest)]
    engine.storage(x).host[...] = 1.0
    engine.halos_stale(x)
    entries = {layer: int(rows.indptr[rows.count(layer)]) for layer in range((deepest - 1) * pattern.depth + 1)}

    def products(count: int, stale: bool) -> float:
        if stale:
            engine.halos_stale(x)
        if comm is not None:
            comm.Barrier()
        began = time.perf_counter()
        engine.matrices.products(A, [(x, ys[:count], None)])
        return time.perf_counter() - began

    products(1, True)
    product = _median(lambda: products(1, False))  # x's halo is valid: the owned rows' product only
    _, single = engine.matrices.prepare_products(A, 1)
    kernel = _median(lambda: _product_kernel(single, engine.storage(x).host, engine.storage(ys[0]).host))
    entry = kernel / max(entries[0], 1)
    call = max(product - kernel, 0.0)  # the engine's work around the kernel, per products() call
    vector, other = np.ones(n), np.ones(n)
    streams = []
    for vectors in WORKING_SETS:  # a sweep of dots among this many vectors: the basis's working set
        block = np.ones((vectors, n))
        _sweep(block)
        streams.append(_median(lambda: _timed(_sweep, block)) / max(2 * vectors * n, 1))
    measured = [entry, call, *streams]
    for steps in candidates:
        whole = _median(lambda: products(steps, True))
        compute = sum(entries[(steps - k) * pattern.depth] for k in range(1, steps + 1)) * entry
        measured.append(max(whole - compute - call, 0.0) if comm is not None else 0.0)
    bases = [_basis_seconds(engine, A, x, steps) for steps in candidates] if block_parts else []
    bases = [] if None in bases else bases  # (the same on every rank: one process, or no compiled MPI)
    blocks = [_block_seconds(steps, n, engine.storage(x).host.size) for steps in candidates] if block_parts else []
    measured += bases + blocks
    one, many = _reduction_times(comm, dot(vector, other))
    measured += [one, many]
    layers = sorted(entries)
    values = np.array(measured + [float(n)] + [float(entries[j]) for j in layers])
    if comm is not None:  # the slowest rank's costs and the largest part's sizes: the same on every rank
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, values, op=MPI.MAX)
    sizes = values[len(measured):]
    n, entries = int(sizes[0]), {j: int(e) for j, e in zip(layers, sizes[1:])}
    entry, call, *rest = (float(v) for v in values[:len(measured)])
    count = len(candidates)
    streams, rest = rest[:len(WORKING_SETS)], rest[len(WORKING_SETS):]
    exchanges, rest = rest[:count], rest[count:]
    bases, blocks, (one, many) = rest[:len(bases)], rest[len(bases):len(bases) + len(blocks)], rest[-2:]
    costs = KrylovCosts(rows=n, entries=entries, entry=entry, stream=dict(zip(WORKING_SETS, streams)), call=call,
                        exchange=dict(zip(candidates, exchanges)), reduction=one,
                        per_number=max(many - one, 0.0) / (MANY - 1), depth=pattern.depth,
                        basis=dict(zip(candidates, bases)), block=dict(zip(candidates, blocks)))
    kept_for(engine, MEASURED, A)[key] = (pattern.indptr, costs)  # (after the halo layers added: a new layout
    # empties the session's solver caches)
    return costs


MANY = 600  # numbers in the larger timed reduction
BASES = 4  # compiled matrix powers calls per timing of a basis
BLOCKS = 8  # compiled sums and updates per timing of a block's


def _basis_seconds(engine, A, x, steps: int) -> float | None:
    """Seconds of one block s-step CG basis of ``steps`` products of ``x`` with its exchange, as
    its compiled outer iterations make it (:func:`~meshchain.backends.sparse.sequence_on_ranks`
    called from compiled code: no Python around it, every rank at once; the median of
    :data:`REPEATS` timings of :data:`BASES` calls), or None where the solve would not make it so
    (one process, no MPI library that compiled code can call). Collective."""
    if not engine.distributed:  # (no plan made for nothing)
        return None
    plan = engine.matrices.sequence_plan(A, x, steps)
    Y = np.empty((steps + 1, plan.width))
    engine.halos_stale(x)
    arguments = plan.compiled_arguments(np.zeros(steps), Y)
    if arguments is None:
        return None
    comm = engine.comm

    def timed() -> float:
        comm.Barrier()
        began = time.perf_counter()
        error = _bases(BASES, *arguments)
        seconds = time.perf_counter() - began
        if error:
            plan.exchanged(error)  # aborts every rank, saying which call failed
        return seconds / BASES

    plan.exchanged(_bases(1, *arguments))  # compiled (or loaded) before it is timed
    seconds = _median(timed)
    plan.exchanged(0)
    return seconds


def _block_seconds(steps: int, n: int, width: int) -> float:
    """Seconds of a block s-step CG outer iteration's sums and update on this rank's ``n`` rows
    (:func:`~meshchain.linalg.blockcg.block_sums` with the Jacobi weights, whose pass of 2
    elements per row a solve without Jacobi does not make, :func:`~meshchain.linalg.blockcg.block_update`
    after a block of ``steps`` directions, as long as this one, and the copy of ``x`` and ``r``
    kept for an undo; not the small dense solves of ``steps`` unknowns), compiled: the median
    of :data:`REPEATS` timings of :data:`BLOCKS` calls, on vectors of their sizes (``width``: a
    basis row's, halo rows included)."""
    random = np.random.default_rng(steps)
    Y, AQ_old, P_old = (random.uniform(0.5, 1.0, shape) for shape in ((steps + 1, width), (steps, n), (steps, n)))
    B, a = random.uniform(-0.1, 0.1, (steps, steps)), random.uniform(-0.1, 0.1, steps)
    P, AQ, x, r, weights = np.empty((steps, n)), np.empty((steps, n)), np.zeros(n), np.zeros(n), np.ones(n)
    sums = np.empty(steps * (steps + 1) + steps * steps + 1)
    arguments = (Y, steps, AQ_old, P_old, weights, sums, np.zeros(steps), B, a, P, AQ, x, r, np.empty((2, n)))
    _blocks(1, *arguments)  # compiled (or loaded) before it is timed
    return _median(lambda: _timed(_blocks, BLOCKS, *arguments)) / BLOCKS


@numba.njit(cache=True, nogil=True)
def _blocks(count, Y, steps, AQ_old, P_old, weights, sums, shifts, B, a, P, AQ, x, r, before):
    """``count`` times the block's sums, the copy of ``x`` and ``r`` and the update."""
    for _ in range(count):
        block_sums(Y, steps, AQ_old, steps, weights, True, sums)
        for i in range(len(x)):
            before[0, i] = x[i]
            before[1, i] = r[i]
        block_update(Y, shifts, steps, P_old, AQ_old, steps, B, a, P, AQ, x, r)


@numba.njit(cache=True, nogil=True)
def _bases(count, functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr, indices,
           values, targets, spans, at, shifts, Y):
    """``count`` calls of :func:`~meshchain.backends.sparse.sequence_on_ranks` (the first MPI
    error code, or 0)."""
    for _ in range(count):
        error = sequence_on_ranks(functions, x, send_at, send, receive_at, receive, requests, flag, statuses, indptr,
                                  indices, values, targets, spans, at, shifts, Y)
        if error:
            return error
    return 0


@numba.njit(cache=True, nogil=True, fastmath=True)
def _sweep(block):
    """``sum_a block[a] · block[a + 1]``: every vector read twice, as the Gram dots read them."""
    total = 0.0
    count, n = block.shape
    for a in range(count):
        first, second = block[a], block[(a + 1) % count]
        for i in range(n):
            total += first[i] * second[i]
    return total


def _product_kernel(rows, x, y) -> float:
    """Seconds of the compiled product on the owned rows alone (no engine around it)."""
    indptr, _, indices, targets = rows.unsigned
    began = time.perf_counter()
    csr_rows(indptr, indices, rows.values, targets, rows.count(0), x.reshape(-1), y.reshape(-1), 0.0)
    return time.perf_counter() - began


def _timed(function, *arguments) -> float:
    began = time.perf_counter()
    function(*arguments)
    return time.perf_counter() - began


def _median(timing) -> float:
    return statistics.median(timing() for _ in range(REPEATS))


def _reduction_times(comm, seed: float) -> tuple[float, float]:
    """Seconds of a sum over ranks of one and of :data:`MANY` numbers as the solvers' blocking
    sums make it (:func:`~meshchain.comm.pairwise.short_sum`; 0 on one process)."""
    if comm is None:
        return 0.0, 0.0

    def reduce(count: int) -> float:
        values = np.full(count, seed)
        comm.Barrier()
        began = time.perf_counter()
        short_sum(comm, values)
        return time.perf_counter() - began

    reduce(MANY)
    return _median(lambda: reduce(1)), _median(lambda: reduce(MANY))
