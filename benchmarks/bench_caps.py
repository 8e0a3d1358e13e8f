"""Dollar caps and deadlines, measured through the latency server (every call over HTTP, billed by the server).

For each schedule, cap and seed: the server's bill against the cap (never above it), the share of the
cap the run used, whether the run's own meter equals the bill, and what ended the run. For each
deadline: the search's wall-clock past the deadline, in calls of the slowest kind (target: within one).

    python benchmarks/bench_caps.py                              # 2 schedules x 3 caps x 3 seeds, 3 deadlines; ~3 min
    python benchmarks/bench_caps.py --caps 0.05,0.5 --seeds 5 --deadlines 10,30 --pool ray

The two models are registered with litellm at made-up prices (task $1/$4, reflection $3/$12 per
million prompt/completion tokens); the simulated task's prompts are a few hundred tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy  # noqa: E402
import litellm  # noqa: E402

from dspy_pxn import BatchedGEPA  # noqa: E402
from dspy_pxn import testing as sim  # noqa: E402
from dspy_pxn.testing import LatencyServer  # noqa: E402

PRICES = {"openai/sim-priced-task": (1e-6, 4e-6), "openai/sim-priced-reflection": (3e-6, 12e-6)}


def billed(stats: dict) -> float:
    return sum(tokens["prompt"] * PRICES[f"openai/{model}"][0] + tokens["completion"] * PRICES[f"openai/{model}"][1]
               for model, tokens in stats["tokens"].items())


def run(server: LatencyServer, schedule: str, seed: int, pool, **caps):
    server.reset_stats()
    train, val, _ = sim.make_splits(seed=seed, train=60, val=12, test=1)
    optimizer = BatchedGEPA(metric=sim.metric, p=4, n=2, max_metric_calls=20000, num_threads=16, schedule=schedule,
                            seed=seed, pool=pool, **caps,
                            reflection_lm=server.lm("priced-reflection", max_tokens=400, temperature=1.0))
    started = time.perf_counter()
    with dspy.context(lm=server.lm("priced-task", max_tokens=200)):
        result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
    return result, server.stats(), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default="0.05,0.2,1.0", help="dollar caps")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--deadlines", default="5,10,20", help="max_wall_s values")
    parser.add_argument("--schedules", default="async,steps")
    parser.add_argument("--pool", choices=("threads", "ray"), default="threads")
    args = parser.parse_args()
    for model, (prompt, completion) in PRICES.items():
        litellm.register_model({model: {"input_cost_per_token": prompt, "output_cost_per_token": completion,
                                        "litellm_provider": "openai", "mode": "chat"}})
    pool = None
    if args.pool == "ray":
        from dspy_pxn.pools.ray import RayWorkerPool

        pool = RayWorkerPool(max_concurrency=16, actors=2, init_kwargs={"num_cpus": 2})
    schedules = args.schedules.split(",")
    print("| schedule | cap $ | billed $ (mean, min-max over seeds) | used | meter = bill | ended by |")
    print("|---|---|---|---|---|---|")
    with LatencyServer(task_latency=0.05, reflection_latency=0.2) as server:
        for schedule in schedules:
            for cap in (float(c) for c in args.caps.split(",")):
                bills, exact, ended = [], [], []
                for seed in range(args.seeds):
                    result, stats, _ = run(server, schedule, seed, pool, max_cost_usd=cap)
                    bill = billed(stats)
                    assert bill <= cap, f"over the cap: {bill} > {cap}"
                    bills.append(bill)
                    exact.append(abs((result.usage.cost_usd or 0.0) - bill) < 1e-9)
                    ended.append(result.stopped_by)
                print(f"| {schedule} | {cap:g} | {statistics.mean(bills):.4f} ({min(bills):.4f}-{max(bills):.4f}) | "
                      f"{statistics.mean(bills) / cap:.0%} | {sum(exact)}/{len(exact)} | "
                      f"{', '.join(sorted(set(ended)))} |", flush=True)
    task_s, reflection_s = 0.3, 1.2
    print(f"\nDeadlines (T_e {task_s} s, T_r {reflection_s} s fixed):\n")
    print("| schedule | max_wall_s | search wall (mean, max) | past the deadline, max | in reflection calls | ended by |")
    print("|---|---|---|---|---|---|")
    with LatencyServer(task_latency=task_s, reflection_latency=reflection_s) as server:
        for schedule in schedules:
            for deadline in (float(d) for d in args.deadlines.split(",")):
                walls, ended = [], []
                for seed in range(args.seeds):
                    result, _, _ = run(server, schedule, seed, pool, max_wall_s=deadline)
                    walls.append(result.wall_s)
                    ended.append(result.stopped_by)
                past = max(walls) - deadline
                print(f"| {schedule} | {deadline:g} | {statistics.mean(walls):.2f} s, {max(walls):.2f} s | "
                      f"{past:+.2f} s | {past / reflection_s:+.2f} | {', '.join(sorted(set(ended)))} |", flush=True)
    if pool is not None:
        pool.close()


if __name__ == "__main__":
    main()
