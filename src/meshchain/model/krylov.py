"""Time per iteration of the Krylov methods, predicted from a problem's measured costs: what
``s="auto"`` chooses ``s`` by (issue 36, item 3).

An iteration of a Krylov method is products (matrix entries), vector passes (elements
streamed), halo exchanges and reductions. :class:`KrylovCosts` holds what one of each
costs on one problem (measured by :func:`meshchain.linalg.tune.measure_costs`, slowest
rank), and the functions here count how many of each a method does per iteration:

* ``cg``: one product, one depth-1 exchange, two reductions, about 18 streamed elements per
  row (three updates and the Jacobi scaling in one pass, its two dots in a read-only pass:
  :func:`meshchain.linalg.fused.cg_update`);
* ``pipecg``: one product, one exchange, one reduction of three numbers (in flight during
  the product; ``overlap`` is the fraction of it hidden, 0 without asynchronous progress),
  about 45 streamed elements per row (its update's pass, then ``(m, m)``'s and the other sums'
  read-only passes: :func:`meshchain.linalg.fused.pipecg_update`);
* ``sstep-cg`` (the block form) with ``s``: per ``s`` iterations one exchange ``s`` layers
  deep, one reduction of ``s (s + 1) + s² + 1`` numbers, the ``s`` products of the matrix
  powers kernel on the owned rows and the halo rows it recomputes (``entries[j]``: the
  entries of the rows of halo layers ``0..j``), ``s (s + 1) / 2 + s + s²`` dots (up to eight
  per pass, two rows of the basis against four others: :func:`block_sum_streams`) and the
  block update (the new directions from the last block's four at a time, then ``x`` and
  ``r``: :func:`block_update_streams`). Where ``s="auto"`` timed the block's parts as it runs
  them (``KrylovCosts.basis``: the basis with its exchange in one compiled call on several
  ranks; ``KrylovCosts.block``: the sums and update), those times replace the counts, and
  ``cg``'s and ``pipecg``'s product with its exchange is the timed basis of one product
  (:func:`product_with_exchange`);
* ``ca-cg`` with ``s``: per ``s`` iterations one exchange ``s`` layers deep, one
  reduction of the Gram matrices (``2 (2s+1)²`` numbers with Jacobi), the ``2s - 1``
  products of the matrix powers kernel, the Gram matrices (``m (m + 1) / 2`` pairs of
  vectors, ``m = 2s + 1``, each read once, with the Jacobi weights a third stream) and
  forming ``x``, ``r``, ``p`` (``3m`` plus copies);
* ``gmres`` with ``restart``: one product, one exchange, two reductions (Gram-Schmidt and
  the norm) and Gram-Schmidt against the mean basis size ``k = (restart + 1) / 2``;
* ``ca-gmres`` with ``s``: per block one exchange ``s`` deep, one reduction of ``s (k + s)``
  numbers, ``s`` products, the block's dots and projection against ``k`` vectors; per cycle
  the true residual and the update of ``x``.

The counts of streamed elements are the kernels' (fused passes read and write several
vectors at once); the driver's own work (Python between compiled calls) is counted in units
of one call's overhead, :data:`DRIVER`. The initial Ritz iterations of the Newton basis
(``s`` iterations at CG's cost, in a matrix's first solve) and the block form's last outer
iteration (whose basis only tests the residual) are not counted. ``benchmarks/krylov.py`` and the
profitability notebook show predicted against measured.

Examples
--------
>>> costs = KrylovCosts(rows=1000, entries={0: 7000, 1: 7600, 2: 8200, 3: 8800}, entry=1e-9, stream=1e-9,
...                     exchange={1: 20e-6, 2: 22e-6, 4: 25e-6}, reduction=30e-6, per_number=1e-8)
>>> round(cg_iteration(costs) * 1e6, 1)
105.0
>>> round(cacg_iteration(costs, 4, jacobi=True) * 1e6, 1)
69.7
>>> best_steps(costs, "ca-cg", jacobi=True, candidates=(1, 2, 4))
2
>>> round(sstep_iteration(costs, 4, jacobi=True) * 1e6, 1)
44.7
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["KrylovCosts", "DRIVER", "product_with_exchange", "cg_iteration", "pipecg_iteration", "sstep_iteration",
           "block_sum_streams", "block_update_streams", "cacg_iteration",
           "gmres_iteration", "cagmres_iteration", "predict", "best_steps", "candidates_of", "STEP_CANDIDATES",
           "BLOCK_CANDIDATES"]

STEP_CANDIDATES = (1, 2, 3, 4, 5, 6, 8)
"""The ``s`` that ``s="auto"`` chooses among for ``ca-cg`` and ``ca-gmres``."""

BLOCK_CANDIDATES = (1, 2, 3, 4, 5)
"""The ``s`` of the block s-step CG's ``s="auto"``: beyond 5 its basis is too ill-conditioned
for CG's iterations on problems that need many (:mod:`meshchain.linalg.blockcg`)."""


