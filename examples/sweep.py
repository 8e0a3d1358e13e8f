"""The paper's comparison: one nested MLflow run per P×N setting, same task, budget and seed.

    export DSPY_PXN_DATA_DIR=/path/to/shared/data   OPENAI_API_KEY=...
    python examples/sweep.py --configs 1x1,2x2,8x1 --budget 300
    mlflow ui      # the parent run "gsm8k-sweep" holds one child per configuration

GSM8K keeps each rollout to one LM call, so a sweep is cheap. --api-base points both LMs at
an OpenAI-compatible server; the tests run this script that way, with tiny sizes.
"""

import argparse
import os
import time

import dspy
from dspy_pxn.programs.gsm8k import GSM8KSolver, load_gsm8k, metric

from dspy_pxn import BatchedGEPA
from dspy_pxn.local import build_lm
from dspy_pxn.planning import parse_shapes
from dspy_pxn.tracking import MlflowTracker, sweep
from dspy_pxn.tracking.compare import compare_experiment


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default="openai/gpt-4.1-mini")
    parser.add_argument("--reflection-lm", default="openai/gpt-5-mini")
    parser.add_argument("--api-base", help="OpenAI-compatible endpoint for both LMs")
    parser.add_argument("--data-dir", help="default: $DSPY_PXN_DATA_DIR")
    parser.add_argument("--configs", default="1x1,2x2,8x1")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--sizes", default="100,50,100", help="train,val,test")
    parser.add_argument("--tracking-uri", help="default: MLflow's (./mlflow.db)")
    parser.add_argument("--experiment", default="gsm8k-sweep")
    parser.add_argument("--log-dir", default=time.strftime("runs/gsm8k-sweep-%Y%m%d-%H%M%S"),
                        help="a new directory per run; pass an earlier run's to resume it")
    args = parser.parse_args(argv)

    n_train, n_val, n_test = (int(v) for v in args.sizes.split(","))
    train, val, test = load_gsm8k(args.data_dir, n_train=n_train, n_val=n_val, n_test=n_test)
    dspy.configure(lm=build_lm(args.lm, "task", api_base=args.api_base, timeout=600))
    reflection_lm = build_lm(args.reflection_lm, "reflection", api_base=args.api_base, timeout=600)

    # Every BatchedGEPA compiled inside the block becomes a child run of the sweep's parent run.
    with sweep("gsm8k-sweep", experiment=args.experiment, tracking_uri=args.tracking_uri,
               log_dir=args.log_dir) as parent:
        for p, n in parse_shapes(args.configs):
            BatchedGEPA(
                metric=metric, p=p, n=n, max_metric_calls=args.budget, num_threads=args.workers,
                reflection_lm=reflection_lm, tracker=MlflowTracker(run_name=f"{p}x{n}"),
            ).compile(GSM8KSolver(), trainset=train, valset=val, testset=test)

    # Wall-clock, speedup vs 1x1, best val, test and the val-test gap, one row per child.
    comparison = compare_experiment(args.experiment, os.path.join(args.log_dir, "comparison"), args.tracking_uri,
                                    parent_run_id=parent.run_id)
    print(comparison.table)


if __name__ == "__main__":
    main()
