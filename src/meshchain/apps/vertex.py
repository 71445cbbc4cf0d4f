"""A vertex-centred finite-volume chain: edge fluxes into the nodes, then a node update.

The most common unstructured finite-volume pattern (MG-CFD's own, on which the OP2
paper's synthetic chain is modelled), as a chain ``"vertex"`` of ``nchains`` steps::

    flux    edges  reads u through e2n and the edge weight w; increments res through e2n
    relax   nodes  u = f(u, res), acc += res, res = 0 (a direct loop on a set no map
                   starts from)

Run loop by loop, every ``flux`` exchanges the ``u`` halo that the ``relax`` before it
made stale: one message per neighbour per step. Run communication-avoiding, the node
updates run redundantly on the nodes' halo, one layer less per step, and the whole chain
needs one grouped message per neighbour, ``nchains`` layers deep.

All values are small integers, so every rank count, chain mode and dtype gives the same
:func:`checksum` exactly.

The module offers the workload interface of :mod:`meshchain.apps` (:func:`setup`,
:func:`step`, :data:`CHAIN`, :func:`loops_in_chain`, :func:`checksum`).

Examples
--------
>>> from meshchain.apps import vertex
>>> from meshchain.meshes import structured_tris
>>> problem = vertex.declare(structured_tris(6, 6))
>>> vertex.run(problem, 3, 2, ca=True)
>>> vertex.checksum(problem)
1052.0
"""

from __future__ import annotations

import dataclasses

import numpy as np

import meshchain as mc

from . import _check_chain_mode, _paired_workload, _pairs

__all__ = ["flux", "relax", "VertexChain", "declare", "record", "run", "CHAIN", "VertexWorkload", "setup", "step",
           "loops_in_chain", "checksum"]


@mc.kernel
def flux(w, u1, u2, res1, res2):
    f0 = w[0] * (u2[0] - u1[0])
    f1 = w[0] * (u2[1] - u1[1]) + u1[0]
    res1[0] += f0
    res1[1] += f1
    res2[0] -= f0
    res2[1] -= f1


@mc.kernel
def relax(u, res, acc):
    u[0] = (u[0] + res[0]) % 7 - 3
    u[1] = (u[1] + 2 * res[1]) % 5 - 2
    acc[0] += res[0] - res[1]
    res[0] = 0
    res[1] = 0


@dataclasses.dataclass
class VertexChain:
    """The sets, maps and dats of the chain (``edges`` are the mesh's interior facets)."""

    nodes: mc.Set
    edges: mc.Set
    e2n: mc.Map
    w: mc.Dat
    u: mc.Dat
    res: mc.Dat
    acc: mc.Dat


def declare(mesh, *, dtype=np.float64, method: str = "kway", seed: int = 0) -> VertexChain:
    """Declare the chain's data on ``mesh`` (a :class:`~meshchain.meshes.UnstructuredMesh`;
    its interior facets are the edges) and partition it over the ranks."""
    d = mesh.declare()
    rng = np.random.default_rng(seed)
    nedge = d.facets.size
    problem = VertexChain(
        nodes=d.nodes, edges=d.facets, e2n=d.facet2node,
        w=mc.Dat(d.facets, 1, rng.integers(-2, 3, size=(nedge, 1)).astype(dtype), "w", dtype=dtype),
        u=mc.Dat(d.nodes, 2, rng.integers(-3, 4, size=(mesh.nnode, 2)).astype(dtype), "u", dtype=dtype),
        res=mc.Dat(d.nodes, 2, None, "res", dtype=dtype),
        acc=mc.Dat(d.nodes, 1, None, "acc", dtype=dtype),
    )
    mc.partition(method, coords=d.coords, seed_set=d.cells)
    return problem


def record(p: VertexChain, nchains: int) -> None:
    """Record ``nchains`` steps of flux and relax."""
    for _ in range(nchains):
        mc.par_loop(flux, p.edges, p.w(mc.READ), p.u(mc.READ, p.e2n[0]), p.u(mc.READ, p.e2n[1]),
                    p.res(mc.INC, p.e2n[0]), p.res(mc.INC, p.e2n[1]))
        mc.par_loop(relax, p.nodes, p.u(mc.RW), p.res(mc.RW), p.acc(mc.RW))


def run(p: VertexChain, nchains: int, iters: int, *, ca=True, tile_size=None) -> None:
    """``iters`` executions of the chain (``ca=None``: no chain, loop by loop;
    ``tile_size``: sparse-tile the chain)."""
    for _ in range(iters):
        if ca is None:
            record(p, nchains)
            mc.flush()
        else:
            with mc.loop_chain(CHAIN, ca=ca, tile_size=tile_size):
                record(p, nchains)


def checksum(p: VertexChain) -> float | None:
    """The sum of ``|acc|`` and ``|u|`` over all nodes, on rank 0 (None on other ranks): a
    number every rank count and mode must reproduce exactly."""
    acc, u = p.acc.gather(), p.u.gather()
    return None if acc is None else float(np.abs(acc).sum() + np.abs(u).sum())


# -- workload interface (see meshchain.apps) ---------------------------------------------

CHAIN = "vertex"
"""The name of the vertex-centred loop chain."""

_PAIR = "the vertex-centred chain repeats a pair of loops (flux, relax)"


@dataclasses.dataclass
class VertexWorkload(VertexChain):
    """A :class:`VertexChain` with the number of (flux, relax) steps :func:`step` chains."""

    nchains: int = 1


def setup(*, per_rank: int, loops: int, method: str = "kway") -> VertexWorkload:
    """A triangle mesh with about ``per_rank`` edges per MPI rank, the chain's data declared
    on it and partitioned; ``loops`` (even, at least 2) loops in the chain.

    Raises
    ------
    meshchain.ConfigurationError
        ``loops`` is odd or less than 2, or ``per_rank`` is not a positive integer.

    Examples
    --------
    >>> from meshchain.apps import vertex
    >>> problem = vertex.setup(per_rank=200, loops=6)
    >>> problem.edges.size, problem.nchains
    (176, 3)
    """
    return _paired_workload(VertexWorkload, declare, per_rank=per_rank, loops=loops, chain=_PAIR, method=method)


def step(problem: VertexWorkload, *, ca) -> None:
    """One execution of the chain as ``mc.loop_chain("vertex", ca=ca)`` (True, False or
    ``"auto"``)."""
    _check_chain_mode(ca)
    run(problem, problem.nchains, 1, ca=ca)


def loops_in_chain(loops: int) -> int:
    """The loops in the chain for a request of ``loops`` (even, at least 2): ``loops``.

    >>> from meshchain.apps import vertex
    >>> vertex.loops_in_chain(8)
    8
    """
    return 2 * _pairs(loops, _PAIR)
