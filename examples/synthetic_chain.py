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

The kernels and the chain live in ``meshchain.apps.synthetic``
(``src/meshchain/apps/synthetic.py``); this script is its command-line driver.

Run ``python examples/synthetic_chain.py --help``; under ``mpiexec -n N`` it partitions
the mesh over the ranks.
"""

from __future__ import annotations

import argparse
import sys
import time

import meshchain as mc
from meshchain.core.config import BACKENDS
from meshchain.apps.synthetic import *  # noqa: F401,F403 - re-exported: tests and benchmarks use sc.declare, .run, ...
from meshchain.apps.synthetic import checksum, declare, run
from meshchain.meshes import structured_tris


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
    parser.add_argument("--backend", choices=BACKENDS, help="execution backend (default: numba)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.backend is not None:
        mc.configure(backend=args.backend)
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
