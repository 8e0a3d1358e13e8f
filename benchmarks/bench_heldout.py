"""Held-out score of P×N settings vs 1×1 over several seeds (no latency: scores only).

One seed's test score swings by ±0.1 on this task, so a single run cannot say whether a
setting generalises worse than 1×1. This runs each setting at equal budget on the
deterministic in-process simulated LM (the same answers the latency server gives, without
the waiting) for several seeds and prints mean and per-seed test scores.

    python benchmarks/bench_heldout.py                 # 5 seeds, ~3 min
    python benchmarks/bench_heldout.py --seeds 10
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

import dspy

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

RESULTS = Path(__file__).parent / "results"


def parse_config(text: str) -> tuple[int, int, str | int]:
    """'4x4' -> (4, 4, 'all'); '16x1 best' -> (16, 1, 'best'); '4x4 top2' -> (4, 4, 2)."""
    shape, *rest = text.split()
    p, n = map(int, shape.split("x"))
    selection: str | int = rest[0] if rest else "all"
    if isinstance(selection, str) and selection.startswith("top"):
        selection = int(selection[3:])
    return p, n, selection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--configs", default="1x1,4x4,8x2,16x1,4x4 best,8x2 best,16x1 best,4x4 top2,16x1 top2")
    parser.add_argument("--out", default=str(RESULTS / "heldout.json"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    configs = [c.strip() for c in args.configs.split(",")]
    scores: dict[str, list[float]] = {c: [] for c in configs}
    for seed in range(args.seeds):
        train, val, test = sim.make_splits(seed=seed, train=60, val=30, test=100)
        for config in configs:
            p, n, selection = parse_config(config)
            with dspy.context(lm=sim.SimulatedLM()):
                best = BatchedGEPA(
                    metric=sim.metric, p=p, n=n, max_metric_calls=args.budget, reflection_lm=sim.SimulatedLM(),
                    num_threads=args.workers, seed=seed, selection=selection, schedule="steps",
                ).compile(sim.seed_program(), trainset=train, valset=val)
                evaluate = dspy.Evaluate(devset=test, metric=sim.score, num_threads=args.workers,
                                         display_progress=False)
                scores[config].append(evaluate(best).score / 100)
        print(f"seed {seed} done", flush=True)

    baseline = statistics.mean(scores[configs[0]])
    print(f"\n| config | mean test | vs {configs[0]} | per seed |")
    print("|---|---|---|---|")
    for config in configs:
        mean = statistics.mean(scores[config])
        print(f"| {config} | {mean:.3f} | {mean - baseline:+.3f} | {' '.join(f'{s:.2f}' for s in scores[config])} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"args": vars(args), "scores": scores}, handle, indent=2)


if __name__ == "__main__":
    main()
