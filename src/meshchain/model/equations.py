"""The analytic model of the OP2 communication-avoiding paper (§3.2, equations 1-4).

One loop ``l`` run by Alg. 1 (exchange, core iterations while it is in flight, the rest
after it) takes

    T_op2,l = max(g_l S^c_l, k d_l p_l (L + m^1_l / B)) + g_l (S^1_l - S^c_l)      (1)

and a chain of ``n`` such loops ``T_op2 = Σ_l T_op2,l`` (2). Run communication-avoiding
(Alg. 2: one grouped message per neighbour, every core, then every rest) it takes

    T_ca = max(Σ_l g_l S^c_l, p (L + m^r / B + c)) + Σ_l g_l (S^h_l - S^c_l)          (3)

with ``m^r`` the grouped message to one neighbour (4): every exchanged dat's export rows
up to the depth the chain needs, times the row size.

Two readings of the paper are made explicit here:

* The paper writes ``+ g_l S^1_l`` and ``+ Σ g_l S^h_l`` after the ``max``, its ``S^1`` and
  ``S^h`` meaning the halo iterations run after the exchange. meshchain's statistics count
  ``S^1`` and ``S^h`` as *all* iterations of a loop (owned plus exec halo, as the paper's
  Tables 2 and 5 do), so what runs after the exchange is ``S - S^c``.
* ``k`` (``messages_per_dat``) is 2 in OP2, which sends the exec and non-exec halo of a
  dat separately; meshchain sends them in one message, ``k = 1`` (the default).
* The pack cost ``c`` is per byte here (``c = pack_cost · m^r``): packing a grouped message
  is a copy, which costs in proportion to its size.
* Two software terms the paper leaves out (OP2 is C; meshchain drives its rounds from
  Python): ``o_r``, the runtime's work per exchange round (Alg. 1 or one segment of
  Alg. 2: planning, posting, waiting, bookkeeping) and ``o_l``, its work per loop run
  in a round. Equation (1) gains ``o_l`` per loop and ``o_r`` per loop that exchanges,
  equation (3) ``n o_l`` per segment and ``o_r`` per segment that exchanges (a loop or
  segment with nothing to exchange does no round). With both zero (the default) the equations are the paper's. They are fitted
  from timed chain executions (:mod:`meshchain.model.overheads`).

* ``max(a, b)`` assumes that messages travel while the cores compute. Whether they do
  depends on the MPI library's progress (``mc.configure(progress=...)``): the machine's
  ``overlap`` ``φ`` is the achieved fraction, measured by the calibration
  (:func:`~meshchain.model.calibrate.measure_overlap`), and the equations use
  ``a + b - φ min(a, b)``: ``max(a, b)`` for ``φ = 1`` (the paper), ``a + b`` for ``φ = 0``
  (no progress while computing: exchange, then compute).

A chain split into several CA segments costs the sum of (3) over its segments.

Examples
--------
>>> from meshchain.model.equations import Machine, op2_loop_time
>>> machine = Machine(latency=1e-5, bandwidth=1e9, pack_cost=0.0)
>>> # 1000 core iterations of 1 µs hide one 1 kB message (11 µs); 100 more run after it
>>> round(op2_loop_time(g=1e-6, core=1000, iterations=1100, dats=1, neighbours=1,
...                     max_message=1000, machine=machine) * 1e6, 3)
1100.0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..core.errors import ConfigurationError
from ..core.stats import comm_reduction_percent, comp_increase_percent, gain_percent

__all__ = [
    "Machine", "op2_loop_time", "op2_chain_time", "ca_segment_time", "grouped_message_size",
    "gain_percent", "comm_reduction_percent", "comp_increase_percent",
]


@dataclass(frozen=True)
class Machine:
    """The machine constants of the model.

    Attributes
    ----------
    latency : float
        ``L``, seconds per message.
    bandwidth : float
        ``B``, bytes per second.
    pack_cost : float
        Seconds per byte to pack and unpack a grouped message (``c = pack_cost · m^r``).
    staged_latency : float or None
        ``Λ``: the latency of a halo staged through host memory (GPU data); used in place of
        ``L`` by :meth:`staged`.
    round_overhead, loop_overhead : float
        ``o_r`` and ``o_l``: the runtime's seconds per exchange round and per loop in a round
        (0: the paper's equations).
    overlap : float
        ``φ``, the fraction of the shorter of computation and communication that runs hidden
        behind the other (1: the paper's ``max``; 0: none).
    """

    latency: float
    bandwidth: float
    pack_cost: float = 0.0
    staged_latency: float | None = None
    round_overhead: float = 0.0
    loop_overhead: float = 0.0
    overlap: float = 1.0

    def __post_init__(self):
        if not 0.0 <= self.overlap <= 1.0:
            raise ConfigurationError(f"Machine.overlap must be in [0, 1], got {self.overlap!r}")
        for name in ("latency", "bandwidth", "pack_cost", "round_overhead", "loop_overhead"):
            value = getattr(self, name)
            if not value >= 0 or value != value:
                raise ConfigurationError(f"Machine.{name} must be a non-negative number, got {value!r}")
        if not self.bandwidth > 0:
            raise ConfigurationError(f"Machine.bandwidth must be positive, got {self.bandwidth!r}")
        if self.staged_latency is not None and not self.staged_latency >= 0:
            raise ConfigurationError(f"Machine.staged_latency must be >= 0 or None, got {self.staged_latency!r}")

    def message_time(self, nbytes: float) -> float:
        """``L + m / B``."""
        return self.latency + nbytes / self.bandwidth

    def hidden(self, compute: float, communicate: float) -> float:
        """Seconds of ``compute`` and ``communicate`` run side by side: ``a + b - φ min(a, b)``.

        >>> Machine(latency=1e-6, bandwidth=1e9, overlap=0.5).hidden(4.0, 2.0)
        5.0
        """
        return compute + communicate - self.overlap * min(compute, communicate)

    def staged(self) -> "Machine":
        """The machine seen by host-staged (GPU) halos: ``Λ`` replaces ``L``."""
        if self.staged_latency is None:
            raise ConfigurationError("this Machine has no staged_latency (Λ): calibrate it on the GPU or set it")
        return dataclasses.replace(self, latency=self.staged_latency)


def op2_loop_time(*, g: float, core: int, iterations: int, dats: int, neighbours: int, max_message: int,
                  machine: Machine, messages_per_dat: int = 1) -> float:
    """Equation (1): one loop run by Alg. 1.

    Parameters
    ----------
    g : float
        Seconds per iteration of the loop body (``g_l``).
    core, iterations : int
        ``S^c_l`` (run while the exchange is in flight) and ``S^1_l`` (every iteration:
        owned plus the exec halo of depth 1).
    dats, neighbours, max_message : int
        ``d_l`` dats exchanged, ``p_l`` neighbours, ``m^1_l`` the largest message in bytes.
    machine : Machine
    messages_per_dat : int
        ``k``: 1 for meshchain, 2 for OP2 (separate exec and non-exec halo messages).

    Examples
    --------
    >>> m = Machine(latency=2e-6, bandwidth=1e9)
    >>> # communication-bound: 2 dats x 3 neighbours x (2 µs + 1 µs) = 18 µs > 5 µs of core work
    >>> round(op2_loop_time(g=1e-8, core=500, iterations=600, dats=2, neighbours=3, max_message=1000,
    ...                     machine=m) * 1e6, 6)
    19.0
    """
    exchanges = bool(dats and neighbours)
    exchange = messages_per_dat * dats * neighbours * machine.message_time(max_message) if exchanges else 0.0
    return (machine.hidden(g * core, exchange) + g * (iterations - core) + (machine.round_overhead if exchanges else 0.0)
            + machine.loop_overhead)


def op2_chain_time(loops, *, machine: Machine, messages_per_dat: int = 1) -> float:
    """Equation (2): the sum of (1) over ``loops``, mappings with the keyword arguments of
    :func:`op2_loop_time` (``g``, ``core``, ``iterations``, ``dats``, ``neighbours``,
    ``max_message``)."""
    return sum(op2_loop_time(machine=machine, messages_per_dat=messages_per_dat, **_terms(loop)) for loop in loops)


_LOOP_TERMS = ("g", "core", "iterations", "dats", "neighbours", "max_message")


def _terms(loop) -> dict:
    return {k: loop[k] for k in _LOOP_TERMS}


def ca_segment_time(*, g, core, iterations, neighbours: int, max_message: int, machine: Machine) -> float:
    """Equation (3) for one grouped exchange and the loops after it.

    ``g``, ``core`` and ``iterations`` are sequences over the loops (``g_l``, ``S^c_l``,
    ``S^h_l``: owned plus exec halo to the loop's depth); ``neighbours`` is ``p`` and
    ``max_message`` is ``m^r`` (0 when the segment exchanges nothing).

    Examples
    --------
    >>> m = Machine(latency=1e-5, bandwidth=1e9, pack_cost=1e-9)
    >>> # p (L + m^r/B + c) = 2 (10 + 2 + 2) µs = 28 µs > 20 µs of cores; then 10 µs of halos
    >>> round(ca_segment_time(g=[1e-8, 1e-8], core=[1000, 1000], iterations=[1500, 1500],
    ...                       neighbours=2, max_message=2000, machine=m) * 1e6, 6)
    38.0
    """
    compute_core = sum(gl * s for gl, s in zip(g, core))
    rest = sum(gl * (s - c) for gl, s, c in zip(g, iterations, core))
    exchange = neighbours * (machine.message_time(max_message) + machine.pack_cost * max_message) if max_message else 0.0
    round_overhead = machine.round_overhead if neighbours else 0.0
    return machine.hidden(compute_core, exchange) + rest + round_overhead + len(core) * machine.loop_overhead


def grouped_message_size(exports) -> int:
    """Equation (4): ``m^r = Σ_l Σ_d (S_d^{eeh,h_l} + S_d^{enh,h_l}) · δ`` for one neighbour.

    ``exports`` holds one ``(rows, row_bytes)`` pair per (loop, dat) exchanged: the export
    rows of the dat's set up to the depth its loop needs (exec and non-exec halo, only the
    layers that are stale) and ``δ``, the bytes of one row.

    >>> grouped_message_size([(120, 32), (40, 8)])
    4160
    """
    return int(sum(rows * row_bytes for rows, row_bytes in exports))
