"""Every example run on the GPU and on the numba backend, with the results compared.

Each example runs twice, ``MESHCHAIN_BACKEND=numba`` and ``MESHCHAIN_BACKEND=cupy`` (or
``cuda-emulation`` with ``--backend``), on 1 rank or under ``mpiexec``; the figures it
prints (Airfoil's rms history, the checksums of the synthetic chain and Jacobi, the rms
after rebalancing) are compared to ``--rtol`` (1e-10). An example the GPU backend refuses
with a clear error (``poisson.py``: matrix assembly is host-only) is reported as
refused, with the error's last line; an example that fails otherwise, or whose figures
differ, or that is refused but not listed in ``EXPECTED_REFUSALS``, fails the check.

Usage::

    python benchmarks/gpu_examples.py                            # on a GPU machine
    python benchmarks/gpu_examples.py --backend cuda-emulation --small   # no GPU: checks the script

Writes ``benchmarks/results/gpu_examples.json``; prints a Markdown table; exits 1 when a
result differs or an example fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from comm import mpiexec  # noqa: E402
EXAMPLES = HERE.parent / "examples"
NUMBER = r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"

#: (label, script, arguments, ranks, pattern of the compared figures); ``small`` arguments for --small
CASES = (
    ("Airfoil, 1 rank", "airfoil.py", ["--size", "100", "150", "--iters", "300"], 1, rf"^\d+ ({NUMBER})$"),
    ("Airfoil, colouring", "airfoil.py", ["--size", "100", "150", "--iters", "300", "--gpu-increments", "colour"],
     1, rf"^\d+ ({NUMBER})$"),
    ("Airfoil, 2 ranks, CA chains", "airfoil.py", ["--size", "100", "150", "--iters", "300", "--chain", "ca"], 2,
     rf"^\d+ ({NUMBER})$"),
    ("synthetic chain, 1 rank", "synthetic_chain.py", ["--size", "200", "200", "--iters", "5"], 1,
     rf"checksum ({NUMBER})"),
    ("synthetic chain, 2 ranks, CA", "synthetic_chain.py", ["--size", "200", "200", "--iters", "5"], 2,
     rf"checksum ({NUMBER})"),
    ("Jacobi, 1 rank", "jacobi.py", ["--size", "400", "400", "--sweeps", "20", "--steps", "2"], 1,
     rf"checksum ({NUMBER})"),
    ("Jacobi, 2 ranks, CA", "jacobi.py", ["--size", "400", "400", "--sweeps", "20", "--steps", "2"], 2,
     rf"checksum ({NUMBER})"),
    ("rebalance, 2 ranks", "rebalance.py", ["--size", "60", "90", "--iters", "10", "--wall-work", "200"], 2,
     rf"rms after \d+ iterations ({NUMBER})"),
    ("Poisson", "poisson.py", ["--sizes", "16"], 1, rf"^\d+ \d+ \d+ {NUMBER} ({NUMBER})"),  # the error
)
SMALL = {"airfoil.py": ["--size", "10", "15", "--iters", "200"], "synthetic_chain.py": ["--size", "20", "20", "--iters", "2"],
         "jacobi.py": ["--size", "40", "40", "--sweeps", "4", "--steps", "2"],
         "rebalance.py": ["--size", "8", "12", "--iters", "3", "--wall-work", "10"], "poisson.py": ["--sizes", "8"]}
REFUSED = "BackendUnavailableError"
#: Examples the GPU backend refuses by design (matrix assembly is host-only); any other refusal fails the check.
EXPECTED_REFUSALS = {"poisson.py"}


def small_arguments(script: str, arguments: list) -> list:
    """The case's arguments with the mesh and iteration options of ``SMALL`` instead."""
    extra = [a for a in arguments if a in ("--chain", "ca", "--gpu-increments", "colour")]
    return SMALL[script] + extra


def run(script: str, arguments: list, ranks: int, backend: str, timeout: float) -> dict:
    command = [sys.executable, str(EXAMPLES / script), *arguments]
    if ranks > 1:
        command = [mpiexec(), "-n", str(ranks), *command]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, MESHCHAIN_BACKEND=backend))
    except subprocess.TimeoutExpired:
        return {"returncode": None, "stdout": "", "stderr": f"timed out after {timeout:.0f} s", "seconds": timeout}
    return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
            "seconds": time.perf_counter() - began}


def figures(stdout: str, pattern: str) -> list:
    return [float(m.group(1)) for m in re.finditer(pattern, stdout, flags=re.MULTILINE)]


def compare(label, script, arguments, ranks, pattern, *, backend: str, rtol: float, timeout: float) -> dict:
    numba = run(script, arguments, ranks, "numba", timeout)
    device = run(script, arguments, ranks, backend, timeout)
    row = {"example": label, "command": " ".join([script, *arguments]), "ranks": ranks,
           "numba_seconds": numba["seconds"], "device_seconds": device["seconds"]}
    if numba["returncode"] != 0:
        return {**row, "outcome": "failed", "detail": "numba: " + numba["stderr"][-1500:]}
    if device["returncode"] != 0:
        last = (device["stderr"].strip().splitlines() or ["(no output)"])[-1]
        outcome = "refused" if REFUSED in device["stderr"] and script in EXPECTED_REFUSALS else "failed"
        return {**row, "outcome": outcome, "detail": last if outcome == "refused" else device["stderr"][-3000:]}
    want, got = figures(numba["stdout"], pattern), figures(device["stdout"], pattern)
    if not want or len(want) != len(got):
        return {**row, "outcome": "failed", "detail": f"figures differ in number: numba {want}, {backend} {got}"}
    worst = max(abs(g - w) / max(abs(w), 1e-300) for w, g in zip(want, got))
    outcome = "equal" if worst <= rtol else "differs"
    return {**row, "outcome": outcome, "figures": len(want), "worst_relative_difference": worst,
            "numba": want, backend: got}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cupy", choices=("cupy", "cuda-emulation"))
    parser.add_argument("--rtol", type=float, default=1e-10)
    parser.add_argument("--small", action="store_true", help="small meshes (a check of the script)")
    parser.add_argument("--only", nargs="*", help="run only the examples whose label contains one of these")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--out", default=str(HERE / "results" / "gpu_examples.json"))
    args = parser.parse_args(argv)
    rows = []
    for label, script, arguments, ranks, pattern in CASES:
        if args.only and not any(word in label for word in args.only):
            continue
        if args.small:
            arguments = small_arguments(script, arguments)
        rows.append(compare(label, script, arguments, ranks, pattern, backend=args.backend, rtol=args.rtol,
                            timeout=args.timeout))
        print(f"{label}: {rows[-1]['outcome']}", file=sys.stderr, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"backend": args.backend, "rtol": args.rtol, "rows": rows}, indent=2))
    print(f"| example | ranks | numba against {args.backend} | worst relative difference | s numba / {args.backend} |")
    print("|---|---|---|---|---|")
    for row in rows:
        worst = row.get("worst_relative_difference")
        shown = f"{worst:.1e} over {row['figures']} figures" if worst is not None else row.get("detail", "")[-200:]
        print(f"| {row['example']} | {row['ranks']} | {row['outcome']} | {shown} | "
              f"{row['numba_seconds']:.1f} / {row['device_seconds']:.1f} |")
    bad = [row for row in rows if row["outcome"] in ("failed", "differs")]
    for row in bad:
        print(f"\n{row['example']}: {row['outcome']}\n{row.get('detail', '')}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
