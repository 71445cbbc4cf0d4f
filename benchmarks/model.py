"""Prediction error of the model over the synthetic-chain sweep, held out and within the job.

For each network, rank count and per-rank size, one ``mpiexec`` job
(``meshchain.apps.report``) times the chain loop by loop and communication-avoiding at
each loop count (medians of interleaved rounds, noisy rows re-measured and marked),
calibrates the model on the job's communicator and predicts both variants.

Two predictions per row:

* **held out** (:func:`meshchain.model.validate.held_out`): the model is built only from
  the *other* rows of the same network and rank count that differ in size per rank and in
  loop count (``L``, ``B``, ``c``, ``g_l``: their medians; ``o_r``, ``o_l``: fitted to their
  times), never from the row itself. This is the figure the issue's goal is about.
* **same job** (the report's own column): the job's calibration, taken after warm-up
  executions and before the timed rounds: fitted on other executions of the same chains
  than the ones it is compared with.

Besides the mean error, the tables count the rows the model over-predicts (its gain
above the measured one): a model without systematic error over-predicts about half.

The error is ``|predicted gain - measured gain|`` in percentage points; a choice is right
when the predicted and measured gains have the same sign, and a "tie" when the measured
gain is within the row's measured spread (either choice then costs less than the noise).

Usage::

    python benchmarks/model.py                 # writes results/model.json, prints the tables
    python benchmarks/model.py --networks shm --ranks 2 --per-rank 1000 4000 --loops 2 8 --iters 5
    python benchmarks/model.py --from-json results/model.json   # the tables again, no runs
    python benchmarks/model.py --from-json results/model.json --refit   # predicted again by this tree's model

With 2 cores, 4 ranks oversubscribe the machine: their rows say so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from meshchain.apps.report import NETWORKS, ProgressBar, run_report
from meshchain.model.validate import held_out, summary

HERE = Path(__file__).resolve().parent


def sweep(args) -> list[dict]:
    rows = []
    for network in args.networks:
        for ranks in args.ranks:
            rows += run_report(args.workload, ranks=[ranks], per_rank=args.per_rank, loops=args.loops,
                               iters=args.iters, repeats=args.repeats, network=network,
                               progress=ProgressBar())
    for row in rows:
        row["in_sample_gain"] = row["predicted_gain"]
        row["in_sample_error"] = abs(row["predicted_gain"] - row["measured_gain"])
        row["cores"] = os.cpu_count()
    return rows


def tables(rows) -> str:
    out = ["| network | ranks | size/rank | loops | loop ms | CA ms | spread % | measured gain % | held-out gain % "
           "| error | right | same-job gain % | error |", "|---" * 13 + "|"]
    for r in rows:
        oversubscribed = " (oversubscribed)" if r["ranks"] > r.get("cores", r["ranks"]) else ""
        held = "n/a" if r["predicted_gain"] is None else f"{r['predicted_gain']:+.1f}"
        error = "n/a" if r["error"] is None else f"{r['error']:.1f}"
        right = "n/a" if r["right_choice"] is None else ("yes" if r["right_choice"] else
                                                         ("tie" if r["tie"] else "**no**"))
        spread = 100 * max(r["per_loop_spread"], r["ca_spread"])
        out.append(f"| {r['network']} | {r['ranks']}{oversubscribed} | {r['per_rank']} | {r['loops']} | "
                   f"{r['per_loop'] * 1e3:.3f} | {r['ca'] * 1e3:.3f} | {spread:.1f}{'*' if r['noisy'] else ''} | "
                   f"{r['measured_gain']:+.1f} | {held} | {error} | {right} | {r['in_sample_gain']:+.1f} | "
                   f"{r['in_sample_error']:.1f} |")
    out.append("")
    for label, subset in [("all rows", rows)] + [(f"{n}, {k} ranks", [r for r in rows if (r["network"], r["ranks"])
                                                                       == (n, k)])
                                                  for n in dict.fromkeys(r["network"] for r in rows)
                                                  for k in dict.fromkeys(r["ranks"] for r in rows)]:
        if not subset:
            continue
        s = summary(subset)
        in_sample = [r["in_sample_error"] for r in subset]
        over = sum(r["in_sample_gain"] > r["measured_gain"] for r in subset)
        out.append(f"{label}: held-out mean |error| {s['mean_error']:.1f} points (worst {s['worst_error']:.1f}) over "
                   f"{s['rows']} rows, over-predicted in {s['over_predicted']}/{s['rows']}; right choice "
                   f"{s['right_choices']}/{s['rows']} ({s['right_or_tie']}/{s['rows']} counting ties within the "
                   f"spread); noisy rows {s['noisy']}; same-job mean |error| {sum(in_sample) / len(in_sample):.1f} "
                   f"points, over-predicted in {over}/{len(subset)}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="synthetic", choices=("synthetic", "vertex", "mgcfd"))
    p.add_argument("--networks", nargs="+", choices=tuple(NETWORKS), default=list(NETWORKS))
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--per-rank", type=int, nargs="+", default=[1000, 10000, 40000])
    p.add_argument("--loops", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--from-json", type=Path, help="print the tables of an earlier run instead of running")
    p.add_argument("--refit", action="store_true",
                   help="with --from-json: predict the stored rows again with this tree's model (held out)")
    p.add_argument("--output", type=Path, default=HERE / "results" / "model.json")
    args = p.parse_args(argv)
    os.environ.setdefault("MESHCHAIN_THREADS", "1")
    if args.refit and not args.from_json:
        p.error("--refit predicts the rows of --from-json again: give --from-json")
    rows = json.loads(args.from_json.read_text()) if args.from_json else held_out(sweep(args))
    if args.refit:
        rows = held_out(rows)
    if not args.from_json:
        args.output.parent.mkdir(exist_ok=True)
        args.output.write_text(json.dumps(rows, indent=1))
    print(tables(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
