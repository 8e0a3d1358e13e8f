"""Measure a landscape: does GEPA learn on it, and how far does its best val over-state held-out?

The numbers in ``landscape``'s docstring come from this (in-process ``SimulatedLM``, no
latency, a few seconds per seed)::

    python -m dspy_pxn.testing.measure_landscape --landscape breadth --seeds 5

Per seed: the seed program's val and test, the best candidate's val and test, and the
best candidate's val with its luck re-drawn (the mean over a few copies of its instruction
with a harmless extra line, which changes every answer's noise draw but no definition).
Best val minus that is what adaptive selection gained from luck: zero on DEPTH, where
answers have no noise, and the val→test argument on a noisy landscape.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from dataclasses import dataclass

import dspy

from dspy_pxn.teleprompter import BatchedGEPA
from dspy_pxn.testing.landscape import LANDSCAPES, Landscape, resolve_landscape
from dspy_pxn.testing.simulated_lm import SimulatedLM
from dspy_pxn.testing.task import make_splits, metric, score, seed_program

REDRAWS = 10


@dataclass(frozen=True)
class Measurement:
    """One seed's run: every score a fraction of its split."""

    seed: int
    seed_val: float
    seed_test: float
    best_val: float
    test: float
    val_redrawn: float
    candidates: int


def _evaluate(program: dspy.Module, data: list, threads: int) -> float:
    return dspy.Evaluate(devset=data, metric=score, num_threads=threads, display_progress=False)(program).score / 100


def _with_luck_redrawn(program: dspy.Module, data: list, threads: int) -> float:
    """The program's mean score over copies whose instruction differs by one non-definition line."""
    instruction = program.predict.signature.instructions
    scores = []
    for k in range(REDRAWS):
        variant = program.deepcopy()
        variant.predict.signature = variant.predict.signature.with_instructions(f"{instruction}\n(Variant {k}.)")
        scores.append(_evaluate(variant, data, threads))
    return statistics.mean(scores)


def measure(landscape: Landscape, seed: int, *, p: int = 1, n: int = 1, budget: int = 600, val: int = 30,
            test: int = 100, threads: int = 16) -> Measurement:
    """One ``BatchedGEPA`` run on ``make_splits(seed)`` with this landscape's simulated model."""
    train_set, val_set, test_set = make_splits(seed=seed, val=val, test=test)
    with dspy.context(lm=SimulatedLM(landscape=landscape)):
        seed_val, seed_test = _evaluate(seed_program(), val_set, threads), _evaluate(seed_program(), test_set, threads)
        best = BatchedGEPA(metric=metric, p=p, n=n, max_metric_calls=budget, num_threads=threads, seed=seed,
                           reflection_lm=SimulatedLM(landscape=landscape)).compile(
            seed_program(), trainset=train_set, valset=val_set)
        results = best.detailed_results
        return Measurement(seed, seed_val, seed_test, results.val_aggregate_scores[results.best_idx],
                           _evaluate(best, test_set, threads), _with_luck_redrawn(best, val_set, threads),
                           len(results.candidates))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landscape", default="breadth", help=f"{'|'.join(LANDSCAPES)} or a Landscape's JSON")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--p", type=int, default=1)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--val-size", type=int, default=30)
    parser.add_argument("--test-size", type=int, default=100)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    landscape = resolve_landscape(args.landscape)
    print(f"{landscape}\n{args.p}x{args.n}, budget {args.budget}, |val| {args.val_size}, |test| {args.test_size}")
    print("| seed | seed val | seed test | best val | test | val, luck re-drawn | candidates |\n|---|---|---|---|---|---|---|")
    rows = []
    for seed in range(args.seeds):
        m = measure(landscape, seed, p=args.p, n=args.n, budget=args.budget, val=args.val_size, test=args.test_size)
        rows.append(m)
        print(f"| {seed} | {m.seed_val:.3f} | {m.seed_test:.3f} | {m.best_val:.3f} | {m.test:.3f} | "
              f"{m.val_redrawn:.3f} | {m.candidates} |", flush=True)

    def mean(field: str) -> float:
        return statistics.mean(getattr(m, field) for m in rows)

    print(f"| mean | {mean('seed_val'):.3f} | {mean('seed_test'):.3f} | {mean('best_val'):.3f} | {mean('test'):.3f} | "
          f"{mean('val_redrawn'):.3f} | |")
    print(f"best val - test {mean('best_val') - mean('test'):+.3f}; "
          f"best val - its val with luck re-drawn {mean('best_val') - mean('val_redrawn'):+.3f}")


if __name__ == "__main__":
    main()
