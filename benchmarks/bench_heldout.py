"""Held-out score of P×N settings of the step loop against 1×1, over seeds and landscapes, with each side's bill.

One seed's test score swings by ±0.1 on this task, so a single run cannot say whether a
setting generalises worse than 1×1 (dspy.GEPA's own search, candidate for candidate). This runs
each setting at equal budget on the deterministic in-process simulated LM (the same answers the
latency server gives, without the waiting: scores and the bill, not time), for several seeds on each
landscape, and prints each setting's held-out paired by seed with 1×1's (mean difference and its
standard error) beside both sides' reflection calls, reflection tokens and dollars at the price pair
(``dspy_pxn.testing.bill``). ``dspy-pxn plan`` reads the settings measured here (``planning.measured``).

    python benchmarks/bench_heldout.py                          # 5 seeds, depth and chain, ~4 min
    python benchmarks/bench_heldout.py --seeds 10 --landscapes depth,breadth,chain
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
from pathlib import Path

import dspy
from bench_schedules import bill_ratios, paired  # benchmarks/ is the script's own directory

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing.bill import PRICE_PAIR, dollars, from_simulated

RESULTS = Path(__file__).parent / "results"


def parse_config(text: str) -> tuple[int, int, str | int]:
    """'4x4' -> (4, 4, 'all'); '16x1 best' -> (16, 1, 'best'); '4x4 top2' -> (4, 4, 2)."""
    shape, *rest = text.split()
    p, n = map(int, shape.split("x"))
    selection: str | int = rest[0] if rest else "all"
    if isinstance(selection, str) and selection.startswith("top"):
        selection = int(selection[3:])
    return p, n, selection


def run_one(config: str, landscape: str, seed: int, args: argparse.Namespace) -> dict:
    """One setting on one seed: its held-out score and its bill, counted where the calls were answered."""
    p, n, selection = parse_config(config)
    train, val, test = sim.make_splits(seed=seed, train=60, val=30, test=100)
    task, reflection = sim.SimulatedLM(landscape=landscape), sim.SimulatedLM(landscape=landscape)
    with dspy.context(lm=task):
        best = BatchedGEPA(
            metric=sim.metric, p=p, n=n, max_metric_calls=args.budget, reflection_lm=reflection,
            num_threads=args.workers, seed=seed, selection=selection, schedule="steps",
        ).compile(sim.seed_program(), trainset=train, valset=val)
    bill = from_simulated(task, reflection)  # before the held-out evaluation, which is not the run's
    with dspy.context(lm=sim.SimulatedLM(landscape=landscape)):
        score = dspy.Evaluate(devset=test, metric=sim.score, num_threads=args.workers, display_progress=False)(best)
    return {"config": config, "seed": seed, "test": score.score / 100,
            "metric_calls": best.detailed_results.total_metric_calls, "bill": bill, "usd": dollars(bill)}


def table(rows: list[dict], configs: list[str]) -> list[dict]:
    """Per setting: mean held-out, its paired difference from the first setting's, and the bill beside it."""
    baseline = [r for r in rows if r["config"] == configs[0]]
    summary = []
    for config in configs:
        mine = [r for r in rows if r["config"] == config]
        difference, error = paired(mine, baseline, lambda r: r["test"])
        summary.append({
            "config": config, "test_mean": statistics.mean(r["test"] for r in mine),
            "test_sd": statistics.stdev(r["test"] for r in mine) if len(mine) > 1 else 0.0,
            "vs_first": difference, "vs_first_se": error,
            "reflection_calls": statistics.mean(r["bill"]["reflection"]["calls"] for r in mine),
            "reflection_in": statistics.mean(r["bill"]["reflection"]["prompt"] for r in mine),
            "reflection_out": statistics.mean(r["bill"]["reflection"]["completion"] for r in mine),
            "usd": statistics.mean(r["usd"] for r in mine), "bill_vs_first": bill_ratios(mine, baseline),
            "tests": [r["test"] for r in mine],
        })
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--landscapes", default="depth,chain",
                        help="comma-separated presets: depth, breadth, chain (each improvement builds on the last)")
    parser.add_argument("--configs", default="1x1,4x4,8x2,16x1,4x4 best,8x2 best,16x1 best,4x4 top2,16x1 top2")
    parser.add_argument("--out", default=str(RESULTS / "heldout.json"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    configs = [c.strip() for c in args.configs.split(",")]
    report: dict = {"args": vars(args), "price_pair": PRICE_PAIR, "tables": {}}
    for landscape in args.landscapes.split(","):
        rows = [run_one(config, landscape, seed, args) for seed in range(args.seeds) for config in configs]
        summary = table(rows, configs)
        report["tables"][landscape] = {"rows": rows, "table": summary}
        print(f"\n### landscape {landscape} (B {args.budget}, W {args.workers}, {args.seeds} seeds; dollars at "
              f"{PRICE_PAIR['task']} (task) and {PRICE_PAIR['reflection']} (reflection) list prices)\n")
        print(f"| config | held-out mean ± sd | − {configs[0]} (se) | reflection calls | "
              "reflection tokens in / out | $ | reflection calls × | reflection in × | $ × | per seed |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in summary:
            ratios = r["bill_vs_first"]
            print(f"| {r['config']} | {r['test_mean']:.3f} ± {r['test_sd']:.3f} | {r['vs_first']:+.3f} "
                  f"({r['vs_first_se']:.3f}) | {r['reflection_calls']:.1f} | {r['reflection_in']:.0f} / "
                  f"{r['reflection_out']:.0f} | {r['usd']:.4f} | {ratios['reflection_calls']:.2f} | "
                  f"{ratios['reflection_in']:.2f} | {ratios['usd']:.2f} | {' '.join(f'{t:.2f}' for t in r['tests'])} |",
                  flush=True)
        RESULTS.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
