"""Make ``docs/images/timeline.png``, the README's timeline: OP2's Airfoil (NACA0012 120x180)
on 2 MPI ranks, each stage a communication-avoiding chain, two iterations of the profile.

Usage (from anywhere; needs matplotlib)::

    python docs/images/make_timeline.py

It runs ``examples/profile_airfoil.py --png`` under the ``mpiexec`` next to this Python (the
mpich wheel's) or on PATH; the picture shows the fastest two of twelve profiled iterations,
the least disturbed by whatever else the machine runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parents[1] / "examples" / "profile_airfoil.py"


def mpiexec() -> str:
    candidate = Path(sys.executable).parent / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def main() -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("MESHCHAIN_MPI_CHILD", "MESHCHAIN_PROFILE")}
    env.setdefault("MESHCHAIN_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="meshchain-timeline-") as work:
        command = [mpiexec(), "-n", "2", sys.executable, str(EXAMPLE), "--size", "120", "180", "--iters", "12",
                   "--trace", str(Path(work) / "trace.json"), "--png", str(HERE / "timeline.png"), "--zoom", "2"]
        done = subprocess.run(command, env=env, timeout=600)
    if done.returncode == 0:
        print(f"wrote {HERE / 'timeline.png'} ({(HERE / 'timeline.png').stat().st_size // 1024} KB)")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
