"""Chain profitability: when communication avoidance pays.

For now only :func:`choose_ca`, the hook ``ca="auto"`` calls; the analytic model of the
OP2 paper (equations 1-4) and its calibration replace its placeholder rule.
"""

from .policy import ChainEstimate, choose_ca

__all__ = ["ChainEstimate", "choose_ca"]
