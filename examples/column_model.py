"""Heat in a slab of prisms: a column model on a mesh extruded from an unstructured triangle mesh.

The base is a jittered Delaunay triangulation of the unit square; ``--layers`` prisms stand on
each triangle (``mc.ExtrudedSet``), over a depth of 1. The temperature ``T`` of each prism
(finite volumes) diffuses

* **vertically**, across the horizontal facets between adjacent layers
  (``region=mc.ON_INTERIOR_FACETS``: a whole-map argument through an extruded map sees the
  prism below and the prism above);
* **horizontally**, across the vertical facets between neighbouring columns: the base mesh's
  interior edges extruded too (a second ``mc.ExtrudedSet``), mapped to their two prisms with
  ``offset=1``;

and the top layer is heated by a flux ``Q`` (``region=mc.ON_TOP``); the other sides are
insulated. Explicit Euler steps, one loop chain per step (``--ca on``: communication-avoiding).
The heat content ``sum(T * volume)`` must grow by exactly ``Q * area * time``: the script prints
that budget's relative error (rounding only) and a checksum of ``T``, and runs unchanged on
several ranks (the same checksum, to rounding).

Usage::

    python examples/column_model.py                                  # 400 points, 20 layers
    python examples/column_model.py --n 2000 --layers 40 --steps 200
    python examples/column_model.py --output out/ --every 10         # ParaView: out/column.xdmf
    mpiexec -n 3 python examples/column_model.py --ca on

Prints ``prisms <n> layers <L> ranks <p>``, then ``step <k> heat <H> top-mean <T>`` every
``--every`` steps and ``budget error <e> checksum <s>`` at the end. Exits with 1 if the budget
error exceeds 1e-10.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import meshchain as mc
from meshchain.meshes import jittered_delaunay


@mc.kernel
def vertical_flux(t, dt_, k):
    f = k[0] * (t[1, 0] - t[0, 0])
    dt_[0, 0] += f
    dt_[1, 0] -= f


@mc.kernel
def horizontal_flux(t, area, w, dt_, k):
    f = k[1] * w[0] * (t[1, 0] - t[0, 0])
    dt_[0, 0] += f / area[0, 0]
    dt_[1, 0] -= f / area[1, 0]


@mc.kernel
def heat_top(dt_, k):
    dt_[0] += k[2]


@mc.kernel
def advance(t, dt_, area, heat, k):
    t[0] += k[3] * dt_[0]
    dt_[0] = 0.0
    heat[0] += t[0] * area[0] * k[4]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=400, help="points of the base triangulation (default 400)")
    p.add_argument("--layers", type=int, default=20, help="prisms per column (default 20)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ca", choices=["on", "off"], default="off", help="run each step's chain communication-avoiding")
    p.add_argument("--every", type=int, default=25, help="print (and write, with --output) every this many steps")
    p.add_argument("--output", help="a directory for a ParaView time series of T on the prisms (column.xdmf)")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def declare(n: int, layers: int, seed: int):
    """The prisms, their vertical facets, maps and dats (global arrays, the same on every rank)."""
    base = jittered_delaunay(n, seed=seed)
    dz = 1.0 / layers
    area = np.abs(base.signed_measures())
    centroids = base.coords[base.cells].mean(axis=1)
    edge = base.coords[base.facets[:, 1]] - base.coords[base.facets[:, 0]]
    across = centroids[base.facet_cells[:, 1]] - centroids[base.facet_cells[:, 0]]
    weight = np.linalg.norm(edge, axis=1) / np.linalg.norm(across, axis=1)  # edge length over centroid distance

    cells = mc.ExtrudedSet(mc.Set(base.ncell, "triangles"), layers, "prisms")
    sides = mc.ExtrudedSet(mc.Set(base.nfacet, "edges"), layers, "sides")
    nodes = mc.ExtrudedSet(mc.Set(base.nnode, "vertices"), layers + 1, "nodes")
    own = mc.Map(cells, cells, 1, np.arange(base.ncell)[:, None] * layers, "own", offset=1)
    s2c = mc.Map(sides, cells, 2, base.facet_cells * layers, "side2prism", offset=1)
    tri = base.cells[:, [0, 2, 1]] * (layers + 1)  # each base triangle clockwise seen from above: VTK's wedge
    c2n = mc.Map(cells, nodes, 6, np.concatenate([tri, tri + 1], axis=1), "prism2node", offset=1)

    depth = 1.0 - (np.arange(layers) + 0.5) * dz  # layer 0 is the bottom, at depth 1
    t0 = (np.sin(np.pi * centroids[:, 0])[:, None] * np.exp(-3.0 * depth)[None, :]).reshape(-1)  # column by column
    height = np.arange(layers + 1) * dz - 1.0  # vertex level j of a column, from the bottom (z = -1) to the top (z = 0)
    xyz = np.concatenate([np.repeat(base.coords, layers + 1, axis=0), np.tile(height, base.nnode)[:, None]], axis=1)
    return {
        "cells": cells, "sides": sides, "own": own, "s2c": s2c, "c2n": c2n, "dz": dz,
        "min_area": float(area.min()), "total_area": float(area.sum()),
        "T": mc.Dat(cells, 1, t0, "T"),
        "dT": mc.Dat(cells, 1, None, "dT"),
        "area": mc.Dat(cells, 1, np.repeat(area, layers), "area"),
        "w": mc.Dat(sides, 1, np.repeat(weight, layers), "w"),
        "xyz": mc.Dat(nodes, 3, xyz, "xyz"),
    }


def coefficients(m: dict, *, kv=1.0, kh=0.1, q=1.0):
    """``k`` for the kernels: vertical and horizontal diffusivity over the lengths they act on,
    the top heating per step, the step and the volume factor (dz); and the step dt."""
    dz = m["dz"]
    dt = 0.1 * min(dz * dz / kv, m["min_area"] / kh)
    return np.array([kv / (dz * dz), kh, q / dz, dt, dz]), dt, q


def step(m: dict, k, heat, *, ca: bool):
    with mc.loop_chain("column step", ca=ca):
        mc.par_loop(vertical_flux, m["cells"], m["T"](mc.READ, m["own"]), m["dT"](mc.INC, m["own"]), k(mc.READ),
                    region=mc.ON_INTERIOR_FACETS)
        mc.par_loop(horizontal_flux, m["sides"], m["T"](mc.READ, m["s2c"]), m["area"](mc.READ, m["s2c"]),
                    m["w"](mc.READ), m["dT"](mc.INC, m["s2c"]), k(mc.READ))
        mc.par_loop(heat_top, m["cells"], m["dT"](mc.INC), k(mc.READ), region=mc.ON_TOP)
        mc.par_loop(advance, m["cells"], m["T"](mc.RW), m["dT"](mc.RW), m["area"](mc.READ), heat(mc.INC), k(mc.READ))


def heat_content(m: dict, k) -> float:
    heat = mc.Global(1, 0.0, "heat")
    mc.par_loop(mc.Kernel.from_source("def content(t, a, h, k):\n    h[0] += t[0] * a[0] * k[4]\n"), m["cells"],
                m["T"](mc.READ), m["area"](mc.READ), heat(mc.INC), k(mc.READ))
    return float(heat.value[0])


def top_mean(m: dict) -> float:
    total = mc.Global(1, 0.0, "top")
    mc.par_loop(mc.Kernel.from_source("def add(t, s):\n    s[0] += t[0]\n"), m["cells"], m["T"](mc.READ),
                total(mc.INC), region=mc.ON_TOP)
    return float(total.value[0]) / m["cells"].base.size


def simulate(args, *, report=print) -> dict:
    """Run the model; ``{"budget_error", "checksum", "T"}`` (``T`` gathered on rank 0)."""
    m = declare(args.n, args.layers, args.seed)
    mc.partition("kway", seed_set=m["cells"])
    values, dt, q = coefficients(m)
    k = mc.Global(5, values, "k")
    comm = mc.get_runtime().comm
    rank0 = comm is None or comm.rank == 0
    if rank0:
        report(f"prisms {m['cells'].size} layers {args.layers} ranks {1 if comm is None else comm.size}")
    out = mc.Output(args.output, coords=m["xyz"], cells=m["c2n"], name="column") if args.output else None
    start = heat_content(m, k)
    for n in range(1, args.steps + 1):
        heat = mc.Global(1, 0.0, "heat")  # a new global per step, as users write it
        step(m, k, heat, ca=args.ca == "on")
        if n % args.every == 0 or n == args.steps:
            mean = top_mean(m)
            if rank0:
                report(f"step {n} heat {heat.value[0]:.12g} top-mean {mean:.12g}")
            if out is not None:
                out.write(n * dt, {"T": m["T"]})
    expected = start + args.steps * dt * q * m["total_area"]
    error = abs(heat_content(m, k) - expected) / abs(expected)
    T = m["T"].gather()
    checksum = float(np.sum(T * np.arange(1, len(T) + 1)[:, None])) if T is not None else None
    if rank0:
        report(f"budget error {error:.3e} checksum {checksum:.15e}")
    return {"budget_error": error, "checksum": checksum, "T": T}


def main(argv=None) -> int:
    result = simulate(parse_args(argv))
    return 0 if result["budget_error"] <= 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
