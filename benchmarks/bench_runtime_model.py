"""Runtime model vs measured wall-clock across a P×N sweep on the latency-injecting server.

For each configuration, BatchedGEPA runs at equal budget (every call through dspy.LM ->
HTTP to the server on loopback) and writes its step log. The runtime model is then
fitted three ways and asked to predict each run's wall-clock:

- own fit: from that run's own step records (does the model's structure explain the run?);
- pooled fit: from all runs' records together (one model for the setup);
- pilot fit: from the 1×1 run only (what a user has before choosing P×N).

The planner ranks the measured shapes with the pooled and the pilot model, and its top pick is
compared with the fastest measured run. Prints markdown tables, writes
benchmarks/results/runtime_model.json and the plot benchmarks/results/runtime_model.png.

    python benchmarks/bench_runtime_model.py                      # ~6 min
    python benchmarks/bench_runtime_model.py --task-latency 0.1   # quicker, same shape
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import dspy

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.engine.records import StepRecord, read_step_log
from dspy_pxn.planning import RunShape, RuntimeModel, parse_shapes
from dspy_pxn.testing import LatencyServer
from dspy_pxn.tracking.plots import plot_model_vs_measured

RESULTS = Path(__file__).parent / "results"


@dataclass
class Measured:
    config: str
    p: int
    n: int
    wall_s: float
    iterations: int
    trigger_fraction: float
    metric_calls: int
    acceptance: float
    own_fit_s: float
    pooled_fit_s: float
    pilot_fit_s: float

    def error(self, predicted: float) -> float:
        return (predicted - self.wall_s) / self.wall_s


def run_config(p: int, n: int, server: LatencyServer, args, log_dir: str) -> tuple[float, list[StepRecord]]:
    optimizer = BatchedGEPA(
        metric=sim.metric, p=p, n=n, max_metric_calls=args.budget, reflection_lm=server.lm("reflection"),
        num_threads=args.workers, seed=args.seed, log_dir=log_dir, selection=args.selection, schedule="steps",
    )
    train, val, _ = sim.make_splits(seed=args.seed, train=args.train, val=args.val, test=1)
    with dspy.context(lm=server.lm("task")):
        start = time.perf_counter()
        optimizer.compile(sim.seed_program(), trainset=train, valset=val)
        wall = time.perf_counter() - start
    return wall, read_step_log(log_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-latency", type=float, default=0.5, help="seconds per task LM call")
    parser.add_argument("--reflection-ratio", type=float, default=4.0, help="reflection latency / task latency")
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--train", type=int, default=60)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--selection", default="all")
    parser.add_argument("--configs", default="1x1,2x2,2x4,4x4,8x1,8x2")
    parser.add_argument("--out", default=str(RESULTS / "runtime_model.json"))
    args = parser.parse_args()
    selection = int(args.selection) if args.selection.isdigit() else args.selection

    shapes = parse_shapes(args.configs)
    shape = RunShape(workers=args.workers, budget=args.budget, val_size=args.val, minibatch_size=3)
    walls: dict[tuple[int, int], float] = {}
    logs: dict[tuple[int, int], list[StepRecord]] = {}
    with LatencyServer(task_latency=args.task_latency,
                       reflection_latency=args.reflection_ratio * args.task_latency) as server, \
            tempfile.TemporaryDirectory() as tmp:
        server.warm_up()
        for p, n in shapes:
            walls[(p, n)], logs[(p, n)] = run_config(p, n, server, args, os.path.join(tmp, f"{p}x{n}"))
            print(f"{p}x{n}: {walls[(p, n)]:.1f} s, {len(logs[(p, n)])} steps", flush=True)

    pooled = RuntimeModel.fit([s for steps in logs.values() for s in steps])
    pilot = RuntimeModel.fit(logs[shapes[0]])
    rows = []
    for p, n in shapes:
        steps = logs[(p, n)]
        own = RuntimeModel.fit(steps)
        rows.append(Measured(
            config=f"{p}x{n}", p=p, n=n, wall_s=walls[(p, n)], iterations=len(steps),
            trigger_fraction=sum(s.full_validation for s in steps) / len(steps),
            metric_calls=steps[-1].metric_calls_total, acceptance=own.acceptance,
            own_fit_s=own.predict(p, n, shape, selection).wall_s,
            pooled_fit_s=pooled.predict(p, n, shape, selection).wall_s,
            pilot_fit_s=pilot.predict(p, n, shape, selection).wall_s,
        ))

    print(f"\nfitted (pooled): T_e={pooled.task_s:.3f} s, T_r={pooled.reflection_s:.3f} s, "
          f"a={pooled.acceptance:.3f}, overhead={pooled.step_overhead_s:.3f} s/step; "
          f"pilot ({shapes[0][0]}x{shapes[0][1]}): a={pilot.acceptance:.3f}\n")
    print("| config | measured s | iterations | validation-trigger | own fit s (err) | pooled fit s (err) "
          "| 1x1-pilot fit s (err) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.config} | {r.wall_s:.1f} | {r.iterations} | {r.trigger_fraction:.2f} "
              f"| {r.own_fit_s:.1f} ({r.error(r.own_fit_s):+.0%}) | {r.pooled_fit_s:.1f} ({r.error(r.pooled_fit_s):+.0%}) "
              f"| {r.pilot_fit_s:.1f} ({r.error(r.pilot_fit_s):+.0%}) |")

    fastest = min(rows, key=lambda r: r.wall_s)
    by_config = {r.config: r for r in rows}
    picks = {}
    for label, model in (("pooled", pooled), ("pilot", pilot)):
        top = model.plan(shape, shapes, selection)[0]
        picked = by_config[f"{top.p}x{top.n}"]
        picks[label] = {"pick": picked.config, "pick_measured_s": picked.wall_s,
                        "vs_fastest": picked.wall_s / fastest.wall_s, "binding": top.binding}
        print(f"planner ({label} fit) picks {picked.config} ({top.binding}-bound): measured {picked.wall_s:.1f} s, "
              f"{picked.wall_s / fastest.wall_s:.2f}x the fastest measured ({fastest.config}, {fastest.wall_s:.1f} s)")

    RESULTS.mkdir(parents=True, exist_ok=True)
    png = Path(args.out).with_suffix(".png")
    plot_model_vs_measured({"1x1 pilot fit": pilot, "pooled fit": pooled}, shape, {(r.p, r.n): r.wall_s for r in rows}, png, selection=selection)
    with open(args.out, "w") as handle:
        json.dump({"args": vars(args), "pooled": asdict(pooled), "pilot": asdict(pilot), "picks": picks,
                   "rows": [asdict(r) for r in rows]}, handle, indent=2)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
