"""Best validation score so far against wall-clock: dspy.GEPA 1×1 and BatchedGEPA p=4, n=4, side by side.

The regime of ``bench_schedules.py`` (W 16, B 600, |val| 30, the simulated LM in this process with
its call times slept, task call 0.5 s and reflection 2 s before ``--scale``), both landscapes, fixed
call times. Each run records, through gepa's ``on_valset_evaluated`` callback (the same listener for
both optimizers), the seconds since ``compile()`` began at which each candidate's validation ended
and its score, and the run's held-out score. Writes benchmarks/results/curves_w16.json, which
``plot_benchmarks.py`` draws.

    python benchmarks/bench_curves.py                  # 5 seeds, time-scaled by 0.2: about 2 minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # gepa's and DSPy's progress bars, read when tqdm is imported

import dspy
from bench_schedules import landscape_of, regime_parser  # benchmarks/ is the script's own directory

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing.bill import PRICE_PAIR, dollars, from_simulated

CONFIGS = ("dspy.GEPA 1x1", "async 4x4 merge")


class ValidationClock:
    """gepa callback: (seconds since start, candidate's val score) at the end of each full validation."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.points: list[tuple[float, float]] = []

    def on_valset_evaluated(self, event: dict) -> None:  # gepa's ValsetEvaluatedEvent (a TypedDict)
        self.points.append((time.perf_counter() - self.start, float(event["average_score"])))


def run_one(config: str, args, landscape: str, seed: int) -> dict:
    train, val, test = sim.make_splits(seed=seed, train=args.train, val=args.val, test=args.test)
    task_s = args.task_latency * args.scale
    task_lm, reflection_lm = (sim.SimulatedLM(task_latency=task_s, reflection_latency=4 * task_s, latency="fixed",
                                              seed=seed * 2 + kind, landscape=landscape_of(args, landscape))
                               for kind in (0, 1))
    clock = ValidationClock()
    common = {"metric": sim.metric, "max_metric_calls": args.budget, "reflection_lm": reflection_lm,
              "num_threads": args.workers, "use_merge": False, "seed": seed}
    if config == "dspy.GEPA 1x1":
        teleprompter = dspy.GEPA(**common, track_stats=True, gepa_kwargs={"callbacks": [clock]})
    else:
        teleprompter = BatchedGEPA(**common, p=4, n=4, gepa_kwargs={"callbacks": [clock]})
    with dspy.context(lm=task_lm):
        clock.start = time.perf_counter()
        best = teleprompter.compile(sim.seed_program(), trainset=train, valset=val)
        wall = time.perf_counter() - clock.start
    bill = from_simulated(task_lm, reflection_lm)
    with dspy.context(lm=sim.SimulatedLM(landscape=landscape_of(args, landscape))):
        test_score = dspy.Evaluate(devset=test, metric=sim.score, num_threads=16, display_progress=False)(best).score / 100
    return {"config": config, "landscape": landscape, "seed": seed, "wall_s": wall,
            "metric_calls": best.detailed_results.total_metric_calls, "test": test_score, "validations": clock.points,
            "bill": bill, "usd": dollars(bill)}


def main() -> None:
    parser = regime_parser(__doc__, scale=0.2)
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (they mostly sleep)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "curves_w16.json"))
    args = parser.parse_args()
    jobs = [(c, land, s) for land in args.landscapes.split(",") for s in range(args.seeds) for c in CONFIGS]
    with ThreadPoolExecutor(max_workers=args.parallel) as executor:
        runs = list(executor.map(lambda job: run_one(job[0], args, job[1], job[2]), jobs))
    for run in runs:
        print(f"{run['landscape']:8s} seed {run['seed']} {run['config']:16s} wall {run['wall_s']:6.1f} s, "
              f"{len(run['validations'])} validations, best val {max(v for _, v in run['validations']):.3f}, "
              f"held-out {run['test']:.3f}, reflection calls {run['bill']['reflection']['calls']}, "
              f"reflection tokens in {run['bill']['reflection']['prompt']}, ${run['usd']:.4f}")
    print(f"(dollars at {PRICE_PAIR['task']} for the task and {PRICE_PAIR['reflection']} for reflection)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
