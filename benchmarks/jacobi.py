"""Five-point Jacobi on one rank: meshchain's structured grid against its map path, PETSc's
MatMult and a direct Numba loop (the floor).

The paper's kernel (``parsec-ca-stencil.txt``): five general weights, 9 flops per update,
on the interior of an ``n x n`` grid, sweeping between two arrays. Per variant and size:
milliseconds per sweep (median of ``--repeats`` rounds) and the ratio to the direct loop.
One Numba thread everywhere (Devito: compiled C without OpenMP, when it is installed; it is a
benchmark-only dependency). ``meshchain grid, captured``: the two sweeps of a time step
captured once with ``mc.capture`` and replayed (one compiled call per two sweeps); ``step.repeat``:
the same step's replays of a round made by one ``step.repeat(k)``, in one compiled call;
``wavefront tiles``: that step captured with ``tile_size`` (``--tile-lines`` interior lines per
tile): the two sweeps walk the grid together, the second a line behind the first. This is
the first part of issue 19's benchmark: no MPI and no communication-avoiding sweeps.

Usage::

    .venv/bin/python benchmarks/jacobi.py                 # n = 200 and 2000
    .venv/bin/python benchmarks/jacobi.py --sizes 100 1000 4000

Writes ``benchmarks/results/jacobi.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("MESHCHAIN_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numba  # noqa: E402
import numpy as np  # noqa: E402

import meshchain as mc  # noqa: E402

HERE = Path(__file__).resolve().parent
WEIGHTS = (0.2, 0.2, 0.2, 0.2, 0.2)
STAR = [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)]
TILE_LINES = 8
"""Interior lines per tile of the wavefront row (``--tile-lines``)."""


@mc.kernel
def sweep(s, out):
    out[0] = 0.2 * s[0, 0] + 0.2 * s[1, 0] + 0.2 * s[2, 0] + 0.2 * s[3, 0] + 0.2 * s[4, 0]


@mc.kernel
def sweep_map(s, out):
    out[0] = 0.2 * s[0, 0] + 0.2 * s[1, 0] + 0.2 * s[2, 0] + 0.2 * s[3, 0] + 0.2 * s[4, 0]


def _direct(u, v):
    n, m = u.shape
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            v[i, j] = 0.2 * u[i, j] + 0.2 * u[i - 1, j] + 0.2 * u[i + 1, j] + 0.2 * u[i, j - 1] + 0.2 * u[i, j + 1]


direct = numba.njit(nogil=True)(_direct)
direct_contracted = numba.njit(nogil=True, fastmath={"contract"})(_direct)  # the floor of fp_contract=True


def timed(step, sweeps: int, repeats: int) -> float:
    """Median seconds per sweep; ``step(k)`` does ``k`` sweeps (``k`` even)."""
    step(2)
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(sweeps)
        rounds.append((time.perf_counter() - start) / sweeps)
    return statistics.median(rounds)


def grid_variant(n: int, start: np.ndarray):
    mc.reset_runtime()
    g = mc.Grid((n, n), "g")
    a, b = mc.Dat(g, 1, start, "a"), mc.Dat(g, 1, start, "b")
    star, inner = mc.Stencil(STAR, "star"), g.interior(1)

    def step(k):
        for _ in range(k // 2):
            mc.par_loop(sweep, inner, a(mc.READ, star), b(mc.WRITE))
            mc.par_loop(sweep, inner, b(mc.READ, star), a(mc.WRITE))
        mc.flush()

    return step, lambda: a.data_ro.reshape(n, n).copy()


def captured_variant(n: int, start: np.ndarray, *, repeat: bool = False, tile_lines: int | None = None, **options):
    """The grid path with two sweeps captured as one step (``mc.capture``) and replayed;
    ``repeat``: the round's replays made by one ``step.repeat(k)`` (after the first, in one
    compiled call: the time loop inside, as Devito's) instead of ``k`` calls; ``tile_lines``:
    the two sweeps run as a wavefront, tiles of that many interior lines (``tile_size``);
    ``options``: the session's (``fp_contract=True``: multiplies and adds fused)."""
    mc.reset_runtime(**options)
    g = mc.Grid((n, n), "g")
    a, b = mc.Dat(g, 1, start, "a"), mc.Dat(g, 1, start, "b")
    star, inner = mc.Stencil(STAR, "star"), g.interior(1)

    @mc.capture(tile_size=None if tile_lines is None else tile_lines * (n - 2))
    def two_sweeps():
        mc.par_loop(sweep, inner, a(mc.READ, star), b(mc.WRITE))
        mc.par_loop(sweep, inner, b(mc.READ, star), a(mc.WRITE))

    def step(k):
        if repeat:
            two_sweeps.repeat(k // 2)
        else:
            for _ in range(k // 2):
                two_sweeps()
        mc.flush()

    return step, lambda: a.data_ro.reshape(n, n).copy()


def map_variant(n: int, start: np.ndarray):
    """Today's way without grids: a set of interior points and a map to their five points."""
    mc.reset_runtime()
    points = mc.Set(n * n, "points")
    i, j = np.meshgrid(np.arange(1, n - 1), np.arange(1, n - 1), indexing="ij")
    centre = (i * n + j).ravel()
    interior = mc.Set(len(centre), "interior")
    to_points = mc.Map(interior, points, 5, np.stack([centre + di * n + dj for di, dj in STAR], axis=1), "star")
    to_centre = mc.Map(interior, points, 1, centre[:, None], "centre")
    a, b = mc.Dat(points, 1, start.ravel(), "a"), mc.Dat(points, 1, start.ravel(), "b")

    def step(k):
        for _ in range(k // 2):
            mc.par_loop(sweep_map, interior, a(mc.READ, to_points), b(mc.WRITE, to_centre[0]))
            mc.par_loop(sweep_map, interior, b(mc.READ, to_points), a(mc.WRITE, to_centre[0]))
        mc.flush()

    return step, lambda: a.data_ro.reshape(n, n).copy()


def petsc_variant(n: int, start: np.ndarray):
    """PETSc's MatMult on the assembled five-point matrix (boundary rows: identity)."""
    try:
        import petsc4py

        petsc4py.init()
        from petsc4py import PETSc
    except ImportError:
        return None
    import scipy.sparse as sp

    size = n * n
    rows, cols, vals = [], [], []
    boundary = np.ones((n, n), dtype=bool)
    boundary[1:-1, 1:-1] = False
    ids = np.arange(size).reshape(n, n)
    for di, dj in STAR:
        rows.append(ids[1:-1, 1:-1].ravel())
        cols.append(ids[1 + di:n - 1 + di, 1 + dj:n - 1 + dj].ravel())
        vals.append(np.full(rows[-1].size, 0.2))
    rows.append(ids[boundary]), cols.append(ids[boundary]), vals.append(np.ones(boundary.sum()))
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size))
    M = PETSc.Mat().createAIJ(size=A.shape, csr=(A.indptr.astype(PETSc.IntType), A.indices.astype(PETSc.IntType),
                                                  A.data), comm=PETSc.COMM_SELF)
    x = PETSc.Vec().createWithArray(start.ravel().copy(), comm=PETSc.COMM_SELF)
    y = x.duplicate()

    def step(k):
        for _ in range(k // 2):
            M.mult(x, y)
            M.mult(y, x)

    return step, lambda: x.getArray().reshape(n, n).copy()


def devito_variant(n: int, start: np.ndarray, *, loop_inside: bool):
    """Devito (a benchmark-only dependency): the same update on ``grid.interior``, compiled
    C on one thread; with the time loop inside one ``apply()`` or one ``apply()`` per sweep."""
    try:
        import devito
    except ImportError:
        return None
    devito.configuration["log-level"] = "ERROR"
    devito.configuration["language"] = "C"
    grid = devito.Grid(shape=(n, n), dtype=np.float64)
    x, y = grid.dimensions
    t = grid.stepping_dim
    u = devito.TimeFunction(name="u", grid=grid, space_order=1, dtype=np.float64)  # its default is float32
    u.data[0], u.data[1] = start, start
    expr = 0.2 * u[t, x, y] + 0.2 * u[t, x - 1, y] + 0.2 * u[t, x + 1, y] + 0.2 * u[t, x, y - 1] + 0.2 * u[t, x, y + 1]
    operator = devito.Operator([devito.Eq(u.forward, expr, subdomain=grid.interior)])
    clock = [0]

    def step(k):
        if loop_inside:
            operator.apply(time_m=clock[0], time_M=clock[0] + k - 1)
        else:
            for c in range(clock[0], clock[0] + k):
                operator.apply(time_m=c, time_M=c)
        clock[0] += k

    def final():
        return np.array(u.data[clock[0] % 2])

    return step, final


def devito_inside(n, start):
    return devito_variant(n, start, loop_inside=True)


def devito_per_sweep(n, start):
    return devito_variant(n, start, loop_inside=False)


def direct_variant(n: int, start: np.ndarray, function=direct):
    u, v = start.copy(), start.copy()

    def step(k):
        for _ in range(k // 2):
            function(u, v)
            function(v, u)

    return step, lambda: u.copy()


def variants(tile_lines: int = TILE_LINES) -> dict:
    """Variant name -> ``make(n, start)`` (``tile_lines``: of the wavefront row)."""
    return {"meshchain grid": grid_variant, "meshchain grid, captured": captured_variant,
            "meshchain grid, captured, fp_contract=True": lambda n, start: captured_variant(n, start, fp_contract=True),
            "meshchain grid, captured, step.repeat": lambda n, start: captured_variant(n, start, repeat=True),
            "meshchain grid, captured, step.repeat, fp_contract=True":
                lambda n, start: captured_variant(n, start, repeat=True, fp_contract=True),
            "meshchain grid, captured, wavefront tiles, step.repeat":
                lambda n, start: captured_variant(n, start, repeat=True, tile_lines=tile_lines),
            "meshchain maps": map_variant, "PETSc MatMult": petsc_variant,
            "Devito, time loop inside": devito_inside, "Devito, apply() per sweep": devito_per_sweep,
            "direct Numba loop": direct_variant,
            "direct Numba loop, fastmath contract": lambda n, start: direct_variant(n, start, direct_contracted)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[200, 2000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tile-lines", type=int, default=TILE_LINES,
                        help=f"interior lines per wavefront tile (default {TILE_LINES})")
    parser.add_argument("--out", default=str(HERE / "results" / "jacobi.json"))
    args = parser.parse_args(argv)
    rows = []
    for n in args.sizes:
        start = np.random.default_rng(0).random((n, n))
        sweeps = max(4, int(4e8 // (n * n * 10)) // 2 * 2)
        results, finals = {}, {}
        for name, make in variants(args.tile_lines).items():
            made = make(n, start)
            if made is None:
                continue
            step, final = made
            results[name] = timed(step, sweeps, args.repeats)
            finals[name] = final()
        floor = results["direct Numba loop"]
        for name, seconds in results.items():
            agree = float(np.abs(finals[name] - finals["direct Numba loop"]).max())
            rows.append({"n": n, "variant": name, "ms_per_sweep": 1e3 * seconds, "x_direct": seconds / floor,
                         "max_difference": agree})
    print("| n | variant | ms per sweep | x direct loop | max difference to the direct loop |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['n']} | {row['variant']} | {row['ms_per_sweep']:.4f} | {row['x_direct']:.2f}x | "
              f"{row['max_difference']:.1e} |")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
