"""Profile OP2's Airfoil run communication-avoiding: a timeline trace and the summary table.

Runs ``--warmup`` iterations (plans built, kernels compiled), then profiles ``--iters``
more with each stage a communication-avoiding loop chain (``ca=True``): ``mc.profile``
writes the Chrome trace (open it in https://ui.perfetto.dev, or draw it with
``meshchain.plot.timeline``), and rank 0 prints ``mc.stats(summary=True)`` for the
profiled iterations.

Usage::

    mpiexec -n 2 python examples/profile_airfoil.py --trace trace.json --summary summary.json
    mpiexec -n 2 python examples/profile_airfoil.py --size 120 180 --iters 6 --png timeline.png --zoom 2
    python examples/profile_airfoil.py --size 60 90 --iters 3          # one process: no exchanges

``--png`` draws the timeline of the fastest ``--zoom`` consecutive profiled iterations (the
least disturbed by other work on the machine); ``docs/images/make_timeline.py`` makes the
README's picture with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import meshchain as mc
from meshchain.apps import airfoil
from meshchain.core.config import BACKENDS
from meshchain.meshes import naca0012


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="airfoil-trace.json", metavar="PATH",
                        help="the trace file (default airfoil-trace.json)")
    parser.add_argument("--summary", metavar="PATH", help="also write the summary as JSON (Summary.as_dict())")
    parser.add_argument("--size", nargs=2, type=int, metavar=("I", "J"), default=(120, 180),
                        help="generated NACA0012 mesh size (default 120 180: 21600 cells)")
    parser.add_argument("--iters", type=int, default=10, help="profiled iterations (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations run before profiling (default 2)")
    parser.add_argument("--backend", choices=BACKENDS, help="execution backend")
    parser.add_argument("--png", metavar="PATH", help="draw the timeline of --zoom iterations to PATH (needs matplotlib)")
    parser.add_argument("--zoom", type=int, default=2, metavar="K", help="iterations shown by --png (default 2)")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.zoom < 1:
        parser.error("--iters and --zoom must be at least 1, --warmup at least 0")
    return args


def iteration_windows(events) -> list[tuple[float, float]]:
    """(start, end) in milliseconds of each Airfoil iteration in the trace ``events``: from one
    ``save_soln`` run to the next (the earliest rank's), the last to the end of the trace."""
    starts: dict = {}
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "unit" and e["name"] == "loop save_soln":
            starts.setdefault(e["pid"], []).append(e["ts"] / 1e3)
    if not starts:
        return []
    firsts = [min(ts) for ts in zip(*(sorted(s) for s in starts.values()))]
    last = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X") / 1e3
    return list(zip(firsts, firsts[1:] + [last]))


def draw(trace: Path, png: Path, *, zoom: int, title: str) -> None:
    """The timeline of the fastest ``zoom`` consecutive iterations of ``trace``, to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from meshchain import plot

    events = plot.trace_events(trace)
    windows = iteration_windows(events)
    spans = [(windows[i + zoom - 1][1] - windows[i][0], i) for i in range(max(len(windows) - zoom + 1, 1))]
    first = min(spans)[1]
    shown = windows[first:first + zoom]
    start, end = shown[0][0], shown[-1][1]
    fig, ax = plt.subplots(figsize=(11, 2.6), layout="constrained")
    plot.timeline(events, ax=ax, start=start, end=end)
    ax.set_title(title, fontsize="medium")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.backend is not None:
        mc.configure(backend=args.backend)
    session = mc.get_runtime()
    rank, ranks = (session.comm.rank, session.comm.size) if session.comm is not None else (0, 1)
    problem = airfoil.declare(naca0012(*args.size))
    airfoil.run(problem, args.warmup, out=None, ca=True)  # build and compile outside the profile
    mc.stats(reset=True)
    with mc.profile(args.trace):
        for _ in range(args.iters):
            rms = airfoil.iterate(problem, ca=True)
    summary = mc.stats(summary=True)
    if rank == 0:
        print(f"Airfoil {args.size[0]}x{args.size[1]} ({problem.cells.size} cells), {ranks} rank(s), "
              f"{args.iters} iterations profiled (ca=True); rms {rms:.15e}; trace: {args.trace}")
        print(summary)
        if args.summary:
            Path(args.summary).write_text(json.dumps(summary.as_dict(), indent=1))
        if args.png:
            draw(Path(args.trace), Path(args.png), zoom=args.zoom,
                 title=f"Airfoil {args.size[0]}x{args.size[1]}, {ranks} rank(s), communication-avoiding stages: "
                       f"{args.zoom} iteration(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