def candidates_of(method: str) -> tuple:
    """The ``s`` that ``s="auto"`` chooses among for ``method``."""
    return BLOCK_CANDIDATES if method == "sstep-cg" else STEP_CANDIDATES


@dataclass(frozen=True)
class KrylovCosts:
    """What one of each piece of a Krylov iteration costs on one problem (seconds, slowest
    rank): ``entry`` per matrix entry of a product; ``stream`` per vector element read or
    written by a vector pass, by the number of vectors the pass works among (a float: the
    same for every working set; a dict ``{vectors: seconds}``: the rate of the smallest
    measured working set at least that large, since a basis of many vectors leaves the
    caches); ``exchange[k]`` a halo exchange for ``k`` products (``k`` layers of the
    pattern's depth); ``reduction`` a blocking sum over ranks of one number and
    ``per_number`` each number more (:func:`meshchain.comm.pairwise.short_sum`, as the
    solvers sum); ``call`` the engine's and the interpreter's work around one compiled call
    (the driver overhead unit, :data:`DRIVER`); ``rows`` this rank's owned scalar rows
    and ``entries[j]`` the entries of the rows of halo layers ``0..j`` (``entries[0]``: the
    owned rows'); ``basis[k]``, where measured, a block s-step CG's basis of ``k`` products with
    its exchange as its compiled outer iterations make it (on several ranks: one compiled call
    each, messages, redundant rows and the wait for the slowest rank included), which then
    replaces the products and exchange worked out from ``entry`` and ``exchange`` for it;
    ``block[k]``, where measured, its sums (with the Jacobi weights) and update for ``k`` (as
    it runs them, compiled), which replace the streams counted for them."""

    rows: int
    entries: dict
    entry: float
    stream: float | dict
    exchange: dict
    reduction: float
    per_number: float
    depth: int = 1
    call: float = 0.0
    basis: dict = field(default_factory=dict)
    block: dict = field(default_factory=dict)

    def allreduce(self, numbers: int) -> float:
        return self.reduction + self.per_number * max(numbers - 1, 0)

    def exchanged(self, steps: int) -> float:
        """An exchange for ``steps`` products (measured, or the nearest measured deeper one)."""
        deeper = [k for k in self.exchange if k >= steps]
        return self.exchange[min(deeper)] if deeper else self.exchange[max(self.exchange)]

    def streamed(self, per_row: float, vectors: int) -> float:
        """Seconds of ``per_row`` elements per row streamed among ``vectors`` vectors."""
        rate = self.stream
        if isinstance(rate, dict):
            larger = [k for k in rate if k >= vectors]
            rate = rate[min(larger)] if larger else rate[max(rate)]
        return per_row * self.rows * rate

    def powers_entries(self, lengths) -> float:
        """Entries multiplied by sequences of these lengths in one matrix powers call."""
        steps = max(lengths)
        rows = sorted(self.entries)
        total = 0
        for length in lengths:
            for k in range(1, length + 1):
                layer = (steps - k) * self.depth
                total += self.entries[max([j for j in rows if j <= layer], default=0)]
        return total


DRIVER = {"cg": 0.0, "pipecg": 1.0, "gmres": 2.0, "sstep-cg": 0.8, "ca-cg": 2.5, "ca-gmres": 1.5,
          "ca-gmres column": 0.3}
"""Driver overhead in units of :attr:`KrylovCosts.call`: per iteration of ``pipecg`` and
``gmres`` (their loops run in Python), per outer iteration of ``sstep-cg`` and ``ca-cg`` and
per block of ``ca-gmres``, plus per column of ``ca-gmres`` (its Givens rotations); ``cg``
iterates inside compiled calls. Fitted once on one rank at 500 unknowns (Poisson and
advection-diffusion, 2026-11-29); the other sizes and rank counts in ``benchmarks/krylov.py``
and the notebook are predicted with them unchanged."""


