"""Five-point Jacobi on a structured grid (the CA-stencil paper's problem: five general
weights, 9 flops per update), with ``mc.Grid``, ``grid.interior(1)`` and ``mc.Stencil``.

Usage::

    python examples/jacobi.py                          # 2000 x 2000, 100 sweeps
    python examples/jacobi.py --size 500 800 --sweeps 40 --weights 0.6 0.1 0.1 0.1 0.1

Prints the time per sweep and a checksum (the sum of the final values). Structured grids
run on one process for now (issue 19: block decomposition and communication-avoiding sweeps
come next); on several ranks the script stops with meshchain's error saying so.
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
    parser.add_argument("--sweeps", type=int, default=100, help="Jacobi sweeps, an even number (default 100)")
    parser.add_argument("--weights", nargs=5, type=float, default=[0.2] * 5,
                        help="centre, north, south, west, east (default 0.2 each)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.sweeps < 2 or args.sweeps % 2:
        parser.error("--sweeps must be an even number >= 2")
    return args


def run(args) -> tuple[float, float]:
    """``(seconds per sweep, checksum)``."""
    nx, ny = args.size
    g = mc.Grid((nx, ny), "grid")
    start = np.random.default_rng(args.seed).random((nx, ny))
    a, b = mc.Dat(g, 1, start, "a"), mc.Dat(g, 1, start, "b")
    star, inner, kernel = mc.Stencil(STAR, "star"), g.interior(1), jacobi_kernel(args.weights)
    mc.par_loop(kernel, inner, a(mc.READ, star), b(mc.WRITE))  # compile outside the timing
    mc.flush()
    began = time.perf_counter()
    for _ in range(args.sweeps // 2):
        mc.par_loop(kernel, inner, a(mc.READ, star), b(mc.WRITE))
        mc.par_loop(kernel, inner, b(mc.READ, star), a(mc.WRITE))
    checksum = float(a.data_ro.sum())
    return (time.perf_counter() - began) / args.sweeps, checksum


def main(argv=None) -> int:
    args = parse_args(argv)
    seconds, checksum = run(args)
    print(f"{args.size[0]} x {args.size[1]}, {args.sweeps} sweeps: {1e3 * seconds:.4f} ms per sweep, "
          f"checksum {checksum:.12e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
