"""OP2's Airfoil: 2D inviscid Euler flow around a NACA0012 aerofoil, written with meshchain.

The five kernels and the constants follow OP2's ``airfoil.cpp`` exactly, operation
order included. OP2 assigns single-precision literals to its double constants
(``gam = 1.4f`` ...), so the constants are the float32 values of those literals.
The kernels, constants and time loop live in ``meshchain.apps.airfoil``
(``src/meshchain/apps/airfoil.py``); this script is its command-line driver.

Usage::

    python examples/airfoil.py                      # generated 720000-cell mesh, 1000 iterations
    python examples/airfoil.py --mesh new_grid.dat  # OP2 ASCII mesh
    python examples/airfoil.py --mesh new_grid.dat --iters 0 --write-mesh new_grid.h5   # convert it
    mpiexec -n 4 python examples/airfoil.py --mesh new_grid.h5   # OP2 HDF5: each rank reads its rows
    python examples/airfoil.py --size 100 150 --iters 200 --backend reference
    python examples/airfoil.py --backend cupy           # on an NVIDIA GPU
    mpiexec -n 4 python examples/airfoil.py --repartition-at 500 --repartition-method kway
    mpiexec -n 2 python examples/airfoil.py --iters 500 --checkpoint run.h5 --checkpoint-every 100
    mpiexec -n 3 python examples/airfoil.py --iters 1000 --restart run.h5   # continues at 501
    mpiexec -n 2 python examples/airfoil.py --output flow --output-every 50   # open flow/airfoil.xdmf in ParaView

Every 100 iterations it prints one line ``<iter> <rms>`` (rms as ``%.15e``).
"""

from __future__ import annotations

import argparse
import sys
import time

import meshchain as mc
from meshchain.apps.airfoil import *  # noqa: F401,F403 - re-exported: tests and benchmarks use airfoil.declare, .run, ...
from meshchain.apps.airfoil import declare, open_output, restore_state, run
from meshchain.core.config import BACKENDS, GPU_INCREMENTS
from meshchain.meshes import naca0012, read_op2_ascii, read_op2_hdf5, write_op2_hdf5


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", help="OP2 mesh: ASCII (new_grid.dat format) or HDF5 (.h5/.hdf5, OP2's layout); "
                                       "default: generated NACA0012 O-mesh")
    parser.add_argument("--write-mesh", metavar="PATH", help="write the mesh in OP2's HDF5 layout to PATH first")
    parser.add_argument("--size", nargs=2, type=int, metavar=("I", "J"), default=(400, 600),
                        help="generated mesh size, as OP2's generator (default 400 600: 720000 cells)")
    parser.add_argument("--iters", type=int, default=1000, help="iterations (default 1000)")
    parser.add_argument("--backend", choices=BACKENDS, help="execution backend")
    parser.add_argument("--gpu-increments", choices=GPU_INCREMENTS, help="cupy backend: atomicAdd or colouring")
    parser.add_argument("--threads", type=int, help="threads for the numba backend")
    parser.add_argument("--partition", choices=("rib", "kway", "block"), default="rib",
                        help="how to distribute the mesh under mpiexec (default rib)")
    parser.add_argument("--chain", choices=("none", "ca", "per-loop", "auto"), default="none",
                        help="run each stage as a loop chain: communication-avoiding, loop by loop, or auto")
    parser.add_argument("--tile-size", type=int, help="sparse-tile each stage chain (needs --chain ca or auto)")
    parser.add_argument("--repartition-at", type=int, metavar="N",
                        help="after iteration N, move the mesh to a new partition (mc.repartition)")
    parser.add_argument("--repartition-method", choices=("rib", "kway", "block"), default="rib",
                        help="partitioner for --repartition-at (default rib)")
    parser.add_argument("--transport", help="halo exchange transport: p2p, persistent, neighbour or rma")
    parser.add_argument("--output", metavar="DIR", help="write the flow for ParaView to DIR (airfoil.xdmf + HDF5)")
    parser.add_argument("--output-every", type=int, default=100, metavar="N",
                        help="with --output: write every N iterations (default 100)")
    parser.add_argument("--timing", action="store_true", help="print time per iteration and mc.stats() to stderr")
    parser.add_argument("--captured", action="store_true",
                        help="capture one iteration with mc.capture and replay it (its nine loops one chain, "
                             "loop by loop unless --chain ca/auto)")
    parser.add_argument("--checkpoint", metavar="PATH", help="save the flow state to PATH (HDF5, atomic)")
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="N",
                        help="with --checkpoint: every N iterations (default 100)")
    parser.add_argument("--restart", metavar="PATH",
                        help="start from a checkpoint (written on any number of ranks); the iteration count continues")
    return parser.parse_args(argv)


def read_mesh(args):
    """The mesh of ``--mesh`` (HDF5 by its suffix: each rank reads only its rows) or a generated one."""
    if not args.mesh:
        return naca0012(*args.size)
    if args.mesh.endswith((".h5", ".hdf5")):
        return read_op2_hdf5(args.mesh)
    return read_op2_ascii(args.mesh)


def main(argv=None) -> int:
    args = parse_args(argv)
    chosen = (("backend", args.backend), ("threads", args.threads), ("gpu_increments", args.gpu_increments),
              ("transport", args.transport))
    options = {k: v for k, v in chosen if v is not None}
    if options:
        mc.configure(**options)
    problem = declare(read_mesh(args), method=args.partition)
    if args.write_mesh:
        write_op2_hdf5(problem, args.write_mesh)
    ncell = problem.cells.size
    rank = mc.get_runtime().comm.rank if mc.get_runtime().comm is not None else 0
    start = time.perf_counter()
    ca = {"none": None, "ca": True, "per-loop": False, "auto": "auto"}[args.chain]
    if args.tile_size is not None and ca is None:
        ca = True  # tiling needs a chain
    first = restore_state(problem, args.restart) if args.restart else 0
    write = None
    if args.output:
        write = open_output(problem, args.output, every=args.output_every, keep_until=first if args.restart else None)
        if not args.restart:
            write(0)  # the initial state
    run(problem, args.iters, out=sys.stdout if rank == 0 else None, ca=ca, tile_size=args.tile_size,
        repartition_at=args.repartition_at, repartition_method=args.repartition_method, start=first,
        checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every, on_iteration=write,
        captured=args.captured)
    elapsed = time.perf_counter() - start
    stats = mc.stats()
    if args.timing and rank == 0:
        print(f"{elapsed / max(args.iters, 1) * 1e3:.3f} ms per iteration ({ncell} cells)", file=sys.stderr)
        print(stats, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
