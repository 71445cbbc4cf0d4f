"""Five-point Jacobi on a structured grid (the CA-stencil paper's problem: five general
weights, 9 flops per update), with ``mc.Grid``, ``grid.interior(1)`` and ``mc.Stencil``.

Usage::

    python examples/jacobi.py                          # 2000 x 2000, 100 sweeps
    python examples/jacobi.py --size 500 800 --sweeps 40 --weights 0.6 0.1 0.1 0.1 0.1
    mpiexec -n 4 python examples/jacobi.py --size 400 400 --steps 15      # CA: 15 sweeps per exchange
    mpiexec -n 4 python examples/jacobi.py --size 400 400 --steps 15 --ratio 0.4
    mpiexec -n 4 python examples/jacobi.py --size 400 400 --boundary tasks   # tiles as tasks

Runs unchanged on one process or under ``mpiexec`` (the grid is cut into ``px x py`` blocks,
``--blocks`` or chosen). ``--steps s`` groups ``s`` sweeps into one loop chain run
communication-avoiding (``--ca``): one exchange of ``s``-deep ghosts, corners included, then
``s`` sweeps with redundant updates on the shrinking ghost region (PA1). ``--ratio r`` is the
paper's knob for emulating a faster kernel: each rank computes on ``r^2`` of its points while
it sends as many messages (here the grid is scaled by ``r`` per axis, so messages shrink by
``r`` too; with ``r = 1`` the problem is the one asked for). Prints the time per sweep and a
checksum (the sum of the final values).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import meshchain as mc

STAR = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)]


def jacobi_kernel(weights) -> mc.Kernel:
    """``out = w0 c + w1 north + w2 south + w3 west + w4 east`` (5 multiplications, 4 additions)."""
    terms = " + ".join(f"{w!r} * s[{k}, 0]" for k, w in enumerate(weights))
    return mc.Kernel.from_source(f"def jacobi(s, out):\n    out[0] = {terms}\n")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, default=[2000, 2000], metavar=("NX", "NY"))
    parser.add_argument("--sweeps", type=int, default=100,
                        help="Jacobi sweeps, a multiple of 2 * steps (default 100; the first chain is not timed)")
    parser.add_argument("--steps", type=int, default=1, help="sweeps per loop chain (one exchange each with CA)")
    parser.add_argument("--ca", choices=["on", "off", "auto"], default="on", help="how chains run (default on)")
    parser.add_argument("--ratio", type=float, default=1.0, help="the paper's kernel-speed knob, in (0, 1]")
    parser.add_argument("--blocks", nargs=2, type=int, default=None, metavar=("PX", "PY"))
    parser.add_argument("--weights", nargs=5, type=float, default=[0.2] * 5,
                        help="centre, north, south, west, east (default 0.2 each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--boundary", choices=["bulk", "tasks"], default="bulk",
                        help="on several ranks: run the ghost-dependent points after all messages (bulk) or in "
                             "tasks, each as soon as its neighbours' messages are in")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.sweeps < 2 * args.steps or args.sweeps % (2 * args.steps):
        parser.error("--sweeps must be a positive multiple of 2 * --steps")
    if not 0 < args.ratio <= 1:
        parser.error("--ratio must lie in (0, 1]")
    return args


@mc.kernel
def add_up(value, total):
    total[0] += value[0]


def run(args) -> tuple[float, float]:
    """``(seconds per sweep, checksum)``."""
    nx, ny = (max(3, round(args.ratio * n)) for n in args.size)
    g = mc.Grid((nx, ny), "grid")
    inner = g.interior(1)
    start = np.random.default_rng(args.seed).random((nx, ny)) if mc.get_runtime().rank == 0 else None
    a, b = mc.Dat(g, 1, start, "a"), mc.Dat(g, 1, start, "b")
    total = mc.Global(1, 0.0, "total")
    star, kernel = mc.Stencil(STAR, "star"), jacobi_kernel(args.weights)
    mc.partition("block", blocks=args.blocks)
    ca = {"on": True, "off": False, "auto": "auto"}[args.ca]

    def chain():
        with mc.loop_chain("jacobi", ca=ca):
            for _ in range(args.steps):
                mc.par_loop(kernel, inner, a(mc.READ, star), b(mc.WRITE))
                mc.par_loop(kernel, inner, b(mc.READ, star), a(mc.WRITE))

    chain()  # the first chain compiles and plans, outside the timing
    mc.flush()
    comm = mc.get_runtime().comm
    if comm is not None:
        comm.Barrier()
    began = time.perf_counter()
    chains = args.sweeps // (2 * args.steps) - 1
    for _ in range(chains):
        chain()
    mc.flush()
    seconds = (time.perf_counter() - began) / max(2 * args.steps * chains, 1)
    mc.par_loop(add_up, g, a(mc.READ), total(mc.INC))
    return seconds, float(total.value[0])


def main(argv=None) -> int:
    args = parse_args(argv)
    mc.configure(boundary=args.boundary)
    seconds, checksum = run(args)
    if mc.get_runtime().rank == 0:
        print(f"{args.size[0]} x {args.size[1]} (ratio {args.ratio}), {args.sweeps} sweeps in chains of "
              f"{2 * args.steps} on {mc.get_runtime().size} rank(s): {1e3 * seconds:.4f} ms per sweep, "
              f"checksum {checksum:.12e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
