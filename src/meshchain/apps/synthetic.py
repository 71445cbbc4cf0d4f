"""The MG-CFD synthetic loop chain of the OP2 communication-avoiding paper (§4.1.1).

This is the solver library of the synthetic chain: its kernels, the declaration of its
data, and its time loop. The command-line driver is ``examples/synthetic_chain.py``.

One time step (:func:`run`) is a direct loop over the nodes, then the chain
``"synthetic"``: ``nchains`` repetitions of two loops over the edges::

    advance    nodes  rewrites pres (the solver's time step), before the chain
    update     edges  reads pres, increments res (both through e2n)
    edge_flux  edges  reads res (through e2n) and cw, the cell weights (through e2c);
                      increments flux (through e2n)

Because ``edge_flux`` reads the ``res`` that ``update`` has just incremented, the chain
run loop by loop exchanges the ``res`` halo before every ``edge_flux``. Run as one
communication-avoiding chain it exchanges halos once per execution, two layers deep,
and computes the halo edges redundantly; ``advance`` makes the ``pres`` halo stale
again before the next execution.

All values are small integers, so every rank count, chain mode and dtype gives the same
:func:`checksum` exactly.

Workload interface
------------------
:func:`setup`, :func:`step`, :data:`CHAIN`, :func:`loops_in_chain` and :func:`checksum`
run the chain as a profiling workload (see :mod:`meshchain.apps`): the main set is the
edges, the chain has ``loops`` loops (``loops / 2`` repetitions of the pair).

Examples
--------
>>> from meshchain.apps import synthetic
>>> from meshchain.meshes import structured_tris
>>> problem = synthetic.declare(structured_tris(6, 6))
>>> synthetic.run(problem, 2, 3, ca=True)
>>> synthetic.checksum(problem) > 0
True
"""

from __future__ import annotations

import dataclasses
import numpy as np

import meshchain as mc

from . import _check_chain_mode, _paired_workload, _pairs

__all__ = [
    "update", "edge_flux", "advance", "SyntheticChain", "declare", "record", "run", "reset",
    "CHAIN", "SyntheticWorkload", "setup", "step", "loops_in_chain", "checksum",
]


@mc.kernel
def update(res1, res2, pres1, pres2):
    res1[0] += pres1[0] - pres1[1]
    res1[1] += pres2[0] - pres2[1]
    res2[0] += pres2[1] - pres2[0]
    res2[1] += pres1[1] - pres1[0]


@mc.kernel
def edge_flux(flux1, flux2, res1, res2, cw1, cw2):
    flux1[0] += res1[0] * cw1[0] - res1[1] * cw1[1]
    flux1[1] += res2[1] * cw1[2] - res2[0] * cw1[3]
    flux2[0] += res2[1] * cw2[2] - res1[1] * cw2[3]
    flux2[1] += res1[0] * cw2[0] - res1[1] * cw2[1]


@mc.kernel
def advance(pres):
    pres[0] = (pres[0] * 3 + 1) % 7 - 3
    pres[1] = (pres[1] * 5 + 2) % 7 - 3


@dataclasses.dataclass
class SyntheticChain:
    """The sets, maps and dats of the synthetic chain (``edges`` are the mesh's interior facets)."""

    nodes: mc.Set
    edges: mc.Set
    cells: mc.Set
    e2n: mc.Map
    e2c: mc.Map
    res: mc.Dat
    pres: mc.Dat
    flux: mc.Dat
    cw: mc.Dat


def declare(mesh, *, dtype=np.float64, method: str = "kway", seed: int = 0) -> SyntheticChain:
    """Declare the chain's data on ``mesh`` (a :class:`~meshchain.meshes.UnstructuredMesh`;
    its interior facets are the edges) and partition it over the ranks.

    Values are small integers (exact in any dtype), so integer and float runs agree.
    """
    d = mesh.declare()
    rng = np.random.default_rng(seed)
    problem = SyntheticChain(
        nodes=d.nodes, edges=d.facets, cells=d.cells, e2n=d.facet2node, e2c=d.facet2cell,
        res=mc.Dat(d.nodes, 2, None, "res", dtype=dtype),
        pres=mc.Dat(d.nodes, 2, rng.integers(-3, 4, size=(mesh.nnode, 2)).astype(dtype), "pres", dtype=dtype),
        flux=mc.Dat(d.nodes, 2, None, "flux", dtype=dtype),
        cw=mc.Dat(d.cells, 4, rng.integers(-2, 3, size=(mesh.ncell, 4)).astype(dtype), "cw", dtype=dtype),
    )
    mc.partition(method, coords=d.coords, seed_set=d.cells)
    return problem


