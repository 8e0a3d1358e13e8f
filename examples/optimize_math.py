"""Optimize the LiveBench-Math solver's instruction with BatchedGEPA (the paper's math task).

    export OPENAI_API_KEY=...   DSPY_PXN_DATA_DIR=/path/to/shared/data
    python examples/optimize_math.py --p 2 --n 2 --workers 16 --budget 300

Any provider/model string dspy.LM takes works (--lm anthropic/claude-sonnet-4-5, ...), or the embedded model (--lm local).
--api-base points both LMs at an OpenAI-compatible server (vLLM, llama-server, dspy-pxn's
latency server); the tests run this script that way, with tiny sizes.
"""

import argparse
import os
import time

import dspy
from dspy_pxn.programs.math_solver import MathSolver, load_livebench_math, metric

from dspy_pxn import BatchedGEPA
from dspy_pxn.local import build_lm


class PrintSteps:
    """A gepa callback; one with ``on_step_record(record)`` also hears each step's StepRecord."""

    def on_step_record(self, s) -> None:
        print(f"step {s.step}: {s.metric_calls_total}/{s.budget} calls, "
              f"best val {s.best_val:.3f}, {s.accepted} accepted")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default="openai/gpt-4.1-mini")
    parser.add_argument("--reflection-lm", default="openai/gpt-5-mini")
    parser.add_argument("--api-base", help="OpenAI-compatible endpoint for both LMs")
    parser.add_argument("--data-dir", help="default: $DSPY_PXN_DATA_DIR")
    parser.add_argument("--p", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--train-size", type=int, default=100)  # the Terrarium split is 100 / 100 / 168
    parser.add_argument("--val-size", type=int, default=100)
    parser.add_argument("--test-size", type=int, default=168)
    parser.add_argument("--log-dir", default=time.strftime("runs/math-%Y%m%d-%H%M%S"),
                        help="a new directory per run; pass an earlier run's to resume it")
    args = parser.parse_args(argv)

    train, val, test = load_livebench_math(args.data_dir)
    train, val, test = train[: args.train_size], val[: args.val_size], test[: args.test_size]
    dspy.configure(lm=build_lm(args.lm, "task", api_base=args.api_base, timeout=600))

    optimizer = BatchedGEPA(
        metric=metric,  # score + feedback naming the expected answer and the required format
        p=args.p, n=args.n, max_metric_calls=args.budget, num_threads=args.workers,
        reflection_lm=build_lm(args.reflection_lm, "reflection", api_base=args.api_base, timeout=600),
        log_dir=args.log_dir,  # steps.jsonl; rerun with the same log_dir to resume after a crash
        gepa_kwargs={"callbacks": [PrintSteps()]},  # gepa callbacks, as under dspy.GEPA
    )
    # testset: scored once after the search, never seen by it (detailed_results.test_score)
    best = optimizer.compile(MathSolver(), trainset=train, valset=val, testset=test)

    results = best.detailed_results
    print(f"val {results.val_aggregate_scores[0]:.3f} -> {max(results.val_aggregate_scores):.3f}, "
          f"test {results.test_score:.3f}, {results.total_metric_calls} calls in {results.wall_s:.1f} s")
    print("instruction:", best.solve.predict.signature.instructions)
    best.save(os.path.join(args.log_dir, "program.json"))


if __name__ == "__main__":
    main()