def product_with_exchange(costs: KrylovCosts) -> float:
    """Seconds of one product of the owned rows with its halo exchange: the compiled basis of
    one product where it was timed (``costs.basis[1]``: the owned rows computed while the
    messages travel, as the compiled iterations of ``cg`` make their product), else its
    entries and ``exchange[1]``; so ``cg`` and the s-step CG are predicted from costs
    measured alike."""
    timed = costs.basis.get(1)
    return timed if timed is not None else costs.entries[0] * costs.entry + costs.exchanged(1)


def cg_iteration(costs: KrylovCosts) -> float:
    """Seconds per iteration of ``cg``."""
    return (product_with_exchange(costs) + 2 * costs.allreduce(1) + costs.streamed(18, 6)
            + DRIVER["cg"] * costs.call)


def pipecg_iteration(costs: KrylovCosts, *, overlap: float = 0.0) -> float:
    """Seconds per iteration of ``pipecg`` (``overlap``: the fraction of its reduction hidden)."""
    return (product_with_exchange(costs) + max((1.0 - overlap) * costs.allreduce(3), 0.0)
            + costs.streamed(45, 12) + DRIVER["pipecg"] * costs.call)


def block_sum_streams(steps: int, *, jacobi: bool) -> int:
    """Elements per row the block s-step CG's sums stream (:func:`meshchain.linalg.blockcg.block_sums`):
    for each two ``v_a``, ``v_{a+1}`` of ``R``, one pass per four of ``v_a .. v_s`` and one per
    four of the last block's ``Â p_k``, each reading the two and its four (a vector among both
    once); the weighted norm (``v_0`` and the weights, with Jacobi).

    >>> block_sum_streams(4, jacobi=False)  # v_0, v_1 with v_0..v_3 (4), v_4 (3), 4 of Â P (6); v_2, v_3: 3 and 6
    22
    """
    s, total = steps, 2 if jacobi else 0
    for a in range(0, s, 2):
        rows = {a, min(a + 1, s - 1)}
        for c in range(a, s + 1, 4):
            total += len(rows | set(range(c, min(c + 4, s + 1))))
        for k in range(0, s, 4):
            total += len(rows) + min(4, s - k)
    return total


