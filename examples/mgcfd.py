"""MG-CFD: Warwick's 3D multigrid finite-volume Euler mini-app, written with meshchain.

The kernels, declarations and multigrid cycle live in ``meshchain.apps.mgcfd``
(``src/meshchain/apps/mgcfd.py``); this script is its command-line driver. It reads MG-CFD's
input (``input.dat`` and one HDF5 file per level, OP2's layout; each rank reads only its
block of rows) or generates a channel with a bump (:func:`meshchain.meshes.channel_bump`).

Usage::

    python examples/mgcfd.py --generate 8 --levels 3 --cycles 10        # 9 537 nodes, 3 levels
    python examples/mgcfd.py --generate 64 --levels 4 --write-mesh mesh --cycles 0   # write MG-CFD input
    mpiexec -n 4 python examples/mgcfd.py --input mesh/input.dat --cycles 25
    mpiexec -n 2 python examples/mgcfd.py --input mesh/input.dat --synthetic-loops 8 --ca on
    python examples/mgcfd.py --generate 16 --levels 4 --cycles 50 --captured   # each cycle replayed
    python examples/mgcfd.py --input mesh/input.dat --cycles 10 --synthetic-loops 2 \\
        --write-variables out/ --compare op2/        # against OP2's --output-variables files

Every cycle it prints ``<cycle> <rms>`` (the rms of the level-0 step's residual, ``%.15e``).
``--write-variables PREFIX`` writes each level's final variables as OP2's MG-CFD does
(``PREFIXvariables.L<l>.cycles=<N>.chains=<C>.h5``, dataset ``p_variables_result_L<l>``);
``--compare PREFIX`` reads OP2's files of that name and prints the largest relative
difference per level. ``--captured`` captures the cycle once with ``mc.capture`` and replays
it every cycle (the same rms history; the whole cycle is one chain, run as ``--ca`` says):
no Python between its loops.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import meshchain as mc
from meshchain.apps import mgcfd
from meshchain.meshes import channel_bump


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input", help="MG-CFD's input.dat (its [levels] files beside it)")
    source.add_argument("--generate", type=int, metavar="N", default=8,
                        help="generate a channel with a bump, N hexahedra across (3N along; default 8)")
    parser.add_argument("--levels", type=int, default=3, help="multigrid levels of a generated mesh (default 3)")
    parser.add_argument("--shuffle", action="store_true", help="number a generated mesh's nodes and edges at random")
    parser.add_argument("--write-mesh", metavar="DIR", help="write the generated mesh as MG-CFD input into DIR first")
    parser.add_argument("--cycles", "--iters", type=int, default=10, help="multigrid cycles (default 10)")
    parser.add_argument("--synthetic-loops", type=int, default=0,
                        help="loops of the OP2 CA paper's synthetic chain in each Runge-Kutta stage (even; default 0)")
    parser.add_argument("--ca", choices=("on", "off", "auto"), default="off",
                        help="run the synthetic chain communication-avoiding (default off: loop by loop)")
    parser.add_argument("--partition", choices=("rib", "kway"), default="rib", help="how to distribute the mesh")
    parser.add_argument("--captured", action="store_true",
                        help="capture the cycle once (mc.capture) and replay it every cycle (not with --snapshots)")
    parser.add_argument("--write-variables", metavar="PREFIX", help="write the final variables as OP2's MG-CFD does")
    parser.add_argument("--compare", metavar="PREFIX", help="compare the final variables with OP2's files")
    parser.add_argument("--snapshots", metavar="PREFIX", help="write level 0's variables after each of its steps, as "
                                                               "OP2's MG-CFD does with -I 1")
    return parser.parse_args(argv)


def variables_path(prefix: str, level: int, cycles: int, chains: int) -> str:
    """The name OP2's MG-CFD gives a level's final variables (``--output-variables``)."""
    return f"{prefix}variables.L{level}.cycles={cycles}.chains={chains}.h5"


def write_variables(problem: mgcfd.MGCFD, prefix: str, cycles: int) -> None:
    """Each level's variables in global numbering, in OP2's output layout (rank 0 writes)."""
    import h5py

    chains = max(problem.synthetic_loops // 2, 1)
    for index, level in enumerate(problem.levels):
        values = level.variables.gather()
        if values is not None:
            with h5py.File(variables_path(prefix, index, cycles, chains), "w") as f:
                f.create_dataset(f"p_variables_result_L{index}", data=np.asarray(values, dtype=np.float64))


def snapshot_path(prefix: str, cycle: int) -> str:
    """The name of OP2's MG-CFD ``-I`` snapshot of level 0 after cycle ``cycle``'s step."""
    return f"{prefix}variables.L0.cycle={cycle}.h5"


def write_snapshot(problem: mgcfd.MGCFD, prefix: str) -> None:
    """Level 0's variables now, as OP2's ``-I 1`` writes them (dataset ``p_variables``)."""
    import h5py

    values = problem.levels[0].variables.gather()
    if values is not None:
        with h5py.File(snapshot_path(prefix, problem.cycles_done + 1), "w") as f:
            f.create_dataset("p_variables", data=np.asarray(values, dtype=np.float64))


def compare(problem: mgcfd.MGCFD, prefix: str, cycles: int, out=sys.stdout) -> list[float]:
    """The largest relative difference of each level's variables from OP2's (rank 0; None
    elsewhere): ``max |v - v_OP2| / max |v_OP2|`` per level."""
    import h5py

    chains = max(problem.synthetic_loops // 2, 1)
    found = []
    for index, level in enumerate(problem.levels):
        values = level.variables.gather()
        if values is None:
            continue
        with h5py.File(variables_path(prefix, index, cycles, chains), "r") as f:
            reference = np.asarray(f[f"p_variables_result_L{index}"][()]).reshape(values.shape)
        found.append(float(np.abs(values - reference).max() / np.abs(reference).max()))
        print(f"level {index}: largest relative difference from OP2 {found[-1]:.3e}", file=out)
    return found


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.input is None:
        mesh = channel_bump(args.generate, levels=args.levels, shuffle=args.shuffle)
        if args.write_mesh:
            comm = mc.get_runtime().comm
            if comm is None or comm.rank == 0:
                print(f"wrote {mesh.write(args.write_mesh)}")
        source = mesh
    else:
        source = args.input
    ca = {"on": True, "off": False, "auto": "auto"}[args.ca]
    began = time.perf_counter()
    problem = mgcfd.declare(source, synthetic_loops=args.synthetic_loops, ca=ca, method=args.partition)
    set_up = time.perf_counter() - began
    comm = mc.get_runtime().comm
    root = comm is None or comm.rank == 0
    began = time.perf_counter()
    snapshot = (lambda p: write_snapshot(p, args.snapshots)) if args.snapshots else None
    mgcfd.run(problem, args.cycles, out=sys.stdout if root else None, after_level0=snapshot, captured=args.captured)
    seconds = time.perf_counter() - began
    if root:
        sizes = [level.nodes.size for level in problem.levels]
        print(f"levels {sizes} nodes; set-up {set_up:.2f} s; {args.cycles} cycles in {seconds:.3f} s "
              f"({seconds / max(args.cycles, 1) * 1e3:.2f} ms per cycle)")
    if args.write_variables:
        write_variables(problem, args.write_variables, args.cycles)
    if args.compare:
        compare(problem, args.compare, args.cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
