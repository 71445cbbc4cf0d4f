"""The examples gallery: ``docs/examples.md``, with each example's recorded output.

``python docs/gallery.py --record`` runs every example in ``examples/`` with the command below (under
``mpiexec -n 2`` where the example runs on several ranks), keeps its output (standard output and error, as a terminal shows them) in
``docs/gallery/<example>.txt`` with the SHA-256 of the example's source in
``docs/gallery/records.json``, and writes the page. ``python docs/gallery.py`` writes the page from
the records only. ``tests/test_docs.py`` fails when an example has no record, when its source
changed since it was recorded, or when the committed page is not what this script writes.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
RECORDS = ROOT / "docs" / "gallery"
PAGE = ROOT / "docs" / "examples.md"

#: per example: (ranks, arguments) of the recorded run, and what the page says about it
RUNS = {
    "airfoil.py": (2, ["--size", "60", "90", "--iters", "200", "--chain", "ca", "--timing"]),
    "mgcfd.py": (1, ["--generate", "8", "--levels", "3", "--cycles", "10"]),
    "synthetic_chain.py": (2, ["--nchains", "8", "--ca", "on"]),
    "poisson.py": (1, ["--sizes", "8", "16", "32"]),
    "stokes.py": (2, ["--sizes", "8", "16"]),
    "advection_diffusion.py": (1, ["--n", "32"]),
    "jacobi.py": (2, ["--size", "200", "200", "--sweeps", "60", "--steps", "6"]),
    "column_model.py": (2, ["--n", "200", "--layers", "10", "--steps", "50", "--ca", "on"]),
    "profile_airfoil.py": (2, ["--size", "60", "90", "--iters", "10"]),
    "rebalance.py": (2, []),
    "test_my_solver.py": (1, None),  # run by pytest
}

DESCRIPTIONS = {
    "airfoil.py": (
        "OP2's Airfoil (`--mesh new_grid.dat` or `.h5`, `--size I J`, `--iters N`, "
        "`--backend numba|reference|cupy|cuda-emulation`, `--threads`, `--transport`, `--chain none|ca|per-loop|auto`, "
        "`--tile-size`, `--captured`, `--repartition-at N --repartition-method rib|kway|block`, `--output DIR`, "
        "`--checkpoint PATH`, `--restart PATH`). On the generated 720 000-cell mesh (`--size 400 600`, the default) "
        "it reproduces OP2's published rms at iteration 1000, 1.060114637578e-04."),
    "mgcfd.py": (
        "Warwick's MG-CFD, the OP2 CA paper's application: 3D multigrid finite-volume Euler on MG-CFD's own HDF5 "
        "input (`--input input.dat`, each rank reading its block of rows) or a generated channel with a bump "
        "(`--generate N --levels L`, `--write-mesh DIR`; `meshchain.meshes.channel_bump`, 9.1 million nodes at "
        "`N = 144`); `--cycles`, `--synthetic-loops n` with `--ca on|off|auto`, `--partition rib|kway`, "
        "`--write-variables`/`--snapshots`/`--compare` in OP2's output layout. Its results equal those of OP2's own "
        "MG-CFD (`feature/icpp2023-commavoid`): bit for bit serially on the test mesh, to one rounding (2.5e-16 of "
        "the values) on 3 ranks and on a 14 161-node mesh (`tests/test_mgcfd.py`, reference data in "
        "`tests/data/mgcfd/`)."),
    "synthetic_chain.py": (
        "The MG-CFD synthetic chain of the OP2 CA paper (`--nchains`, `--ca on|off|auto|none`, `--tile-size`, "
        "`--backend`). Its kernels and chains live in `meshchain.apps`, which `python -m meshchain report` and the "
        "demo run, beside `meshchain.apps.vertex`: a vertex-centred finite-volume chain that CA runs as one segment."),
    "poisson.py": (
        "P1 finite elements assembled into a `mc.Mat` and solved with `mc.solve` (`--cell triangle|tetra`, "
        "`--sizes`, `--method`, `--pc`): the error falls at second order."),
    "stokes.py": (
        "Stabilised P1-P1 Stokes on a mixed space (velocity dim 2, pressure dim 1), a block `mc.Mat` solved by PETSc "
        "with a Schur field split (`--sizes`, `--beta`): velocity errors fall at second order, pressure at about 1.5."),
    "advection_diffusion.py": (
        "Upwinded advection-diffusion (a nonsymmetric `mc.Mat`) at two Péclet numbers, solved by `gmres`, "
        "`pipegmres`, `bicgstab` and `pipebicgstab` and compared with a direct solve (`--methods`, `--peclet`, "
        "`--n`, `--pc`)."),
    "jacobi.py": (
        "Five-point Jacobi on a `mc.Grid` (`--size NX NY`, `--sweeps`, `--steps s` sweeps per "
        "communication-avoiding chain, `--ca on|off|auto`, `--ratio r`, `--blocks PX PY`, `--weights`)."),
    "column_model.py": (
        "Heat in a slab of prisms extruded from a Delaunay triangle mesh (`mc.ExtrudedSet`): vertical diffusion "
        "across the interior horizontal facets, horizontal diffusion across the extruded base edges, a heated top "
        "layer; the heat budget closes to rounding and the result is the same on any number of ranks (`--n`, "
        "`--layers`, `--steps`, `--ca on|off`, `--output DIR` for ParaView: prisms as VTK wedges)."),
    "profile_airfoil.py": (
        "Airfoil profiled communication-avoiding: the Chrome trace and the summary table (`--trace`, `--summary`, "
        "`--size`, `--iters`, `--png` with `--zoom N` iterations)."),
    "rebalance.py": (
        "Airfoil with a costly wall model on one rank: the imbalance measured by `mc.stats(all_ranks=True)`, then "
        "removed by `mc.rebalance()` with weights from the measured cost of each element (`--size`, `--iters`, "
        "`--wall-work`)."),
    "test_my_solver.py": (
        "A solver's own regression tests with meshchain's pytest plugin: a stored reference value, serial, 2 and 3 "
        "ranks, a communication-avoiding chain against loop by loop."),
}


def source_hash(example: Path) -> str:
    return hashlib.sha256(example.read_bytes()).hexdigest()


def examples() -> list[Path]:
    return sorted(EXAMPLES.glob("*.py"))


def command(name: str) -> list[str]:
    """The recorded command line, as a user types it from the repository root."""
    ranks, arguments = RUNS[name]
    if arguments is None:
        return ["python", "-m", "pytest", "-v", "--no-header", "-p", "no:cacheprovider", "-o", "addopts=",
                f"examples/{name}"]
    prefix = ["mpiexec", "-n", str(ranks)] if ranks > 1 else []
    return [*prefix, "python", f"examples/{name}", *arguments]


def record(name: str) -> dict:
    """Run ``name``'s command (the venv's Python and mpiexec) in a scratch directory; its record."""
    bin_dir = Path(sys.executable).parent
    line = command(name)
    argv = [str(bin_dir / "mpiexec") if word == "mpiexec" else sys.executable if word == "python"
            else str(ROOT / word) if word.startswith("examples/") else word for word in line]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:  # what the examples write goes there; pytest runs from the root
        done = subprocess.run(argv, cwd=ROOT if RUNS[name][1] is None else scratch, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=900,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(line)} failed ({done.returncode}):\n{done.stdout}")
    (RECORDS / f"{Path(name).stem}.txt").write_text(done.stdout)
    return {"command": " ".join(line), "sha256": source_hash(EXAMPLES / name), "seconds": round(seconds, 1),
            "recorded": datetime.date.today().isoformat()}


def title(example: Path) -> str:
    return ast.get_docstring(ast.parse(example.read_text())).splitlines()[0]


def page(records: dict) -> str:
    """The gallery page's text from the records."""
    out = ["# Examples", "",
           "The scripts in `examples/` of the repository, each with the output of one run: the command shown, from "
           "the repository root with `.venv/bin` first on `PATH`, on a 2-core machine (timings vary; everything "
           "else is what the example computes). Every example runs serially or under `mpiexec -n N` unchanged. "
           "`python docs/gallery.py --record` runs them again.", ""]
    for example in examples():
        name, entry = example.name, records[example.name]
        out += [f"## `{name}`", "", f"**{title(example)}**", "", DESCRIPTIONS[name], "",
                f"Output of `{entry['command']}` ({entry['seconds']} s, recorded {entry['recorded']}):", "",
                f"```{{literalinclude}} gallery/{example.stem}.txt", ":language: text", "```", "",
                "The source:", "", f"```{{literalinclude}} ../examples/{name}", ":language: python", "```", ""]
    return "\n".join(out)


def load_records() -> dict:
    path = RECORDS / "records.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", nargs="*", metavar="EXAMPLE",
                        help="run these examples (all without names) and keep their output")
    args = parser.parse_args(argv)
    records = load_records()
    if args.record is not None:
        RECORDS.mkdir(exist_ok=True)
        for name in args.record or [e.name for e in examples()]:
            records[name] = record(name)
            print(f"{name}: {records[name]['seconds']} s", flush=True)
            (RECORDS / "records.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    PAGE.write_text(page(records))


if __name__ == "__main__":
    main()
