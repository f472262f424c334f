"""Fit held-out top-1 against log(tokens trained) for a campaign's evaluations and read off where the fit would
reach given accuracies: a rough extrapolation of a scaling curve, to size the data a target accuracy needs.

    python benchmarks/results/fresh-head-2026-12-07/fit.py RUN_DIR [--depth 1] [--from-tokens 3e5]
        [--reach 0.5,0.6,0.7]

Each evaluation line of ``RUN_DIR/eval.jsonl`` with at least ``--from-tokens`` trained tokens is one point; the fit
is least squares of ``acc = a + b * ln(tokens)``. A log-linear fit bends neither up nor down: far beyond the points
it is a guess, and the printout says how far.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--from-tokens", type=float, default=3e5)
    parser.add_argument("--reach", default="0.5,0.6,0.7")
    args = parser.parse_args()
    records = [json.loads(line) for line in (args.run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    points = [(r["trained_tokens"], r[f"acc_{args.depth}"]) for r in records if r["trained_tokens"] >= args.from_tokens]
    if len(points) < 2:
        raise SystemExit(f"{args.run_dir}: fewer than 2 evaluations with >= {args.from_tokens:,.0f} trained tokens")
    xs = [math.log(tokens) for tokens, _ in points]
    ys = [acc for _, acc in points]
    slope, intercept = statistics.linear_regression(xs, ys)
    residual = max(abs(intercept + slope * x - y) for x, y in zip(xs, ys, strict=True))
    print(f"{len(points)} points, {points[0][0]:,} to {points[-1][0]:,} trained tokens, depth {args.depth}: "
          f"acc = {intercept:.3f} + {slope:.4f} ln(tokens); +{slope * math.log(2):.3f} per doubling; "
          f"largest residual {residual:.3f}")
    for target in (float(value) for value in args.reach.split(",")):
        if slope <= 0:
            print(f"  {target:.2f}: not reached (the fit does not rise)")
            continue
        log_tokens = (target - intercept) / slope
        if log_tokens - math.log(points[-1][0]) > math.log(1000):
            print(f"  {target:.2f}: beyond 1,000x the last point (the fit is nearly flat)")
            continue
        tokens = math.exp(log_tokens)
        print(f"  {target:.2f}: at ~{tokens:,.0f} trained tokens ({tokens / points[-1][0]:,.0f}x the last point)")


if __name__ == "__main__":
    main()