def block_update_streams(steps: int) -> int:
    """Elements per row the block s-step CG's update streams (:func:`meshchain.linalg.blockcg.block_update`,
    the last block as long as this one), with the copy of ``x`` and ``r`` kept for an undo: per
    new direction, a pass per four old ones (reading them and their ``Â p``, ``p`` and ``q``
    read and written; the first pass makes them from the basis, the last one also updates ``x``
    and ``r``), then per two, then one, and ``x`` and ``r`` in a pass of their own where the
    last pass was not one of four.

    >>> block_update_streams(4), block_update_streams(2)  # 4 x (one pass of 16) + 4; 2 x (4 + 8 + 6) + 4
    (68, 40)
    """
    whole, rest = steps - steps % 4, steps % 4
    per_direction = 12 * (whole // 4) + (4 if whole else 0)  # x and r in the last pass of four
    if whole == 0:
        per_direction += 4  # p and q made from the basis in a pass of their own
    per_direction += 8 * (rest // 2) + 6 * (rest % 2)
    if rest or whole == 0:
        per_direction += 6 - (4 if whole else 0)  # x and r in a pass of their own
    return steps * per_direction + 4


def sstep_iteration(costs: KrylovCosts, steps: int, *, jacobi: bool) -> float:
    """Seconds per iteration of the block ``sstep-cg`` with ``s = steps`` (an outer iteration
    over ``s``; its last block of directions as long as this one). Where the basis was timed as
    the compiled outer iterations make it (``costs.basis``), that time replaces the products and
    the exchange, and no driver overhead is counted: those iterations run inside one compiled
    call, Python sees only the last. Where its sums and update were timed (``costs.block``),
    that time replaces their streams."""
    s = steps
    basis, block = costs.basis.get(s), costs.block.get(s)
    if basis is None:
        basis = costs.exchanged(s) + costs.powers_entries([s]) * costs.entry + DRIVER["sstep-cg"] * costs.call
    if block is None:
        block = costs.streamed(block_sum_streams(s, jacobi=jacobi) + block_update_streams(s), 4 * s + 5)
    return (basis + costs.allreduce(s * (s + 1) + s * s + 1) + block) / s


def cacg_iteration(costs: KrylovCosts, steps: int, *, jacobi: bool) -> float:
    """Seconds per iteration of ``ca-cg`` with ``s = steps`` (an outer iteration over ``s``)."""
    m = 2 * steps + 1
    gram = m * (m + 1) // 2 * (3 if jacobi else 2)  # pairs of vectors (and the weights) read once per pair
    outer = (costs.exchanged(steps) + costs.allreduce(m * m * (2 if jacobi else 1))
             + costs.powers_entries([steps, steps - 1]) * costs.entry
             + costs.streamed(gram + 3 * m + 4, m + 5) + DRIVER["ca-cg"] * costs.call)
    return outer / steps


def gmres_iteration(costs: KrylovCosts, *, restart: int = 30) -> float:
    """Seconds per iteration of ``gmres`` (classical Gram-Schmidt against the mean basis)."""
    basis = (restart + 1) / 2
    return (costs.entries[0] * costs.entry + costs.exchanged(1) + costs.allreduce(int(basis) + 1)
            + costs.allreduce(1) + costs.streamed(4 * (basis + 1) + 8, restart + 3) + DRIVER["gmres"] * costs.call)


def cagmres_iteration(costs: KrylovCosts, steps: int, *, restart: int = 30) -> float:
    """Seconds per iteration of ``ca-gmres`` with ``s = steps``."""
    basis = (restart + 1) / 2
    block = (costs.exchanged(steps) + costs.allreduce(int(steps * (basis + steps)))
             + costs.powers_entries([steps]) * costs.entry
             + costs.streamed(2 * steps * (basis + steps) + 2 * steps * basis + steps * steps + 2 * steps,
                              restart + steps + 2)
             + DRIVER["ca-gmres"] * costs.call)
    cycle = (costs.exchanged(1) + costs.entries[0] * costs.entry + costs.allreduce(1)
             + costs.streamed(restart + 4, restart + 2))
    return block / steps + cycle / restart + DRIVER["ca-gmres column"] * costs.call


def predict(costs: KrylovCosts, *, jacobi: bool = True, restart: int = 30, overlap: float = 0.0,
            candidates=None) -> dict:
    """Predicted seconds per iteration by method (``"sstep-cg s=4"`` and the like; each s-step
    method over its own candidates, or over ``candidates``)."""
    out = {"cg": cg_iteration(costs), "pipecg": pipecg_iteration(costs, overlap=overlap),
           "gmres": gmres_iteration(costs, restart=restart)}
    for method in ("sstep-cg", "ca-cg", "ca-gmres"):
        for steps in candidates or candidates_of(method):
            out[f"{method} s={steps}"] = _iteration(costs, method, steps, jacobi=jacobi, restart=restart)
    return out


def _iteration(costs: KrylovCosts, method: str, steps: int, *, jacobi: bool, restart: int) -> float:
    if method == "sstep-cg":
        return sstep_iteration(costs, steps, jacobi=jacobi)
    if method == "ca-cg":
        return cacg_iteration(costs, steps, jacobi=jacobi)
    return cagmres_iteration(costs, steps, restart=restart)


def best_steps(costs: KrylovCosts, method: str, *, jacobi: bool = True, restart: int = 30,
               candidates=None, iterations: float | None = None) -> int:
    """The ``s`` with the least predicted time per iteration for ``method``
    (``"sstep-cg"``, ``"ca-cg"`` or ``"ca-gmres"``; over its candidates, or ``candidates``);
    the smaller on a tie. With ``iterations`` (CG's iterations for the solve, where known), the
    block form's ``s`` is the one with the least predicted time for them rounded up to a
    multiple of ``s``, which is what it makes.

    >>> costs = KrylovCosts(rows=1000, entries={j: 7000 + 600 * j for j in range(5)}, entry=1e-9, stream=3e-10,
    ...                     exchange={k: 20e-6 for k in range(1, 6)}, reduction=60e-6, per_number=1e-8)
    >>> best_steps(costs, "sstep-cg"), best_steps(costs, "sstep-cg", iterations=46)  # s = 5: 50 iterations, 4: 48
    (5, 4)
    """
    def time(steps: int) -> float:
        per_iteration = _iteration(costs, method, steps, jacobi=jacobi, restart=restart)
        if iterations is None or method != "sstep-cg":
            return per_iteration
        return per_iteration * math.ceil(iterations / steps - 1e-9) * steps

    return min(candidates or candidates_of(method), key=lambda steps: (time(steps), steps))
