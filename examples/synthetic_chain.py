"""The MG-CFD synthetic loop chain of the OP2 communication-avoiding paper (§4.1.1).

Two loops over edges, repeated ``nchains`` times inside one chain:

* ``update``: ``INC res`` through e2n, reading ``pres`` through e2n;
* ``edge_flux``: ``READ res`` through e2n, ``READ cw`` (cell weights) through e2c,
  ``INC flux`` through e2n.

``edge_flux`` reads what ``update`` just incremented, so loop by loop every
``edge_flux`` exchanges ``res``; as one communication-avoiding chain the halo is
exchanged once, two layers deep, and the halo edges are computed redundantly.
Before each chain a direct loop over the nodes (``advance``, the solver's time step)
changes ``pres``, whose halo must then be exchanged again.

Run ``python examples/synthetic_chain.py --help``; under ``mpiexec -n N`` it partitions
the mesh over the ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

import meshchain as mc
from meshchain.meshes import structured_tris


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
    p.res.data[:] = 0
    p.flux.data[:] = 0


def checksum(p: SyntheticChain) -> float:
    """A number every rank count and mode must reproduce (sums of integers)."""
    flux = p.flux.gather()
    return None if flux is None else float(np.abs(flux).sum())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, metavar=("NX", "NY"), default=(100, 100),
                        help="structured triangle mesh of NX x NY squares (default 100 100)")
    parser.add_argument("--nchains", type=int, default=8, help="repetitions of the 2-loop chain (default 8)")
    parser.add_argument("--iters", type=int, default=20, help="chain executions (default 20)")
    parser.add_argument("--ca", choices=("on", "off", "auto", "none"), default="on",
                        help="communication-avoiding (on), chain run loop by loop (off), auto, or no chain")
    parser.add_argument("--partition", choices=("rib", "kway", "block"), default="kway")
    parser.add_argument("--tile-size", type=int, help="sparse-tile the chain (seed iterations per tile)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    ca = {"on": True, "off": False, "auto": "auto", "none": None}[args.ca]
    if args.tile_size is not None and ca is None:
        raise SystemExit("--tile-size tiles a chain: use it with --ca on, off or auto, not none")
    problem = declare(structured_tris(*args.size), method=args.partition)
    start = time.perf_counter()
    run(problem, args.nchains, args.iters, ca=ca, tile_size=args.tile_size)
    total = checksum(problem)
    elapsed = time.perf_counter() - start
    if total is not None:
        print(f"checksum {total:.1f}  ({elapsed / args.iters * 1e3:.3f} ms per chain of {2 * args.nchains} loops)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
