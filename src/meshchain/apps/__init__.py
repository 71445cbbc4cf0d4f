"""Example applications written with meshchain, importable from the installed package.

Each module holds one solver's kernels, data declarations and time loop; the scripts in
``examples/`` are thin command-line drivers around them.

* :mod:`meshchain.apps.airfoil`: OP2's Airfoil (2D Euler flow around a NACA0012 aerofoil);
  its predictor/corrector stage is the loop chain ``"stage"``.
* :mod:`meshchain.apps.mgcfd`: Warwick's MG-CFD (3D multigrid finite-volume Euler, the OP2
  CA paper's application), equal to OP2's own MG-CFD; its synthetic chain is ``"synthetic"``.
* :mod:`meshchain.apps.synthetic`: the MG-CFD synthetic loop chain of the OP2
  communication-avoiding paper; the chain ``"synthetic"``.
* :mod:`meshchain.apps.vertex`: a vertex-centred finite-volume chain (edge fluxes into
  the nodes, then a direct update of the nodes); the chain ``"vertex"``.
* :mod:`meshchain.apps.poisson`: P1 finite elements for Poisson's equation, assembled into a
  :class:`~meshchain.Mat` and solved with :func:`meshchain.solve`.
* :mod:`meshchain.apps.advection_diffusion`: upwinded advection-diffusion, a nonsymmetric
  :class:`~meshchain.Mat` for the nonsymmetric Krylov methods.

Workload interface
------------------
Both modules offer the same small interface, used to profile them side by side:

``setup(*, per_rank, loops, method=...) -> problem``
    Build a mesh sized so that each MPI rank owns about ``per_rank`` iterations of the
    chain's main set, declare the data on it and partition it.
``step(problem, *, ca) -> None``
    One time step, with the chain run as ``mc.loop_chain(CHAIN, ca=ca)``;
    ``ca`` is True, False or ``"auto"``.
``CHAIN``
    The chain's name (``"stage"``, ``"synthetic"``).
``loops_in_chain(loops) -> int``
    How many loops the chain really has when ``loops`` are requested.
``checksum(problem) -> float | None``
    A number every rank count and mode reproduces, on rank 0 (``None`` on other ranks).

Examples
--------
>>> from meshchain.apps import airfoil, synthetic
>>> airfoil.CHAIN, airfoil.loops_in_chain(10), synthetic.CHAIN, synthetic.loops_in_chain(10)
('stage', 4, 'synthetic', 10)
"""

from __future__ import annotations

import dataclasses
import math

from ..core.errors import ConfigurationError
from ..meshes import structured_tris

__all__: list[str] = []


def _total_size(per_rank: int) -> int:
    """``per_rank`` times the number of MPI ranks (1 without MPI): the workload's global size."""
    if isinstance(per_rank, bool) or not isinstance(per_rank, int) or per_rank < 1:
        raise ConfigurationError(f"per_rank must be a positive integer, got {per_rank!r}.")
    from ..api import get_runtime

    comm = get_runtime().comm
    return per_rank * (1 if comm is None else comm.size)


def _pairs(loops: int, chain: str) -> int:
    """The repetitions of a pair of loops in a chain of ``loops`` loops (even, at least 2);
    ``chain`` says what the pair is, for the error."""
    if isinstance(loops, bool) or not isinstance(loops, int) or loops < 2 or loops % 2:
        raise ConfigurationError(f"{chain}: loops must be an even integer >= 2, got {loops!r}.")
    return loops // 2


def _paired_workload(kind, declare, *, per_rank: int, loops: int, chain: str, method: str):
    """A ``kind`` (a workload dataclass: the fields of what ``declare`` returns plus
    ``nchains``) on ``structured_tris(n, n)`` sized for about ``per_rank`` edges per rank,
    with ``loops / 2`` repetitions of the chain's pair of loops (``chain`` says what the
    pair is, for the error)."""
    nchains = _pairs(loops, chain)
    n = _mesh_size(_total_size(per_rank))
    problem = declare(structured_tris(n, n), method=method)
    return kind(**{f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}, nchains=nchains)


def _mesh_size(nedge: int) -> int:
    """``n`` such that ``structured_tris(n, n)`` has about ``nedge`` (``3 n^2``) interior
    edges; at least 4.

    >>> _mesh_size(30000)
    100
    """
    return max(4, round(math.sqrt(nedge / 3)))


def _check_chain_mode(ca) -> None:
    """A workload step always runs its chain: ``ca=None`` (no chain) is refused here; other
    values are checked by :class:`meshchain.loop_chain`."""
    if ca is None:
        raise ConfigurationError("a workload step runs its loop chain: ca must be True, False or 'auto', not None.")