def record(p: SyntheticChain, nchains: int) -> None:
    """Record ``nchains`` repetitions of update and edge_flux."""
    for _ in range(nchains):
        mc.par_loop(update, p.edges, p.res(mc.INC, p.e2n[0]), p.res(mc.INC, p.e2n[1]),
                    p.pres(mc.READ, p.e2n[0]), p.pres(mc.READ, p.e2n[1]))
        mc.par_loop(edge_flux, p.edges, p.flux(mc.INC, p.e2n[0]), p.flux(mc.INC, p.e2n[1]),
                    p.res(mc.READ, p.e2n[0]), p.res(mc.READ, p.e2n[1]),
                    p.cw(mc.READ, p.e2c[0]), p.cw(mc.READ, p.e2c[1]))


def run(p: SyntheticChain, nchains: int, iters: int, *, ca=True, tile_size=None) -> None:
    """``iters`` time steps: ``advance``, then the chain (``ca=None``: no chain, loop by loop;
    ``tile_size``: sparse-tile the chain)."""
    for _ in range(iters):
        mc.par_loop(advance, p.nodes, p.pres(mc.RW))
        if ca is None:
            record(p, nchains)
            mc.flush()
        else:
            with mc.loop_chain("synthetic", ca=ca, tile_size=tile_size):
                record(p, nchains)


def reset(p: SyntheticChain) -> None:
    """Zero ``res`` and ``flux`` (``pres`` keeps its values)."""
    p.res.data[:] = 0
    p.flux.data[:] = 0


def checksum(p: SyntheticChain) -> float | None:
    """A number every rank count and mode must reproduce (sums of integers): the sum of
    ``|flux|`` over all nodes, on rank 0 (None on other ranks).

    Examples
    --------
    >>> from meshchain.apps import synthetic
    >>> problem = synthetic.setup(per_rank=200, loops=4)
    >>> synthetic.checksum(problem)  # nothing has run yet
    0.0
    >>> synthetic.step(problem, ca=True)
    >>> synthetic.checksum(problem)
    8124.0
    """
    flux = p.flux.gather()
    return None if flux is None else float(np.abs(flux).sum())


# -- workload interface (see meshchain.apps) ---------------------------------------------

CHAIN = "synthetic"
"""The name of the synthetic loop chain."""

@dataclasses.dataclass
class SyntheticWorkload(SyntheticChain):
    """A :class:`SyntheticChain` with the number of ``update``/``edge_flux`` pairs that
    :func:`step` runs in its chain."""

    nchains: int = 1


_PAIR = "the synthetic chain repeats a pair of loops (update, edge_flux)"


def setup(*, per_rank: int, loops: int, method: str = "kway") -> SyntheticWorkload:
    """Build a triangle mesh with about ``per_rank`` edges per MPI rank, declare the chain's
    data on it and partition it.

    Parameters
    ----------
    per_rank : int, keyword-only
        Edges (interior facets) each rank should own. ``structured_tris(n, n)`` has about
        ``3 n^2`` of them, so ``n = max(4, round(sqrt(per_rank * nranks / 3)))``.
    loops : int, keyword-only
        Loops in the chain: an even number, at least 2 (``loops / 2`` repetitions of
        ``update`` and ``edge_flux``).
    method : {"kway", "rib", "block"}, keyword-only
        Partitioner (see :func:`meshchain.partition`).

    Returns
    -------
    SyntheticWorkload
        The declared, partitioned problem, with ``nchains = loops // 2``.

    Raises
    ------
    meshchain.ConfigurationError
        ``loops`` is odd or less than 2, or ``per_rank`` is not a positive integer.

    Examples
    --------
    >>> from meshchain.apps import synthetic
    >>> problem = synthetic.setup(per_rank=200, loops=4)  # structured_tris(8, 8), one process
    >>> problem.edges.size, problem.nchains
    (176, 2)
    """
    return _paired_workload(SyntheticWorkload, declare, per_rank=per_rank, loops=loops, chain=_PAIR, method=method)


def step(problem: SyntheticWorkload, *, ca) -> None:
    """One time step: ``advance``, then the chain as ``mc.loop_chain("synthetic", ca=ca)``.

    Parameters
    ----------
    problem : SyntheticWorkload
        From :func:`setup`.
    ca : True, False or "auto", keyword-only
        Communication-avoiding chain, chain run loop by loop, or the runtime's choice.

    Examples
    --------
    >>> from meshchain.apps import synthetic
    >>> problem = synthetic.setup(per_rank=200, loops=4)
    >>> synthetic.step(problem, ca=True)
    >>> synthetic.step(problem, ca=False)  # modes can alternate: the results agree
    >>> synthetic.checksum(problem)
    15532.0
    """
    _check_chain_mode(ca)
    run(problem, problem.nchains, 1, ca=ca)


def loops_in_chain(loops: int) -> int:
    """The loops in the chain for a request of ``loops``: ``loops`` itself, which must be
    even and at least 2 (:class:`~meshchain.ConfigurationError` otherwise).

    Examples
    --------
    >>> from meshchain.apps import synthetic
    >>> synthetic.loops_in_chain(8)
    8
    """
    return 2 * _pairs(loops, _PAIR)
