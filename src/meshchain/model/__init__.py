"""Chain profitability: when communication avoidance pays (the OP2 paper's §3.2).

* :mod:`~meshchain.model.equations`: equations 1-4, the predicted gain and the paper's
  Table 5 columns;
* :mod:`~meshchain.model.profile`: a chain's model terms on one rank (``mc.stats()``
  keeps the latest in ``ChainStats.profile``);
* :mod:`~meshchain.model.calibrate`: ``L``, ``B``, ``c`` measured on this machine and
  ``g_l`` from timed runs, saved per :class:`~meshchain.model.keys.CalibrationKey` (host,
  rank count, network, transport, progress mode, threads);
* :mod:`~meshchain.model.policy`: the decision of ``ca="auto"``;
* :mod:`~meshchain.model.estimate`: a chain's model terms read off its schedules.

The engine consults this package through :mod:`~meshchain.model.policy`,
:mod:`~meshchain.model.estimate` and :func:`~meshchain.model.calibrate.measure`;
``python -m meshchain report`` (:mod:`meshchain.apps.report`) prints the profitability table.
"""

from .calibrate import Calibration, apply, calibrate, load_calibration, loop_costs, measure
from .keys import CalibrationKey
from .equations import (
    Machine,
    ca_segment_time,
    comm_reduction_percent,
    comp_increase_percent,
    gain_percent,
    grouped_message_size,
    op2_chain_time,
    op2_loop_time,
)
from .policy import Decision, choose_ca
from .profile import ChainProfile, LoopProfile, SegmentProfile

__all__ = [
    "Machine", "op2_loop_time", "op2_chain_time", "ca_segment_time", "grouped_message_size", "gain_percent",
    "comm_reduction_percent", "comp_increase_percent", "ChainProfile", "LoopProfile", "SegmentProfile",
    "Calibration", "CalibrationKey", "calibrate", "apply", "measure", "load_calibration", "loop_costs", "Decision", "choose_ca",
]
