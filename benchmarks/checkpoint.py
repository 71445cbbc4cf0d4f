"""Checkpoint, mesh and output throughput on Airfoil, against h5py alone.

On the 720000-cell NACA0012 mesh (``--size 400 600``), on ``--ranks`` ranks:
``mc.checkpoint`` and ``mc.restore`` of the four flow dats (``p_q``, ``p_qold``, ``p_adt``,
``p_res``: 75 MB); ``write_op2_hdf5`` and ``read_op2_hdf5`` of the mesh (its sets, maps,
``p_x`` and ``p_bound``); ``mc.Output.write`` of one ParaView step (``p_q`` and ``p_adt``).
The floor: one process writing and reading the same state arrays with h5py directly (one
dataset each, contiguous), and reading the mesh from OP2's ASCII format. MB/s (median of
``--repeats``).

Usage::

    .venv/bin/python benchmarks/checkpoint.py                # 1 and 2 ranks
    .venv/bin/python benchmarks/checkpoint.py --ranks 1 2 3 --size 100 150

Writes ``benchmarks/results/checkpoint.json`` and prints the table for ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import launch, machine, serve, slowest  # noqa: E402


def _timed(comm, action, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        comm.Barrier()
        began = time.perf_counter()
        action()
        seconds.append(slowest(comm, time.perf_counter() - began))
    return statistics.median(seconds)


def worker(config: dict) -> dict:
    import numpy as np
    from mpi4py import MPI

    import meshchain as mc
    from meshchain.apps import airfoil
    from meshchain.meshes import naca0012

    comm = MPI.COMM_WORLD
    mc.reset_runtime(comm=comm)
    problem = airfoil.declare(naca0012(*config["size"]), method="block")
    airfoil.run(problem, 2, out=None)
    state = [problem.p_q, problem.p_qold, problem.p_adt, problem.p_res]
    megabytes = sum(d.dataset.size * d.dim * d.dtype.itemsize for d in state) / 1e6
    path = comm.bcast(os.path.join(tempfile.mkdtemp(prefix="meshchain-ckpt-"), "state.h5"), root=0)
    write = _timed(comm, lambda: mc.checkpoint(path, state), config["repeats"])
    read = _timed(comm, lambda: mc.restore(path, state), config["repeats"])
    result = {"megabytes": megabytes, "write_mb_s": megabytes / write, "read_mb_s": megabytes / read}
    result.update(_mesh_and_output(comm, problem, os.path.dirname(path), config["repeats"]))
    if comm.size == 1:  # the floor: the same arrays with h5py directly
        import h5py

        arrays = [np.ascontiguousarray(d.gather()) for d in state]
        floor = path + ".h5py"

        def write_directly():
            with h5py.File(floor, "w") as f:
                for k, a in enumerate(arrays):
                    f.create_dataset(f"d{k}", data=a)

        def read_directly():
            with h5py.File(floor, "r") as f:
                for k in range(len(arrays)):
                    np.asarray(f[f"d{k}"])

        result["h5py_write_mb_s"] = megabytes / _timed(comm, write_directly, config["repeats"])
        result["h5py_read_mb_s"] = megabytes / _timed(comm, read_directly, config["repeats"])
    return result


def _mesh_and_output(comm, problem, directory: str, repeats: int) -> dict:
    """Mesh write/read in OP2's HDF5 layout and one ParaView output step, in MB/s."""
    import meshchain as mc
    from meshchain.meshes import read_op2_hdf5, write_op2_hdf5

    mesh = [problem.nodes, problem.edges, problem.bedges, problem.cells, problem.pedge, problem.pecell,
            problem.pbedge, problem.pbecell, problem.pcell, problem.p_x, problem.p_bound]
    sizes = [(o.source.size * o.arity * 4) if hasattr(o, "arity") else (o.dataset.size * o.dim * o.dtype.itemsize)
             for o in mesh[4:]]
    mesh_mb = sum(sizes) / 1e6
    path = os.path.join(directory, "new_grid.h5")
    write = _timed(comm, lambda: write_op2_hdf5(mesh, path), repeats)
    read = _timed(comm, lambda: read_op2_hdf5(path), repeats)
    fields = {"q": problem.p_q, "adt": problem.p_adt}
    out = mc.Output(os.path.join(directory, "flow"), coords=problem.p_x, cells=problem.pcell)
    output_mb = sum(d.dataset.size * d.dim * d.dtype.itemsize for d in fields.values()) / 1e6
    step = _timed(comm, lambda: out.write(0.0, fields), repeats)
    result = {"mesh_megabytes": mesh_mb, "mesh_write_mb_s": mesh_mb / write, "mesh_read_mb_s": mesh_mb / read,
              "output_megabytes": output_mb, "output_mb_s": output_mb / step}
    if comm.size == 1:  # the floor for reading a mesh: OP2's ASCII format
        from meshchain.meshes import read_op2_ascii, write_op2_ascii

        ascii_path = os.path.join(directory, "new_grid.dat")
        write_op2_ascii(read_op2_hdf5(path), ascii_path)
        result["ascii_read_mb_s"] = mesh_mb / _timed(comm, lambda: read_op2_ascii(ascii_path), repeats)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--size", nargs=2, type=int, default=[400, 600])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results" / "checkpoint.json"))
    args = parser.parse_args(argv)
    if args.worker:
        return serve(worker, json.loads(args.config))
    env = dict(os.environ, MESHCHAIN_THREADS="1", NUMBA_NUM_THREADS="1")
    rows = []
    for ranks in args.ranks:
        config = {"size": args.size, "repeats": args.repeats}
        rows.append(dict(ranks=ranks, **launch(__file__, [], ranks, "shm", env, config, 1800, "checkpoint")))
    print("| ranks | MB | mc.checkpoint MB/s | mc.restore MB/s | h5py write MB/s (1 process) | h5py read MB/s |")
    print("|---|---|---|---|---|---|")
    floor = rows[0] if rows and rows[0]["ranks"] == 1 else {}
    for r in rows:
        print(f"| {r['ranks']} | {r['megabytes']:.1f} | {r['write_mb_s']:.0f} | {r['read_mb_s']:.0f} | "
              f"{floor.get('h5py_write_mb_s', float('nan')):.0f} | {floor.get('h5py_read_mb_s', float('nan')):.0f} |")
    print()
    print("| ranks | mesh MB | write_op2_hdf5 MB/s | read_op2_hdf5 MB/s | read_op2_ascii MB/s (1 process) | "
          "output MB | mc.Output.write MB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['mesh_megabytes']:.1f} | {r['mesh_write_mb_s']:.0f} | {r['mesh_read_mb_s']:.0f} | "
              f"{floor.get('ascii_read_mb_s', float('nan')):.1f} | {r['output_megabytes']:.1f} | "
              f"{r['output_mb_s']:.0f} |")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"argv": sys.argv[1:], "machine": machine(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
