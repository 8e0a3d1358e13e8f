"""Compare the runs of an MLflow experiment: a table and three plots (val vs calls, time, dollars).

    python examples/sweep.py ...                                  # or any runs with use_mlflow=True
    python examples/compare_runs.py --experiment gsm8k-sweep --out comparison/

The same as `dspy-pxn compare`, from Python, plus the per-run numbers a notebook would use.
"""

import argparse

from dspy_pxn.tracking.compare import compare_runs, load_runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--tracking-uri", help="default: MLflow's (./mlflow.db)")
    parser.add_argument("--sweep", help="only the children of this sweep (parent run id)")
    parser.add_argument("--out", default="comparison")
    args = parser.parse_args(argv)

    runs = load_runs(args.experiment, args.tracking_uri, parent_run_id=args.sweep)
    if not runs:
        raise SystemExit(f"experiment {args.experiment!r} has no dspy-pxn runs; run examples/sweep.py first")
    comparison = compare_runs(runs, args.out)  # writes comparison.md and the PNGs
    print(comparison.table)
    print("plots:", ", ".join(comparison.plots))


if __name__ == "__main__":
    main()
