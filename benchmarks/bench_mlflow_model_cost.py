"""What tracking costs a compile: the same search untracked and tracked to a real MLflow server.

A tracked compile logs per-step metrics from a writer thread while the search runs, then at the end
logs the optimized program as an MLflow model (``mlflow.dspy`` save, registry prompts, an input
example MLflow checks by calling the model once) and the proposal and candidate tables. The search
itself should not slow down; the model logging is a fixed cost paid once, after the search. This
prints both, side by side in one run, per seed:

- ``search s``: the search's own wall (``detailed_results.wall_s``), untracked and tracked,
- ``compile s``: ``compile()`` from call to return, untracked and tracked,
- ``log model s``: the part of the tracked compile spent in logging the model and its prompts.

    python benchmarks/bench_mlflow_model_cost.py                 # 3 seeds, 4x2, B 160; about 1 min
    python benchmarks/bench_mlflow_model_cost.py --seeds 5 --task-latency 0.02

Uses the in-process simulated LM (LM caches do not apply; its latency is slept) and starts
``mlflow server`` on loopback with a sqlite store in a temp directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OPENAI_API_KEY", "sk-unused")  # the simulated LM ignores it; MLflow's example check wants one

import dspy

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing.mlflow_server import running_mlflow_server
from dspy_pxn.tracking import MlflowTracker, mlflow_io

LOGGING_SECONDS: list[float] = []


def time_model_logging() -> None:
    """Wrap the writer's model logging with a clock (the writer calls it once per tracked compile)."""
    log_program = mlflow_io.MlflowMirror.log_program

    def timed(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return log_program(self, *args, **kwargs)
        finally:
            LOGGING_SECONDS.append(time.perf_counter() - started)

    mlflow_io.MlflowMirror.log_program = timed


def compile_once(seed: int, args: argparse.Namespace, tracking_uri: str | None) -> tuple[float, float]:
    train, val, _ = sim.make_splits(seed=0, train=30, val=args.val_size, test=8)
    tracker = MlflowTracker(tracking_uri=tracking_uri, experiment="tracking-cost") if tracking_uri else False
    lm = sim.SimulatedLM(task_latency=args.task_latency, reflection_latency=args.reflection_latency)
    optimizer = BatchedGEPA(metric=sim.metric, p=args.p, n=args.n, max_metric_calls=args.budget, num_threads=16,
                            reflection_lm=lm, seed=seed, tracker=tracker)
    started = time.perf_counter()
    with dspy.context(lm=lm):
        program = optimizer.compile(sim.seed_program(), trainset=train, valset=val)
    return time.perf_counter() - started, program.detailed_results.wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--budget", type=int, default=160)
    parser.add_argument("--val-size", type=int, default=12)
    parser.add_argument("--task-latency", type=float, default=0.01)
    parser.add_argument("--reflection-latency", type=float, default=0.05)
    args = parser.parse_args()
    time_model_logging()
    rows = []
    with running_mlflow_server() as server:
        for seed in range(args.seeds):
            untracked = compile_once(seed, args, None)
            tracked = compile_once(seed, args, server.uri)
            rows.append((seed, *untracked, *tracked, LOGGING_SECONDS[-1]))
    print(f"{args.p}x{args.n}, B {args.budget}, |val| {args.val_size}, T_e {args.task_latency}s, "
          f"T_r {args.reflection_latency}s, MLflow server on loopback")
    print(f"{'seed':>4} | {'search s untracked':>18} | {'search s tracked':>16} | {'compile s untracked':>19} | "
          f"{'compile s tracked':>17} | {'log model s':>11}")
    for seed, compile_off, search_off, compile_on, search_on, logging in rows:
        print(f"{seed:>4} | {search_off:>18.2f} | {search_on:>16.2f} | {compile_off:>19.2f} | {compile_on:>17.2f} | "
              f"{logging:>11.2f}")
    ratio = statistics.median(row[4] / row[2] for row in rows)
    added = statistics.median(row[3] - row[1] for row in rows)
    print(f"median search tracked/untracked: {ratio:.2f}x; median compile time added by tracking: {added:.2f} s "
          f"(model logging median {statistics.median(row[5] for row in rows):.2f} s)")


if __name__ == "__main__":
    main()
