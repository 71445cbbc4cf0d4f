"""Prediction error of the calibrated model over the synthetic-chain sweep.

For each rank count and per-rank size, one ``mpiexec`` job (``meshchain.apps.report``)
times the synthetic chain loop by loop and communication-avoiding at each loop count,
calibrates the model on the job's communicator (``L``, ``B``, ``c`` measured; ``g_l`` and
meshchain's overheads ``o_r``, ``o_l`` fitted from the job's timed executions) and predicts
both. The error is ``|predicted gain - measured gain|`` in percentage points, for the
full model and for the paper's equations alone (overheads zero).

Usage::

    python benchmarks/model.py                 # writes results/model.json, prints the table
    python benchmarks/model.py --ranks 2 --per-rank 1000 --loops 2 8 --iters 5 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from meshchain.apps.report import ProgressBar, format_table, run_report

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--per-rank", type=int, nargs="+", default=[1000, 10000, 40000])
    p.add_argument("--loops", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.setdefault("MESHCHAIN_THREADS", "1")
    rows = run_report("synthetic", ranks=args.ranks, per_rank=args.per_rank, loops=args.loops, iters=args.iters,
                      repeats=args.repeats, progress=ProgressBar())
    for row in rows:
        row["error"] = abs(row["predicted_gain"] - row["measured_gain"])
        row["paper_error"] = abs(row["paper_gain"] - row["measured_gain"])
        row["right_choice"] = (row["predicted_gain"] > 0) == (row["measured_gain"] > 0)
    out = HERE / "results" / "model.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(format_table(rows))
    print()
    print("| ranks | edges/rank | loops | measured gain % | model gain % | error (points) | paper eq. gain % | "
          "error (points) | model picks the faster |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['per_rank']} | {r['loops']} | {r['measured_gain']:+.1f} | {r['predicted_gain']:+.1f} "
              f"| {r['error']:.1f} | {r['paper_gain']:+.1f} | {r['paper_error']:.1f} | "
              f"{'yes' if r['right_choice'] else 'no'} |")
    errors = [r["error"] for r in rows]
    paper = [r["paper_error"] for r in rows]
    print(f"\nmean |error|: model {sum(errors) / len(errors):.1f} points (worst {max(errors):.1f}); paper's equations "
          f"alone {sum(paper) / len(paper):.1f} points (worst {max(paper):.1f}); right choice in "
          f"{sum(r['right_choice'] for r in rows)}/{len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
