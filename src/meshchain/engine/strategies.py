"""How a unit runs: strategies, chosen from a registry.

A strategy turns a :class:`~.units.Unit` and the session's layout into a
:class:`~meshchain.inspector.schedule.Schedule`:

``"serial"``
    one process: every loop over its whole set, nothing exchanged;
``"per-loop"``
    Alg. 1 for each loop in turn (a single loop, or a chain with ``ca=False``);
``"ca"``
    Alg. 2: one grouped exchange per segment, redundant work in the halo; a chain that
    needs deeper halo layers than exist gets :class:`~meshchain.inspector.schedule.MoreLayers`
    (the pipeline builds them, then asks again).

Strategies are pure: they read the unit and the layout and change nothing.

The pipeline picks one (:meth:`~.pipeline.Pipeline._strategy`; ``ca="auto"`` asks
:mod:`.auto`). Sparse tiling is not a
strategy of its own: it cuts the phases of a ``"serial"`` or ``"ca"`` schedule into tiles
when the plan is assembled (:mod:`.tiling`).

Examples
--------
>>> sorted(STRATEGIES)
['ca', 'per-loop', 'serial']
"""

from __future__ import annotations

import numpy as np

from ..inspector.schedule import ca_schedule, per_loop_schedule, serial_schedule
from ..partition.distribute import MAX_DEPTH

__all__ = ["STRATEGIES", "strategy", "schedule_for"]

STRATEGIES: dict = {}


def strategy(name: str):
    """Register a function ``(session, unit) -> Schedule`` as the strategy ``name``."""
    def register(function):
        STRATEGIES[name] = function
        return function

    return register


def schedule_for(session, unit, name: str):
    """The schedule of ``unit`` under strategy ``name`` from the current state (or a
    :class:`~meshchain.inspector.schedule.MoreLayers`: the halo layers it needs first)."""
    return STRATEGIES[name](session, unit)


@strategy("serial")
def _serial(session, unit):
    return serial_schedule(unit.signature, sizes={key: s.size for key, s in unit.sets.items()})


def _inputs(session, unit) -> dict:
    layout = session.layout
    return dict(layouts={key: layout.of(s) for key, s in unit.sets.items()},
                valid=unit.valid(), built=layout.depth, row_bytes=_row_bytes(unit),
                overlap=session.config.overlap)


def _row_bytes(unit) -> dict:
    return {key: int(np.prod(storage.host.shape[1:], dtype=np.int64)) * storage.host.dtype.itemsize
            for key, storage in unit.storage.items() if not unit.objects[key].is_global}


@strategy("per-loop")
def _per_loop(session, unit):
    return per_loop_schedule(unit.signature, **_inputs(session, unit))


@strategy("ca")
def _ca(session, unit):
    options = unit.options
    limit = min(options.max_halo or MAX_DEPTH, MAX_DEPTH) if options is not None else MAX_DEPTH
    return ca_schedule(unit.signature, limit=limit, names=unit.object_names(), **_inputs(session, unit))
