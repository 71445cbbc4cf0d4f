"""What one execution of a chain costs on one rank, in the model's terms, without ``g``.

A :class:`ChainProfile` holds, for the same loops from the same state, both ways of
running them: loop by loop (Alg. 1, one :class:`LoopProfile` per loop) and
communication-avoiding (Alg. 2, one :class:`SegmentProfile` per grouped exchange). The
distributed runtime fills it from the halo lists and the chain plan (nothing is run
for it); :meth:`ChainProfile.per_loop_time` and :meth:`ChainProfile.ca_time` apply
equations (1)-(3) with per-loop costs ``g`` and a :class:`~meshchain.model.Machine`.

Examples
--------
>>> from meshchain.model import Machine
>>> from meshchain.model.profile import ChainProfile, LoopProfile, SegmentProfile
>>> loops = (LoopProfile("a", core=900, iterations=1000, dats=1, neighbours=2, max_message=800),
...          LoopProfile("b", core=900, iterations=1000, dats=1, neighbours=2, max_message=800))
>>> ca = (SegmentProfile(("a", "b"), core=(850, 800), iterations=(1050, 1000), neighbours=2,
...                      max_message=1600),)
>>> profile = ChainProfile(loops, ca)
>>> machine = Machine(latency=5e-5, bandwidth=1e9)
>>> g = {"a": 1e-8, "b": 1e-8}
>>> round(profile.per_loop_time(g, machine) * 1e6, 3), round(profile.ca_time(g, machine) * 1e6, 3)
(205.2, 107.2)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .equations import ca_segment_time, op2_loop_time

__all__ = ["LoopProfile", "SegmentProfile", "ChainProfile"]


@dataclass(frozen=True)
class LoopProfile:
    """One loop run by Alg. 1: ``S^c_l``, ``S^1_l``, ``d_l``, ``p_l``, ``m^1_l`` (bytes), and the
    messages and bytes it sends."""

    name: str
    core: int
    iterations: int
    dats: int = 0
    neighbours: int = 0
    max_message: int = 0
    messages: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class SegmentProfile:
    """One CA segment: its loops' names, ``S^c_l`` and ``S^h_l`` per loop, ``p``, ``m^r``, and
    the messages and bytes of its grouped exchange."""

    loops: tuple
    core: tuple
    iterations: tuple
    neighbours: int = 0
    max_message: int = 0
    messages: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class ChainProfile:
    """Both executions of one chain on one rank (see the module docstring)."""

    per_loop: tuple
    ca: tuple

    def missing(self, g: dict) -> list[str]:
        """Loops that run iterations here but have no cost in ``g``."""
        names = {lp.name for lp in self.per_loop if lp.iterations}
        return sorted(n for n in names if n not in g)

    def per_loop_time(self, g: dict, machine, *, messages_per_dat: int = 1) -> float:
        """Equation (2): seconds to run the loops one by one."""
        return sum(op2_loop_time(g=g.get(lp.name, 0.0), core=lp.core, iterations=lp.iterations, dats=lp.dats,
                                 neighbours=lp.neighbours, max_message=lp.max_message, machine=machine,
                                 messages_per_dat=messages_per_dat)
                   for lp in self.per_loop)

    def ca_time(self, g: dict, machine) -> float:
        """Equation (3), summed over the segments: seconds to run communication-avoiding."""
        return sum(ca_segment_time(g=[g.get(n, 0.0) for n in s.loops], core=s.core, iterations=s.iterations,
                                   neighbours=s.neighbours, max_message=s.max_message, machine=machine)
                   for s in self.ca)

    def totals(self) -> dict:
        """The paper's Table 2 components on this rank: ``Σ d·p·m^1`` (``per_loop_bytes``),
        ``p·m^r`` (``ca_bytes``), ``ΣS^c`` and ``ΣS^1`` / ``ΣS^h`` of each variant."""
        return {
            "per_loop_bytes": sum(lp.bytes for lp in self.per_loop),
            "per_loop_messages": sum(lp.messages for lp in self.per_loop),
            "per_loop_core": sum(lp.core for lp in self.per_loop),
            "per_loop_iterations": sum(lp.iterations for lp in self.per_loop),
            "ca_bytes": sum(s.bytes for s in self.ca),
            "ca_messages": sum(s.messages for s in self.ca),
            "ca_core": sum(sum(s.core) for s in self.ca),
            "ca_iterations": sum(sum(s.iterations) for s in self.ca),
        }

    def as_dict(self) -> dict:
        return {"per_loop": [asdict(lp) for lp in self.per_loop], "ca": [asdict(s) for s in self.ca]}

    @classmethod
    def from_dict(cls, data: dict) -> "ChainProfile":
        return cls(tuple(LoopProfile(**lp) for lp in data["per_loop"]),
                   tuple(SegmentProfile(**{**s, "loops": tuple(s["loops"]), "core": tuple(s["core"]),
                                           "iterations": tuple(s["iterations"])}) for s in data["ca"]))
