"""Ray worker pool vs thread pool: wall-clock at equal budget and latency, one machine.

The overhead of the engine: the same BatchedGEPA run (same seed, same latency server,
same W) with rollouts on a ThreadWorkerPool and on a RayWorkerPool backed by a local
Ray (threaded actors). Runs alternate (threads, ray, threads, ray, ...) so machine noise
hits both; prints each run and the ratio of the medians.

    python benchmarks/bench_ray_pool.py                      # ~3 min
    python benchmarks/bench_ray_pool.py --task-latency 0.5 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import dspy
import ray

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.pools import ThreadWorkerPool
from dspy_pxn.pools.ray import RayWorkerPool
from dspy_pxn.testing import LatencyServer

RESULTS = Path(__file__).parent / "results"


def timed_run(pool, server: LatencyServer, args) -> tuple[float, int, list[str]]:
    train, val, _ = sim.make_splits(seed=args.seed, train=60, val=args.val, test=1)
    optimizer = BatchedGEPA(metric=sim.metric, p=args.p, n=args.n, max_metric_calls=args.budget,
                            reflection_lm=server.lm("reflection"), pool=pool, seed=args.seed,
                            schedule="steps", selection="all")  # deterministic: both pools propose the same
    with dspy.context(lm=server.lm("task")):
        start = time.perf_counter()
        best = optimizer.compile(sim.seed_program(), trainset=train, valset=val)
        wall = time.perf_counter() - start
    results = best.detailed_results
    return wall, results.total_metric_calls, [c.predict.signature.instructions for c in results.candidates]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-latency", type=float, default=0.2)
    parser.add_argument("--reflection-ratio", type=float, default=4.0)
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "ray_pool.json"))
    args = parser.parse_args()

    ray.init(include_dashboard=False, log_to_driver=False)
    walls: dict[str, list[float]] = {"threads": [], "ray": []}
    same = True
    with LatencyServer(task_latency=args.task_latency,
                       reflection_latency=args.reflection_ratio * args.task_latency) as server, \
            ThreadWorkerPool(args.workers) as threads, RayWorkerPool(max_concurrency=args.workers) as on_ray:
        server.warm_up()
        timed_run(on_ray, server, args)  # actors import dspy once; not part of the comparison
        for repeat in range(args.repeats):
            outcomes = {}
            for name, pool in (("threads", threads), ("ray", on_ray)):
                wall, calls, candidates = timed_run(pool, server, args)
                walls[name].append(wall)
                outcomes[name] = (calls, candidates)
                print(f"repeat {repeat}: {name:7s} {wall:6.2f} s, {calls} metric calls", flush=True)
            same = same and outcomes["threads"] == outcomes["ray"]
    ray.shutdown()

    threads_s, ray_s = statistics.median(walls["threads"]), statistics.median(walls["ray"])
    print(f"\n{args.p}x{args.n}, W={args.workers}, B={args.budget}, T_e={args.task_latency} s: "
          f"threads median {threads_s:.2f} s, Ray median {ray_s:.2f} s, ratio {ray_s / threads_s:.2f} "
          f"(same candidates and calls: {same})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"args": vars(args), "walls": walls, "ratio": ray_s / threads_s, "same_candidates": same},
                  handle, indent=2)


if __name__ == "__main__":
    main()
