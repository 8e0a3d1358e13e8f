"""BatchedGEPA vs dspy.GEPA at equal budget on the latency-injecting LM server.

Regime (the paper's, scaled to one machine): reflection latency 4x a task call's,
minibatch 3, |val| = 30, B = 600 metric calls, W = 16 workers. Every LM call goes
through dspy.LM -> HTTP (DSPy's default engine) to a server subprocess on loopback, which sleeps
the configured latency and answers deterministically (dspy_pxn.simulation).

    python benchmarks/bench_core.py                      # full table, ~10 min
    python benchmarks/bench_core.py --task-latency 0.1   # quicker, same shape

Prints one markdown table (ratios are measured side by side in this one run) and
writes the rows to benchmarks/results/core.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import dspy
from gepa.strategies.proposal_sampling import PxNSampling

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from dspy_pxn.testing.bill import PRICE_PAIR, dollars, from_server


@dataclass
class Row:
    config: str
    wall_s: float
    x_floor: float
    speedup: float
    metric_calls: int
    budget: int
    candidates: int
    val: float
    test: float
    reflection_calls: int
    reflection_tokens_in: int
    usd: float  # the run's calls at the stated price pair (dspy_pxn.testing.bill)


def make_optimizer(config: str, server: LatencyServer, args) -> dspy.Teleprompter:
    common = {"metric": sim.metric, "max_metric_calls": args.budget, "reflection_lm": server.lm("reflection"),
              "num_threads": args.workers, "use_merge": False, "seed": args.seed}
    if config == "dspy.GEPA 1x1":
        return dspy.GEPA(**common, track_stats=True)
    if config.startswith("dspy.GEPA+PxNSampling"):
        p, n = map(int, config.split()[-1].split("x"))
        return dspy.GEPA(**common, track_stats=True, gepa_kwargs={"sampling_strategy": PxNSampling(p, n)})
    _, shape, *selection = config.split()  # "BatchedGEPA 4x4" or "BatchedGEPA 4x4 best"
    p, n = map(int, shape.split("x"))
    # The step loop, as measured for this table (bench_schedules.py compares it with the async schedule).
    return BatchedGEPA(**common, p=p, n=n, selection=selection[0] if selection else "all", schedule="steps")


def test_score(program: dspy.Module, test: list[dspy.Example], workers: int) -> float:
    evaluate = dspy.Evaluate(devset=test, metric=sim.score,
                             num_threads=workers, display_progress=False)
    return evaluate(program).score / 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-latency", type=float, default=0.5, help="seconds per task LM call (T_e)")
    parser.add_argument("--reflection-ratio", type=float, default=4.0, help="reflection latency / task latency")
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--train", type=int, default=60)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--configs",
        default="dspy.GEPA 1x1,dspy.GEPA+PxNSampling 4x4,BatchedGEPA 1x1,BatchedGEPA 4x4,BatchedGEPA 8x2,BatchedGEPA 16x1,"
        "BatchedGEPA 4x4 best,BatchedGEPA 16x1 best,BatchedGEPA 8x2 best",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "core.json"))
    args = parser.parse_args()

    train, val, test = sim.make_splits(seed=args.seed, train=args.train, val=args.val, test=args.test)
    floor = args.budget * args.task_latency / args.workers
    rows: list[Row] = []
    with LatencyServer(task_latency=args.task_latency, reflection_latency=args.reflection_ratio * args.task_latency) as server:
        server.warm_up()
        for config in args.configs.split(","):
            optimizer = make_optimizer(config, server, args)
            server.reset_stats()
            with dspy.context(lm=server.lm("task")):
                start = time.perf_counter()
                best = optimizer.compile(sim.seed_program(), trainset=train, valset=val)
                wall = time.perf_counter() - start
                bill = from_server(server.stats())  # the compile's calls, before the held-out scoring's
                score = test_score(best, test, args.workers)
            results = best.detailed_results
            baseline = rows[0].wall_s if rows else wall
            rows.append(Row(
                config=config, wall_s=round(wall, 2), x_floor=round(wall / floor, 2), speedup=round(baseline / wall, 2),
                metric_calls=results.total_metric_calls, budget=args.budget,
                candidates=len(results.candidates),
                val=round(max(results.val_aggregate_scores), 3), test=round(score, 3),
                reflection_calls=bill["reflection"]["calls"], reflection_tokens_in=bill["reflection"]["prompt"],
                usd=round(dollars(bill), 4),
            ))
            print(f"{config}: {rows[-1]}", flush=True)

    print(f"\nfloor B*T_e/W = {args.budget}*{args.task_latency}/{args.workers} = {floor:.2f} s; "
          f"speedup is vs {rows[0].config}; the bill counted at the server, dollars at {PRICE_PAIR['task']} (task) "
          f"and {PRICE_PAIR['reflection']} (reflection)\n")
    print("| config | wall s | x floor | speedup | metric calls / B | candidates | best val | test "
          "| reflection calls | reflection tokens in | $ |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.config} | {r.wall_s} | {r.x_floor} | {r.speedup} | {r.metric_calls} / {r.budget} "
              f"| {r.candidates} | {r.val} | {r.test} | {r.reflection_calls} | {r.reflection_tokens_in} | {r.usd:.4f} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"args": vars(args), "floor_s": floor, "rows": [asdict(r) for r in rows]}, handle, indent=2)


if __name__ == "__main__":
    main()
