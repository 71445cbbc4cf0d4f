"""Airfoil's generated GPU kernels timed alone: launched back to back between two CUDA
events (no Python between launches), beside the floors that say what limits them.

* ``update`` (direct, 4 doubles per cell in q, qold and res): as generated (the rows of qold,
  res and adt staged in registers; q, written only, is stored through its pointer; see
  ``meshchain.backends.cuda.codegen``), with rows passed as pointers
  (``stage_rows=False``, the code before staging), and a hand-written kernel on the same
  data laid out as structure of arrays (the layout's floor);
* ``res_calc`` (indirect increments of res through pecell): with ``atomicAdd`` (as run with
  ``gpu_increments="atomic"``), and the same kernel with plain ``+=`` on all edges at once
  (racy, wrong results: only its time counts) -- what the atomics cost;
* ``adt_calc`` (indirect reads, direct write);
* a device-to-device copy of 1 GiB.

Bandwidth counts compulsory bytes as ``benchmarks/gpu.py`` does. Needs CuPy and a GPU.

Usage::

    python benchmarks/gpu_kernels.py                   # 720 000 cells
    python benchmarks/gpu_kernels.py --size 1200 1800  # 2.16M cells

Writes ``benchmarks/results/gpu_kernels.json``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
THREADS = 256

SOA_UPDATE = r"""
#define TH 256
extern "C" __global__ void update_soa(long long n, const double* __restrict__ qold, double* __restrict__ q,
                                       double* __restrict__ res, const double* __restrict__ adt, double* __restrict__ part) {
    const long long e = (long long)blockIdx.x * TH + threadIdx.x;
    double sum = 0.0;
    if (e < n) {
        const double adti = 1.0 / adt[e];
        for (int k = 0; k < 4; ++k) {
            const double d = adti * res[k * n + e];
            q[k * n + e] = qold[k * n + e] - d; res[k * n + e] = 0.0; sum += d * d;
        }
    }
    for (int o = 16; o; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
    __shared__ double w[TH / 32];
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < TH / 32 ? w[threadIdx.x] : 0.0;
        for (int o = 16; o; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
        if (threadIdx.x == 0) part[blockIdx.x] = sum;
    }
}
"""


def airfoil_loops() -> dict:
    """Airfoil's loops by kernel name, as the engine records them (on a tiny mesh: the
    generated source does not depend on the sizes)."""
    import meshchain as mc
    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    problem = airfoil.declare(naca0012(4, 6))
    mc.get_runtime().trace.take()
    airfoil.record_stage(problem)
    return {loop.kernel.name: loop for loop, _ in mc.get_runtime().trace.take()}


def compiled(cupy, loop, **options):
    from meshchain.backends.cuda.codegen import loop_source

    text = loop_source(loop, threads=THREADS, **options).text
    return cupy.RawModule(code=text, options=("--std=c++17",)).get_function("mc_loop")


def timed(cupy, launch, repeats: int = 30) -> float:
    """Microseconds per launch, ``repeats`` launches back to back after 3 warm-ups."""
    for _ in range(3):
        launch()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        launch()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats * 1e3


def measure(size) -> list:
    import cupy

    from meshchain.meshes import naca0012

    loops = airfoil_loops()
    mesh = naca0012(*size)
    ncell, nnode, nedge = mesh.ncell, mesh.nnode, mesh.nedge
    rng = np.random.default_rng(0)
    x = cupy.asarray(mesh.x)
    qold, q, res = (cupy.asarray(rng.uniform(1.0, 2.0, (ncell, 4))) for _ in range(3))
    adt = cupy.asarray(rng.uniform(1.0, 2.0, ncell))
    edge, ecell, cell = (cupy.asarray(np.ascontiguousarray(a, dtype=np.int32)) for a in (mesh.edge, mesh.ecell, mesh.cell))
    none, whole = cupy.zeros(1, dtype=cupy.int64), np.int32(0)  # no element list: iterations start..start+n
    cells, edges = (ncell + THREADS - 1) // THREADS, (nedge + THREADS - 1) // THREADS
    rms, partials = cupy.zeros(1), cupy.empty((cells, 1))
    head = lambda n: (np.int64(0), np.int64(n), none, whole)  # noqa: E731
    update_bytes = (4 + 4 + 8 + 1) * 8 * ncell
    res_calc_bytes = nnode * 2 * 8 + ncell * (4 + 1 + 8) * 8 + nedge * 4 * 4
    adt_calc_bytes = nnode * 2 * 8 + ncell * (4 + 1) * 8 + ncell * 4 * 4
    rows = []

    def row(name, what, nbytes, micros):
        rows.append({"kernel": name, "variant": what, "us": micros, "GBs": nbytes / micros / 1e3})

    copy_source = cupy.ones(1 << 27, dtype=cupy.float64)
    copy_target = cupy.empty_like(copy_source)
    row("copy", "device to device, 1 GiB", 2 * copy_source.nbytes,
        timed(cupy, lambda: copy_target.__setitem__(Ellipsis, copy_source), 10))
    for staged in (True, False):
        f = compiled(cupy, loops["update"], colour=False, stage_rows=staged)
        row("update", "generated" if staged else "generated, rows as pointers", update_bytes,
            timed(cupy, lambda: f((cells,), (THREADS,), (*head(ncell), qold, q, res, adt, rms, partials))))
    soa = cupy.RawModule(code=SOA_UPDATE).get_function("update_soa")
    row("update", "hand-written, structure of arrays", update_bytes,
        timed(cupy, lambda: soa((cells,), (THREADS,), (np.int64(ncell), qold, q, res, adt, partials))))
    f = compiled(cupy, loops["adt_calc"], colour=False)
    row("adt_calc", "generated", adt_calc_bytes, timed(cupy, lambda: f((cells,), (THREADS,), (*head(ncell), x, q, adt, cell))))
    for plain in (False, True):
        f = compiled(cupy, loops["res_calc"], colour=plain)
        row("res_calc", "plain += on all edges (racy: the atomics' cost)" if plain else "generated, atomicAdd",
            res_calc_bytes, timed(cupy, lambda: f((edges,), (THREADS,), (*head(nedge), x, q, adt, res, edge, ecell))))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=2, type=int, default=(400, 600), help="NACA0012 mesh (default 720 000 cells)")
    parser.add_argument("--out", default=str(HERE / "results" / "gpu_kernels.json"))
    args = parser.parse_args(argv)
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as exc:  # noqa: BLE001 - CuPy raises driver-specific errors without a GPU
        print(f"benchmarks/gpu_kernels.py needs CuPy and a GPU: {exc}", file=sys.stderr)
        return 2
    rows = measure(tuple(args.size))
    copy = rows[0]["GBs"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": name, "size": args.size, "rows": rows}, indent=2))
    print(f"{name}, naca0012({args.size[0]}, {args.size[1]}), {THREADS} threads per block, launches back to back:")
    print("| kernel | variant | us per launch | GB/s | of copy |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['variant']} | {r['us']:.1f} | {r['GBs']:.0f} | {r['GBs'] / copy:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
