"""Where a wide async run leaves its pool idle: at the start, while it searches, or at the end.

Runs BatchedGEPA (``async auto merge``, the default) on the simulated task in this process, as
``bench_schedules.py`` does, with a DSPy callback that times every LM call. From those times:

    busy      task-call seconds summed; busy / W is the wall of a pool that never idles
    x busy    wall / (busy / W): the run's own floor, at the call times it actually drew
    idle      W · wall − busy, as seconds of the whole pool (idle / W), split at two instants:
      seed      until the seed's validation ends (its |val| calls are the run's first)
      search    from there until the last reflection starts (pipelines and merges can still begin)
      end       from the last reflection's start: the slowest reflections in flight, the final validation

With fixed call times the split shows the width and the validations' waves; with lognormal ones
(p99/p50 = 4), what the tail costs where the run has a barrier: the seed's slowest call holds
every pipeline back, and the run ends with its slowest reflection and its final validation.

    python benchmarks/bench_pool_idle.py --workers 64 --budget 3000 --val 150 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import dspy
from bench_schedules import lm, optimizer
from dspy.utils.callback import BaseCallback

from dspy_pxn import testing as sim


class CallTimes(BaseCallback):
    """(is_reflection, start, end) of every LM call made in its context; the reflection LM is told apart by identity."""

    def __init__(self, reflection_lm: dspy.BaseLM):
        self.reflection_lm = reflection_lm
        self.calls: list[tuple[bool, float, float]] = []
        self._open: dict[str, tuple[bool, float]] = {}
        self._lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs):
        with self._lock:
            self._open[call_id] = (instance is self.reflection_lm, time.perf_counter())

    def on_lm_end(self, call_id, outputs, exception=None):
        with self._lock:
            reflection, start = self._open.pop(call_id)
            self.calls.append((reflection, start, time.perf_counter()))


def busy_between(calls: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Task-call seconds inside [lo, hi)."""
    return sum(max(0.0, min(end, hi) - max(start, lo)) for start, end in calls)


def idle_split(tasks: list[tuple[float, float]], reflection_starts: list[float], seed_calls: int, wall: float,
               workers: int) -> dict[str, float]:
    """The pool's idle time, as seconds of the whole pool, at the two instants every run has: the end of the
    seed's validation (its first ``seed_calls`` task calls) and the start of its last reflection. ``tasks``
    are (start, end) and ``reflection_starts`` seconds from the run's start, which ends at ``wall``."""
    tasks = sorted(tasks)
    seed_end = max(end for _, end in tasks[:seed_calls])
    last_reflection = max(reflection_starts, default=seed_end)
    idle = {name: (workers * (hi - lo) - busy_between(tasks, lo, hi)) / workers
            for name, lo, hi in (("seed", 0.0, seed_end), ("search", seed_end, last_reflection),
                                 ("end", last_reflection, wall))}
    busy = busy_between(tasks, 0.0, wall)
    return {"busy_over_w_s": busy / workers, "x_busy": wall / (busy / workers), "mean_call_s": busy / len(tasks),
            "seed_end_s": seed_end, "last_reflection_s": last_reflection,
            **{f"idle_{name}_s": seconds for name, seconds in idle.items()}}


def run_one(args, landscape: str, latency: str, seed: int) -> dict:
    train, val, _ = sim.make_splits(seed=seed, train=args.train, val=args.val, test=1)
    task_lm, reflection_lm = lm(args, landscape, latency, seed, "task"), lm(args, landscape, latency, seed, "reflection")
    times = CallTimes(reflection_lm)
    with dspy.context(lm=task_lm, callbacks=[times]):
        teleprompter = optimizer(args.config, args, reflection_lm, seed)
        started = time.perf_counter()
        teleprompter.compile(sim.seed_program(), trainset=train, valset=val)
        wall = time.perf_counter() - started
    tasks = [(s - started, e - started) for reflection, s, e in times.calls if not reflection]
    reflections = [s - started for reflection, s, e in times.calls if reflection]
    return {"seed": seed, "wall_s": wall, **idle_split(tasks, reflections, args.val, wall, args.workers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-latency", type=float, default=0.5, help="T_e in seconds (before --scale)")
    parser.add_argument("--reflection-ratio", type=float, default=4.0)
    parser.add_argument("--scale", type=float, default=0.5)
    parser.add_argument("--budget", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--train", type=int, default=150)
    parser.add_argument("--val", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--landscapes", default="depth,breadth")
    parser.add_argument("--latencies", default="fixed,lognormal")
    parser.add_argument("--config", default="async auto merge", help="a BatchedGEPA config of bench_schedules.py")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "pool_idle.json"))
    args = parser.parse_args()

    report: dict = {"args": vars(args), "cells": {}}
    print(f"W {args.workers}, B {args.budget}, |val| {args.val}, T_e {args.task_latency * args.scale:g} s, "
          f"T_r {args.reflection_ratio * args.task_latency * args.scale:g} s, {args.config}, {args.seeds} seeds; "
          "seconds of the whole pool, mean over seeds\n")
    print("| landscape / latency | wall s | busy / W s | x busy | idle: seed | search | end | seed ends at | last reflection at |")
    print("|---|---|---|---|---|---|---|---|---|")
    for landscape in args.landscapes.split(","):
        for latency in args.latencies.split(","):
            rows = [run_one(args, landscape, latency, seed) for seed in range(args.seeds)]
            report["cells"][f"{landscape}/{latency}"] = rows
            mean = {key: statistics.mean(r[key] for r in rows) for key in rows[0] if key != "seed"}
            print(f"| {landscape} / {latency} | {mean['wall_s']:.1f} | {mean['busy_over_w_s']:.1f} | "
                  f"{mean['x_busy']:.2f} | {mean['idle_seed_s']:.2f} | {mean['idle_search_s']:.2f} | "
                  f"{mean['idle_end_s']:.2f} | {mean['seed_end_s']:.2f} | {mean['last_reflection_s']:.1f} of "
                  f"{mean['wall_s']:.1f} |", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
